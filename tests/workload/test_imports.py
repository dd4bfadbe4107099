"""Real traffic as workloads (``workload.imports``, ``justitia workload import``): tau2-bench results
files, a chat-log JSONL and Mooncake's trace, read exactly at scale 1, and bad input refused with
one sentence naming the file, the simulation or line, and the field."""

import gzip
import json

import pytest

from justitia.core import KV
from justitia.workload import WorkloadError, load_workload
from justitia.workload.imports import (
    TAU2_COMPACT,
    conversations_to_agents,
    read_chat_log,
    read_compact,
    read_mooncake,
    read_tau2,
    write_compact,
)


def _msg(role, at, content="", usage=None, tool_calls=None):
    m = {"role": role, "content": content, "timestamp": f"2025-08-01T16:20:{at:09.6f}"}
    if usage is not None:
        m["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m


def _sim(sim_id, user=True):
    """A greeting, then turns: [user, call, tool, call], [user, call]; solo: the calls alone."""
    msgs = [_msg("assistant", 0.0, "Hi! How can I help you today?")] if user else []
    if user:
        msgs.append(_msg("user", 1.0, "I want to change my flight", (450, 51)))  # the user simulator's usage
    msgs += [
        _msg("assistant", 2.0, None, (3346, 57), [{"name": "get_user"}]),
        _msg("tool", 2.5, '{"user": "x"}'),
        _msg("assistant", 4.0, "Done.", (3437, 22)),
    ]
    if user:
        msgs += [_msg("user", 9.0, "Thanks, and my bag?", (600, 20)), _msg("assistant", 10.0, "Added.", (3500, 30))]
    return {"id": sim_id, "task_id": "13", "messages": msgs}


@pytest.fixture
def tau2_dir(tmp_path):
    (tmp_path / "gpt41_airline.json").write_text(json.dumps({"simulations": [_sim("aaaaaaaa-1"), _sim("bbbbbbbb-2")]}))
    (tmp_path / "ft_telecom_nouser.json").write_text(json.dumps({"simulations": [_sim("cccccccc-3", user=False)]}))
    return tmp_path


def test_tau2_import_is_exact_at_scale_1(tau2_dir, tmp_path):
    convs = read_tau2([tau2_dir])
    agents = {a.agent_id: a for a in conversations_to_agents(convs, [0.0, 1.0, 2.0])}
    session = agents["gpt41_airline/aaaaaaaa"]
    assert session.type == "tau2-airline/gpt41" and session.is_session
    # every agent call (an assistant message with usage), with the API's tokens; the user's are not calls
    assert [(t.prompt_tokens, t.output_tokens) for t in session.tasks] == [(3346, 57), (3437, 22), (3500, 30)]
    assert [st.turn for st in session.stages] == [0, None, 1]  # two user turns
    assert session.stages[1].pause_s == pytest.approx(0.5)  # the tool's time
    assert session.stages[2].pause_s == pytest.approx(5.0)  # the user's think time
    assert session.tasks[0].prompt == "I want to change my flight"  # the text that opens the turn
    # its context: the previous call's prompt and output, on top of the domain's system prompt
    assert [c.kind for c in session.tasks[1].context] == ["prompt_of", "output_of"]
    assert session.tasks[0].context[0].kind == "shared"
    solo = agents["ft_telecom_nouser/cccccccc"]
    assert not solo.is_session and solo.type == "tau2-telecom-solo/ft" and len(solo.tasks) == 2
    # the file a user writes reads back the same
    out = tmp_path / "w.jsonl"
    from justitia.workload import save_workload

    save_workload(list(agents.values()), out)
    back = {a.agent_id: a for a in load_workload(out)}
    assert sum(t.prompt_tokens for t in back["gpt41_airline/aaaaaaaa"].tasks) == 3346 + 3437 + 3500
    assert back["gpt41_airline/aaaaaaaa"].cost(KV) == session.cost(KV)


def test_the_compact_file_replays_what_the_results_files_hold(tau2_dir, tmp_path):
    convs = read_tau2([tau2_dir])
    back = read_compact(write_compact(convs, tmp_path / "c.jsonl.gz"))
    assert [(c.conv_id, c.kind, [(x.prompt_tokens, x.output_tokens, x.turn) for x in c.calls]) for c in back] == [
        (c.conv_id, c.kind, [(x.prompt_tokens, x.output_tokens, x.turn) for x in c.calls]) for c in convs
    ]


def test_the_shipped_compact_file_holds_tau2_bench():
    convs = read_tau2([TAU2_COMPACT])
    assert len(convs) == 280 and sum(len(c.calls) for c in convs) == 4329
    assert sum(c.solo for c in convs) == 80


@pytest.mark.parametrize(
    "break_it, field",
    [
        (lambda d: d["simulations"][0]["messages"][2]["usage"].update(prompt_tokens=0), "usage.prompt_tokens"),
        (lambda d: d["simulations"][0]["messages"][2]["usage"].pop("completion_tokens"), "usage.completion_tokens"),
        (lambda d: d["simulations"][0]["messages"][2].update(role="robot"), "role"),
        (lambda d: d["simulations"][0]["messages"][3].update(timestamp="yesterday"), "timestamp"),
        (lambda d: d["simulations"][0].update(messages=[]), "messages"),
        (lambda d: d["simulations"][0].update(id=""), "id"),
    ],
)
def test_a_bad_tau2_file_is_refused_naming_the_simulation_and_the_field(tmp_path, break_it, field):
    doc = {"simulations": [_sim("aaaaaaaa-1")]}
    break_it(doc)
    path = tmp_path / "gpt41_airline.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(WorkloadError) as err:
        read_tau2([path])
    assert str(path) in str(err.value) and f"'{field}'" in str(err.value)


def test_a_chat_log_takes_usage_where_present_and_says_when_it_estimated(tmp_path):
    path = tmp_path / "log.jsonl"
    with_usage = [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi", "usage": {"prompt_tokens": 20, "completion_tokens": 3}},
    ]
    without = {
        "id": "s2",
        "kind": "support",
        "messages": [
            {"role": "user", "content": "x" * 400, "timestamp": "2025-01-01T00:00:00"},
            {"role": "assistant", "content": "y" * 40, "timestamp": "2025-01-01T00:00:02"},
            {"role": "user", "content": "z" * 80, "timestamp": "2025-01-01T00:00:07"},
            {"role": "assistant", "content": "w" * 8, "timestamp": "2025-01-01T00:00:08"},
        ],
    }
    path.write_text(json.dumps(with_usage) + "\n" + json.dumps(without) + "\n")
    a, b = read_chat_log(path)
    assert a.meta["tokens"] == "usage" and [(c.prompt_tokens, c.output_tokens) for c in a.calls] == [(20, 3)]
    assert b.meta["tokens"] == "estimated" and b.kind == "support" and len(b.calls) == 2
    assert b.calls[0].prompt_tokens == 100 and b.calls[0].output_tokens >= 10  # 4 characters a token
    assert b.calls[1].turn == 1 and b.calls[1].pause_s == pytest.approx(5.0)
    assert b.calls[1].prompt_tokens > b.calls[0].prompt_tokens + b.calls[0].output_tokens  # the conversation so far


def test_a_bad_chat_log_line_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps([{"role": "user", "content": "a"}]) + "\n" + json.dumps({"messages": "no"}) + "\n")
    with pytest.raises(WorkloadError, match=r"log\.jsonl:1: .*'messages'"):  # no call in line 1
        read_chat_log(path)


