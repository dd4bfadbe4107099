"""The clock's M measured from what the engine delivers: the meter, the clock's changing rate, and
the delay bound when the engine slows down two-fold for part of a run."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import agent, engine
from justitia.core import KV, AgentBook, AgentScheduler, CapacityMeter, Charge, RequestMeta, VirtualClock
from justitia.core.policies import make_policy
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.predictors import make_predictor
from justitia.sim import Simulator


def test_the_clock_moves_at_the_new_rate_from_the_moment_it_changes():
    clock = VirtualClock(100.0)
    assert clock.arrive("A", 100.0, 0.0) == 100.0
    clock.set_capacity(50.0, 0.5)  # V(0.5) = 50 at the old rate, then 50 a second
    assert clock.virtual_time(1.0) == pytest.approx(75.0)
    assert clock.drain()["A"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="positive"):
        clock.set_capacity(0.0, 2.0)


def test_the_meter_moves_m_once_a_window_of_busy_time_has_gathered_within_its_floor_and_ceiling():
    meter = CapacityMeter(1000.0, KV, window_s=2.0)
    meter.observe(1.5, Charge(kv_token_iters=600))
    assert meter.update(1.5) is None  # not a full window yet
    meter.observe(0.5, Charge(prefill_tokens=80, kv_token_iters=200))  # 800 in 2 s: 400 a second
    assert meter.update(2.0) == pytest.approx(700.0)  # half way from 1000 to 400
    for t in range(3, 30):
        meter.observe(2.0, Charge())  # nothing delivered: M falls to its floor, no further
        meter.update(float(t))
    assert meter.capacity_per_s == pytest.approx(250.0)
    meter.observe(2.0, Charge(kv_token_iters=100_000))
    assert meter.update(30.0) == pytest.approx(2000.0)  # the ceiling: twice the formula's
    meter.observe(2.0, Charge(kv_token_iters=100_000))
    assert meter.update(31.0) is None  # unchanged: nothing to tell the clock
    assert meter.schedule[0] == (0.0, 1000.0) and meter.schedule[1] == (2.0, pytest.approx(700.0))


def test_a_tagging_front_end_measures_m_from_its_requests_round_trips():
    book = AgentBook.tagging("justitia", 10_000.0, measure_every_s=1.0, kv_tokens=150)
    book.tag("r1", RequestMeta("a"), 60, 40, now_s=0.0)  # demand 100: fits the cache, not busy yet
    book.tag("r2", RequestMeta("b"), 60, 40, now_s=1.0)  # demand 200 > 150: some request must wait
    book.finish("r1", 2.0, 40)  # 60*40 + 40*40/2 = 3200 served in 1 busy second
    book.finish("r2", 2.5, 40)  # demand 100: the half second after r1 was not busy
    assert book.core.capacity_per_s == 10_000.0  # M moves only at an agent's arrival
    book.tag("r3", RequestMeta("c"), 60, 40, now_s=3.0)
    assert book.core.capacity_per_s == pytest.approx(0.5 * 10_000 + 0.5 * 3200)  # the meter's smoothing
    assert book.core.capacity_schedule == [(0.0, 10_000.0), (3.0, pytest.approx(6600.0))]
    idle = AgentBook.tagging("justitia", 10_000.0, measure_every_s=1.0, kv_tokens=10_000)
    for k in range(5):  # never more asked than the cache holds: nothing to measure
        idle.tag(f"r{k}", RequestMeta(f"a{k}"), 60, 40, now_s=float(k))
        idle.finish(f"r{k}", k + 0.9, 40)
    assert idle.core.capacity_schedule == [(0.0, 10_000.0)]
    assert AgentBook.tagging("justitia", 10_000.0).core.capacity_schedule is None  # no kv_tokens, no meter


def test_only_a_policy_with_a_clock_is_measured_and_m_changes_only_at_arrivals():
    for name in ("fcfs", "vtc", "srjf"):
        assert not AgentScheduler.for_policy(name, 100.0, KV, measure_every_s=1.0).measures_capacity
    core = AgentScheduler.for_policy("justitia", 100.0, KV, measure_every_s=1.0)
    assert core.measures_capacity and core.capacity_schedule == [(0.0, 100.0)]
    core.observe_service(1.0, Charge(kv_token_iters=50))
    assert core.capacity_per_s == 100.0  # not until an agent arrives
    core.agent_arrived("a", "t", 10.0, 3.0)
    assert core.capacity_per_s == pytest.approx(75.0) and core.capacity_schedule[-1] == (3.0, pytest.approx(75.0))


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
@given(seed=st.integers(0, 100_000), blocks=st.integers(90, 200), n=st.integers(40, 120),
       slow=st.tuples(st.floats(0.1, 0.5), st.floats(0.2, 0.5)))
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
