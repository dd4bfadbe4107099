"""Sessions (docs/sessions.md): the workload format's pauses, branches, shared text and turns; the
agent process that runs them; the simulator's pauses and turn times."""

import asyncio
import json

import pytest
from helpers import engine, session, tiny_cpu_config

from justitia.agent import AgentProcess, Answer, drive
from justitia.core import Registration
from justitia.predictors import OraclePredictor
from justitia.sim import Simulator
from justitia.workload import Agent, Segment, Stage, Task, WorkloadError, load_workload, save_workload, scale_tokens


def test_a_session_round_trips_and_old_files_read_the_same(tmp_path):
    s = session()
    path = save_workload([s], tmp_path / "w.jsonl")
    assert load_workload(path) == [s]
    line = json.loads(path.read_text())
    assert line["stages"][1] == {"tasks": [s.stages[1][0].to_json()], "pause_s": 2.0}
    assert line["stages"][2]["branches"][0][1]["pause_s"] == 1.0 and "turn" not in line["stages"][2]
    plain = Agent("p", "t", 0.0, ((Task("x", 3, 2),), (Task("y", 4, 1), Task("z", 5, 1))))
    assert json.loads(save_workload([plain], tmp_path / "p.jsonl").read_text())["stages"] == [
        [{"prompt": "x", "prompt_tokens": 3, "output_tokens": 2}],
        [
            {"prompt": "y", "prompt_tokens": 4, "output_tokens": 1},
            {"prompt": "z", "prompt_tokens": 5, "output_tokens": 1},
        ],
    ]
    assert not plain.is_session and s.is_session
    assert len(s.tasks) == 7 and s.task(2, 1).id == "a1" and s.task(2, 2).id == "b0"


def _with_stage(stage_doc):
    doc = session().to_json()
    doc["stages"].append(stage_doc)
    return doc


@pytest.mark.parametrize(
    "stage, message",
    [
        ({"tasks": [], "branches": []}, "'stages[5]' must hold at least one task or one branch"),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1}], "pause_s": -1},
            "'stages[5].pause_s' must be",
        ),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1}], "turn": 0},
            "'stages[5].turn' must be an integer >= 1",
        ),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1}], "wait": 1},
            "unknown field 'stages[5].wait'",
        ),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1, "id": "t0"}]},
            "task id 't0' appears twice",
        ),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1, "context": [{"output_of": "zz"}]}]},
            "names 'zz', no task",
        ),
        (
            {
                "tasks": [{"prompt": "p", "prompt_tokens": 99, "output_tokens": 1, "context": [{"prompt_of": "x0"}]}],
                "branches": [[[{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1, "id": "x0"}]]],
            },
            "names 'x0', a task not finished before it starts",
        ),
        (
            {
                "tasks": [
                    {
                        "prompt": "p",
                        "prompt_tokens": 40,
                        "output_tokens": 1,
                        "context": [{"shared": "system", "tokens": 40}],
                    }
                ]
            },
            "leave none of its 40 prompt tokens",
        ),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1, "context": [{"shared": "s"}]}]},
            "'stages[5].tasks[0].context[0].tokens' must be an integer >= 1",
        ),
        (
            {"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1, "context": [{"nope": "s"}]}]},
            "'stages[5].tasks[0].context[0]' must be one of",
        ),
        (
            {"branches": [[{"tasks": [{"prompt": "p", "prompt_tokens": 9, "output_tokens": 1}], "turn": 3}]]},
            "a branch's stages belong to their stage's turn",
        ),
    ],
)
def test_bad_session_fields_are_named(tmp_path, stage, message):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(_with_stage(stage)) + "\n")
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_workload(path)


def test_scaling_keeps_each_prompt_its_context_plus_its_own_text():
    s = scale_tokens([session()], 3.0)[0]
    by = {t.id: t for t in s.tasks}
    assert by["t0"].prompt_tokens == 13 + 3  # the system prompt 40/3 -> 13, its own text 10/3 -> 3
    for t in s.tasks:
        ctx = sum(
            c.tokens
            if c.kind == "shared"
            else (by[c.ref].prompt_tokens if c.kind == "prompt_of" else by[c.ref].output_tokens)
            for c in t.context
        )
        assert t.prompt_tokens > ctx
    assert by["t3"].prompt_tokens == by["t2"].prompt_tokens + by["t2"].output_tokens + 2  # own 5/3 -> 2
    assert s.stages[1].pause_s == 2.0 and s.stages[2].branches[0][1].pause_s == 1.0 and s.stages[4].turn == 1


