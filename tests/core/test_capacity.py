"""The clock's M measured from what the engine delivers: the meter, the clock's changing rate, and
the delay bound when the engine slows down two-fold for part of a run."""

from dataclasses import replace

import numpy as np
import pytest
from helpers import agent, engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.core import KV, AgentScheduler, CapacityMeter, Charge, Registration, RequestMeta, VirtualClock
from justitia.core.policies import make_policy
from justitia.lab.live.calibrate import calibrated_capacity
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.predictors import make_predictor
from justitia.sim import Simulator
from justitia.sim.config import PROFILES


def test_the_clock_moves_at_the_new_rate_from_the_moment_it_changes():
    clock = VirtualClock(100.0)
    assert clock.arrive("A", 100.0, 0.0) == 100.0
    clock.set_capacity(50.0, 0.5)  # V(0.5) = 50 at the old rate, then 50 a second
    assert clock.virtual_time(1.0) == pytest.approx(75.0)
    assert clock.drain()["A"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="positive"):
        clock.set_capacity(0.0, 2.0)


def test_the_first_window_replaces_the_starting_m_and_later_ones_move_it_within_a_band_around_the_record():
    meter = CapacityMeter(1000.0, KV, window_s=2.0)
    meter.observe(1.5, Charge(kv_token_iters=600))
    assert meter.update(1.5) is None  # not a full window yet
    meter.observe(0.5, Charge(prefill_tokens=80, kv_token_iters=200))  # 800 in 2 s: 400 a second
    assert meter.update(2.0) == pytest.approx(400.0)  # the first window: all the way, the guess has no say
    meter.observe(2.0, Charge(kv_token_iters=1200))  # 600 a second
    assert meter.update(3.0) == pytest.approx(500.0)  # later windows: half way
    assert meter.measured_per_s == pytest.approx(2000 / 4)
    for t in range(4, 30):
        meter.observe(2.0, Charge())  # nothing delivered: M falls, but never below a quarter of the record
        meter.update(float(t))
    assert meter.capacity_per_s == pytest.approx(0.25 * meter.measured_per_s)
    meter.observe(2.0, Charge(kv_token_iters=100_000))
    assert meter.update(30.0) == pytest.approx(2 * meter.measured_per_s)  # the ceiling: twice the record
    assert meter.schedule[:3] == [(0.0, 1000.0), (2.0, pytest.approx(400.0)), (3.0, pytest.approx(500.0))]
    steady = CapacityMeter(1000.0, KV, window_s=2.0)
    steady.observe(2.0, Charge(kv_token_iters=800))
    assert steady.update(1.0) == pytest.approx(400.0)
    steady.observe(2.0, Charge(kv_token_iters=800))
    assert steady.update(2.0) is None  # unchanged: nothing to tell the clock


@pytest.mark.parametrize("guess", [1.0, 400.0, 1e9])
def test_whatever_the_guess_the_measured_m_is_the_same(guess):
    meter = CapacityMeter(guess, KV, window_s=1.0)
    meter.observe(1.0, Charge(prefill_tokens=50))  # only partial prefills: no service, nothing to go on
    assert meter.update(1.0) is None and meter.capacity_per_s == guess
    for t, kv in enumerate((300, 500, 400), start=2):
        meter.observe(1.0, Charge(kv_token_iters=kv))
        meter.update(float(t))
    assert [m for _, m in meter.schedule[1:]] == pytest.approx([300.0, 400.0])  # the third window: no change


def test_an_interval_far_longer_than_the_measured_steps_is_an_idle_gap_and_is_not_counted():
    meter = CapacityMeter(1000.0, KV, window_s=10.0)
    for _ in range(40):  # 40 steps of 20 ms, 10 KV token-iterations each
        assert meter.observe(0.02, Charge(kv_token_iters=10), steps=1)
    assert not meter.observe(5.0, Charge(kv_token_iters=10), steps=1)  # a step before 5 s of idling
    assert meter.dropped_s == 5.0 and meter.busy_s == pytest.approx(0.8)
    assert meter.observe(0.5, Charge(kv_token_iters=250), steps=25)  # a span of 25 steps: counted
    assert meter.observe(0.9, Charge(kv_token_iters=10), steps=1)  # a long step (45 mean steps): counted
    assert meter.observe(60.0, Charge(kv_token_iters=10))  # a caller that counts no steps: no judgement


