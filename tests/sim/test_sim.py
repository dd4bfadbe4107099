"""The simulator follows vLLM v1's rules, and event skipping changes nothing."""

from dataclasses import replace

import numpy as np
import pytest
from helpers import agent, engine, random_agents
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.core.policies import POLICY_NAMES, make_policy
from justitia.predictors import make_predictor
from justitia.sim import LatencyProfile, Simulator


def run(agents, policy="fcfs", cfg=None, skip=True, predictor="oracle", cost="kv", measure=False):
    cfg = cfg or engine()
    pol = make_policy(policy, cfg.capacity_per_s(cost), cost)
    return Simulator(cfg, pol, make_predictor(predictor, 7), cost, skip, measure_capacity=measure).run(agents)


def finish(result):
    return {a.agent_id: a.finish_s for a in result.agents}


def test_chunked_prefill_takes_one_iteration_per_chunk():
    # 1000 prompt tokens, budget 256: 4 prefill chunks, the last samples token 1, then 9 decodes.
    res = run([agent("a", 0.0, [(1000, 10)])], cfg=engine(blocks=100, budget=256))
    assert res.iterations == 4 + 9
    assert finish(res)["a"] == pytest.approx(0.13)


def test_running_requests_are_served_before_waiting_ones():
    # b's prompt gets only the budget left after a's decode token: chunks of 255, not 256.
    cfg = engine(blocks=200, budget=256)
    res = run([agent("a", 0.0, [(10, 40)]), agent("b", 0.005, [(765, 1)])], cfg=cfg)
    # b arrives during a's first iteration, then needs exactly 3 chunks of 255 beside a's decodes.
    assert finish(res)["b"] == pytest.approx(0.04)


def test_head_of_line_request_that_does_not_fit_blocks_the_queue():
    cfg = engine(blocks=20, budget=512)  # 320 tokens
    agents = [
        agent("x", 0.0, [(200, 50)]),  # holds 13..16 blocks while it decodes
        agent("y", 0.001, [(150, 5)]),  # needs 10 blocks: does not fit beside x
        agent("z", 0.002, [(10, 5)]),  # needs 1 block: would fit, but y is ahead of it
    ]
    f = finish(run(agents, "fcfs", cfg))
    assert f["z"] > f["x"]  # z waited for x to free memory even though it fit
    assert f["y"] < f["z"] or f["y"] == pytest.approx(f["z"])


def test_decode_growth_preempts_lowest_priority_by_recompute():
    cfg = engine(blocks=10, budget=512)  # 160 tokens; two requests grow to 140 tokens each
    agents = [agent("a", 0.0, [(40, 100)]), agent("b", 0.0, [(40, 100)])]
    res = run(agents, "fcfs", cfg)
    f = finish(res)
    assert res.preemptions >= 1
    assert f["a"] < f["b"]  # b arrived later, so it is the victim and recomputes
    # b was preempted near iteration 40 holding ~40 output tokens. It keeps them: once a is done it
    # recomputes prompt + output in one chunk and decodes the ~60 left, rather than all 100 again.
    assert res.preemptions == 1
    assert 0.5 < f["b"] - f["a"] < 0.7


def test_max_num_seqs_caps_the_running_batch():
    agents = [agent(n, 0.0, [(16, 20)]) for n in "abc"]
    f = finish(run(agents, "fcfs", engine(blocks=100, seqs=2)))
    assert f["a"] == pytest.approx(0.2) and f["b"] == pytest.approx(0.2)
    assert f["c"] == pytest.approx(0.4)


def test_stages_run_one_after_another():
    # Two parallel tasks of 10 iterations, then one of 20, then one of 5.
    f = finish(run([agent("a", 0.0, [(16, 10), (16, 10)], [(32, 20)], [(8, 5)])], "fcfs", engine(blocks=100)))
    assert f["a"] == pytest.approx(0.35)


def test_a_stage_sent_on_an_answer_misses_the_step_the_engine_schedules_then():
    """vLLM's engine loop schedules its next step as soon as it has handed out the last one's
    outputs, before any client can answer them. With 10 ms steps, an agent's stage of two tokens
    ends at 20 ms; its next stage, sent then, misses the step that starts at 20 ms when another
    agent keeps the engine busy (it runs 30-50 ms), and misses nothing on an idle engine (20-40
    ms). A front end of one picosecond changes no step."""
    chain = agent("b", 0.0, [(10, 2)], [(10, 2)])
    busy = agent("x", 0.0, [(10, 20)])
    assert finish(run([chain, busy]))["b"] == pytest.approx(0.050)
    assert finish(run([chain]))["b"] == pytest.approx(0.040)
    blink = engine(profile=replace(engine().profile, request_latency_ms=1e-9))  # 1 ps
    for agents in ([chain, busy], [chain]):
        plain, fronted = finish(run(agents)), finish(run(agents, cfg=blink))
        assert plain == pytest.approx(fronted, abs=1e-9)