def test_the_process_runs_chains_branches_and_pauses_in_order():
    proc = AgentProcess(session(), OraclePredictor())
    calls = proc.start()
    assert [(c.task.id, c.pause_s, c.turn) for c in calls] == [("t0", 0.0, 0)]
    calls = proc.answered(calls[0], Answer("", 50, 10))
    assert [(c.task.id, c.pause_s) for c in calls] == [("t1", 2.0)]
    calls = proc.answered(calls[0], Answer("", 67, 8))
    assert sorted((c.task.id, c.pause_s) for c in calls) == [("a0", 0.5), ("b0", 0.5)]  # the fork's pause
    a0, b0 = sorted(calls, key=lambda c: c.task.id)
    assert proc.answered(b0, Answer("", 44, 5)) == []  # branch b is done; a is not
    [a1] = proc.answered(a0, Answer("", 45, 6))
    assert (a1.task.id, a1.pause_s, a1.stage, a1.index) == ("a1", 1.0, 2, 1)
    [t2] = proc.answered(a1, Answer("", 54, 4))  # the last branch done: the parent's next stage
    assert t2.task.id == "t2" and t2.pause_s == 0.0
    [t3] = proc.answered(t2, Answer("", 88, 9))
    assert (t3.pause_s, t3.turn) == (5.0, 1)
    assert proc.answered(t3, Answer("", 100, 6)) == [] and proc.done
    with pytest.raises(RuntimeError, match="not expected"):
        proc.answered(t3, Answer("", 100, 6))


def test_runs_name_the_text_prompts_share():
    proc = AgentProcess(session(), OraclePredictor())
    [t0] = proc.start()
    [t1] = proc.answered(t0, Answer("", 50, 10))
    r0, r1 = proc.runs(t0), proc.runs(t1)
    assert sum(n for _, n in r0) == 50 + 10 and sum(n for _, n in r1) == 67 + 8
    assert r0[0] == (("shared", "system"), 40)
    assert r1[:3] == r0  # the conversation so far: t0's prompt and output, then t1's own text
    other = AgentProcess(session("other"), OraclePredictor())
    o0 = other.start()[0]
    assert other.runs(o0)[0] == r0[0] and other.runs(o0)[1] != r0[1]  # the system prompt, not the user's text


def test_drive_waits_each_pause_and_times_turns():
    proc = AgentProcess(session(), OraclePredictor())
    sent = []

    async def serve(call):
        sent.append((call.task.id, asyncio.get_running_loop().time()))
        await asyncio.sleep(0.01)
        return Answer("", call.task.prompt_tokens, call.task.output_tokens)

    async def main():
        return await drive(proc, serve)

    scale = 0.02  # the session's pauses, shrunk to keep the test short
    s = session()
    fast = Agent(
        s.agent_id,
        s.type,
        0.0,
        tuple(
            Stage(
                st, st.pause_s * scale, [tuple(Stage(b, b.pause_s * scale) for b in ch) for ch in st.branches], st.turn
            )
            for st in s.stages
        ),
    )
    proc = AgentProcess(fast, OraclePredictor())
    asyncio.run(main())
    at = dict(sent)
    assert proc.done and at["t1"] - at["t0"] >= 2.0 * scale + 0.01 - 1e-3
    assert at["a1"] - at["a0"] >= 1.0 * scale + 0.01 - 1e-3 and at["t2"] >= at["a1"] + 0.01 - 1e-3
    assert len(proc.turns()) == 2 and all(t > 0 for t in proc.turns())


