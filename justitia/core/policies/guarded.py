"""Justitia with the lag guard (``justitia-guarded``): selective pampering in tag order, except that an
agent (or a tenant) the engine has left more than ``L`` seconds behind its fair pace goes first, the
most behind first (``core.guard``; docs/design.md, "A bound that holds whatever the prices").

- **An agent on its own** is watched on the GPS clock: its pace point ``E = S + a / w`` (its GPS
  start, plus the service charged to it over its weight); urgent once ``E < V(now - L)``.
- **A tenant** is watched on ``R``, the engine shared by weight among the root entries present (each
  tenant with an agent in the engine, each agent without one): its pace point is where it started
  in ``R`` plus the service charged to its agents over its weight; urgent once ``P < R(now - L)``.
  ``R`` reads no price. Inside a tenant the paper's order is kept (its pampering schedule).

Keys are ``(urgent?, when, tag, arrival order)``, lower first: urgent ``(0, T, ...)``, ``T`` the time
the clock reached the pace point (EDF on it); else ``(1, f, ...)``, the agent's tag (in a tenant,
its root key). A tenant's requests wait as a group of the waiting queue, in inner-tag order, filed
under its head's key. Keys rise with service (a pace point only moves on) and fall with time
(``advance``: the agents that became urgent; a tenant that did is marked moved), so the policy is
dynamic, rising and timed.

Its clock follows the true work whatever the prices: a leaving agent settles at the service it was
charged (``settles_on_service``), an agent is counted in GPS at no more than the largest burst
served so far, and one served past what GPS counts it for stays active while it runs.
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
    groups = True  # a tenant's requests wait together (the tenant filed under its head's key)
    settles_on_service = True  # its clock's N_t follows the true work: a leaving agent settles at its service

    def __init__(
        self, capacity_per_s: float, cost: CostModel = KV, lag_factor: float = GUARD_FACTOR, scale: float = 0.0
    ) -> None:
        """``scale``: the largest burst of work (cost units) this deployment has seen before, to start
        from (0: cold; the guard learns it from the service it charges, never from a price)."""
        super().__init__(capacity_per_s)
        self.cost = cost
        self.lag_factor = lag_factor
        self.lag_s = 0.0  # L, as of the last advance
        self.lag_max_s = 0.0  # the largest L it ran at: the bound it kept is 2 c_max + this
        self._largest = float(scale)  # L's scale: the largest burst's attained service seen (a session's:
        # its work as it came, between two moments with no request open); a price never counts
        self._cap = float(scale)  # the largest whole burst served (a session's: a turn): GPS counts none past it
        self._now_s = 0.0
        # agents on their own: pace on the GPS clock
        self._pace: dict[str, list] = {}  # agent -> [S, w, attained this burst, tenant, attained since it
        # last had no request open, session?]
        self._urgent: set[str] = set()
        self._watch: list[tuple[float, str]] = []  # (pace point, agent) of agents not urgent
        self._root = Trace()  # t -> V
        self._vlag = 0.0  # V(now - L)
        # tenants: pace on R
        self._r, self._r_t, self._present_w = 0.0, None, 0.0
        self._present: dict[str, float] = {}  # root entries present -> their weight
        self._rtrace = Trace()  # t -> R
        self._rlag = 0.0  # R(now - L)
        self._tpace: dict[str, list] = {}  # tenant -> [its start in R, W, attained since]
        self._tenants_in: set[str] = set()  # the tenants present (each step reads only theirs)
        self._turgent: set[str] = set()
        self._measured: list[float] | None = None  # [start, ∫M dt since, last M, its time]

    # ------------------------------------------------------------------------------ agents
    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        self._comes_in(agent, now_s)
        super().agent_arrived(agent, now_s)
        self._paced(agent)

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        """A session's next burst: its pace starts again from its new GPS start."""
        self._comes_in(agent, now_s)
        super().agent_returned(agent, now_s)
        self._urgent.discard(agent.agent_id)
        self._paced(agent)

    def _arrive(self, agent: AgentInfo, cost: float, now_s: float) -> float:
        """Ordered by its price as the paper's rule orders it, but counted in GPS at no more than the
        largest burst the engine has served (a price past it is a guess no agent has borne out), so
        an over-priced agent does not hold V back for everyone's pace."""
        cap = self._cap
        if agent.tenant is not None or cap <= 0:
            return super()._arrive(agent, cost, now_s)
        counted = min(max(cost, agent.dist.top) if agent.dist is not None else cost, cap)
        self.clock.arrive(agent.agent_id, counted, now_s, agent.weight)
        start = self.clock.start(agent.agent_id)
        self._priced[agent.agent_id] = (start, agent.weight, counted)
        return start + cost / agent.weight

    def _paced(self, agent: AgentInfo) -> None:
        """An agent on its own is watched from its GPS start, with no service yet."""
        if agent.tenant is None:
            start = self.clock.start(agent.agent_id)
            if start is not None:
                self._pace[agent.agent_id] = [start, agent.weight, 0.0, None, 0.0, agent.session]
                heapq.heappush(self._watch, (start, agent.agent_id))
        else:
            self._pace[agent.agent_id] = [0.0, agent.weight, 0.0, agent.tenant, 0.0, agent.session]

    def _comes_in(self, agent: AgentInfo, now_s: float) -> None:
        """Its root entry is present. A tenant that was not starts its pace again at R, or where its
        earlier pace ended if that is later (it ran ahead of its share)."""
        self._now_s = max(self._now_s, now_s)
        tenant = agent.tenant
        if tenant is None:
            self._presence(agent.agent_id, agent.weight, True)
            return
        if tenant in self._present:
            return
        self._presence(tenant, agent.weight, True)
        self._tenants_in.add(tenant)
        pace = self._tpace.get(tenant)
        start = self._r if pace is None else max(self._r, pace[0] + pace[2] / pace[1])
        self._tpace[tenant] = [start, agent.weight, 0.0]
        self._turgent.discard(tenant)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        pace = self._pace.pop(agent_id, None)
        self._urgent.discard(agent_id)
        super().agent_finished(agent_id, now_s)
        self._now_s = max(self._now_s, now_s)
        tenant = pace[3] if pace is not None else None
        if tenant is None:
            self._presence(agent_id, 0.0, False)
        elif not self._groups.has(tenant):
            self._presence(tenant, 0.0, False)
            self._tenants_in.discard(tenant)
            self._turgent.discard(tenant)

    def _presence(self, entry: str, weight: float, present: bool) -> None:
        """A root entry comes into the engine or leaves it (R moved to now at the weight before)."""
        if present == (entry in self._present):
            return
        self._r_to(self._now_s)
        if present:
            self._present[entry] = weight
            self._present_w += weight
        else:
            self._present_w -= self._present.pop(entry)
            if not self._present:
                self._present_w = 0.0

    def _r_to(self, now_s: float) -> float:
        """R moved to ``now_s`` at the clock's M over the weight present."""
        if self._r_t is None:
            self._r_t = now_s
        elif now_s > self._r_t:
            if self._present_w > 0:
                self._r += self.clock.capacity * (now_s - self._r_t) / self._present_w
            self._r_t = now_s
        return self._r

    def charge(self, req, service: Charge) -> None:
        """The pace point moves on; an urgent agent (or tenant) that caught up is no longer urgent."""
        pace = self._pace.get(req.agent_id)
        if pace is None:
            return
        amount = self.cost.service(service)
        pace[2] += amount
        pace[4] += amount
        burst = pace[4] if pace[5] else pace[2]
        if burst > self._largest:
            self._largest = burst
        if pace[2] > self._cap:
            self._cap = pace[2]
        tenant = pace[3]
        if tenant is not None:
            tp = self._tpace[tenant]
            tp[2] += amount
            if tenant in self._turgent and tp[0] + tp[2] / tp[1] >= self._rlag:
                self._turgent.discard(tenant)
                self._groups.moved(tenant)
            return
        priced = self._priced.get(req.agent_id)
        if priced is not None and pace[2] > priced[2]:  # served past what GPS counts it for: it stays
            self._priced[req.agent_id] = (priced[0], priced[1], 2 * pace[2])  # active while it runs
            self.clock.retag(req.agent_id, 0.0, max(self._now_s, self.clock.now_s), 2 * pace[2], anchored=True)
        if req.agent_id in self._urgent and pace[0] + pace[2] / pace[1] >= self._vlag:
            self._urgent.discard(req.agent_id)
            heapq.heappush(self._watch, (pace[0] + pace[2] / pace[1], req.agent_id))

    def requests_drained(self, agent_id: str) -> None:
        """A session's work as it came ends when it has no request open (a burst of the GPS yardstick,
        docs/sessions.md): the next one's service counts from 0 for ``L``'s scale."""
        pace = self._pace.get(agent_id)
        if pace is not None and pace[5]:
            pace[4] = 0.0

    def requests_opened(self, agent_id: str, now_s: float | None) -> None:
        """A session on its own sends work again after none was open (a tool ran, or its user): as
        in GPS, where it left and came back, its pace starts again at ``V(now)`` if it fell behind
        while it had nothing to run (a wait the engine did not cause does not make it urgent)."""
        pace = self._pace.get(agent_id)
        if pace is None or not pace[5] or pace[3] is not None:
            return
        self._now_s = max(self._now_s, now_s or 0.0)
        v = self.clock.virtual_time(self._now_s)
        if pace[0] + pace[2] / pace[1] < v:
            pace[0], pace[2] = v, 0.0
            self._urgent.discard(agent_id)
            heapq.heappush(self._watch, (v, agent_id))

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        super().settle(agent_id, cost, now_s)
        self._now_s = max(self._now_s, now_s)

    # ------------------------------------------------------------------------------- time
    def advance(self, now_s: float) -> Iterable[str]:
        """Read V and R now, set ``L``, ``V(now - L)`` and ``R(now - L)``; the agents that became
        urgent (or stopped being so: ``L`` grew). A tenant whose urgency flipped is marked moved."""
        self._now_s = max(self._now_s, now_s)
        v = self.clock.virtual_time(self._now_s)
        self.lag_s = self.lag_factor * self._largest / self._mean_capacity(self._now_s)
        if self.lag_s > self.lag_max_s:
            self.lag_max_s = self.lag_s
        keep_s = 2 * self.lag_s + 1.0
        self._root.add(self._now_s, v, keep_s)
        old = self._vlag
        self._vlag = self._root.at(self._now_s - self.lag_s)
        moved: list[str] = []
        if self._vlag < old:  # L grew: some urgent agents may be within L again
            for agent_id in list(self._urgent):
                pace = self._pace[agent_id]
                if pace[0] + pace[2] / pace[1] >= self._vlag:
                    self._urgent.discard(agent_id)
                    heapq.heappush(self._watch, (pace[0] + pace[2] / pace[1], agent_id))
                    moved.append(agent_id)
        heap = self._watch
        while heap and heap[0][0] < self._vlag:
            _, agent_id = heapq.heappop(heap)
            pace = self._pace.get(agent_id)
            if pace is None or agent_id in self._urgent:
                continue
            point = pace[0] + pace[2] / pace[1]
            if point < self._vlag:
                self._urgent.add(agent_id)
                moved.append(agent_id)
            else:
                heapq.heappush(heap, (point, agent_id))
        self._rtrace.add(self._now_s, self._r_to(self._now_s), keep_s)
        self._rlag = self._rtrace.at(self._now_s - self.lag_s)
        for tenant in self._tenants_in:
            tp = self._tpace[tenant]
            urgent = tp[0] + tp[2] / tp[1] < self._rlag
            if urgent != (tenant in self._turgent):
                (self._turgent.add if urgent else self._turgent.discard)(tenant)
                self._groups.moved(tenant)
        return moved

    def set_capacity(self, capacity_per_s: float, now_s: float) -> None:
        """M measured: the clock moves at it (R too, up to now at the old M); ``L`` reads M's mean."""
        self._now_s = max(self._now_s, now_s)
        self._r_to(self._now_s)
        self._mean_capacity(self._now_s)
        m = self._measured
        m[1] += m[2] * max(0.0, self._now_s - m[3])
        m[2], m[3] = capacity_per_s, max(m[3], self._now_s)
        super().set_capacity(capacity_per_s, now_s)

    def _mean_capacity(self, now_s: float) -> float:
        """M over the run so far, weighted by how long each held (the starting guess's included, as a
        prior until the engine has been measured): a window in which the engine delivered little,
        such as its first as it warms up, does not stretch ``L``."""
        m = self._measured
        if m is None:
            self._measured = m = [now_s, 0.0, self.clock.capacity, now_s]
        span = max(now_s, m[3]) - m[0]
        return (m[1] + m[2] * max(0.0, now_s - m[3])) / span if span > 0 else m[2]

    # ------------------------------------------------------------------------------- keys
    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """``(urgent?, when, tag, arrival order)``: urgent ``(0, T)``, else ``(1, f)``; an agent in
        a tenant keys by its tenant's pace and its root key (docstring of the module)."""
        entry = self._tags.get(agent_id)
        pace = self._pace.get(agent_id)
        if entry is None or pace is None:
            return (1, float("inf"), float("inf"), 0)
        more = 0.0 if extra is NO_CHARGE else self.cost.service(extra)
        tenant = pace[3]
        if tenant is None:
            point = pace[0] + (pace[2] + more) / pace[1]
            if agent_id in self._urgent and point < self._vlag:
                return (0, self._root.when(point), entry[0], entry[1])
            return (1, entry[0], entry[0], entry[1])
        inner = self._inner.get(agent_id, float("inf"))
        tp = self._tpace[tenant]
        point = tp[0] + (tp[2] + more) / tp[1]
        if tenant in self._turgent and point < self._rlag:
            return (0, self._rtrace.when(point), inner, entry[1])
        return (1, self.clock.root_key(agent_id), inner, entry[1])

    key = Policy.key  # agent-level: the agent's key, then request arrival order

    def inner_key(self, req) -> tuple:
        """Order inside a tenant: the inner tag (the paper's), agent and request arrival order."""
        return (self._inner.get(req.agent_id, float("inf")), self._tags.get(req.agent_id, (0.0, 0))[1], req.seq)

    def stamp(self, req) -> tuple[float, float | None]:
        """For an engine that runs ``tagged``: an urgent agent's due time far ahead of every tag."""
        key = self.agent_key(req.agent_id)
        return (float(key[1] - _URGENT_STAMP if key[0] == 0 else key[1]), self._inner.get(req.agent_id))
