"""``JustitiaRouter``: Ray Serve's ``RequestRouter`` for engine replicas, by ``justitia.core.routing``.

Ray Serve calls ``choose_replicas`` for each request sent through a deployment handle, in the
process that holds the handle (the server). The router keeps a ``core.routing.Replicas`` book: a
request counts its predicted KV token-time on the replica it was routed to until Ray reports it
completed (``on_request_completed``), counted from the moment it is chosen (Ray chooses for many
requests before it sends any), and the router ranks the candidates by that book's rule
(``least-load`` by default; ``affinity`` sends a prefix back to the replica that served it while
that replica is not too loaded; ``round-robin``). The same rule routes the simulator's cluster.

A request says what the router needs in its ``route`` keyword argument: ``{"cost": predicted KV
token-time, "prefix": a key or None}`` (``EngineReplica.generate``). Configure with
``RequestRouterConfig(request_router_class=JustitiaRouter, request_router_kwargs={"router":
NAME, "kv_tokens": TOKENS})``; ``kv_tokens`` is one replica's KV cache.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from justitia.core import ReplicaLoad, Replicas, RouteRequest


class JustitiaRouter(RequestRouter):
    """Routes by predicted KV token-time per KV token (``core.routing``)."""

    def initialize_state(self, router: str = "least-load", kv_tokens: int = 1, **_):
        """Ray passes ``request_router_kwargs`` here."""
        self.book = Replicas(router=router)
        self.kv_tokens = int(kv_tokens)

    def _load(self, replica_id: ReplicaID) -> ReplicaLoad:
        key = replica_id.unique_id
        load = self.book.by_id.get(key)
        if load is None:
            load = ReplicaLoad(key, self.kv_tokens)
            self.book.add(load)
        return load

    @staticmethod
    def _request(pending_request: PendingRequest | None) -> RouteRequest:
        route = (pending_request.kwargs.get("route") if pending_request is not None else None) or {}
        request_id = pending_request.metadata.internal_request_id if pending_request is not None else ""
        return RouteRequest(request_id, float(route.get("cost") or 0.0), route.get("prefix"))

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """The candidates, best first, one to a rank (Ray tries them in turn)."""
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = []
        for r in candidate_replicas:
            load = self._load(r.replica_id)
            kv_tokens = (r.routing_stats or {}).get("kv_tokens")
            if kv_tokens:
                load.kv_tokens = int(kv_tokens)
            loads.append(load)
        request = self._request(pending_request)
        ranked = self.book.router.order(loads, request)
        if ranked and pending_request is not None:  # Ray routes many requests at once: count the choice now
            self.book.sent(request, ranked[0].replica_id)
        return [[by_id[load.replica_id]] for load in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        """The request went to ``replica_id``: its cost counts there."""
        self._load(replica_id)
        self.book.sent(self._request(pending_request), replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request is back (answered or failed): its cost no longer counts."""
        self.book.done(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """A dead replica leaves the book (Ray starts another, under a new id)."""
        super().on_replica_actor_died(replica_id)
        self.book.remove(replica_id.unique_id)
