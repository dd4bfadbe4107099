"""The plug-in on vLLM's async path, at the scheduler level: no engine, vLLM's own
scheduler classes driven as its engine core drives them (``tests/vllm_scheduler.py``), the next
step scheduled before the last one's output comes back."""

from __future__ import annotations

from collections import defaultdict

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_scheduler import Driver, count_charges, make_scheduler, request

from justitia.core import REGISTER, RESET, RETIRE, ControlCall
from justitia.vllm.plugin import JustitiaScheduler, StepLogScheduler, check_version
from justitia.vllm.steplog import read_step_log

SIZES = [(40, 5), (50, 6), (60, 7), (70, 8), (80, 9), (90, 10)]  # (prompt tokens, output tokens)


def _run(policy: str, async_scheduling: bool, monkeypatch) -> tuple[dict, list[str], object]:
    """Six requests of three agents under ``policy``: each agent's charges added up, the order they
    were admitted in, and the scheduler."""
    monkeypatch.setenv("JUSTITIA_POLICY", policy)
    scheduler = make_scheduler(JustitiaScheduler, async_scheduling)
    _, charged = count_charges(scheduler)
    for i, (p, d) in enumerate(SIZES):
        scheduler.add_request(request(f"r{i}", p, d, first_token=100 * i, agent_id=f"a{i % 3}"))
    driver = Driver(scheduler, 2 if async_scheduling else 1)
    driver.run()
    return dict(charged), driver.admitted, scheduler


def test_the_plugin_takes_vllms_async_path_when_async_scheduling_is_on():
    """Built as vLLM builds it, each scheduler class is an ``AsyncScheduler`` exactly when async
    scheduling is configured (vLLM's default on a GPU)."""
    for cls in (JustitiaScheduler, StepLogScheduler):
        assert isinstance(make_scheduler(cls, True), AsyncScheduler)
        built = make_scheduler(cls, False)
        assert isinstance(built, cls) and not isinstance(built, AsyncScheduler)


def test_with_a_step_in_flight_each_agent_is_charged_exactly_its_kv_token_time(monkeypatch):
    """One step ahead, every agent is charged its requests' prompts, outputs and KV token-time,
    exactly as in step (a sampling step holds the tokens before it, ``sum_j (p + j)``; a partial
    prefill chunk holds its tokens too), and the requests are admitted in the same order (las:
    least attained service first)."""
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for i, (p, d) in enumerate(SIZES):
        total = expected[f"a{i % 3}"]
        total[0] += p
        total[1] += d
        total[2] += sum(p + j for j in range(d))
    charged_async, order_async, scheduler = _run("las", True, monkeypatch)
    charged_sync, order_sync, _ = _run("las", False, monkeypatch)
    assert isinstance(scheduler, AsyncScheduler)
    assert charged_async == charged_sync
    for agent, (p, d, kv) in expected.items():
        assert charged_sync[agent][:2] == [p, d] and charged_sync[agent][2] >= kv
    assert order_async == order_sync != sorted(order_sync)  # las reorders, the same way on both paths
    assert scheduler.book.open_count == 0 and not scheduler.waiting  # every request released


def test_one_step_ahead_the_plugin_serves_in_virtual_finish_order(monkeypatch):
    """justitia on the async path: one request at a time; a large agent registered first and a small
    one after it; while the first request runs, the small agent's request is admitted before the
    large agent's second."""
    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    scheduler = make_scheduler(JustitiaScheduler, True, max_num_seqs=1)
    big = scheduler.control(ControlCall(REGISTER, {"agent_id": "big", "predicted_cost": 1e6}))
    small = scheduler.control(ControlCall(REGISTER, {"agent_id": "small", "predicted_cost": 1e3}))
    assert small < big
    scheduler.add_request(request("big-1", 32, 4, agent_id="big"))
    scheduler.add_request(request("big-2", 32, 4, first_token=300, agent_id="big"))
    scheduler.add_request(request("small-1", 32, 4, first_token=600, agent_id="small"))
    driver = Driver(scheduler, 2)
    driver.run()
    assert driver.admitted == ["small-1", "big-1", "big-2"]