def test_the_simulator_holds_a_paused_session_out_of_the_engine_and_times_its_turns():
    s = session()
    result = Simulator(engine(), "fcfs", OraclePredictor()).run([s])
    [r] = result.agents
    # every call: prefill 1 step, then one step per output token (10 ms each); pauses on top
    steps = {t.id: t.output_tokens for t in s.tasks}
    turn0 = (
        steps["t0"]
        + 2.0 / 0.01
        + steps["t1"]
        + 0.5 / 0.01
        + max(steps["a0"] + 1.0 / 0.01 + steps["a1"], steps["b0"])
        + steps["t2"]
    ) * 0.01
    assert r.turns_s == pytest.approx([turn0, steps["t3"] * 0.01], abs=0.011)
    assert r.jct_s == pytest.approx(turn0 + 5.0 + steps["t3"] * 0.01, abs=0.011)
    assert result.prefix_cache is None  # the cache is off unless the engine's config turns it on
    plain = Simulator(engine(), "fcfs", OraclePredictor()).run([Agent("p", "t", 0.0, ((Task("x", 30, 3),),))])
    assert plain.agents[0].turns_s is None and "turns_s" not in plain.agents[0].to_json()


# ------------------------------------------------------------------ sessions in the core's clock
def _core(name: str, capacity: float = 100.0):
    from justitia.core import AgentScheduler, make_policy

    return AgentScheduler(make_policy(name, capacity))


def _burst(core, agent_id, cost, now, n=1):
    for k in range(n):
        core.request_arrived(f"{agent_id}/{now}/{k}", agent_id, 1, cost / n, now)


def test_a_session_back_before_gps_finished_its_work_queues_behind_it():
    core = _core("justitia")
    core.agent_arrived(Registration("s", "coding", 300.0), 0.0)  # f = 300; alone, V runs at 100/s
    _burst(core, "s", 300.0, 0.0)
    core.agent_arrived(Registration("x", "t", 1000.0), 0.0)  # two flows: V runs at 50/s
    [req] = [core.peek()]
    core.dequeue(req)
    core.request_finished(req)  # the engine ran the burst ahead of GPS
    core.agent_finished("s", 1.0, pause=True)  # V(1) = 50 < 300: GPS still serves its burst
    core.agent_arrived(Registration("s", "coding", 200.0), 2.0)  # back at V(2) = 100
    assert core.agent("s").virtual_finish == pytest.approx(300.0 + 200.0)  # behind its earlier work, not 100 + 200
    late = _core("justitia")
    late.agent_arrived(Registration("s", "coding", 100.0), 0.0)
    _burst(late, "s", 100.0, 0.0)
    r = late.peek()
    late.dequeue(r)
    late.request_finished(r)
    late.agent_finished("s", 0.5, pause=True)
    late.agent_arrived(
        Registration("s", "coding", 50.0), 5.0
    )  # GPS finished it at t=1 and V stood still since: V = 100
    assert late.agent("s").virtual_finish == pytest.approx(100.0 + 50.0)


def test_a_pause_settles_the_burst_at_what_it_asked_for():
    core = _core("justitia")
    core.agent_arrived(Registration("s", "coding", 1000.0), 0.0)  # predicted 1000, asks for 100
    _burst(core, "s", 100.0, 0.0)
    r = core.peek()
    core.dequeue(r)
    core.request_finished(r)
    core.agent_finished("s", 0.1, pause=True)
    core.agent_arrived(Registration("s", "coding", 50.0), 0.2)  # V(0.2) = 20: its settled f is 100, not 1000
    assert core.agent("s").virtual_finish == pytest.approx(150.0)


def test_las_counts_a_sessions_service_across_its_pauses():
    core = _core("las")
    for a in ("s", "new"):
        core.agent_arrived(Registration(a, "t", 1.0), 0.0)
    _burst(core, "s", 1.0, 0.0)
    r = core.peek()
    core.dequeue(r)
    from justitia.core import Charge

    core.charge(r, Charge(0, 10, 500))
    core.request_finished(r)
    core.agent_finished("s", 1.0, pause=True)
    core.agent_arrived(Registration("s", "t", 1.0), 2.0)
    _burst(core, "s", 1.0, 2.0)
    _burst(core, "new", 1.0, 2.0)
    assert core.peek().agent_id == "new"  # "s" keeps the service it had before its pause


def test_only_a_session_with_nothing_open_pauses():
    core = _core("justitia")
    core.agent_arrived(Registration("s", "t", 10.0), 0.0)
    _burst(core, "s", 10.0, 0.0)
    with pytest.raises(ValueError, match="cannot pause"):
        core.agent_finished("s", 0.1, pause=True)
    with pytest.raises(ValueError, match="cannot pause"):
        core.agent_finished("nobody", 0.1, pause=True)


