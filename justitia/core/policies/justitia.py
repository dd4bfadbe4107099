"""Justitia: serve agents in the order of their GPS virtual finish tags (selective pampering), fair
across tenants and pampering within each (hierarchical GPS: ``core.clock``)."""

from justitia.core.clock import VirtualClock
from justitia.core.cost import NO_CHARGE, Charge
from justitia.core.policies.base import AgentInfo, Policy, RequestInfo, TenantGroups


class Justitia(Policy):
    """Each agent gets ``f = V(arrival) + C`` once; all its requests inherit ``f``.

    An agent in a tenant is ordered among its tenant's agents by its inner tag, and across tenants
    by its root key (``VirtualClock.root_key``: when hierarchical GPS finishes it if its tenant gets
    no more work), which moves only at its tenant's events. A tenant is a group of the waiting queue:
    its requests wait in inner-tag order and the tenant is filed under its head's root key, re-read
    when its tenant changes (``take_dirty``)."""

    name = "justitia"  # the paper's rule; ``justitia-guarded`` adds the lag guard (policies.guarded)
    agent_level = True
    groups = True
    revises = True
    holds_place = True  # the agent at the front keeps its place across a hand-off (AgentScheduler.advance)

    def __init__(self, capacity_per_s: float, chained: bool = False) -> None:
        """``chained``: a tenant serves its agents in arrival order (``justitia-chained``, the rule
        before hierarchical GPS, kept to compare against)."""
        self.clock = VirtualClock(capacity_per_s, record=False, chained=chained)  # engines may run for days
        self._chained = chained
        if chained:
            self.name = "justitia-chained"
        self._tags: dict[str, tuple[float, int]] = {}  # agent -> (its tag when stamped, arrival order)
        self._groups = TenantGroups()  # tenants whose root keys moved: take_dirty, take_moved
        self._tenant = self._groups.tenant  # agents in a tenant -> the tenant
        self._inner: dict[str, float] = {}  # agents in a tenant -> their inner tag
        self._sessions: set[str] = set()  # sessions: a burst that reveals more retags from its start too
        self._priced: dict[str, tuple[float, float, float]] = {}  # priced as distributions: (S, w, GPS cost)

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Stamp the agent with its virtual finish tag (in a tenant: its inner tag, and its root key)."""
        # a resumed agent is stamped with the work GPS still owed it (its place before the restart)
        owed = agent.predicted_cost if agent.resume_cost is None else agent.resume_cost
        tag = self._arrive(agent, owed, now_s)
        self._tags[agent.agent_id] = (tag, agent.seq)
        if agent.session:
            self._sessions.add(agent.agent_id)
        if agent.tenant is not None:
            self._groups.join(agent.agent_id, agent.tenant)
            self._inner[agent.agent_id] = agent.seq if self._chained else self.clock.inner_tag(agent.agent_id)
            self._groups.moved(agent.tenant)

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        """A paused session's next burst: stamped as an arrival, behind its earlier work if GPS has
        not finished it (``VirtualClock.arrive``), in its arrival order."""
        tag = self._arrive(agent, agent.predicted_cost, now_s)
        self._tags[agent.agent_id] = (tag, agent.seq)
        if agent.tenant is not None:
            self._inner[agent.agent_id] = agent.seq if self._chained else self.clock.inner_tag(agent.agent_id)
            self._groups.moved(agent.tenant)

    def _arrive(self, agent: AgentInfo, cost: float, now_s: float) -> float:
        """Stamp the agent on the clock; its tag. An agent priced as a distribution (without a
        tenant) counts in GPS as the distribution's largest value (``_priced``: it is active until it
        leaves, when it settles at what it asked for), and is ordered by its index, ``S + cost / w``."""
        if agent.dist is None or agent.tenant is not None:
            self._priced.pop(agent.agent_id, None)
            return self.clock.arrive(agent.agent_id, cost, now_s, agent.weight, agent.tenant)
        self.clock.arrive(agent.agent_id, max(cost, agent.dist.top), now_s, agent.weight)
        start = self.clock.start(agent.agent_id)
        self._priced[agent.agent_id] = (start, agent.weight, max(cost, agent.dist.top))
        return start + cost / agent.weight

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent's tag (the clock keeps it as ``settle`` left it)."""
        self._tags.pop(agent_id, None)
        self._sessions.discard(agent_id)
        self._priced.pop(agent_id, None)
        self._inner.pop(agent_id, None)
        self._groups.leave(agent_id)

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        """GPS keeps a leaving agent no longer than the work it asked for (``VirtualClock.settle``)."""
        self.clock.settle(agent_id, cost, now_s)
        if agent_id in self._tenant:
            self._groups.moved(self._tenant[agent_id])

    def revise(self, agent_id: str, revealed_cost: float, remaining_cost: float, now_s: float) -> None:
        """An agent that reveals more work than its tag assumed moves back to where an agent arriving
        now with its remaining work would be: ``f = max(f, V(now) + remaining / w)`` (in a tenant, its
        inner tag); requests queued from now on carry the new tag."""
        self._retag(agent_id, remaining_cost, now_s, revealed_cost if agent_id in self._sessions else None, False)

    def reprice(self, agent_id: str, index_cost: float, attained: float, now_s: float) -> None:
        """An agent priced as a distribution, repriced at its Gittins index having attained
        ``attained``: ``f = max(f, S + index / w)``, anchored at its GPS start (never at ``V(now)``:
        a burst the engine has delayed is not pushed further back for it)."""
        priced = self._priced.get(agent_id)
        entry = self._tags.get(agent_id)
        if priced is None or entry is None:
            self._retag(agent_id, max(0.0, index_cost - attained), now_s, index_cost, True)
            return
        start, weight, counted = priced
        if 2 * attained > counted:  # past its distribution: it stays active in GPS while it runs
            counted = 2 * attained
            self.clock.retag(agent_id, 0.0, now_s, counted, anchored=True)
            self._priced[agent_id] = (start, weight, counted)
        tag = start + index_cost / weight
        if tag > entry[0]:
            self._tags[agent_id] = (tag, entry[1])

    def _retag(
        self, agent_id: str, remaining_cost: float, now_s: float, revealed_cost: float | None, anchored: bool
    ) -> None:
        entry = self._tags.get(agent_id)
        if entry is None:
            return
        tag = self.clock.retag(agent_id, remaining_cost, now_s, revealed_cost, anchored=anchored)
        tenant = self._tenant.get(agent_id)
        if tenant is not None:
            if tag is not None and tag > self._inner[agent_id] and not self._chained:
                self._inner[agent_id] = tag
            self._groups.moved(tenant)
        elif tag is not None and tag > entry[0]:
            self._tags[agent_id] = (tag, entry[1])

    def virtual_finish(self, agent_id: str) -> float | None:
        """The tag that orders the agent now (in a tenant, its root key), or None if it is not known."""
        entry = self._tags.get(agent_id)
        if entry is None:
            return None
        return self.clock.root_key(agent_id) if agent_id in self._tenant else entry[0]

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """The agent's tag (in a tenant, its root key now), then its arrival order."""
        entry = self._tags.get(agent_id)
        if entry is None:
            return (float("inf"), 0)
        if agent_id in self._tenant:
            return (self.clock.root_key(agent_id), entry[1])
        return entry

    def key(self, req: RequestInfo) -> tuple:
        """Finish tag (in a tenant, root key now), then agent arrival order, then request arrival order."""
        if req.agent_id in self._tenant:
            return self.agent_key(req.agent_id) + (req.seq,)
        return self._tags.get(req.agent_id, (float("inf"), req.seq)) + (req.seq,)

    def stamp(self, req: RequestInfo) -> tuple[float, float | None]:
        """The agent's tag (in a tenant: its root key now, and its inner tag as its rank)."""
        return (float(self.key(req)[0]), self._inner.get(req.agent_id))

    # the waiting queue's groups: tenants
    def group_of(self, req: RequestInfo) -> str | None:
        """The request's tenant, or None."""
        return self._tenant.get(req.agent_id)

    def inner_key(self, req: RequestInfo) -> tuple:
        """Order inside a tenant: inner tag, agent arrival order, request arrival order."""
        return (self._inner.get(req.agent_id, float("inf")), self._tags.get(req.agent_id, (0.0, 0))[1], req.seq)

    def group_key(self, group: str, head: RequestInfo) -> tuple:
        """A tenant's place among everyone: its head request's key."""
        return self.key(head)

    def take_dirty(self) -> set[str]:
        """The tenants whose root keys moved since the last call."""
        return self._groups.take_dirty()

    def take_moved(self) -> set[str]:
        """The agents of the tenants whose root keys moved since the last call."""
        return self._groups.take_moved()
