"""The small interface every scheduling policy implements, and what a policy may know."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable

from justitia.core.clock import VirtualClock
from justitia.core.cost import NO_CHARGE, Charge
from justitia.core.gittins import CostDist


@dataclass(frozen=True)
class AgentInfo:
    """What a policy knows about an agent when it arrives."""

    agent_id: str
    agent_type: str
    seq: int  # arrival order among agents
    arrival_s: float
    predicted_cost: float  # predicted total cost, in the cost model's unit
    weight: float = 1.0  # its share under weighted fairness (its tenant's, if it has one)
    tenant: str | None = None  # tenants share the engine, agents their tenant's part (None: on its own)
    resume_cost: float | None = None  # an agent resumed after a restart: the work GPS still owed it (<= predicted)
    session: bool = False  # a session, priced burst by burst (docs/sessions.md)
    dist: CostDist | None = None  # its price as a distribution (core.gittins): predicted_cost is its index at 0


@dataclass(frozen=True, eq=False)
class RequestInfo:
    """What a policy knows about one request."""

    request_id: str
    agent_id: str
    seq: int  # arrival order among requests
    prompt_tokens: int
    predicted_cost: float  # predicted cost of this request, in the cost model's unit
    tag: float | None = None  # the front end's tag for it (the ``tagged`` policy orders by it)
    rank: float | None = None  # the front end's rank of its agent inside its tenant (``tagged``, tenants)


class Policy:
    """A scheduling policy: it orders waiting requests; smaller keys are served first.

    Engines call the hooks below; every hook has a do-nothing default. A policy whose keys change
    as service is charged sets ``dynamic = True`` and must be agent-level: its order is
    ``agent_key(agent)`` and then request arrival order inside an agent, and an agent's key must
    move one way only as service is added (the simulator's event skipping relies on it); one whose
    keys only grow sets ``rising = True``, and a key as charged so far is then a lower bound.
    """

    name: ClassVar[str]
    agent_level: ClassVar[bool]
    dynamic: ClassVar[bool] = False
    rising: ClassVar[bool] = False  # dynamic keys only grow as service is added (las, vtc)
    timed: ClassVar[bool] = False  # keys also move with time: engines call ``advance`` before each step
    clock: VirtualClock | None = None  # the GPS clock, for policies that keep one (justitia)
    reports_capacity: ClassVar[bool] = False  # measures M for a clock elsewhere (tagged: the front end's)
    groups: ClassVar[bool] = False  # some agents' requests wait in groups (tenants): group_of, inner_key, group_key
    pools: ClassVar[bool] = False  # a tenant's agents share one service counter (vtc): charged every step
    settles_on_service: ClassVar[bool] = False  # a leaving agent settles at the service it was charged, not at
    # its requests' prices (justitia-guarded: its clock follows the true work whatever the prices)
    # which events it reads (an engine skips the rest): the service charged (``charge``), work revealed
    # past a price (``revise``), an agent queueing again (``backlogged``); tests/core/test_policies.py holds
    # each to the methods its class defines
    holds_place: ClassVar[bool] = False  # an agent whose last open request finished keeps its place in
    # the engine's next admission pass (``AgentScheduler.advance``): justitia, which pampers by tag
    reads_service: ClassVar[bool] = False
    revises: ClassVar[bool] = False
    lifts_on_backlog: ClassVar[bool] = False

    def set_step(self, step_s: float) -> None:
        """The engine's nominal step, one iteration at saturation, in seconds (the core passes it on
        when the engine names it; justitia-guarded reads it)."""

    def request_done(self, req: RequestInfo, output_tokens: int) -> None:
        """A request finished having produced ``output_tokens`` (where the engine says; justitia-guarded
        reads it: a request's decode steps, for ``L``)."""

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """An agent arrived with its predicted cost."""

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """An agent's last request finished (or it was cancelled): drop its state."""

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        """A paused session arrives again: ``agent`` carries its next burst's predicted cost. By
        default the policy keeps what it knows of it (its attained service, its arrival order)."""

    def requests_drained(self, agent_id: str) -> None:
        """The agent has no request open (its last one finished): a session between two calls, or
        an agent between two stages."""

    def requests_opened(self, agent_id: str, now_s: float | None) -> None:
        """The agent had no request open and has one now (a new request arrived at ``now_s``, if
        the engine tells the time)."""

    def backlogged(self, agent_id: str, others: Iterable[str]) -> None:
        """The agent has waiting requests again; ``others`` are the other backlogged agents (a
        dynamic policy's smallest key first)."""

    def charge(self, req: RequestInfo, service: Charge) -> None:
        """The engine scheduled ``service`` for ``req`` in one or more iterations.

        Charges add up, and policies that read them are agent-level: an engine may report the
        service of several requests of one agent in one call, through any of those requests."""

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """A dynamic policy's key for an agent, as if it were charged ``extra`` more."""
        raise NotImplementedError(f"policy '{self.name}' is not dynamic")

    def key(self, req: RequestInfo) -> tuple:
        """The request's priority key now; smaller is served first."""
        return self.key_in_agent(self.agent_key(req.agent_id), req)

    @staticmethod
    def key_in_agent(agent_key: tuple, req: RequestInfo) -> tuple:
        """A dynamic policy's ``key(req)`` from its agent's ``agent_key``, read once for all of them."""
        return agent_key + (req.seq,)

    def set_capacity(self, capacity_per_s: float, now_s: float) -> None:
        """The engine's measured capacity changed (policies with a clock move at the new rate)."""
        if self.clock is not None:
            self.clock.set_capacity(capacity_per_s, now_s)

    def virtual_finish(self, agent_id: str) -> float | None:
        """The agent's GPS virtual finish tag, for policies that keep a clock; None otherwise."""
        return None

    def advance(self, now_s: float) -> Iterable[str]:
        """The engine is about to take a step at ``now_s`` (``timed`` policies): the agents whose key
        moved with time."""
        return ()

    def stamp(self, req: RequestInfo) -> tuple[float, float | None]:
        """What a front end stamps on the request for engines that run ``tagged``: its key's head, and
        its agent's place among its tenant's agents (None: no tenant)."""
        return (float(self.key(req)[0]), None)

    def group_of(self, req: RequestInfo) -> str | None:
        """A grouping policy: the group (tenant) the request waits in, or None (it waits on its own)."""
        return None

    def inner_key(self, req: RequestInfo) -> tuple:
        """A grouping policy: the request's order inside its group (fixed while it waits)."""
        raise NotImplementedError(f"policy '{self.name}' has no groups")

    def group_key(self, group: str, head: RequestInfo) -> tuple:
        """A grouping policy: the group's key among every waiting request's, ``head`` its first request."""
        raise NotImplementedError(f"policy '{self.name}' has no groups")

    def group_filed(self, group: str, key: tuple | None) -> None:
        """A grouping policy: the waiting queue filed the group under ``key`` (None: it has no
        request waiting any more)."""

    def take_dirty(self) -> set[str]:
        """A grouping policy: the groups whose keys moved since the last call (the waiting queue's)."""
        return set()

    def take_moved(self) -> set[str]:
        """The agents whose keys moved at events other than their own service since the last call
        (their group's): an engine that stamps keys on running requests re-keys theirs."""
        return set()

    def revise(self, agent_id: str, revealed_cost: float, remaining_cost: float, now_s: float) -> None:
        """The agent has revealed more work than predicted: ``revealed_cost`` in all (its requests so
        far, at their predicted costs), of which ``remaining_cost`` is not finished."""

    def reprice(self, agent_id: str, index_cost: float, attained: float, now_s: float) -> None:
        """An agent priced as a distribution has attained ``attained`` (the engine's charges, in the
        cost unit) and is now priced at ``index_cost`` (its Gittins index, ``core.gittins``): justitia
        moves its tag to ``S + index_cost / w``, anchored at its start, never forward."""
        self.revise(agent_id, index_cost, max(0.0, index_cost - attained), now_s)

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        """The agent is leaving (``agent_finished`` follows) having asked for ``cost`` in all (its
        finished requests, at their predicted costs)."""


class TenantGroups:
    """The tenants of a grouping policy (justitia, vtc): each tenant's known agents, and the tenants
    whose keys moved since the waiting queue (``take_dirty``) and the engine (``take_moved``) last
    asked."""

    def __init__(self) -> None:
        self.tenant: dict[str, str] = {}  # agents in a tenant -> the tenant
        self._members: dict[str, set[str]] = {}
        self._dirty: set[str] = set()
        self._moved: set[str] = set()

    def join(self, agent_id: str, tenant: str) -> None:
        """The agent arrived in ``tenant``."""
        self.tenant[agent_id] = tenant
        self._members.setdefault(tenant, set()).add(agent_id)

    def leave(self, agent_id: str) -> str | None:
        """The agent is gone; its tenant (None: it had none), and whether it was the tenant's last
        is ``not self.has(tenant)``."""
        tenant = self.tenant.pop(agent_id, None)
        if tenant is not None:
            members = self._members[tenant]
            members.discard(agent_id)
            if not members:
                del self._members[tenant]
        return tenant

    def has(self, tenant: str) -> bool:
        """Whether the tenant has a known agent."""
        return tenant in self._members

    def moved(self, tenant: str) -> None:
        """The tenant's keys moved."""
        self._dirty.add(tenant)
        self._moved.add(tenant)

    def take_dirty(self) -> set[str]:
        """The tenants whose keys moved since the last call."""
        dirty, self._dirty = self._dirty, set()
        return dirty

    def take_moved(self) -> set[str]:
        """The agents of the tenants whose keys moved since the last call."""
        if not self._moved:
            return set()
        moved: set[str] = set()
        for tenant in self._moved:
            moved |= self._members.get(tenant, set())
        self._moved = set()
        return moved