def test_the_gps_reference_serves_a_sessions_bursts_as_one_flow():
    from justitia.lab.metrics import gps_finish_times

    s = Agent("s", "t", 0.0, ((Task("x", 10, 10),), Stage([Task("y", 10, 10)], pause_s=1.0)))
    x = Agent("x", "t", 0.0, ((Task("x", 100, 100),),))
    cost = Task("x", 10, 10)
    from justitia.core import KV

    c = KV.request_cost(cost.prompt_tokens, cost.output_tokens)  # 150
    big = x.cost(KV)
    # s sends its first burst at 0 and its second at 10 s; at M = 100/s, x's work takes long
    gps = gps_finish_times([s, x], 100.0, bursts={"s": [[0.0, c], [10.0, c]]})
    # [0, 3 s]: two flows share 100/s until s's first burst (150) is done; x is still busy at 10 s,
    # so s's second burst is again served at 50/s: it finishes 3 s after it came
    assert gps["s"] == pytest.approx(13.0)
    assert gps["x"] == pytest.approx((big + 2 * c) / 100.0)


# ------------------------------------------------------------------ a session's turns, priced and predicted
def test_a_turn_is_priced_whole_and_a_tool_pause_inside_it_keeps_the_session_in_the_engine():
    s = session()
    oracle = OraclePredictor()
    from justitia.core import KV

    turn0 = sum(KV.request_cost(t.prompt_tokens, t.output_tokens) for t in s.tasks if t.id != "t3")
    assert [c for c in s.turn_calls(0)] == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0)] and s.turn_calls(1) == [
        (4, 0)
    ]
    proc = AgentProcess(s, oracle)
    [t0] = proc.start()
    assert proc.opens_burst([t0]) and proc.burst_cost([t0]) == pytest.approx(turn0)
    proc.sent([t0], 0.0)
    [t1] = proc.answered(t0, Answer("", 50, 10), 0.1)
    assert not proc.paused  # a tool pause inside the turn: the session keeps its place
    by_pause = AgentProcess(s, oracle, burst="pause")
    [p0] = by_pause.start()
    by_pause.sent([p0], 0.0)
    by_pause.answered(p0, Answer("", 50, 10), 0.1)
    assert by_pause.paused  # priced by pause, the same pause ends its burst
    proc.sent([t1], 2.1)
    calls = proc.answered(t1, Answer("", 67, 8), 2.2)
    while calls:
        proc.sent(calls, 3.0)
        calls = [
            n for c in calls for n in proc.answered(c, Answer("", c.task.prompt_tokens, c.task.output_tokens), 4.0)
        ]
        if proc.paused:
            break
    assert proc.paused and calls and calls[0].turn == 1  # between turns: it leaves the engine
    assert proc.turn_predicted == {0: pytest.approx(turn0)} and proc.turn_true[0] == pytest.approx(turn0)


def test_the_session_predictor_learns_turns_online():
    from justitia.core import KV
    from justitia.predictors import make_predictor

    p = make_predictor("session")
    a = session()
    first_guess = p.turn_cost(a, 0, [], KV)
    assert first_guess == pytest.approx(p.request_cost(a, 0, 0, KV))  # nothing learned: its first call
    p.observe_turn("coding", 0, first_guess, 4000.0)
    p.observe_turn("coding", 0, first_guess, 16000.0)
    assert p.turn_cost(a, 0, [], KV) == pytest.approx(8000.0)  # the typical first turn: a geometric mean
    p.observe_turn("coding", 1, 1.0, 2000.0, earlier=1000.0)
    assert p.turn_cost(a, 3, [100.0, 400.0], KV) == pytest.approx(200.0 * 2.0)  # its own turns, grown
    p.observe_call("coding", 10, 64)
    assert p.request_cost(a, 0, 0, KV) == pytest.approx(KV.request_cost(50, 64))  # the prompt known, the output learnt