def test_mooncake_requests_that_extend_an_earlier_prompt_continue_its_conversation(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 500, "input_length": 900, "output_length": 5, "hash_ids": [0, 7]},  # only the system block
        {"timestamp": 3000, "input_length": 1600, "output_length": 20, "hash_ids": [0, 1, 2, 3, 4]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    convs = read_mooncake(path)
    assert [len(c.calls) for c in convs] == [2, 1]
    assert convs[0].calls[1].pause_s == pytest.approx(3.0) and convs[0].calls[1].turn == 1
    agents = conversations_to_agents(convs)
    assert [a.arrival_s for a in agents] == [0.0, 0.5]


def test_mooncake_trace_with_a_bad_field_is_refused(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}))
    with pytest.raises(WorkloadError, match=r"trace\.jsonl:1: field 'output_length'"):
        read_mooncake(path)


def test_workload_import_writes_a_workload_and_writes_nothing_on_bad_input(tau2_dir, tmp_path, capsys):
    from justitia.cli import main

    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", "tau2", str(tau2_dir), "--out", str(out), "--rate", "2", "--copies", "2"]) == 0
    agents = load_workload(out)
    assert len(agents) == 6 and len({a.agent_id for a in agents}) == 6
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"simulations": "none"}))
    out2 = tmp_path / "w2.jsonl"
    assert main(["workload", "import", "tau2", str(bad), "--out", str(out2)]) != 0
    assert not out2.exists()
    assert "'simulations'" in capsys.readouterr().err


def test_the_compact_file_is_gzip_jsonl():
    with gzip.open(TAU2_COMPACT, "rt", encoding="utf-8") as fh:
        first = json.loads(fh.readline())
    assert set(first) >= {"id", "kind", "system", "calls"}


def test_the_tau2_presets_replay_every_simulation_and_fit_the_small_engine():
    from justitia.lab.studies.tau2 import TAU2_ENGINE_N, tau2_engine_workload, tau2_workload
    from justitia.workload.imports import TAU2_COMPACT

    agents, info = tau2_workload(0, copies=3, source=[TAU2_COMPACT])
    assert len(agents) == 840 and len({a.agent_id for a in agents}) == 840
    assert info["sessions"] == 600 and info["solo_agents"] == 240
    assert sorted(a.arrival_s for a in agents) == [a.arrival_s for a in agents]
    small, info = tau2_engine_workload(0, kv_tokens=2944, max_model_len=2048, source=[TAU2_COMPACT])
    assert len(small) == TAU2_ENGINE_N and all(a.is_session for a in small)
    assert max(t.prompt_tokens + t.output_tokens for a in small for t in a.tasks) <= 0.6 * 2944


def test_a_warm_row_learns_from_the_other_agent_model_only():
    from justitia.lab.bench import warm_predictor
    from justitia.lab.studies.tau2 import disjoint_history, other_model
    from justitia.predictors import make_predictor

    assert other_model("tau2-airline/gpt41") == "tau2-airline/ft"
    assert other_model("tau2-retail-solo/ft") == "tau2-retail-solo/gpt41"
    agents = conversations_to_agents(read_tau2([TAU2_COMPACT]), [float(i) for i in range(280)])
    history = disjoint_history(agents)
    assert all(h.type == other_model(a.type) != a.type for h, a in zip(history, agents))
    gpt = next(a for a in agents if a.type == "tau2-airline/gpt41")
    cold, warm = make_predictor("online"), make_predictor("online")
    warm_predictor(warm, [h for h in history if h.type == "tau2-airline/gpt41"])  # the ft agent's sessions
    assert warm.turn_cost(gpt, 1, [1e6], KV) != cold.turn_cost(gpt, 1, [1e6], KV)
