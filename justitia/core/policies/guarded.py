"""Justitia with the lag guard (``justitia-guarded``): selective pampering in tag order, except that an agent
(or a tenant) the engine has left more than ``L`` seconds behind GPS's pace goes first, the most
behind first (``core.guard``; docs/design.md, "A bound that holds whatever the prices").

Keys are 5-tuples ``(urgent?, when, urgent inside?, inner, arrival order)``, lower first:

- an agent on its own: urgent ``(0, T_j, 0, 0, seq)``, ``T_j`` the time its clock reached its pace
  point; else ``(1, f_j, 1, 0, seq)``, its tag (the paper's order);
- an agent in a tenant: the tenant's part first, urgent ``(0, T_k, ...)`` (the tenant's own pace
  at the root), else ``(1, ρ_j, ...)``, the agent's root key (its tenant's pampering, one level
  down), where an agent urgent in its tenant's inner clock takes its tenant's first root key; then
  the inner part, ``(0, E_j)`` urgent inside (its inner pace point), else ``(1, f_j)``, its inner
  tag.

Keys rise with service (a pace point only moves on), and fall with time (``advance``: the agents
that became urgent, and those whose tenant's keys moved), so the policy is dynamic, rising and
timed. With true prices no agent falls ``L`` behind in practice and the order is the paper's.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from justitia.core.cost import KV, NO_CHARGE, Charge, CostModel
from justitia.core.guard import GUARD_FACTOR, Trace
from justitia.core.policies.base import AgentInfo, Policy
from justitia.core.policies.justitia import Justitia

_URGENT_STAMP = 1e12  # a front end's stamp for an urgent agent: its due time less this (before any tag)


class GuardedJustitia(Justitia):
    """Justitia's tags behind a lag guard: the paper's order, and a bound whatever the prices."""

    name = "justitia-guarded"
    dynamic = True
    rising = True
    timed = True
    groups = False  # a tenant's agents are keyed one by one (their keys move at the tenant's events)

    def __init__(self, capacity_per_s: float, cost: CostModel = KV, lag_factor: float = GUARD_FACTOR,
                 scale: float = 0.0) -> None:
        """``scale``: the largest burst of work (cost units) this deployment has seen before, to start
        from (0: cold; the guard learns it from the service it charges, never from a price)."""
        super().__init__(capacity_per_s)
        self.cost = cost
        self.lag_factor = lag_factor
        self.lag_s = 0.0  # L, as of the last advance
        self.lag_max_s = 0.0  # the largest L it ran at: the bound it kept is 2 c_max + this
        self._largest = float(scale)  # the largest burst's attained service seen (a price never counts)
        self._pace: dict[str, list] = {}  # agent -> [S in its own clock, w, attained this burst, tenant]
        self._urgent: set[str] = set()
        self._watch: dict[str | None, list[tuple[float, str]]] = {}  # own clock -> (pace point, agent) heap
        self._root = Trace()  # t -> V
        self._inner_traces: dict[str, Trace] = {}  # tenant -> (root V -> its inner V)
        self._vlag = 0.0  # V(now - L)
        self._vlag_in: dict[str, float] = {}  # tenant -> its inner V at root V(now - L)
        self._tpace: dict[str, list] = {}  # tenant -> [G: start at the root, W, attained since G]
        self._turgent: set[str] = set()
        self._now_s = 0.0

    # ------------------------------------------------------------------------------ agents
    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        self._tenant_starts(agent, now_s)
        super().agent_arrived(agent, now_s)
        self._paced(agent)

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        self._tenant_starts(agent, now_s)
        super().agent_returned(agent, now_s)
        self._urgent.discard(agent.agent_id)
        self._paced(agent)

    def _tenant_starts(self, agent: AgentInfo, now_s: float) -> None:
        """A tenant that is not active in GPS starts its pace anew: at V, or where its earlier pace
        ended if that is later (it ran ahead of GPS)."""
        tenant = agent.tenant
        if tenant is None:
            return
        v = self.clock.virtual_time(now_s)
        if self.clock.tenant_active(tenant) and tenant in self._tpace:
            return
        pace = self._tpace.get(tenant)
        start = v if pace is None else max(v, pace[0] + pace[2] / pace[1])
        self._tpace[tenant] = [start, agent.weight, 0.0]
        self._turgent.discard(tenant)

    def _paced(self, agent: AgentInfo) -> None:
        start = self.clock.pace_start(agent.agent_id)
        if start is None:
            return
        self._pace[agent.agent_id] = [start, agent.weight, 0.0, agent.tenant]
        heapq.heappush(self._watch.setdefault(agent.tenant, []), (start, agent.agent_id))

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        pace = self._pace.pop(agent_id, None)
        self._urgent.discard(agent_id)
        super().agent_finished(agent_id, now_s)
        if pace is not None and pace[3] is not None and not self._groups.has(pace[3]):
            self._inner_traces.pop(pace[3], None)  # the tenant's pace is kept: it may come back
            self._vlag_in.pop(pace[3], None)
            self._watch.pop(pace[3], None)

    def charge(self, req, service: Charge) -> None:
        """The pace point moves on; an urgent agent (or tenant) that caught up is no longer urgent."""
        pace = self._pace.get(req.agent_id)
        if pace is None:
            return
        amount = self.cost.service(service)
        pace[2] += amount
        if pace[2] > self._largest:
            self._largest = pace[2]
        tenant = pace[3]
        if req.agent_id in self._urgent and pace[0] + pace[2] / pace[1] >= self._own_vlag(tenant):
            self._urgent.discard(req.agent_id)
            heapq.heappush(self._watch.setdefault(tenant, []), (pace[0] + pace[2] / pace[1], req.agent_id))
        if tenant is not None:
            tp = self._tpace[tenant]
            tp[2] += amount
            if tenant in self._turgent and tp[0] + tp[2] / tp[1] >= self._vlag:
                self._turgent.discard(tenant)
                self._groups.moved(tenant)

    def _own_vlag(self, tenant: str | None) -> float:
        return self._vlag if tenant is None else self._vlag_in.get(tenant, float("-inf"))

    # ------------------------------------------------------------------------------- time
    def advance(self, now_s: float) -> Iterable[str]:
        """Read V now, set ``L`` and ``V(now - L)``; the agents that became urgent (or stopped being
        so: ``L`` grew), and those whose tenant's keys moved."""
        self._now_s = now_s
        clock = self.clock
        v = clock.virtual_time(now_s)
        self.lag_s = self.lag_factor * self._largest / clock.capacity
        if self.lag_s > self.lag_max_s:
            self.lag_max_s = self.lag_s
        keep_s = 2 * self.lag_s + 1.0
        self._root.add(now_s, v, keep_s)
        old = self._vlag
        self._vlag = self._root.at(now_s - self.lag_s)
        moved: list[str] = []
        for tenant in list(self._watch):
            if tenant is None:
                continue
            inner_v = clock.inner_time(tenant)
            if inner_v is None:
                continue
            trace = self._inner_traces.setdefault(tenant, Trace())
            trace.add(v, inner_v, max(v - self._root.at(now_s - keep_s), 0.0) + 1.0)
            self._vlag_in[tenant] = trace.at(self._vlag)
        if self._vlag < old:  # L grew: some urgent agents may be within L again
            for agent_id in list(self._urgent):
                pace = self._pace[agent_id]
                if pace[0] + pace[2] / pace[1] >= self._own_vlag(pace[3]):
                    self._urgent.discard(agent_id)
                    heapq.heappush(self._watch.setdefault(pace[3], []), (pace[0] + pace[2] / pace[1], agent_id))
                    moved.append(agent_id)
        for tenant, heap in self._watch.items():
            vlag = self._own_vlag(tenant)
            while heap and heap[0][0] < vlag:
                _, agent_id = heapq.heappop(heap)
                pace = self._pace.get(agent_id)
                if pace is None or agent_id in self._urgent or pace[3] != tenant:
                    continue
                point = pace[0] + pace[2] / pace[1]
                if point < vlag:
                    self._urgent.add(agent_id)
                    moved.append(agent_id)
                else:
                    heapq.heappush(heap, (point, agent_id))
        for tenant, tp in self._tpace.items():
            urgent = tp[0] + tp[2] / tp[1] < self._vlag and self._groups.has(tenant)
            if urgent != (tenant in self._turgent):
                (self._turgent.add if urgent else self._turgent.discard)(tenant)
                self._groups.moved(tenant)
        return moved + list(self._groups.take_moved())

    # ------------------------------------------------------------------------------- keys
    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        entry = self._tags.get(agent_id)
        pace = self._pace.get(agent_id)
        if entry is None or pace is None:
            return (1, float("inf"), 1, float("inf"), 0)
        more = 0.0 if extra is NO_CHARGE else self.cost.service(extra)
        point = pace[0] + (pace[2] + more) / pace[1]
        tenant = pace[3]
        if tenant is None:
            if agent_id in self._urgent and point < self._vlag:
                return (0, self._root.when(point), 0, 0.0, entry[1])
            return (1, entry[0], 1, 0.0, entry[1])
        inside = agent_id in self._urgent and point < self._vlag_in.get(tenant, float("-inf"))
        inner = (0, point) if inside else (1, self._inner.get(agent_id, float("inf")))
        tp = self._tpace[tenant]
        if tenant in self._turgent and tp[0] + (tp[2] + more) / tp[1] < self._vlag:
            return (0, self._root.when(tp[0] + (tp[2] + more) / tp[1])) + inner + (entry[1],)
        root = self.clock.root_key(agent_id)
        if inside:
            head = self.clock.head_key(tenant)
            if head is not None and head < root:
                root = head
        return (1, root) + inner + (entry[1],)

    key = Policy.key  # agent-level: the agent's key, then request arrival order

    def stamp(self, req) -> tuple[float, float | None]:
        """For an engine that runs ``tagged``: an urgent agent's due time far ahead of every tag."""
        key = self.agent_key(req.agent_id)
        head = key[1] - _URGENT_STAMP if key[0] == 0 else key[1]
        return (float(head), self._inner.get(req.agent_id))

    def group_of(self, req) -> str | None:
        return None

    def urgent(self, agent_id: str) -> bool:
        """Whether the agent (or its tenant) is urgent now: the guard put it ahead of the tags."""
        return self.agent_key(agent_id)[0] == 0 or self.agent_key(agent_id)[2] == 0

    @property
    def scale(self) -> float:
        """The largest burst of work seen (what ``L`` is made of), to keep for the next start."""
        return self._largest
