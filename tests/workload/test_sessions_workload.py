"""The session generator (justitia/workload/sessions.py) against its data file (justitia/data/sessions.json):
statistics within sampling error, conversation growth, shared system prompts, subagents, the KV cap,
determinism, and the workload file round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from justitia.workload import generate_sessions, load_workload, save_workload
from justitia.workload.sessions import build_sessions, load_session_params, session_kv_cap

P = load_session_params()
N = 400
SEED = 3


@pytest.fixture(scope="module")
def sessions():
    return generate_sessions(N, SEED)


def _int_lognormal(spec: dict) -> tuple[float, float]:
    """Exact mean and standard deviation of clip(rint(median * exp(sigma * z)), min, max)."""
    lo, hi = int(spec["min"]), int(spec["max"])
    ks = np.arange(lo, hi + 1)
    cdf = lambda x: norm.cdf(np.log(np.maximum(x, 1e-300) / spec["median"]) / spec["sigma"])  # noqa: E731
    pk = cdf(ks + 0.5) - cdf(ks - 0.5)
    pk[0], pk[-1] = cdf(lo + 0.5), 1 - cdf(hi - 0.5)
    mean = float((ks * pk).sum())
    return mean, float(math.sqrt(((ks - mean) ** 2 * pk).sum()))


def _lognormal_time(spec: dict, n: int = 400_000) -> tuple[float, float]:
    """Mean and standard deviation of a clamped continuous lognormal (numerically)."""
    z = np.random.default_rng(12345).standard_normal(n)
    x = np.clip(spec["median"] * np.exp(spec["sigma"] * z), spec["min"], spec["max"])
    return float(x.mean()), float(x.std())


def _within(sample, mean: float, sd: float, k: float = 4.0) -> None:
    sample = np.asarray(sample, dtype=float)
    assert abs(sample.mean() - mean) <= k * sd / math.sqrt(len(sample)), (sample.mean(), mean, sd, len(sample))


def _chains(agent):
    """The main chain's stages, and every branch chain, as lists of stages."""
    out = [list(agent.stages)]
    for st in agent.stages:
        out.extend(list(chain) for chain in st.branches)
    return out


def test_data_file_documents_every_parameter():
    for name in (
        "type",
        "scale",
        "kv",
        "arrivals",
        "turns_per_session",
        "calls_per_turn",
        "tool_pause_s",
        "think_time_s",
        "output_tokens",
        "system_prompt",
        "user_message_tokens",
        "tool_result_tokens",
        "subagents",
        "text",
    ):
        assert P[name]["source"], name
    for name, stat in P["published"].items():
        assert stat["source"].startswith("ghcp2026"), name
    kv = P["kv"]
    assert (kv["kv_tokens"], kv["block_size"]) == (2700 * 16, 16)  # the llama7b-a100-40gb profile
    from justitia.sim.config import PROFILES

    prof = PROFILES[kv["profile"]]
    assert kv["kv_tokens"] == prof.kv_blocks * prof.block_size
    # the drawn means are the published ones: turns 3.95; main calls + subagent calls ~ 7.83; output ~528
    assert _int_lognormal(P["turns_per_session"])[0] == pytest.approx(3.95, abs=0.02)
    assert _int_lognormal(P["calls_per_turn"])[0] == pytest.approx(7.31, abs=0.02)
    assert _int_lognormal(P["output_tokens"])[0] == pytest.approx(528, rel=0.01)


def test_drawn_turns_and_calls_match_the_file(sessions):
    _within([a.meta["turns_drawn"] for a in sessions], *_int_lognormal(P["turns_per_session"]))
    _within([c for a in sessions for c in a.meta["calls_drawn"]], *_int_lognormal(P["calls_per_turn"]))


def test_realized_structure_is_the_drawn_one_unless_truncated(sessions):
    truncated = 0
    for a in sessions:
        turns = [st.turn for st in a.stages if st.turn is not None]
        assert turns == list(range(len(turns)))  # every turn numbered once, in order, from 0
        assert a.stages[0].turn == 0
        per_turn, k = [], -1
        for st in a.stages:
            if st.turn is not None:
                k = st.turn
                per_turn.append(0)
            per_turn[k] += len(st)  # main calls (a branching stage has none)
        drawn = a.meta["calls_drawn"]
        if a.meta["truncated"]:
            truncated += 1
            assert len(per_turn) <= len(drawn)
            assert per_turn[:-1] == drawn[: len(per_turn) - 1] and per_turn[-1] <= drawn[len(per_turn) - 1]
        else:
            assert per_turn == drawn and len(per_turn) == a.meta["turns_drawn"]
    assert truncated / len(sessions) < 0.15  # the cap cuts only the longest sessions


def test_pauses_tool_between_calls_and_think_between_turns(sessions):
    tool, think = [], []
    for a in sessions:
        for chain in _chains(a):
            for i, st in enumerate(chain):
                if i == 0:
                    assert st.pause_s == 0.0
                elif st.turn is not None:
                    think.append(st.pause_s)
                elif len(st) and not (i > 0 and chain[i - 1].branches):
                    tool.append(st.pause_s)
                else:
                    assert st.pause_s == 0.0  # the subagents' stage, and the call reading their results
    assert min(tool) >= P["tool_pause_s"]["min"] and min(think) >= P["think_time_s"]["min"]
    _within(tool, *_lognormal_time(P["tool_pause_s"]))
    _within(think, *_lognormal_time(P["think_time_s"]))