def test_the_step_log_on_the_async_path_writes_each_step_once_with_the_sync_paths_service(tmp_path, monkeypatch):
    """Every step is logged once, when its own output comes back (a later step already scheduled),
    and the KV token-time the log says was delivered is the sync path's."""
    logs = {}
    for async_scheduling in (False, True):
        scheduler = make_scheduler(StepLogScheduler, async_scheduling)
        path = tmp_path / f"steps-{async_scheduling}.csv"
        assert scheduler.control(ControlCall(RESET, {"step_log": str(path)}))
        for i, (p, d) in enumerate(SIZES):
            scheduler.add_request(request(f"r{i}", p, d, first_token=100 * i))
        driver = Driver(scheduler, 2 if async_scheduling else 1)
        driver.run()
        scheduler.shutdown()
        rows = read_step_log(path)
        assert len(rows) == driver.steps
        logs[async_scheduling] = rows
    delivered = {a: sum(r.delivered_kv for r in rows) for a, rows in logs.items()}
    tokens = {a: sum(r.batched_tokens for r in rows) for a, rows in logs.items()}
    assert delivered[True] == delivered[False] == sum(sum(p + j for j in range(d)) for p, d in SIZES)
    assert tokens[True] == tokens[False]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_requests_in_vllms_kv_holding_queue_are_on_the_books_and_in_policy_order(async_scheduling, monkeypatch):
    """vLLM drains ``kv_holding_waiting`` (requests that hold KV blocks) before ``waiting``: there
    the plug-in's requests keep their policy keys and are charged and released like any other."""
    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    scheduler = make_scheduler(JustitiaScheduler, async_scheduling, max_num_seqs=1)
    scheduler.control(ControlCall(REGISTER, {"agent_id": "big", "predicted_cost": 1e6}))
    scheduler.control(ControlCall(REGISTER, {"agent_id": "small", "predicted_cost": 1e3}))
    held = [request("big-held", 32, 3, agent_id="big"), request("small-held", 32, 3, first_token=500, agent_id="small")]
    for r in held:  # as vLLM's _enqueue_waiting_request puts a request that holds blocks
        scheduler.requests[r.request_id] = r
        scheduler.kv_holding_waiting.add_request(r)
    assert all(isinstance(r.priority, tuple) and scheduler.book.request(r.request_id) for r in held)
    scheduler.add_request(request("small-new", 32, 3, first_token=900, agent_id="small"))
    driver = Driver(scheduler, 2 if async_scheduling else 1)
    driver.run()
    assert driver.admitted == ["small-held", "big-held", "small-new"]  # holders first, in tag order
    assert scheduler.book.open_count == 0 and scheduler.core.agent("big").open_requests == 0


def test_the_plugin_refuses_a_vllm_it_was_not_read_against():
    """Any vLLM but the supported ones is a clear error naming them; a local build's suffix is fine."""
    check_version("0.32.0")
    check_version("0.32.0+cpu")
    check_version("0.33.1")
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32 and 0\.33.*this is vLLM 0\.31\.2"):
        check_version("0.31.2")
    with pytest.raises(RuntimeError, match="0.40.0"):
        check_version("0.40.0")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_agent_charged_beyond_its_price_loses_its_place_on_both_paths(async_scheduling, monkeypatch):
    """Retagging on attained service in the plug-in: an agent priced at 10 whose requests claim 5
    each, the first of which holds the KV cache for 100 tokens, is moved back while that request
    runs; its second request then waits behind an honest agent priced at 2,000 that came later."""
    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    order = {}
    for retag in ("1", "0"):
        monkeypatch.setenv("JUSTITIA_RETAG", retag)
        scheduler = make_scheduler(JustitiaScheduler, async_scheduling, max_num_seqs=1)
        scheduler.control(ControlCall(REGISTER, {"agent_id": "trojan", "predicted_cost": 10.0}))
        scheduler.add_request(request("trojan-1", 32, 100, agent_id="trojan", request_cost=5.0))
        scheduler.add_request(request("trojan-2", 32, 4, first_token=300, agent_id="trojan", request_cost=5.0))
        scheduler.control(ControlCall(REGISTER, {"agent_id": "honest", "predicted_cost": 2000.0}))
        scheduler.add_request(request("honest-1", 32, 4, first_token=600, agent_id="honest", request_cost=2000.0))
        driver = Driver(scheduler, 2 if async_scheduling else 1)
        driver.run()
        order[retag] = driver.admitted
    assert order["1"] == ["trojan-1", "honest-1", "trojan-2"]
    assert order["0"] == ["trojan-1", "trojan-2", "honest-1"]  # the price alone would have kept its place