def test_justitia_keeps_an_agents_place_across_its_hand_off(monkeypatch):
    """Two requests run at a time (10 ms steps). "b", a chain of two calls and first in tag order,
    ends its first call at 20 ms; its second misses the step scheduled then. Left free, that step
    admits "w", which waited behind b, and b's second call waits for w's ten tokens (b ends at
    140 ms). b keeps its place for that step instead (AgentScheduler.advance): its second call
    runs 30-50 ms, and w starts after it."""
    from justitia.core.policies.justitia import Justitia

    chain = agent("b", 0.0, [(10, 2)], [(10, 2)])
    busy = agent("x", 0.0, [(10, 20)])
    waiter = agent("w", 0.005, [(10, 10)])
    cfg = engine(seqs=2)
    f = finish(run([chain, busy, waiter], "justitia", cfg))
    assert f["b"] == pytest.approx(0.050) and f["w"] == pytest.approx(0.150)
    monkeypatch.setattr(Justitia, "holds_place", False)  # the mechanism off: w takes b's place
    f = finish(run([chain, busy, waiter], "justitia", cfg))
    assert f["b"] == pytest.approx(0.140) and f["w"] == pytest.approx(0.120)


def test_a_bench_run_without_the_hold_is_the_mechanism_off():
    """``RunSpec(hold=False)`` (tau2's ``no-hold`` row) runs the same engine with no agent keeping its
    place, and says so in its results."""
    from justitia.lab.bench import RunSpec, simulate

    agents = [agent("b", 0.0, [(10, 2)], [(10, 2)]), agent("x", 0.0, [(10, 20)]), agent("w", 0.005, [(10, 10)])]
    cfg = engine(seqs=2)
    held, free = RunSpec("j", "justitia"), RunSpec("j/no-hold", "justitia", hold=False)
    ends = {s.label: {a.agent_id: a.finish_s for a in simulate(agents, s, cfg, 0).agents} for s in (held, free)}
    assert ends["j"]["b"] == pytest.approx(0.050) and ends["j/no-hold"]["b"] == pytest.approx(0.140)
    assert "hold" not in held.to_json() and free.to_json()["hold"] is False


def test_task_that_cannot_fit_the_cache_is_refused():
    with pytest.raises(ValueError, match="can never fit"):
        run([agent("a", 0.0, [(2000, 10)])], cfg=engine(blocks=64))


LINEAR = LatencyProfile("lin", 1.0, 0.5, 0.01, 0.001, 1.3, 64, "tests: load-dependent latency")