def test_conversation_grows_by_output_plus_new_text(sessions):
    scale = P["scale"]["factor"]
    for a in sessions:
        for chain in _chains(a):
            calls = [st[0] for st in chain if len(st)]
            first = calls[0]
            assert len(first.context) == 1 and first.context[0].kind == "shared"
            assert first.prompt_tokens > first.context[0].tokens
            for prev, t in zip(calls, calls[1:]):
                assert [(c.kind, c.ref) for c in t.context] == [("prompt_of", prev.id), ("output_of", prev.id)]
                assert t.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            for t in calls:
                assert t.output_tokens >= max(1, round(P["output_tokens"]["min"] / scale))


def test_every_call_fits_the_kv_budget(sessions):
    cap = session_kv_cap()
    assert cap == int(P["kv"]["kv_tokens"] * P["kv"]["max_conversation_fraction"])
    assert max(t.prompt_tokens + t.output_tokens for a in sessions for t in a.tasks) <= cap


def test_system_prompts_are_few_and_shared_across_sessions(sessions):
    names = {}
    for a in sessions:
        seg = a.stages[0][0].context[0]
        assert seg.ref == a.meta["system"]
        names.setdefault(seg.ref, set()).add(seg.tokens)
    assert len(names) == P["system_prompt"]["variants"]
    assert all(len(sizes) == 1 for sizes in names.values())  # one name, one text, everywhere
    counts = [sum(a.meta["system"] == n for a in sessions) for n in sorted(names)]
    assert min(counts) >= 10  # every variant is shared by many sessions


def test_subagents_at_the_documented_rate(sessions):
    sub = P["subagents"]
    eligible, spawned, fans = 0, 0, []
    for a in sessions:
        if a.meta["truncated"]:
            continue
        eligible += sum(c >= 2 for c in a.meta["calls_drawn"])
        for i, st in enumerate(a.stages):
            if st.branches:
                spawned += 1
                fans.append(len(st.branches))
                assert len(st) == 0 and st.turn is None
                nxt = a.stages[i + 1][0]  # the parent's next call reads the subagents' results
                results = sum(chain[-1][0].output_tokens for chain in st.branches)
                prev = nxt.context[0].ref
                by_id = {t.id: t for t in a.tasks}
                assert nxt.prompt_tokens - by_id[prev].prompt_tokens - by_id[prev].output_tokens >= results
                for b, chain in enumerate(st.branches):
                    assert chain[0][0].id == f"s{i}.b{b}.t0"
                    assert chain[0][0].context[0].ref.startswith("subagent-")
    p = sub["turn_probability"]
    assert abs(spawned / eligible - p) <= 4 * math.sqrt(p * (1 - p) / eligible)
    assert set(fans) <= set(range(sub["fanout"]["min"], sub["fanout"]["max"] + 1)) and len(set(fans)) > 1


def test_ids_unique_and_lengths_scaled(sessions):
    for a in sessions:
        ids = [t.id for t in a.tasks]
        assert len(ids) == len(set(ids)) and all(ids)
        assert a.type == P["type"]["value"]
    outs = [t.output_tokens for a in sessions for t in a.tasks]
    prompts = [t.prompt_tokens for a in sessions for t in a.tasks]
    assert 60 < np.mean(prompts) / np.mean(outs) < 250  # published ~128:1, kept by the one scale factor


def test_deterministic_per_seed():
    dump = lambda seed: json.dumps([a.to_json() for a in generate_sessions(30, seed)])  # noqa: E731
    assert dump(5) == dump(5)
    assert dump(5) != dump(6)


def test_poisson_arrivals_at_the_rate():
    agents = generate_sessions(400, 1, rate_per_s=2.0)
    gaps = np.diff([a.arrival_s for a in agents])
    assert agents[0].arrival_s == 0.0 and np.all(gaps >= 0)
    _within(gaps, 0.5, 0.5)
    agents, info = build_sessions(5, 1)
    assert info["rate_per_s"] == P["arrivals"]["rate_per_s"] and info["kind"] == "sessions"


def test_bad_input():
    with pytest.raises(ValueError, match="n must be"):
        generate_sessions(0, 1)
    bad = load_session_params()
    bad["calls_per_turn"]["dist"] = "zipf"
    with pytest.raises(ValueError, match="calls_per_turn.dist"):
        generate_sessions(1, 1, params=bad)


def test_round_trips_through_the_workload_file(tmp_path, sessions):
    path = save_workload(sessions[:60], tmp_path / "s.jsonl.gz")
    back = load_workload(path)
    assert [a.to_json() for a in back] == [a.to_json() for a in sorted(sessions[:60], key=lambda a: a.arrival_s)]
    assert back == sorted(sessions[:60], key=lambda a: a.arrival_s)


def test_cli_generates_sessions(tmp_path):
    from justitia.cli import main

    out = tmp_path / "s.jsonl"
    assert main(["workload", "generate", "--kind", "sessions", "--agents", "8", "--seed", "2", "--out", str(out)]) == 0
    agents = load_workload(out)
    assert len(agents) == 8 and all(a.is_session for a in agents)
    assert [a.to_json() for a in agents] == [a.to_json() for a in build_sessions(8, 2)[0]]