def test_turn_prediction_errors_are_reported_turn_by_turn():
    from justitia.agent import AgentResult
    from justitia.lab.metrics import turn_prediction

    r = AgentResult("s", "coding", 0.0, 1.0, 1.0, 1.0, 1.0, [1.0, 1.0], [[0.0, 1.0]], [[100.0, 100.0], [100.0, 800.0]])
    doc = turn_prediction([r])
    assert doc["0"] == {"turns": 1, "within_2x": 1.0, "median_abs_log2_error": 0.0}
    assert doc["1"]["median_abs_log2_error"] == pytest.approx(3.0) and doc["all"]["within_2x"] == 0.5


def test_a_sessions_bench_reports_turns_the_cache_and_the_bound(tmp_path):
    from justitia.lab.bench import run_bench
    from justitia.lab.presets import SIM_DEFAULT_PROFILE
    from justitia.lab.studies.sessions import sessions_specs, sessions_summary
    from justitia.sim import EngineConfig
    from justitia.sim.config import load_profile
    from justitia.workload import generate_sessions

    agents = generate_sessions(12, 5, rate_per_s=0.5)
    config = EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE), kv_blocks=800, prefix_caching=True)
    specs = sessions_specs()[:1] + [
        s for s in sessions_specs(choices=True) if s.label in ("justitia", "justitia@session-predictor")
    ]
    doc = run_bench(agents, specs, config, {"kind": "sessions"}, progress=False)
    j = doc["policies"]["justitia"]
    assert j["turns"] >= len(agents) and j["p90_turn_s"] >= j["p50_turn_s"] > 0
    assert 0 < j["prefix_cache"]["hit_rate"] < 1 and j["prefix_cache"]["hit_tokens"] > 0
    assert j["bound_violations"] == 0 and all("bursts" in a and "turns_s" in a for a in j["agents"])
    assert set(doc["policies"]["justitia@session-predictor"]["turn_prediction"]) >= {"0", "all"}
    lines = sessions_summary(doc)
    assert any(line.startswith("justitia's mean turn time against fcfs") for line in lines)
    from justitia.lab.plots import plot_results

    assert "turn_cdf.png" in [p.name for p in plot_results(doc, tmp_path)]


@pytest.mark.parametrize("policy", ["las", "justitia", "justitia-eligible"])
@pytest.mark.parametrize("burst", ["turn", "pause"])
def test_both_stepping_modes_agree_on_sessions_with_the_cache_on(policy, burst):
    from justitia.lab.presets import SIM_DEFAULT_PROFILE
    from justitia.sim import EngineConfig
    from justitia.sim.config import load_profile
    from justitia.workload import generate_sessions

    agents = generate_sessions(16, 7, rate_per_s=1.0)
    cfg = EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE), kv_blocks=900, prefix_caching=True)
    runs = [
        Simulator(cfg, policy, OraclePredictor(), event_skipping=skip, measure_capacity=True, burst=burst).run(agents)
        for skip in (True, False)
    ]
    a, b = ([(r.agent_id, r.finish_s, r.turns_s) for r in run.agents] for run in runs)
    assert a == b and runs[0].prefix_cache == runs[1].prefix_cache and runs[0].prefix_cache["hit_tokens"] > 0
    if policy != "justitia-eligible":  # a timed policy always steps one iteration at a time
        assert runs[0].steps < runs[1].steps  # the skipping stepper did skip


def test_a_session_burst_that_reveals_more_moves_back_from_its_start():
    core = _core("justitia")
    core.agent_arrived(Registration("x", "t", 10_000.0), 0.0)
    core.agent_arrived(Registration("s", "coding", 100.0, session=True), 0.0)  # f = 100, predicted small
    plain = _core("justitia")
    plain.agent_arrived(Registration("x", "t", 10_000.0), 0.0)
    plain.agent_arrived(Registration("s", "coding", 100.0), 0.0)
    for c in (core, plain):
        _burst(c, "s", 100.0, 0.0)
        r = c.peek()
        c.dequeue(r)
        c.request_finished(r)
        _burst(c, "s", 500.0, 1.0)  # V(1) = 50: revealed 600 in all, 500 of it not done
    assert plain.agent("s").virtual_finish == pytest.approx(50.0 + 500.0)  # V(now) + remaining
    assert core.agent("s").virtual_finish == pytest.approx(0.0 + 600.0)  # S + revealed: where GPS would finish it