def test_the_front_end_and_each_arrival_add_to_an_agents_time_as_the_profile_says():
    """One request alone (3 output tokens, 10 ms steps): it waits for the front end (1 ms), the
    request latency (20 ms); its first step pays for its arrival (2 ms, scaled 1.0); its agent
    learns of its end 5 ms after the last step. A second request in the stage waits for the first
    to leave the front end, and joins the engine's next step."""
    profile = LatencyProfile(
        "c",
        0.0,
        10.0,
        0.0,
        0.0,
        1.0,
        64,
        "test",
        request_latency_ms=20.0,
        answer_latency_ms=5.0,
        frontend_ms_per_request=1.0,
        per_arrival_ms=2.0,
    )
    one = run([agent("a", 0.0, [(10, 3)])], "fcfs", engine(profile=profile))
    assert one.agents[0].jct_s == pytest.approx(0.001 + 0.020 + 0.032 + 0.005)
    plain = run(
        [agent("a", 0.0, [(10, 3)])],
        "fcfs",
        engine(
            profile=replace(
                profile, request_latency_ms=0.0, answer_latency_ms=0.0, frontend_ms_per_request=0.0, per_arrival_ms=0.0
            )
        ),
    )
    assert plain.agents[0].jct_s == pytest.approx(0.030)
    two = run([agent("a", 0.0, [(10, 3), (10, 3)])], "fcfs", engine(profile=profile))
    # the second reaches the engine at 22 ms, during the first's first step (21-33 ms): it joins at 33 ms,
    # paying its arrival then, and its three steps end at 33 + 12 + 10 + 10 ms
    assert two.agents[0].jct_s == pytest.approx(0.065 + 0.005)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(POLICY_NAMES),
    blocks=st.integers(40, 160),
    budget=st.sampled_from([64, 256, 1024]),
    seqs=st.sampled_from([4, 16, 256]),
    measure=st.booleans(),
    slowdown=st.one_of(st.none(), st.tuples(st.floats(0.0, 2.0), st.floats(0.1, 3.0), st.integers(2, 3))),
    weighted=st.booleans(),
    frontend=st.sampled_from([(0.0, 0.0, 0.0), (7.5, 1.5, 0.4), (0.0, 3.0, 2.0)]),
    per_request=st.sampled_from([(0.0, 0.0), (0.12, 0.25)]),
)
def test_event_skipping_matches_per_iteration_stepping(
    seed, policy, blocks, budget, seqs, measure, slowdown, weighted, frontend, per_request
):
    rng = np.random.default_rng(seed)
    agents = random_agents(rng, 24, max_prompt=400, max_output=200, mean_gap_s=0.2)
    if weighted:  # tenants' weights: weighted VTC keeps exact fractions, so charging groups do not matter
        agents = [replace(a, weight=float(rng.choice([0.5, 1.0, 2.0, 3.0]))) for a in agents]
    profile = replace(
        LINEAR,
        request_latency_ms=frontend[0],
        answer_latency_ms=frontend[1],
        frontend_ms_per_request=frontend[2],
        per_request_ms=per_request[0],
        per_arrival_ms=per_request[1],
    )
    cfg = engine(blocks=max(blocks, 38), budget=budget, seqs=seqs, profile=profile)
    if slowdown is not None:  # the engine runs some times slower for a while
        cfg = replace(cfg, slowdown=(slowdown[0], slowdown[0] + slowdown[1], slowdown[2]))
    fast = run(agents, policy, cfg, skip=True, predictor="noisy:2", measure=measure)
    slow = run(agents, policy, cfg, skip=False, predictor="noisy:2", measure=measure)
    assert finish(fast) == finish(slow)  # exactly: latencies are integer picoseconds
    assert (fast.iterations, fast.preemptions) == (slow.iterations, slow.preemptions)
    assert fast.capacity_schedule == slow.capacity_schedule  # the meter sees the same service at every arrival
    assert fast.steps <= slow.steps


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["vtc", "las", "srjf"]),
    blocks=st.integers(38, 90),
    weighted=st.booleans(),
)
def test_lazy_charging_at_the_front_matches_per_iteration_stepping_under_deep_backlog(seed, policy, blocks, weighted):
    """Under keys that rise (vtc, las), event skipping charges decode service only to the agents at
    the front of the queue and looks ahead only at the decoding agents before the first one that
    is not: with most agents waiting, what it admits, and when, must be what plain stepping does."""
    rng = np.random.default_rng(seed)
    agents = random_agents(rng, 70, max_prompt=300, max_output=150, mean_gap_s=0.01)
    if weighted:
        agents = [replace(a, weight=float(rng.choice([0.5, 1.0, 3.0]))) for a in agents]
    cfg = engine(blocks=blocks, budget=512, seqs=32, profile=LINEAR)
    fast, slow = run(agents, policy, cfg, skip=True), run(agents, policy, cfg, skip=False)
    assert finish(fast) == finish(slow)
    assert (fast.iterations, fast.preemptions) == (slow.iterations, slow.preemptions)


def test_a_policy_whose_keys_move_with_time_is_stepped_every_iteration():
    agents = random_agents(np.random.default_rng(5), 24, max_prompt=400, max_output=200, mean_gap_s=0.2)
    asked_to_skip = run(agents, "justitia-eligible", engine(blocks=60), skip=True)
    plain = run(agents, "justitia-eligible", engine(blocks=60), skip=False)
    assert asked_to_skip.steps == plain.steps >= plain.iterations  # no step skipped: eligibility moves with V
    assert finish(asked_to_skip) == finish(plain)
    assert finish(plain) != finish(run(agents, "justitia", engine(blocks=60), skip=False))


def test_a_slower_engine_takes_longer_in_exactly_its_window():
    agents = [agent("a", 0.0, [(16, 100)])]  # 100 iterations of 10 ms
    f = finish(run(agents, cfg=replace(engine(), slowdown=(0.5, 0.7, 3))))
    # steps start at 0.50, 0.53, ..., 0.68 in the window: those 7 take 30 ms instead of 10
    assert f["a"] == pytest.approx(1.0 + 7 * 0.02)


def test_same_seed_same_results_and_skipping_saves_steps():
    agents = random_agents(np.random.default_rng(3), 30, max_output=400)
    a = run(agents, "justitia", engine(blocks=120), predictor="noisy:3")
    b = run(agents, "justitia", engine(blocks=120), predictor="noisy:3")
    assert [r.to_json() for r in a.agents] == [r.to_json() for r in b.agents]
    assert a.steps * 3 < a.iterations
