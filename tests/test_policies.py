"""Costs, each policy's ordering, the waiting queue and the predictors."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from justitia.cost import compute_tokens, cost_model, kv_token_iters
from justitia.policies import POLICY_NAMES, AgentInfo, Charge, RequestInfo, make_policy
from justitia.predictor import make_predictor
from justitia.queue import WaitingQueue
from justitia.scheduler import AgentScheduler
from helpers import agent


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_kv_cost_is_the_tokens_held_over_the_decode(p, d):
    assert kv_token_iters(p, d) == p * d + d * d / 2
    # Holding p + i tokens in decode step i = 1..d sums to p*d + d(d+1)/2: the same up to d/2.
    assert abs(sum(p + i for i in range(1, d + 1)) - kv_token_iters(p, d)) == pytest.approx(d / 2)


def test_compute_cost_and_agent_cost():
    assert compute_tokens(100, 50) == 200
    a = agent("a", 0.0, [(100, 10), (200, 20)], [(50, 5)])
    assert a.cost(cost_model("kv")) == kv_token_iters(100, 10) + kv_token_iters(200, 20) + kv_token_iters(50, 5)
    assert a.cost(cost_model("compute")) == 120 + 240 + 60
    with pytest.raises(ValueError, match="unknown cost model"):
        cost_model("flops")


def scheduler(name, capacity=100.0):
    return AgentScheduler(make_policy(name, capacity))


def order(core):
    out = []
    while len(core.waiting):
        out.append(core.waiting.pop().request_id)
    return out


def test_fcfs_serves_requests_in_arrival_order_across_agents():
    core = scheduler("fcfs")
    core.agent_arrived("x", "t", 500, 0.0)
    core.agent_arrived("y", "t", 5, 0.0)
    for rid, a in [("x1", "x"), ("y1", "y"), ("x2", "x")]:
        core.request_arrived(rid, a, 10, 1.0)
    assert order(core) == ["x1", "y1", "x2"]


def test_sjf_serves_the_cheapest_request_first():
    core = scheduler("sjf")
    core.agent_arrived("x", "t", 0, 0.0)
    for rid, cost in [("big", 90.0), ("small", 5.0), ("mid", 40.0)]:
        core.request_arrived(rid, "x", 10, cost)
    assert order(core) == ["small", "mid", "big"]


def test_parrot_keeps_an_agents_requests_together_in_agent_order():
    core = scheduler("parrot")
    core.agent_arrived("x", "t", 500, 0.0)
    core.agent_arrived("y", "t", 5, 0.0)
    for rid, a in [("x1", "x"), ("y1", "y"), ("x2", "x")]:
        core.request_arrived(rid, a, 10, 1.0)
    assert order(core) == ["x1", "x2", "y1"]


def test_srjf_prefers_least_remaining_and_updates_with_service():
    core = scheduler("srjf")
    core.agent_arrived("x", "t", 100, 0.0)
    core.agent_arrived("y", "t", 60, 0.0)
    rx = core.request_arrived("x1", "x", 10, 1.0)
    core.request_arrived("y1", "y", 10, 1.0)
    assert core.waiting.peek().agent_id == "y"
    core.charge(rx, Charge(kv_token_iters=50))  # x has 50 left, y 60
    assert core.waiting.peek().agent_id == "x"


def test_las_prefers_least_attained_service():
    core = scheduler("las")
    core.agent_arrived("x", "t", 0, 0.0)
    core.agent_arrived("y", "t", 0, 0.0)
    rx = core.request_arrived("x1", "x", 10, 1.0)
    core.request_arrived("y1", "y", 10, 1.0)
    assert core.waiting.peek().agent_id == "x"  # tie: earlier agent
    core.charge(rx, Charge(kv_token_iters=1))
    assert core.waiting.peek().agent_id == "y"


def test_vtc_counts_input_once_and_output_twice_and_lifts_returning_agents():
    core = scheduler("vtc")
    pol = core.policy
    for a in "xyz":
        core.agent_arrived(a, "t", 0, 0.0)
    rx = core.request_arrived("x1", "x", 10, 1.0)
    ry = core.request_arrived("y1", "y", 10, 1.0)
    core.waiting.remove(rx)  # x admitted: 100 prompt tokens, then 10 output tokens
    core.charge(rx, Charge(prefill_tokens=100, decode_tokens=10))
    assert pol.agent_key("x")[0] == 100 + 2 * 10
    core.waiting.remove(ry)
    core.charge(ry, Charge(prefill_tokens=30))
    core.request_arrived("y2", "y", 10, 1.0)  # y backlogged again: nothing else waits, no lift
    assert pol.agent_key("y")[0] == 30
    # z has been idle at 0; when it queues while y (30) waits, it is lifted to 30, not left at 0.
    core.request_arrived("z1", "z", 10, 1.0)
    assert pol.agent_key("z")[0] == 30
    assert core.waiting.peek().agent_id == "y"  # tie at 30: earlier agent first


def test_justitia_orders_by_finish_tag_not_arrival():
    core = scheduler("justitia", capacity=100)
    core.agent_arrived("A", "t", 200, 0.0)
    core.request_arrived("a1", "A", 10, 20.0)
    core.agent_arrived("B", "t", 30, 1.0)
    core.request_arrived("b1", "B", 10, 15.0)
    assert core.policy.tag("A") == 200 and core.policy.tag("B") == pytest.approx(130)
    assert order(core) == ["b1", "a1"]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_victim_is_the_lowest_priority_and_finished_agents_leave_no_state(name):
    core = scheduler(name)
    core.agent_arrived("x", "t", 10, 0.0)
    core.agent_arrived("y", "t", 1000, 0.5)
    rx = core.request_arrived("x1", "x", 10, 1.0)
    ry = core.request_arrived("y1", "y", 10, 900.0)
    assert core.victim([rx, ry]) is max([rx, ry], key=core.policy.key)
    core.request_arrived("x2", "x", 10, 1.0)
    core.agent_finished("x", 1.0)  # cancelled with a request still waiting
    assert [r.agent_id for r in core.waiting] == ["y"]
    state = [v for v in vars(core.policy).values() if isinstance(v, dict)]
    assert all("x" not in d for d in state)


def test_waiting_queue_requeues_and_rejects_duplicates():
    pol = make_policy("fcfs")
    q = WaitingQueue(pol)
    r = RequestInfo("r", "a", 3, 10, 1.0)
    q.add(r)
    with pytest.raises(ValueError, match="already waiting"):
        q.add(r)
    assert q.pop() is r and len(q) == 0
    q.add(r)  # preempted: back in the queue
    assert q.peek() is r
    with pytest.raises(KeyError):
        q.remove(RequestInfo("other", "a", 4, 10, 1.0))


def test_noisy_predictor_is_bounded_seeded_and_order_free():
    a = agent("a", 0.0, [(100, 50)] * 3)
    b = agent("b", 0.0, [(10, 5)])
    kv = cost_model("kv")
    p1, p2 = make_predictor("noisy:3", 1), make_predictor("noisy:3", 1)
    x = p1.agent_cost(a, kv)
    assert p1.agent_cost(b, kv) == p2.agent_cost(b, kv) and p2.agent_cost(a, kv) == x
    assert a.cost(kv) / 3 <= x <= a.cost(kv) * 3
    assert make_predictor("noisy:1").agent_cost(a, kv) == pytest.approx(a.cost(kv))
    assert make_predictor("oracle").request_cost(a, 0, 1, kv) == kv_token_iters(100, 50)
    factors = [math.log(make_predictor("noisy:3", s).agent_cost(a, kv) / a.cost(kv)) for s in range(400)]
    assert max(factors) > 0.8 * math.log(3) and min(factors) < -0.8 * math.log(3)
    with pytest.raises(ValueError, match="noisy"):
        make_predictor("noisy:0.5")


# ---------------------------------------------------------------- agents known from request metadata
def test_agent_book_registers_on_first_request_and_releases_on_done_cancel_or_idle():
    from justitia.scheduler import AgentBook

    book = AgentBook(AgentScheduler(make_policy("justitia", 100.0)), idle_release_s=5.0)
    info, agent = book.arrive("r1", {"agent_id": "a", "agent_cost": 50.0}, 10, 4, now_s=0.0)
    assert agent is not None and agent.predicted_cost == 50.0 and info.predicted_cost == 10 * 4 + 8
    assert book.arrive("r2", {"agent_id": "a", "agent_done": True}, 10, 4, now_s=0.0)[1] is None
    book.finish("r1", 1.0)
    assert book.core.has_agent("a")  # r2 (the last stage) is still open
    book.finish("r2", 2.0)
    assert not book.core.has_agent("a") and not book.infos

    # no agent_done: idle between stages, released by the sweep only after idle_release_s
    book.arrive("s1", {"agent_id": "b"}, 10, 4, now_s=3.0)
    book.finish("s1", 3.0)
    assert book.sweep(7.9) == [] and book.core.has_agent("b")
    book.arrive("s2", {"agent_id": "b"}, 10, 4, now_s=8.0)  # the next stage: no longer idle
    book.finish("s2", 8.0)
    assert book.sweep(12.0) == [] and book.sweep(13.0) == ["b"] and not book.core.has_agent("b")

    # cancel: released at once, its open request finishes later without error
    book.register("c", "t", 30.0, 14.0)
    book.arrive("c1", {"agent_id": "c"}, 10, 4, now_s=14.0)
    assert book.release("c", 14.5) and not book.release("c", 14.6)
    assert book.finish("c1", 15.0) is not None and not book.core.has_agent("c")

    # a request without agent_id is an agent of its own, released when it finishes; bad costs are replaced
    info, agent = book.arrive("solo", {"agent_cost": "nan"}, 8, 2, now_s=16.0)
    assert agent.agent_id == "solo" and agent.predicted_cost == info.predicted_cost == 8 * 2 + 2
    book.finish("solo", 17.0)
    assert not book.core.has_agent("solo") and not book.core.waiting
