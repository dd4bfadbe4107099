"""Routing requests over several engines (replicas): one rule for the simulator's cluster, the Ray
Serve request router and ``--upstream``.

``Replicas`` keeps, for each replica, the predicted KV token-time of the requests sent to it and
not yet finished (its ``load``), and a few prefixes it has served lately. A ``Router`` picks a
replica for each request from that book; the engine calls ``Replicas.sent`` when the request goes
and ``Replicas.done`` when it comes back (finished, failed or aborted).

Routers (``ROUTER_NAMES``):

    least-load   the replica with the least outstanding predicted KV token-time per KV token
                 (``pressure``: iterations of a full cache's work queued there); ties by replica order
    affinity     least-load, except that a request whose prefix a replica served lately goes there
                 while that replica's pressure exceeds the least by at most ``AFFINITY_SLACK_ITERS``
                 (its prefix cache may hold the prefix: the tasks of one stage share their
                 instructions, a self-consistency vote its whole prompt)
    round-robin  each replica in turn, whatever its load (the baseline)

Units: ``load`` is in the cost model's unit (KV token-iterations), ``kv_tokens`` in tokens, so
``pressure`` is in iterations.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

AFFINITY_SLACK_ITERS = 64.0  # the replica holding a prefix keeps it while its pressure <= the least + this
PREFIXES_KEPT = 256  # prefixes remembered per replica (most recent)


@dataclass(eq=False)
class ReplicaLoad:
    """One replica as a router sees it."""

    replica_id: str
    kv_tokens: int
    load: float = 0.0  # predicted KV token-time of the requests in flight there
    in_flight: int = 0
    sent_total: int = 0
    alive: bool = True  # a replica out of routing (dead, or its breaker open) is chosen only if none is alive
    prefixes: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def pressure(self, extra: float = 0.0) -> float:
        """Outstanding predicted KV token-time per KV token (with ``extra`` more), in iterations."""
        return (self.load + extra) / max(1, self.kv_tokens)


@dataclass(frozen=True)
class RouteRequest:
    """What a router knows about a request: its predicted cost and its prefix (None: no affinity)."""

    request_id: str
    predicted_cost: float
    prefix: str | None = None


class Router:
    """Picks the replica for one request."""

    name = "router"

    def order(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> list[ReplicaLoad]:
        """The replicas to try, best first (live ones before the rest)."""
        raise NotImplementedError

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> ReplicaLoad:
        """The best replica."""
        return self.order(replicas, request)[0]


class LeastLoad(Router):
    """The replica with the least outstanding predicted KV token-time per KV token."""

    name = "least-load"

    def order(self, replicas, request):
        """Live replicas by pressure, then the others by pressure."""
        idx = {id(r): i for i, r in enumerate(replicas)}
        return sorted(replicas, key=lambda r: (not r.alive, r.pressure(), idx[id(r)]))


class Affinity(LeastLoad):
    """Least-load, but a prefix goes back to the replica that served it lately unless that replica's
    pressure exceeds the least by more than ``slack_iters`` (a full cache's work for that many steps)."""

    name = "affinity"

    def __init__(self, slack_iters: float = AFFINITY_SLACK_ITERS):
        self.slack_iters = slack_iters

    def order(self, replicas, request):
        """The prefix's replica first when it is not too loaded; then least-load order."""
        ranked = super().order(replicas, request)
        if request.prefix is None or not ranked:
            return ranked
        best = ranked[0]
        bound = best.pressure() + self.slack_iters
        for r in ranked:
            if r.alive and request.prefix in r.prefixes and r.pressure() <= bound:
                return [r] + [x for x in ranked if x is not r]
        return ranked


class RoundRobin(Router):
    """Each live replica in turn."""

    name = "round-robin"

    def __init__(self):
        self._next = 0

    def order(self, replicas, request):
        """Starting from the next replica in turn; live ones first."""
        n = len(replicas)
        start = self._next % max(1, n)
        self._next += 1
        turn = [replicas[(start + i) % n] for i in range(n)]
        return sorted(turn, key=lambda r: not r.alive)


ROUTER_NAMES = ("least-load", "affinity", "round-robin")


def make_router(name: str) -> Router:
    """The router called ``name``."""
    classes = {"least-load": LeastLoad, "affinity": Affinity, "round-robin": RoundRobin}
    if name not in classes:
        raise ValueError(f"unknown router '{name}'; expected one of: {', '.join(ROUTER_NAMES)}.")
    return classes[name]()


class Replicas:
    """The load book of a set of replicas: what each has been sent and not finished."""

    def __init__(self, replicas: Sequence[ReplicaLoad] = (), router: Router | str = "least-load"):
        self.replicas = list(replicas)
        self.by_id = {r.replica_id: r for r in self.replicas}
        if len(self.by_id) != len(self.replicas):
            raise ValueError("replica ids must be unique.")
        self.router = make_router(router) if isinstance(router, str) else router
        self._open: dict[str, tuple[ReplicaLoad, float]] = {}  # request id -> (replica, its cost)

    @property
    def kv_tokens(self) -> int:
        """The replicas' KV caches together, in tokens."""
        return sum(r.kv_tokens for r in self.replicas)

    def add(self, replica: ReplicaLoad) -> None:
        """A new replica (a restarted one comes back under a new id)."""
        if replica.replica_id in self.by_id:
            raise ValueError(f"replica '{replica.replica_id}' is already known.")
        self.replicas.append(replica)
        self.by_id[replica.replica_id] = replica

    def remove(self, replica_id: str) -> None:
        """A replica that is gone: its open requests no longer count anywhere."""
        r = self.by_id.pop(replica_id, None)
        if r is None:
            return
        self.replicas.remove(r)
        for request_id in [q for q, (x, _) in self._open.items() if x is r]:
            del self._open[request_id]

    def order(self, request: RouteRequest, exclude: frozenset | set = frozenset()) -> list[ReplicaLoad]:
        """The replicas to try for ``request``, best first, leaving out ``exclude`` (ids)."""
        left = [r for r in self.replicas if r.replica_id not in exclude]
        return self.router.order(left, request) if left else []

    def choose(self, request: RouteRequest, exclude: frozenset | set = frozenset()) -> ReplicaLoad | None:
        """The replica the router picks (None if ``exclude`` leaves none)."""
        ranked = self.order(request, exclude)
        return ranked[0] if ranked else None

    def sent(self, request: RouteRequest, replica_id: str) -> None:
        """The request went to ``replica_id``: its predicted cost counts there until ``done``."""
        open_on = self._open.get(request.request_id)
        if open_on is not None:
            if open_on[0].replica_id == replica_id:  # counted there already (a router's tentative choice)
                return
            self.done(request.request_id)
        r = self.by_id[replica_id]
        r.load += request.predicted_cost
        r.in_flight += 1
        r.sent_total += 1
        if request.prefix is not None:
            r.prefixes[request.prefix] = None
            r.prefixes.move_to_end(request.prefix)
            if len(r.prefixes) > PREFIXES_KEPT:
                r.prefixes.popitem(last=False)
        self._open[request.request_id] = (r, request.predicted_cost)

    def done(self, request_id: str) -> ReplicaLoad | None:
        """The request is back (finished, failed or aborted); its replica, if it was open."""
        entry = self._open.pop(request_id, None)
        if entry is None:
            return None
        r, cost = entry
        r.load -= cost
        r.in_flight -= 1
        if r.in_flight == 0:
            r.load = 0.0  # no float residue on an idle replica
        return r

    def route(self, request: RouteRequest) -> ReplicaLoad:
        """Choose a replica and count the request there (``done`` it later)."""
        r = self.choose(request)
        if r is None:
            raise ValueError("no replica to route to.")
        self.sent(request, r.replica_id)
        return r