def test_a_cluster_runs_sessions_with_a_clock_per_engine_and_says_why_not_with_one_in_front():
    from justitia.sim import Cluster

    agents = [session("a"), session("b", 0.5)]
    with pytest.raises(ValueError, match="clock per engine"):
        Cluster(engine(), "justitia", OraclePredictor(), replicas=2, clock="global").run(agents)
    result = Cluster(engine(), "justitia", OraclePredictor(), replicas=2, clock="replica").run(agents)
    assert [len(r.turns_s) for r in result.agents] == [2, 2]


def test_subagents_as_flows_of_their_own_are_priced_apart_and_retired_when_their_chain_ends():
    proc = AgentProcess(session(), OraclePredictor(), subagents="flows")
    [t0] = proc.start()
    turn0 = proc.burst_cost([t0])
    [t1] = proc.answered(t0, Answer("", 50, 10))
    calls = proc.answered(t1, Answer("", 67, 8))
    assert sorted(c.flow for c in calls) == ["s/2.0", "s/2.1"] and t1.flow is None
    from justitia.core import KV

    a0, b0 = sorted(calls, key=lambda c: c.task.id)
    assert proc.flow_cost(a0) == pytest.approx(KV.request_cost(45, 6) + KV.request_cost(54, 4))  # its chain's two calls
    proc.answered(b0, Answer("", 44, 5))
    assert proc.ended_flows == ["s/2.1"]
    shared = AgentProcess(session(), OraclePredictor())
    assert shared.burst_cost(shared.start()) - turn0 == pytest.approx(
        KV.request_cost(45, 6) + KV.request_cost(54, 4) + KV.request_cost(44, 5)
    )  # shared: the turn pays for them
    result = Simulator(engine(), "justitia", OraclePredictor(), subagents="flows").run([session(), session("t", 0.2)])
    assert [len(r.turns_s) for r in result.agents] == [2, 2]


def test_a_turn_sent_with_no_pause_before_it_is_still_priced_as_a_turn_of_its_own():
    from justitia.core import KV

    first, second = (
        Task("a", 40, 5, "a"),
        Task("b", 40 + 5 + 3, 4, "b", (Segment.prompt_of("a"), Segment.output_of("a"))),
    )
    s = Agent("s", "coding", 0.0, (Stage([first], turn=0), Stage([second], turn=1)))
    from justitia.core.policies import make_policy

    policy = make_policy("justitia", engine().capacity_per_s("kv"))
    returned = []
    policy.agent_returned = lambda agent, now_s: returned.append(agent.predicted_cost)
    result = Simulator(engine(), policy, OraclePredictor()).run([s])
    assert returned == [pytest.approx(KV.request_cost(48, 4))]  # the engine saw turn 1 arrive at its own price
    [r] = result.agents
    assert len(r.turns_s) == 2
    assert r.turn_costs == [[pytest.approx(KV.request_cost(40, 5))] * 2, [pytest.approx(KV.request_cost(48, 4))] * 2]


# ------------------------------------------------------------------ a cost that sees the prefix cache
def test_kv_prefix_holds_a_prefix_requests_sent_together_share_once():
    from justitia.core import KV, KV_PREFIX, kv_token_iters

    system, a, b = (("shared", "sys"), 100), (("a", "in"), 20), (("b", "in"), 30)
    holders = [((system, a), 10), ((system, b), 4)]
    assert KV.group_cost(holders) == kv_token_iters(120, 10) + kv_token_iters(130, 4)
    # the longest holder (10 outputs) pays for the 100 shared tokens; the other only for its own 30
    assert KV_PREFIX.group_cost(holders) == kv_token_iters(120, 10) + 30 * 4 + 4 * 4 / 2
    assert KV_PREFIX.group_cost([((system, a), 10)]) == KV.request_cost(120, 10)  # alone: as KV


def test_the_oracle_prices_a_turn_in_the_groups_it_is_sent_in():
    from justitia.core import KV, KV_PREFIX

    s = session()
    # a0 and b0 (the fork's branches' first calls) go together; a1 waits its pause; t3 is turn 1
    assert s.turn_groups(0) == [[(0, 0)], [(1, 0)], [(2, 0), (2, 2)], [(2, 1)], [(3, 0)]]
    assert s.turn_groups(1) == [[(4, 0)]]
    o = OraclePredictor()
    blind, aware = o.turn_cost(s, 0, [], KV), o.turn_cost(s, 0, [], KV_PREFIX)
    assert blind == pytest.approx(
        sum(KV.request_cost(t.prompt_tokens, t.output_tokens) for t in s.tasks if t.id != "t3")
    )
    # a0 and b0 start together on the same 40-token system prompt: b0 (5 outputs) rides on a0's (6)
    assert blind - aware == pytest.approx(40 * 5)