def test_a_session_registered_through_the_control_channel_pauses_and_returns(monkeypatch):
    """``register`` with ``session`` (the agent API registers each turn of a session ahead): the
    plug-in's book keeps it as a session, so a pause settles it and a second registration returns
    it at its next turn's price; an agent registered without it, or with a flag that is not true,
    is a plain agent, which a pause leaves alone."""
    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    scheduler = make_scheduler(JustitiaScheduler, True)
    first = scheduler.control(ControlCall(REGISTER, {"agent_id": "s", "predicted_cost": 100.0, "session": True}))
    assert scheduler.control(ControlCall(RETIRE, {"agent_id": "s", "pause": True}))  # settled now: nothing open
    assert scheduler.book.agent("s").paused
    again = scheduler.control(ControlCall(REGISTER, {"agent_id": "s", "predicted_cost": 50.0, "session": True}))
    assert first is not None and again is not None and not scheduler.book.agent("s").paused
    for agent_id, extra in (("plain", {}), ("flagged", {"session": "yes"})):
        scheduler.control(ControlCall(REGISTER, {"agent_id": agent_id, "predicted_cost": 10.0} | extra))
        assert not scheduler.control(ControlCall(RETIRE, {"agent_id": agent_id, "pause": True}))
        assert not scheduler.book.agent(agent_id).paused


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_lag_guard_admits_an_over_priced_agent_that_the_paper_s_rule_leaves_last(async_scheduling, monkeypatch):
    """justitia-guarded in vLLM's scheduler, both paths, one request at a time: a small agent priced
    1e12 behind a large one priced 1. The paper's rule admits it last; the guard admits it once it
    is more than L behind GPS's pace, before the large agent's last request."""
    admitted = {}
    for policy in ("justitia", "justitia-guarded"):
        monkeypatch.setenv("JUSTITIA_POLICY", policy)
        scheduler = make_scheduler(JustitiaScheduler, async_scheduling, max_num_seqs=1)
        scheduler.control(ControlCall(REGISTER, {"agent_id": "big", "predicted_cost": 1.0}))
        scheduler.control(ControlCall(REGISTER, {"agent_id": "small", "predicted_cost": 1e12}))
        for i in range(8):
            scheduler.add_request(request(f"big-{i}", 32, 8, first_token=100 * i, agent_id="big"))
        scheduler.add_request(request("small-1", 32, 4, first_token=900, agent_id="small"))
        driver = Driver(scheduler, 2 if async_scheduling else 1)
        driver.run()
        admitted[policy] = driver.admitted
        assert scheduler.book.open_count == 0
    assert admitted["justitia"][-1] == "small-1"
    assert admitted["justitia-guarded"].index("small-1") < len(admitted["justitia-guarded"]) - 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_agent_keeps_its_place_across_its_hand_off_in_vllms_scheduler(async_scheduling, monkeypatch):
    """Two requests at a time. "b", priced first, sends its second call when its first one's output
    has come back and the engine has scheduled the next step (a client answers after vLLM's loop
    has moved on: one step under sync scheduling, two under async). "w" waits behind b from the
    start. The plug-in keeps b's place across that gap, so its second call goes in before w; with
    the mechanism off, w takes the freed place first."""
    from justitia.core.policies.justitia import Justitia

    def admitted() -> list[str]:
        monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
        scheduler = make_scheduler(JustitiaScheduler, async_scheduling, max_num_seqs=2)
        for agent_id, price in (("b", 100.0), ("x", 1e4), ("w", 1e5)):
            scheduler.control(ControlCall(REGISTER, {"agent_id": agent_id, "predicted_cost": price}))
        scheduler.add_request(request("b-0", 32, 2, first_token=100, agent_id="b"))
        scheduler.add_request(request("x-0", 32, 40, first_token=300, agent_id="x"))
        scheduler.add_request(request("w-0", 32, 20, first_token=500, agent_id="w"))
        driver = Driver(scheduler, 2 if async_scheduling else 1)
        due, sent = None, False  # the scheduling count after which b's second call reaches the engine
        while scheduler.has_unfinished_requests() or driver.in_flight or due is not None:
            if due is not None and driver.steps >= due:
                scheduler.add_request(request("b-1", 32, 2, first_token=700, agent_id="b"))
                due, sent = None, True
            if scheduler.has_unfinished_requests() and len(driver.in_flight) < driver.depth:
                driver.schedule()
                if len(driver.in_flight) < driver.depth:
                    continue
            if driver.in_flight:
                driver.complete()
            if not sent and due is None and "b-0" not in scheduler.requests:
                due = driver.steps + 1  # the step vLLM schedules next goes without it
            assert driver.steps < 1000
        return driver.admitted

    kept = admitted()
    assert kept.index("b-1") < kept.index("w-0"), kept
    monkeypatch.setattr(Justitia, "holds_place", False)
    free = admitted()
    assert free.index("w-0") < free.index("b-1"), free
