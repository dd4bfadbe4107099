"""Justitia with the lag guard (``justitia-guarded``): selective pampering in tag order, except that an
agent (or a tenant) the engine has left more than ``L`` seconds behind its fair pace goes first, the
most behind first (``core.guard``; docs/design.md, "A bound that holds whatever the prices").

- **An agent on its own** is watched on a pace clock of the guard's own: GPS on the true work as the
  bench's yardstick runs it, apart from the clock that stamps the tags. An agent joins it when it
  arrives, a session with each burst (when it opens a request after it had none), counted at its
  price but at no more than the largest burst the engine has served; it leaves at the service it
  was charged (a session when its burst has no request open). Its pace point is ``E = S + a / w``
  (its start there, plus the service charged since, over its weight); urgent once ``E < V(now - L)``.
- **A tenant** is watched on ``R``, the engine shared by weight among the root entries present (each
  tenant with an agent in the engine, each agent without one): its pace point is where it started
  in ``R`` plus the service charged to its agents over its weight; urgent once ``P < R(now - L)``.
  ``R`` reads no price. Inside a tenant the paper's order is kept (its pampering schedule).

Keys are ``(urgent?, when, tag, arrival order)``, lower first: urgent ``(0, T, ...)``, ``T`` the time
the pace clock reached the pace point (EDF on it); else ``(1, f, ...)``, the agent's tag (in a
tenant, its root key). A tenant's requests wait as a group of the waiting queue, in inner-tag order,
filed under its head's key. Keys rise with service (a pace point only moves on) and fall with time
(``advance``: the agents that became urgent; a tenant that did is marked moved), so the policy is
dynamic, rising and timed.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from justitia.core.clock import VirtualClock
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
    settles_on_service = True  # a leaving agent settles at the service it was charged, in both clocks
    reads_service = True

    def __init__(
        self,
        capacity_per_s: float,
        cost: CostModel = KV,
        lag_factor: float = GUARD_FACTOR,
        scale: float = 0.0,
        lag_floor_s: float = 0.0,
        watch: bool = False,
    ) -> None:
        """``scale``: the largest burst of work (cost units) this deployment has seen before, to start
        from (0: cold; the guard learns it from the service it charges, never from a price).
        ``lag_floor_s``: ``L`` is never below it (a what-if: ``lab.studies.guard_watch``).
        ``watch``: the guard watches and counts but never acts: every key is the paper's order
        (``urgent_events``: how often an agent or a tenant fell ``L`` behind its pace)."""
        super().__init__(capacity_per_s)
        self.cost = cost
        self.lag_factor = lag_factor
        self.lag_floor_s = float(lag_floor_s)
        self.watch = watch
        self.step_s = 0.0  # the engine's nominal step (``set_step``; 0: not known, no ĉ in L)
        self._longest = 0  # the most tokens one request produced: its decode steps (ĉ, in steps)
        self.urgent_events = 0  # an agent (or a tenant) fell more than L behind its pace
        self.bursts = 0  # bursts that joined the pace clock (an agent's work, a session's each burst)
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
        self._watch: list[tuple[float, str]] = []  # (pace point, agent) of agents on their own not urgent
        self._gps = VirtualClock(capacity_per_s, record=False)  # the pace clock: GPS as the yardstick runs
        # it (each burst of an agent on its own joins it, counted at no more than the largest burst
        # served, and leaves at the service it was charged), apart from the tags' clock
        self._info: dict[str, AgentInfo] = {}  # agents on their own -> what they arrived as
        self._counts: dict[str, float] = {}  # -> what the pace clock counts their burst for
        self._in_gps: set[str] = set()  # agents on their own with a burst in the pace clock
        self._root = Trace()  # t -> V of the pace clock
        self._vlag = 0.0  # V(now - L) on the pace clock
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
        """A session's next burst (its pace restarts when its first request opens)."""
        self._comes_in(agent, now_s)
        super().agent_returned(agent, now_s)
        if agent.tenant is None:
            self._info[agent.agent_id] = agent
        else:
            self._urgent.discard(agent.agent_id)
            self._paced(agent)

    def _counted(self, agent: AgentInfo) -> float:
        """What the pace clock counts a burst of the agent for: its price (a distribution's top), but
        no more than the largest burst the engine has served (a price past it is a guess no agent
        has borne out), so an over-priced agent does not hold the pace back for everyone."""
        cost = agent.predicted_cost if agent.dist is None else max(agent.predicted_cost, agent.dist.top)
        return min(cost, self._cap) if self._cap > 0 else cost

    def _paced(self, agent: AgentInfo) -> None:
        """An agent on its own is watched on the pace clock from its GPS start, with no service yet (a
        session from its first request: each of its bursts joins the pace clock as GPS's does)."""
        if agent.tenant is not None:
            self._pace[agent.agent_id] = [0.0, agent.weight, 0.0, agent.tenant, 0.0, bool(agent.session)]
            return
        self._info[agent.agent_id] = agent
        pace = self._pace.get(agent.agent_id)
        if agent.session and pace is not None:  # a session's next turn: its next burst restarts its pace
            return
        self._pace[agent.agent_id] = [0.0, agent.weight, 0.0, None, 0.0, bool(agent.session)]
        if not agent.session:
            self._join(agent.agent_id, self._now_s)

    def _join(self, agent_id: str, now_s: float) -> None:
        """A burst of an agent on its own joins the pace clock now; its pace starts at its GPS start."""
        agent, pace = self._info[agent_id], self._pace[agent_id]
        counted = self._counted(agent)
        self.bursts += 1
        self._gps.arrive(agent_id, counted, now_s, agent.weight)
        pace[0], pace[2], pace[4] = self._gps.start(agent_id), 0.0, 0.0
        self._counts[agent_id] = counted
        self._in_gps.add(agent_id)
        self._urgent.discard(agent_id)
        heapq.heappush(self._watch, (pace[0], agent_id))

    def _leave(self, agent_id: str, now_s: float) -> None:
        """A burst ends: the pace clock keeps it no longer than the service it was charged."""
        if agent_id in self._in_gps:
            self._in_gps.discard(agent_id)
            self._gps.settle(agent_id, self._pace[agent_id][2], now_s)

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
        self._now_s = max(self._now_s, now_s)
        self._leave(agent_id, self._now_s)
        pace = self._pace.pop(agent_id, None)
        self._info.pop(agent_id, None)
        self._counts.pop(agent_id, None)
        self._urgent.discard(agent_id)
        super().agent_finished(agent_id, now_s)
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

    def set_step(self, step_s: float) -> None:
        self.step_s = float(step_s)

    def request_done(self, req, output_tokens: int) -> None:
        """ĉ counts a request's decode steps (its prompt's chunks are left out: ĉ stays under c_max)."""
        if output_tokens > self._longest:
            self._longest = int(output_tokens)

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
        counted = self._counts.get(req.agent_id)
        if counted is not None and pace[2] > counted and req.agent_id in self._in_gps:  # served past what
            self._counts[req.agent_id] = 2 * pace[2]  # the pace clock counts it for: it stays active while it runs
            self._gps.retag(req.agent_id, 0.0, max(self._now_s, self._gps.now_s), 2 * pace[2], anchored=True)
        if req.agent_id in self._urgent and pace[0] + pace[2] / pace[1] >= self._vlag:
            self._urgent.discard(req.agent_id)
            heapq.heappush(self._watch, (pace[0] + pace[2] / pace[1], req.agent_id))

    def requests_drained(self, agent_id: str) -> None:
        """A session's burst ends when it has no request open (a burst of the GPS yardstick,
        docs/sessions.md): it leaves the pace clock at the service it was charged."""
        pace = self._pace.get(agent_id)
        if pace is not None and pace[5]:
            self._leave(agent_id, self._now_s)
            pace[4] = 0.0  # the next burst's service counts from 0 for L's scale

    def requests_opened(self, agent_id: str, now_s: float | None) -> None:
        """A session on its own sends work again after none was open (a tool ran, or its user): as in
        GPS, its burst joins the pace clock now, and its pace starts there (a wait the engine did not
        cause does not make it urgent)."""
        pace = self._pace.get(agent_id)
        if pace is None or not pace[5] or pace[3] is not None or agent_id not in self._info:
            return
        self._now_s = max(self._now_s, now_s or 0.0)
        self._leave(agent_id, self._now_s)
        self._join(agent_id, self._now_s)

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        super().settle(agent_id, cost, now_s)
        self._now_s = max(self._now_s, now_s)

    # ------------------------------------------------------------------------------- time
    def advance(self, now_s: float) -> Iterable[str]:
        """Read V and R now, set ``L``, ``V(now - L)`` and ``R(now - L)``; the agents that became
        urgent (or stopped being so: ``L`` grew). A tenant whose urgency flipped is marked moved."""
        self._now_s = max(self._now_s, now_s)
        # the tags' clock is read at every step, as before the pace clock was split off: its float
        # sums depend on the steps, and tenants' count past B with them (7 read so, 12 not)
        self.clock.virtual_time(self._now_s)
        v = self._gps.virtual_time(self._now_s)
        big = self._largest / self._mean_capacity(self._now_s)  # Ĉ / M̄
        self.lag_s = max(self.lag_floor_s, self.lag_factor * big, self._longest * self.step_s + big)
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
                self.urgent_events += 1
                moved.append(agent_id)
            else:
                heapq.heappush(heap, (point, agent_id))
        self._rtrace.add(self._now_s, self._r_to(self._now_s), keep_s)
        self._rlag = self._rtrace.at(self._now_s - self.lag_s)
        for tenant in self._tenants_in:
            tp = self._tpace[tenant]
            urgent = tp[0] + tp[2] / tp[1] < self._rlag
            if urgent != (tenant in self._turgent):
                self.urgent_events += urgent
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
        self._gps.set_capacity(capacity_per_s, self._now_s)

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
            if agent_id in self._urgent and point < self._vlag and not self.watch:
                return (0, self._root.when(point), entry[0], entry[1])
            return (1, entry[0], entry[0], entry[1])
        inner = self._inner.get(agent_id, float("inf"))
        tp = self._tpace[tenant]
        point = tp[0] + (tp[2] + more) / tp[1]
        if tenant in self._turgent and point < self._rlag and not self.watch:
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
