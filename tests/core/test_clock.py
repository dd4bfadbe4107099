"""The GPS virtual clock: the paper's worked example and exactness against a fluid simulation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from justitia.core.clock import VirtualClock
from justitia.core.policies import AgentInfo, Justitia, RequestInfo


def test_paper_worked_example():
    # M = 100; A (cost 200) at t=0 gets 200; at t=1, V=100; B (30) gets 130, C (40) gets 140.
    clock = VirtualClock(100)
    assert clock.arrive("A", 200, 0.0) == 200
    assert clock.virtual_time(1.0) == pytest.approx(100)
    assert clock.arrive("B", 30, 1.0) == pytest.approx(130)
    assert clock.arrive("C", 40, 1.0) == pytest.approx(140)
    # With three agents V grows at 100/3: B finishes at V=130, i.e. t = 1 + 30 / (100/3) = 1.9.
    assert clock.virtual_time(1.9) == pytest.approx(130)
    finish = clock.drain()
    assert finish["B"] == pytest.approx(1.9)
    assert finish["C"] == pytest.approx(1.9 + 10 / 50)  # two left: rate 50
    assert finish["A"] == pytest.approx(2.1 + 60 / 100)  # alone again: rate 100
    assert finish["B"] < finish["C"] < finish["A"]


def test_worked_example_order_under_justitia_policy():
    pol = Justitia(capacity_per_s=100)
    for seq, (name, cost, t) in enumerate([("A", 200, 0.0), ("B", 30, 1.0), ("C", 40, 1.0)]):
        pol.agent_arrived(AgentInfo(name, "t", seq, t, cost), t)
    reqs = [RequestInfo(f"{a}/0", a, i, 10, 1.0) for i, a in enumerate("ABC")]
    assert [r.agent_id for r in sorted(reqs, key=pol.key)] == ["B", "C", "A"]


def test_virtual_time_stands_still_when_idle():
    clock = VirtualClock(10)
    clock.arrive("x", 10, 0.0)
    assert clock.virtual_time(5.0) == pytest.approx(10)  # x finished at t=1
    assert clock.active == 0
    assert clock.arrive("y", 5, 5.0) == pytest.approx(15)


def test_clock_refuses_to_go_back_and_bad_costs():
    clock = VirtualClock(10)
    clock.virtual_time(2.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.virtual_time(1.0)
    with pytest.raises(ValueError, match="cost"):
        clock.arrive("z", float("nan"), 3.0)
    with pytest.raises(ValueError, match="capacity"):
        VirtualClock(0)


def _fluid_gps(arrivals, capacity, dt):
    """Brute force: share capacity equally among unfinished agents in small time steps."""
    left = {}
    finish = {}
    pending = sorted(arrivals, key=lambda a: a[2])
    t, i = 0.0, 0
    while i < len(pending) or left:
        while i < len(pending) and pending[i][2] <= t + 1e-12:
            left[pending[i][0]] = pending[i][1]
            i += 1
        if left:
            share = capacity * dt / len(left)
            for a in list(left):
                left[a] -= share
                if left[a] <= 1e-9:
                    finish[a] = t + dt
                    del left[a]
        t += dt
    return finish


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 50), st.floats(0, 2)), min_size=1, max_size=8))
def test_clock_matches_fluid_gps(jobs):
    arrivals = [(f"j{i}", cost, round(t, 2)) for i, (cost, t) in enumerate(jobs)]
    clock = VirtualClock(20.0)
    for name, cost, t in sorted(arrivals, key=lambda a: a[2]):
        clock.arrive(name, cost, t)
    exact = clock.drain()
    fluid = _fluid_gps(arrivals, 20.0, dt=1e-3)
    for name in exact:
        assert exact[name] == pytest.approx(fluid[name], abs=5e-3 * len(arrivals))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 100), st.floats(0, 5)), min_size=2, max_size=30))
def test_gps_finishes_in_tag_order_and_v_never_decreases(jobs):
    clock = VirtualClock(7.0)
    tags = {}
    last_v = 0.0
    for i, (cost, t) in enumerate(sorted(jobs, key=lambda j: j[1])):
        v = clock.virtual_time(t)
        assert v >= last_v - 1e-9
        last_v = v
        tags[f"j{i}"] = clock.arrive(f"j{i}", cost, t)
    finish = clock.drain()
    order = sorted(tags, key=tags.get)
    times = [finish[a] for a in order]
    assert all(a <= b + 1e-9 for a, b in zip(times, times[1:]))


def test_many_events_are_cheap(monkeypatch):
    # O(log n) per event: each tag is pushed once and popped once, whatever the order of events.
    import heapq

    import justitia.core.clock as clock_module

    ops = {"push": 0, "pop": 0}

    class CountingHeap:
        @staticmethod
        def heappush(heap, item):
            ops["push"] += 1
            heapq.heappush(heap, item)

        @staticmethod
        def heappop(heap):
            ops["pop"] += 1
            return heapq.heappop(heap)

    monkeypatch.setattr(clock_module, "heapq", CountingHeap)
    clock = VirtualClock(1000.0)
    rng = np.random.default_rng(0)
    t = 0.0
    for i in range(20000):
        t += rng.exponential(0.01)
        clock.arrive(f"a{i}", float(rng.uniform(1, 100)), t)
        clock.virtual_time(t)
    assert len(clock.drain()) == 20000
    assert ops == {"push": 20000, "pop": 20000}  # each tag pushed once and popped once, not once per event


def test_a_settled_agent_that_declared_a_huge_cost_stops_slowing_the_clock():
    clock = VirtualClock(100.0)
    clock.arrive("liar", 1e19, 0.0)  # a client's absurd cost: it halves everyone's rate while it is active
    clock.arrive("A", 100.0, 0.0)
    clock.settle("liar", 10.0, 0.5)  # it left having asked for 10: V(0.5) = 25 is past 0 + 10
    assert clock.virtual_time(0.5) == pytest.approx(25.0) and clock.active == 1
    assert clock.drain() == {"liar": 0.5, "A": pytest.approx(0.5 + 75 / 100)}  # not 2.0 s, as with the liar in


def test_an_honest_agent_keeps_its_tag_when_it_leaves_early():
    clock = VirtualClock(100.0)
    clock.arrive("A", 100.0, 0.0)
    clock.arrive("B", 100.0, 0.0)
    clock.settle("A", 100.0, 0.2)  # served ahead of GPS, it asked for what it declared: GPS is unchanged
    assert clock.drain() == {"A": pytest.approx(2.0), "B": pytest.approx(2.0)}


def test_an_overpriced_agent_counts_until_gps_would_have_finished_its_real_work():
    clock = VirtualClock(100.0)
    clock.arrive("A", 100.0, 0.0)
    clock.arrive("B", 100.0, 0.0)
    clock.settle("A", 40.0, 0.2)  # V(0.2) = 10; A counts until V = 40 (t = 0.8), then B runs alone
    assert clock.drain() == {"A": pytest.approx(0.8), "B": pytest.approx(0.8 + 60 / 100)}


def test_retagging_moves_a_tag_to_v_now_plus_the_work_left():
    clock = VirtualClock(100.0)
    clock.arrive("A", 10.0, 0.0)
    clock.arrive("B", 100.0, 0.0)
    assert clock.retag("A", 4.0, 0.1) == 10.0  # V(0.1) = 5, 5 + 4 is below its tag: no move
    assert clock.retag("A", 55.0, 0.1) == pytest.approx(60.0)  # 5 + 55
    assert clock.virtual_time(0.4) == pytest.approx(20.0)  # A (now 60) still counts: V(0.4) = 0.4 * 50
    assert clock.drain() == {"A": pytest.approx(1.2), "B": pytest.approx(1.2 + 40 / 100)}
    assert clock.retag("nobody", 1.0, 2.0) is None


def test_a_zero_cost_agent_is_retagged_when_its_work_shows_up():
    clock = VirtualClock(100.0)
    assert clock.arrive("Z", 0.0, 0.0) == 0.0 and clock.active == 0  # declared nothing: done in GPS at once
    clock.arrive("B", 100.0, 0.0)
    assert clock.retag("Z", 100.0, 0.0) == pytest.approx(100.0) and clock.active == 2  # it counts again
    assert clock.drain()["B"] == pytest.approx(2.0)