def test_a_tagging_front_end_measures_m_from_its_requests_round_trips():
    from justitia.backends.tagging import Tagger

    book = Tagger("justitia", 10_000.0, measure_every_s=1.0, kv_tokens=150)
    book.tag("r1", RequestMeta("a"), 60, 40, now_s=0.0)  # demand 100: fits the cache, not busy yet
    book.tag("r2", RequestMeta("b"), 60, 40, now_s=1.0)  # demand 200 > 150: some request must wait
    book.finish("r1", 2.0, 40)  # 60*40 + 40*40/2 = 3200 served in 1 busy second
    book.finish("r2", 2.5, 40)  # demand 100: the half second after r1 was not busy
    assert book.book.clock().capacity_per_s == 10_000.0  # M moves only at an agent's arrival
    book.tag("r3", RequestMeta("c"), 60, 40, now_s=3.0)
    assert book.book.clock().capacity_per_s == pytest.approx(3200)  # the first window replaces the starting M
    assert book.book.clock().schedule == [(0.0, 10_000.0), (3.0, pytest.approx(3200.0))]
    idle = Tagger("justitia", 10_000.0, measure_every_s=1.0, kv_tokens=10_000)
    for k in range(5):  # never more asked than the cache holds: nothing to measure
        idle.tag(f"r{k}", RequestMeta(f"a{k}"), 60, 40, now_s=float(k))
        idle.finish(f"r{k}", k + 0.9, 40)
    assert idle.book.clock().schedule == [(0.0, 10_000.0)]
    assert Tagger("justitia", 10_000.0).book.clock().schedule is None  # no kv_tokens, no meter


def test_only_a_policy_with_a_clock_is_measured_and_m_changes_only_at_arrivals():
    for name in ("fcfs", "vtc", "srjf"):
        assert not AgentScheduler.for_policy(name, 100.0, KV, measure_every_s=1.0).traits.measures_capacity
    core = AgentScheduler.for_policy("justitia", 100.0, KV, measure_every_s=1.0)
    assert core.traits.measures_capacity and core.clock().schedule == [(0.0, 100.0)]
    core.observe_service(1.0, Charge(kv_token_iters=50))
    assert core.clock().capacity_per_s == 100.0  # not until an agent arrives
    core.agent_arrived(Registration("a", "t", 10.0), 3.0)
    assert core.clock().capacity_per_s == pytest.approx(50.0) and core.clock().schedule[-1] == (
        3.0,
        pytest.approx(50.0),
    )


def _stream(rng, n, mean_gap_s):
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(mean_gap_s))
        tasks = [(int(rng.integers(1, 200)), int(rng.integers(1, 150))) for _ in range(rng.integers(1, 12))]
        out.append(agent(f"a{i:03d}", round(t, 3), tasks))
    return out


def _late(agents, cfg, measure):
    m0 = cfg.capacity_per_s("kv")
    res = Simulator(cfg, make_policy("justitia", m0), make_predictor("oracle"), measure_capacity=measure).run(agents)
    schedule = res.capacity_schedule or [(0.0, m0)]
    gps = gps_finish_times(agents, m0, schedule)
    bound = delay_bound_s(agents, cfg, min(m for _, m in schedule))
    return [a.agent_id for a in res.agents if a.finish_s > gps[a.agent_id] + bound]


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 100_000),
    blocks=st.integers(90, 200),
    n=st.integers(40, 120),
    slow=st.tuples(st.floats(0.1, 0.5), st.floats(0.2, 0.5)),
)
def test_with_m_measured_the_bound_holds_while_the_engine_runs_two_fold_slower(seed, blocks, n, slow):
    # A stream busier than the engine, which runs at half speed for part of it: the GPS reference
    # runs at the capacity the clock measured, and the bound uses its smallest value.
    agents = _stream(np.random.default_rng(seed), n, 0.12)
    end = agents[-1].arrival_s
    cfg = replace(engine(blocks=blocks, budget=512, seqs=256), slowdown=(end * slow[0], end * (slow[0] + slow[1]), 2))
    assert _late(agents, cfg, measure=True) == []


def test_with_the_formula_m_the_same_slowdown_breaks_the_bound():
    agents = _stream(np.random.default_rng(0), 108, 0.12)
    end = agents[-1].arrival_s
    cfg = replace(engine(blocks=150, budget=512, seqs=256), slowdown=(end * 0.3, end * 0.7, 2))
    assert len(_late(agents, cfg, measure=False)) >= 3 and _late(agents, cfg, measure=True) == []


