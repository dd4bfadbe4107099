"""Routing over several engines (justitia.core.routing), the rule the simulator's cluster, the Ray
Serve router and --upstream share, and the ``tagged`` policy an engine behind one clock runs."""

from __future__ import annotations

import pytest

from justitia.core import AgentBook, AgentScheduler, Registration, ReplicaLoad, Replicas, RequestMeta, RouteRequest
from justitia.core.routing import make_router


def _book(router: str, n: int = 3, kv_tokens: int = 1000) -> Replicas:
    return Replicas([ReplicaLoad(f"r{i}", kv_tokens) for i in range(n)], router)


def test_least_load_sends_each_request_to_the_replica_with_the_least_outstanding_work_per_kv_token():
    book = Replicas([ReplicaLoad("small", 1000), ReplicaLoad("big", 4000)], "least-load")
    chosen = [book.route(RouteRequest(f"q{i}", 1000.0)).replica_id for i in range(10)]
    # per KV token the big replica takes 4 of every 5 requests
    assert chosen.count("big") == 8 and chosen.count("small") == 2
    assert book.by_id["big"].load == 8000.0 and book.by_id["big"].in_flight == 8


def test_a_finished_request_no_longer_counts_and_an_idle_replica_has_no_load_left():
    book = _book("least-load", 2)
    for i in range(4):
        book.route(RouteRequest(f"q{i}", 0.1 * (i + 1)))
    for i in range(4):
        book.done(f"q{i}")
    assert [r.load for r in book.replicas] == [0.0, 0.0] and [r.in_flight for r in book.replicas] == [0, 0]
    assert book.done("q0") is None  # twice: nothing more


def test_round_robin_ignores_load():
    book = _book("round-robin", 3)
    book.by_id["r0"].load = 1e9
    assert [book.route(RouteRequest(f"q{i}", 1.0)).replica_id for i in range(6)] == ["r0", "r1", "r2"] * 2


def test_affinity_keeps_a_prefix_on_its_replica_until_that_replica_is_too_loaded():
    book = _book("affinity", 2)  # KV caches of 1,000 tokens: a request of 20,000 token-iterations is 20 steps' work
    first = book.route(RouteRequest("a0", 20_000.0, prefix="stage-0")).replica_id
    # least-load alone would alternate; affinity keeps the stage's prefix where it was served
    assert [book.route(RouteRequest(f"a{i}", 20_000.0, prefix="stage-0")).replica_id for i in range(1, 4)] == [
        first
    ] * 3
    other = next(r for r in book.replicas if r.replica_id != first)
    assert book.route(RouteRequest("b0", 20_000.0)).replica_id == other.replica_id  # no prefix: least load
    assert book.route(RouteRequest("a4", 20_000.0, prefix="stage-0")).replica_id == first  # 80 <= 20 + 64
    # now 100 against 20: more than 64 steps' work ahead of the least, so the prefix moves
    assert book.route(RouteRequest("a5", 20_000.0, prefix="stage-0")).replica_id == other.replica_id


def test_a_replica_out_of_routing_is_chosen_only_when_none_is_alive_and_a_removed_one_forgets_its_requests():
    book = _book("least-load", 2)
    book.by_id["r0"].alive = False
    assert book.route(RouteRequest("q0", 1.0)).replica_id == "r1"
    book.by_id["r1"].alive = False
    assert book.choose(RouteRequest("q1", 1.0)).replica_id == "r0"  # all out: try them anyway
    assert book.choose(RouteRequest("q1", 1.0), exclude={"r0", "r1"}) is None
    book.remove("r1")
    assert book.done("q0") is None and [r.replica_id for r in book.replicas] == ["r0"]
    book.add(ReplicaLoad("r2", 1000))
    with pytest.raises(ValueError, match="already known"):
        book.add(ReplicaLoad("r2", 1000))


def test_a_tentative_choice_counts_once_and_moves_with_the_request():
    book = _book("least-load", 2)
    req = RouteRequest("q0", 5.0)
    book.sent(req, "r0")
    book.sent(req, "r0")  # the same replica again: counted once
    assert book.by_id["r0"].load == 5.0 and book.by_id["r0"].sent_total == 1
    book.sent(req, "r1")  # sent elsewhere after all
    assert (book.by_id["r0"].load, book.by_id["r1"].load) == (0.0, 5.0)


def test_unknown_router_names_are_refused():
    with pytest.raises(ValueError, match="unknown router 'fastest'"):
        make_router("fastest")


def test_an_engine_behind_one_clock_serves_its_requests_in_the_tags_the_front_end_stamped():
    # the front end: justitia's clock stamps agents; two engines each run `tagged`
    front = AgentBook.tagging("justitia", 100.0)
    cores = [AgentScheduler.for_policy("tagged", 100.0, measure_every_s=1.0) for _ in range(2)]
    engines = [AgentBook(core) for core in cores]
    for name, cost in (("big", 5000.0), ("small", 50.0), ("mid", 500.0)):
        front.register(Registration(name, "t", cost), 0.0)
    for i, name in enumerate(("big", "small", "mid") * 2):
        info, _ = front.tag(f"{name}/{i}", RequestMeta(name), 10, 10, 0.0)
        tag = front.stamp(info)[0]
        engines[i % 2].arrive(f"{name}/{i}", RequestMeta(name, agent_tag=tag), 10, 10, 0.0)
    orders = []
    for core in cores:
        order = []
        while (head := core.peek()) is not None:
            core.dequeue(head)
            order.append(head.agent_id)
        orders.append(order)
    assert orders == [["small", "mid", "big"]] * 2  # every engine serves in the one clock's order
    assert cores[0].traits.measures_capacity and cores[0].clock().capacity_per_s == 100.0


def test_a_tagged_engine_puts_untagged_requests_last_and_only_a_trusted_sender_may_tag():
    core = AgentScheduler.for_policy("tagged")
    core.agent_arrived(Registration("a", "t", 1.0), 0.0)
    late = core.request_arrived("untagged", "a", 1, 1.0)
    early = core.request_arrived("tagged", "a", 1, 1.0, tag=7.0)
    assert core.peek() is early and core.priority(late) > core.priority(early)
    meta = RequestMeta.parse({"agent_id": "a", "agent_tag": 3.5})
    assert meta.agent_tag == 3.5 and meta.without_prices().agent_tag is None
    assert RequestMeta.parse({"agent_tag": -1}).agent_tag is None  # not a finite number >= 0: ignored
