"""The Ray front end's replica choice (justitia.backends.ray.router.JustitiaRouter), driven as Ray Serve drives
it (choose_replicas, on_request_routed, on_request_completed, on_replica_actor_died) with Ray's own
ids and requests and stand-in replicas: no Ray cluster, no engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # noqa: E402
from ray.serve.request_router import PendingRequest, ReplicaID  # noqa: E402

from justitia.backends.ray.router import JustitiaRouter  # noqa: E402
from justitia.core.routing import AFFINITY_SLACK_ITERS  # noqa: E402

DEPLOYMENT = DeploymentID(name="EngineReplica", app_name="justitia")
KV_TOKENS = 1000  # the deployment's kv_tokens (request_router_kwargs), until a replica reports its own


def make_router(router: str = "least-load") -> JustitiaRouter:
    """A router as Ray Serve builds one: constructed, then initialize_state(**request_router_kwargs)."""
    r = JustitiaRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)
    r.initialize_state(router=router, kv_tokens=KV_TOKENS)
    return r


def replica(name: str, kv_tokens: int | None = None) -> SimpleNamespace:
    """What choose_replicas reads of a RunningReplica (a real one needs a live actor)."""
    return SimpleNamespace(
        replica_id=ReplicaID(name, DEPLOYMENT), routing_stats={} if kv_tokens is None else {"kv_tokens": kv_tokens}
    )


def request(request_id: str, cost: float | None = None, prefix: str | None = None) -> PendingRequest:
    """A pending request as the server sends it (EngineReplica.generate's ``route`` keyword)."""
    kwargs = {} if cost is None else {"route": {"cost": cost, "prefix": prefix}}

    async def build():  # a PendingRequest holds an asyncio future: made inside a loop
        return PendingRequest(args=[], kwargs=kwargs, metadata=RequestMetadata(request_id, request_id))

    return asyncio.run(build())


def choose(router: JustitiaRouter, candidates: list, pending: PendingRequest | None) -> list[str]:
    """The candidates' names in the order the router ranks them (one to a rank)."""
    ranks = asyncio.run(router.choose_replicas(candidates, pending))
    assert all(len(rank) == 1 for rank in ranks)
    return [rank[0].replica_id.unique_id for rank in ranks]


def test_each_request_goes_first_to_the_replica_with_the_least_predicted_work_per_kv_token():
    """A replica with 4x the KV cache takes 4 of every 5 equal requests, and every candidate is ranked."""
    router = make_router()
    small, big = replica("small", 1000), replica("big", 4000)
    ranked = [choose(router, [small, big], request(f"q{i}", 1000.0)) for i in range(10)]
    assert all(sorted(r) == ["big", "small"] for r in ranked)
    firsts = [r[0] for r in ranked]
    assert firsts.count("big") == 8 and firsts.count("small") == 2, firsts
    # now big holds 8,000 over 4,000 tokens (2 iterations), small 2,000 over 1,000 (2): a tie, candidate order
    assert choose(router, [small, big], None) == ["small", "big"]
    assert choose(router, [big, small], None) == ["big", "small"]


def test_the_ranking_is_by_load_per_kv_token_not_by_load_or_request_count():
    """Less work on a smaller cache can rank behind more work on a bigger one; the rest follow by pressure."""
    router = make_router()
    a, b, c = replica("a", 1000), replica("b", 8000), replica("c", 2000)
    for name, cost in (("a", 500.0), ("b", 2000.0), ("c", 800.0)):  # pressures 0.5, 0.25, 0.4
        router.on_request_routed(request(f"pre-{name}", cost), ReplicaID(name, DEPLOYMENT), None)
    assert choose(router, [a, b, c], None) == ["b", "c", "a"]


def test_a_replica_that_reports_no_kv_cache_counts_the_deployments_and_a_later_report_replaces_it():
    """No kv_tokens in its routing stats: the configured kv_tokens; once it reports, its own."""
    router = make_router()
    known, silent = replica("known", 4000), replica("silent")
    router.on_request_routed(request("x", 2000.0), known.replica_id, None)  # 2,000 / 4,000: 0.5
    router.on_request_routed(request("y", 800.0), silent.replica_id, None)  # 800 / 1,000: 0.8
    assert choose(router, [silent, known], None) == ["known", "silent"]
    router.on_request_completed(silent.replica_id, "y")
    router.on_request_routed(request("z", 400.0), silent.replica_id, None)  # 400 / 1,000: 0.4
    assert choose(router, [known, silent], None) == ["silent", "known"]
    silent.routing_stats = {"kv_tokens": 500}  # 400 / 500: 0.8
    assert choose(router, [silent, known], None) == ["known", "silent"]


def test_a_choice_counts_at_once_so_requests_chosen_before_any_is_sent_spread_out():
    """Ray chooses for many requests before it sends one: each choice counts on the replica chosen."""
    router = make_router()
    a, b = replica("a", 1000), replica("b", 1000)
    firsts = [choose(router, [a, b], request(f"q{i}", 100.0))[0] for i in range(4)]
    assert firsts == ["a", "b", "a", "b"]
    assert router.book.by_id[a.replica_id.unique_id].load == 200.0


def test_a_request_routed_elsewhere_than_first_choice_counts_once_where_it_went_and_not_after_it_completes():
    """Ray may send a request to a later rank: its cost moves there; completed, it counts nowhere."""
    router = make_router()
    a, b = replica("a", 1000), replica("b", 1000)
    q = request("q", 300.0)
    assert choose(router, [a, b], q)[0] == "a"  # counted on a for now
    router.on_request_routed(q, b.replica_id, None)  # a refused it; b took it
    router.on_request_routed(q, b.replica_id, None)  # reported again: still once
    assert [router.book.by_id[n].load for n in ("a", "b")] == [0.0, 300.0]
    assert choose(router, [b, a], None) == ["a", "b"]
    router.on_request_completed(b.replica_id, "q")
    assert router.book.by_id["b"].load == 0.0 and router.book.by_id["b"].in_flight == 0
    assert choose(router, [b, a], None) == ["b", "a"]  # equal again: candidate order


def test_a_request_without_a_route_or_a_ranking_without_a_request_adds_no_load():
    """No ``route`` keyword: cost 0; choose_replicas without a pending request only ranks."""
    router = make_router()
    a, b = replica("a", 1000), replica("b", 1000)
    assert choose(router, [a, b], request("bare"))[0] == "a"
    assert choose(router, [a, b], None) == ["a", "b"]
    assert [r.load for r in router.book.replicas] == [0.0, 0.0]
    assert router.book.by_id["a"].in_flight == 1  # the bare request is counted, at no cost


def test_a_dead_replica_leaves_the_book_with_its_requests_and_its_successor_starts_empty():
    """on_replica_actor_died forgets the replica; Ray's new replica (a new id) starts with no load."""
    router = make_router()
    a, b = replica("a", 1000), replica("b", 1000)
    for i in range(3):
        router.on_request_routed(request(f"q{i}", 500.0), a.replica_id, None)
    router.on_replica_actor_died(a.replica_id)
    assert "a" not in router.book.by_id
    router.on_request_completed(a.replica_id, "q0")  # Ray reports its requests back: nothing to undo
    router.on_request_routed(request("r", 200.0), b.replica_id, None)
    successor = replica("a2", 1000)
    assert choose(router, [b, successor], None) == ["a2", "b"]


def test_affinity_keeps_a_shared_prefix_on_its_replica_until_it_is_too_far_ahead_and_least_load_does_not():
    """With --router affinity a stage's tasks (one prompt prefix) stay on one replica while its
    pressure is within AFFINITY_SLACK_ITERS of the least; least-load spreads them."""
    cost = 20.0 * KV_TOKENS  # 20 iterations of a full cache
    sticky, spread = make_router("affinity"), make_router("least-load")
    a, b = replica("a"), replica("b")
    got = {
        name: [choose(r, [a, b], request(f"t{i}", cost, prefix="stage-0"))[0] for i in range(6)]
        for name, r in (("affinity", sticky), ("least-load", spread))
    }
    assert got["least-load"] == ["a", "b"] * 3
    # before each choice a holds 0, 20, 40, 60 iterations (within 64 of b's 0), then 80: too far ahead,
    # so the prefix goes to b, which then also holds it and is the lighter
    assert AFFINITY_SLACK_ITERS == 64.0
    assert got["affinity"] == ["a", "a", "a", "a", "b", "b"], got["affinity"]
    assert choose(sticky, [a, b], request("other", cost))[0] == "b"  # no prefix: least load