@pytest.mark.parametrize("guess", [8.0, 0.25])  # times the formula's M: 5x above what this engine delivers, 6x below
def test_on_a_saturated_run_m_converges_to_the_delivered_rate_from_a_guess_outside_the_old_band(guess):
    # The A100 profile delivers about 1.6x its formula's M; the old rule kept M within 0.25x-2x the
    # guess, which excludes the delivered rate for both guesses.
    cfg = engine(blocks=150, budget=512, seqs=256, profile=PROFILES["llama7b-a100-40gb"])
    agents = _stream(np.random.default_rng(0), 150, 0.3)  # busier than the engine until the last arrival
    sim = Simulator(
        cfg, make_policy("justitia", guess * cfg.capacity_per_s("kv")), make_predictor("oracle"), measure_capacity=True
    )
    res = sim.run(agents)
    meter = sim.meter
    delivered = meter.service / meter.busy_s  # the run's delivered service over its busy time
    assert meter.busy_s > 0.9 * res.makespan_s  # saturated: requests waited nearly all the run
    served = sum(kv for _, _, kv in res.served) / res.makespan_s  # the same, from the requests' own costs
    assert delivered == pytest.approx(served, rel=0.05)
    assert res.capacity_schedule[0][1] == guess * cfg.capacity_per_s("kv")
    assert meter.capacity_per_s == pytest.approx(delivered, rel=0.10)
    assert meter.schedule[1][1] == pytest.approx(delivered, rel=0.25)  # already the first window


def test_the_simulated_meter_never_counts_the_time_an_idle_engine_waits():
    burst = [agent(f"a{i}", 0.0, [(150, 100)] * 4) for i in range(8)]
    later = [agent(f"b{i}", 1000.0 + 0.01 * i, [(150, 100)] * 4) for i in range(8)]
    cfg = engine(blocks=80, budget=512, seqs=256)
    sim = Simulator(
        cfg, make_policy("justitia", cfg.capacity_per_s("kv")), make_predictor("oracle"), measure_capacity=True
    )
    res = sim.run(burst + later)
    idle = 1000.0 - max(a.finish_s for a in res.agents if a.agent_id.startswith("a"))
    assert idle > 900 and 0 < sim.meter.busy_s <= res.makespan_s - idle
    assert sim.meter.dropped_s == 0.0  # nothing for the guard to catch
    # at b0's arrival the first burst's 5 busy seconds set M; with the idle 994 s in, it would be 0.005x
    assert res.capacity_schedule[1] == (1000.0, pytest.approx(sim.meter.measured_per_s, rel=0.2))


def test_a_calibration_file_gives_the_m_it_measured_only_to_an_engine_with_its_kv_cache():
    doc = {"kv_blocks": 100, "block_size": 16, "fit": {"delivered_capacity_per_s": 1234.5}}
    assert calibrated_capacity(doc) == 1234.5 and calibrated_capacity(doc, kv_tokens=1600) == 1234.5
    assert calibrated_capacity(doc, kv_tokens=3200) is None  # another cache: the meter measures it
    assert calibrated_capacity(doc | {"fit": {"delivered_capacity_per_s": None}}) is None  # no request waited
    assert calibrated_capacity({"kv_blocks": 100, "block_size": 16}) is None


def test_the_plug_in_starts_its_clock_from_a_calibration_of_its_own_kv_cache(tmp_path, monkeypatch):
    """``JUSTITIA_CALIBRATION`` (``justitia serve --calibration``): the plug-in's clock starts at the M
    the file measured when it was measured on this KV cache (64 blocks of 16; vLLM keeps one back),
    and at the formula's guess otherwise; a file that cannot be read stops the engine, by name."""
    import json

    from vllm_scheduler import make_scheduler

    from justitia.vllm.plugin import JustitiaScheduler

    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    guess = make_scheduler(JustitiaScheduler, False).core.clock().capacity_per_s
    for blocks, expected in ((64, 4321.0), (128, guess)):
        path = tmp_path / f"calibration-{blocks}.json"
        path.write_text(
            json.dumps({"kv_blocks": blocks, "block_size": 16, "fit": {"delivered_capacity_per_s": 4321.0}})
        )
        monkeypatch.setenv("JUSTITIA_CALIBRATION", str(path))
        assert make_scheduler(JustitiaScheduler, False).core.clock().capacity_per_s == expected
    assert guess != 4321.0
    monkeypatch.setenv("JUSTITIA_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="JUSTITIA_CALIBRATION="):
        make_scheduler(JustitiaScheduler, False)