def test_kv_prefix_is_kv_to_the_bit_where_nothing_is_shared():
    import numpy as np
    from helpers import random_agents

    agents = random_agents(np.random.default_rng(3), 40)
    runs = [
        Simulator(engine(), "justitia", OraclePredictor(), cost, measure_capacity=True).run(agents)
        for cost in ("kv", "kv-prefix")
    ]
    assert [(a.agent_id, a.finish_s, a.predicted_cost) for a in runs[0].agents] == [
        (a.agent_id, a.finish_s, a.predicted_cost) for a in runs[1].agents
    ]


def test_a_preset_that_turns_the_cache_on_keeps_it_on_without_the_flag():
    import argparse

    from justitia.cli.bench import _sim_config

    args = argparse.Namespace(
        latency=None, kv_blocks=None, max_num_batched_tokens=None, max_num_seqs=None, prefix_caching=False
    )
    assert _sim_config(args, {"prefix_caching": True}).prefix_caching
    assert not _sim_config(args, {}).prefix_caching
    assert _sim_config(argparse.Namespace(**{**vars(args), "prefix_caching": True}), {}).prefix_caching


def test_priced_by_pause_a_stage_sent_at_once_stays_in_its_burst():
    s = Agent(
        "s",
        "coding",
        0.0,
        (Stage([Task("a", 10, 2)]), Stage([Task("b", 10, 2)]), Stage([Task("c", 10, 2)], pause_s=1.0)),
    )
    proc = AgentProcess(s, OraclePredictor(), burst="pause")
    [a] = proc.start()
    assert proc.opens_burst([a])
    proc.sent([a], 0.0)
    [b] = proc.answered(a, Answer("", 10, 2), 0.1)
    assert not proc.opens_burst([b])  # no pause between: the same burst
    proc.sent([b], 0.1)
    [c] = proc.answered(b, Answer("", 10, 2), 0.2)
    assert proc.paused and proc.opens_burst([c])


def test_a_session_call_s_prompt_is_its_context_as_text_then_its_own():
    from justitia.workload import shared_text

    proc = AgentProcess(session(), OraclePredictor())
    [t0] = proc.start()
    system = shared_text("system", 40)
    assert t0.prompt == system + "hi" and shared_text("system", 40) == system != shared_text("other", 40)
    [t1] = proc.answered(t0, Answer("the first answer", 50, 10))
    assert t1.prompt == t0.prompt + "the first answer" + "tool said"  # the conversation so far, then the new text
    other = AgentProcess(session("u"), OraclePredictor()).start()[0]
    assert other.prompt.startswith(system)  # another session's prompt begins with the same system text


def test_the_engine_presets_rate_sweep_shows_ordering_pays_only_once_sessions_queue():
    """``lab.studies.sessions_rates``, how the sessions-engine preset's rate was chosen: each policy's mean
    turn time per seed; at a rate the engine keeps up with, Justitia buys nothing over VTC, and at
    the preset's rate, where sessions queue, it does."""
    from justitia.lab.studies.sessions import SESSIONS_ENGINE_RATE_PER_S
    from justitia.lab.studies.sessions_rates import POLICIES, rate_table

    config = tiny_cpu_config()
    light, dense = rate_table(config, [1.0, SESSIONS_ENGINE_RATE_PER_S], seeds=1)
    assert set(light["mean_turn_s"]) == set(POLICIES) and all(len(v) == 1 for v in light["mean_turn_s"].values())
    ratio = {
        row["rate_per_s"]: row["mean_turn_s"]["justitia"][0] / row["mean_turn_s"]["vtc"][0] for row in (light, dense)
    }
    assert ratio[1.0] > 0.9 and ratio[SESSIONS_ENGINE_RATE_PER_S] < 0.7, ratio
    assert dense["mean_turn_s"]["vtc"][0] > 2 * light["mean_turn_s"]["vtc"][0]  # queueing dominates there
