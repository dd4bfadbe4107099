"""The GPS virtual clock that stamps each agent with its fair finish tag, flat or in tenants.

Units (see docs/design.md): costs are in the cost model's unit (``token_iters`` for KV token-time),
time is in seconds, and ``capacity`` is the service the whole engine delivers per second when it is
saturated, in cost units per second. Under Generalized Processor Sharing each of the ``N_t`` active
agents is served at ``capacity / N_t``, so the virtual time ``V`` (in cost units) grows at
``dV/dt = capacity / N_t`` and an agent of cost ``C`` arriving at ``a`` finishes, in GPS, when
``V`` reaches its tag ``f = V(arrival) + C``. Weighted GPS: an agent of weight ``w`` is served at
``capacity * w / Σ w`` over the active agents, ``dV/dt = capacity / Σ w`` and ``f = V(a) + C / w``
(all weights 1 is the unweighted clock, to the last bit). An agent is active in GPS from its arrival until ``V``
passes its tag, whatever the real engine is doing. While no agent is active, ``V`` stands still. Tags
follow the truth: ``retag`` moves an agent that revealed more work than it was stamped with back to
``V(now) + remaining / w``, and ``settle`` shortens a leaving agent's stay to ``V(a) + what it asked for / w``.

**Tenants: hierarchical GPS** (H-GPS, Bennett & Zhang). An agent that names a tenant is served
inside it: the engine is shared among the *root entries*, the agents without a tenant and the
tenants with an agent active, by weight (``dV/dt = capacity / Σ W``); a tenant's share is shared
among its active agents by the same rule, one level down. Each tenant keeps an inner clock of the
same kind whose time is the root's ``V`` and whose capacity is the tenant's weight ``W``: while the
tenant is active it receives ``W`` cost units per unit of ``V``, so its inner virtual time moves at
``dV_k/dV = W / Σ_{its active agents} w``. An agent's inner tag ``f_j = V_k(a) + C / w`` orders it
among its tenant's agents; its *root key* ``ρ_j = V + Σ_{i: f_i ≤ f_j} w_i (f_i − V_k) / W``, over
the tenant's active agents, is the root virtual time at which the tenant, spending its share on its
agents one after another in inner-tag order (selective pampering, one level down), finishes it if
the tenant gets no more work. That is never later than its finish under H-GPS (where its tenant's
later-tagged agents share the tenant with it), and it is the H-PFQ shape: the tenant is one flow at
the root, whatever order it serves its own agents in. A root key is fixed between events of its own
tenant (an agent that arrives with a smaller inner tag raises it, a settle lowers it), orders
agents across tenants, and inside one tenant is in the order of the inner tags. The tenant is a root
entry tagged with its last agent's root key, ``V + (its remaining work) / W``. Agents without a
tenant are the flat clock above, to the last bit.

``V`` is piecewise linear: it changes slope only when an agent arrives, its tag is reached, or the
capacity changes (``set_capacity``, at an event), so the clock keeps the pending tags in a heap and
does O(log n) work per event (a root key also walks the tenant's agents with smaller inner tags:
those being served or paused, not those waiting behind).
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

from justitia.core.pampering import Pampering
from justitia.core.validate import is_positive_finite, positive_finite


def _capacity(capacity: float) -> float:
    """``capacity`` as a float if it is a finite number > 0, else ValueError (the clock's own wording)."""
    if not is_positive_finite(capacity):
        raise ValueError(f"capacity must be a positive finite number, got {capacity}.")
    return float(capacity)


@dataclass(eq=False)
class _Tenant:
    """A tenant's state in the root clock: its inner clock (time: the root's V; capacity: its weight),
    its weight, its agents not yet settled, and its pampering schedule (its agents' root keys)."""

    inner: "VirtualClock"
    weight: float
    schedule: Pampering
    agents: int = 0


class VirtualClock:
    """Exact GPS virtual time for agents sharing ``capacity`` cost units per second, with tenants
    (hierarchical GPS, the module's docstring) for agents that name one."""

    def __init__(self, capacity: float, record: bool = True, chained: bool = False):
        """``chained``: a tenant serves its agents in arrival order, not inner-tag order (the rule
        before hierarchical GPS, where a tenant was one flow whose agents queued as its packets:
        ``S = max(V(a), the tenant's last tag)``; kept to compare against)."""
        self.capacity = _capacity(capacity)
        self.chained = chained
        self._arrivals = 0
        self.record = record  # keep every GPS finish time (off for long-running servers)
        self._now_s = 0.0
        self._v = 0.0
        self._tags: list[tuple[float, int, object]] = []  # (finish tag, filing seq, root entry)
        self._weight = 0.0  # Σ w over the active root entries
        self._active: dict[object, tuple[int, float, float]] = {}  # active root entries -> (heap seq, w, tag)
        self._agents: dict[str, list] = {}  # agents without a tenant, not settled -> [S, tag, w, arrival]
        self._tenant_of: dict[str, str] = {}  # agents with a tenant, not settled -> their tenant
        self._tenants: dict[str, _Tenant] = {}
        self._seq = 0
        self._gps_finish_s: dict[str, float] = {}
        self._trace: list[tuple[float, float]] | None = [] if record else None  # (V, t) breakpoints, with tenants

    @property
    def active(self) -> int:
        """Number of agents still active in GPS at the last time the clock was advanced to."""
        n = sum(1 for e in self._active if not isinstance(e, tuple))
        for tenant in self._tenants:
            n += self._inner(tenant).active
        return n

    @property
    def now_s(self) -> float:
        """The time the clock was last moved to (it never goes back)."""
        return self._now_s

    @property
    def active_flows(self) -> int:
        """Number of root entries (tenants, and agents without one) active in GPS."""
        return len(self._active)

    def _advance(self, now_s: float) -> None:
        """Move the clock to ``now_s``, retiring every tag that ``V`` reaches on the way."""
        if now_s < self._now_s:
            raise ValueError(f"the clock cannot go back from t={self._now_s} to t={now_s}.")
        self._drop_stale()
        while self._tags:
            rate = self.capacity / self._weight
            tag = self._tags[0][0]
            reach_s = self._now_s + (tag - self._v) / rate
            if reach_s > now_s:
                self._v += rate * (now_s - self._now_s)
                break
            self._now_s, self._v = reach_s, tag
            self._note()
            while self._tags and self._tags[0][0] <= tag:
                self._retire(heapq.heappop(self._tags)[2], reach_s)
                self._drop_stale()
        self._now_s = now_s
        self._note()

    def _note(self) -> None:
        """Keep (V, t) where V changes slope, to read inner finish times in seconds (record, tenants):
        a stretch where V stands still keeps its first and its last point."""
        trace = self._trace
        if trace is None or not self._tenants or (trace and trace[-1] == (self._v, self._now_s)):
            return
        if len(trace) >= 2 and trace[-1][0] == trace[-2][0] == self._v:
            trace[-1] = (self._v, self._now_s)
        else:
            trace.append((self._v, self._now_s))

    def _live(self, entry: tuple) -> bool:
        """Whether a heap entry is current (not one that ``retag`` or ``settle`` replaced)."""
        return self._active.get(entry[2], (None,))[0] == entry[1]

    def _drop_stale(self) -> None:
        while self._tags and not self._live(self._tags[0]):
            heapq.heappop(self._tags)

    def _retire(self, entry: object, now_s: float) -> None:
        """GPS has finished the entry (an agent, or a tenant's last agent): it stops counting."""
        _, weight, _ = self._active.pop(entry)
        if self._active:
            self._weight -= weight
        else:  # no float dust when none is left
            self._weight = 0.0
        if self.record and not isinstance(entry, tuple):
            self._gps_finish_s[entry] = now_s

    def _file(self, entry: object, tag: float, weight: float) -> None:
        """(Re)file a root entry under ``tag``: any earlier heap entry of it goes stale."""
        old = self._active.get(entry)
        if old is None:
            self._weight += weight
        elif weight != old[1]:
            self._weight += weight - old[1]
        heapq.heappush(self._tags, (tag, self._seq, entry))
        self._active[entry] = (self._seq, weight, tag)
        self._seq += 1

    def set_capacity(self, capacity: float, now_s: float) -> None:
        """From ``now_s`` on, the engine delivers ``capacity`` cost units per second (V up to ``now_s``
        moved at the old rate)."""
        capacity = _capacity(capacity)
        self._advance(now_s)
        self.capacity = capacity

    # ------------------------------------------------------------------------------ tenants
    def _inner(self, tenant: str) -> "VirtualClock":
        """The tenant's inner clock and its pampering schedule, moved to the root's V."""
        state = self._tenants[tenant]
        state.inner._advance(max(self._v, state.inner._now_s))
        if self._v > state.schedule.v:
            state.schedule.advance(self._v, state.weight)
        return state.inner

    def _refile_tenant(self, tenant: str) -> None:
        """The tenant's root entry after its agents changed: tagged ``V + work left / W``."""
        self._inner(tenant)
        state = self._tenants[tenant]
        entry = ("tenant", tenant)
        if state.schedule.total > 0:
            self._file(entry, self._v + state.schedule.total / state.weight, state.weight)
        elif entry in self._active:
            self._retire(entry, self._now_s)
            self._drop_stale()

    def _to_seconds(self, v: float) -> float:
        """The time at which the root's V reached ``v`` (record mode)."""
        trace = self._trace
        i = bisect.bisect_left(trace, (v, -math.inf))
        if i >= len(trace):
            return trace[-1][1]
        v1, t1 = trace[i]
        if i == 0 or v1 == v:
            return t1
        v0, t0 = trace[i - 1]
        return t0 + (t1 - t0) * (v - v0) / (v1 - v0)

    def root_key(self, agent_id: str) -> float | None:
        """The root virtual time at which the agent's tenant, spending its share on its agents in
        inner-tag order (selective pampering inside the tenant), finishes it if the tenant gets no
        more work (its flat tag, for an agent without a tenant); None if it is not known. No later
        than its finish under H-GPS."""
        tenant = self._tenant_of.get(agent_id)
        if tenant is None:
            known = self._agents.get(agent_id)
            return None if known is None else known[1]
        self._inner(tenant)
        state = self._tenants[tenant]
        return state.schedule.key(agent_id, state.weight)

    def inner_tag(self, agent_id: str) -> float | None:
        """The agent's tag among its tenant's agents (its flat tag, without a tenant); None if not known."""
        tenant = self._tenant_of.get(agent_id)
        clock = self if tenant is None else self._tenants[tenant].inner
        known = clock._agents.get(agent_id)
        return None if known is None else known[1]

    # ------------------------------------------------------------------------------- verbs
    def retag(
        self,
        agent_id: str,
        remaining_cost: float,
        now_s: float,
        revealed_cost: float | None = None,
        anchored: bool = False,
    ) -> float | None:
        """The agent has revealed more work than it was stamped with, ``remaining_cost`` of it not done:
        its tag becomes ``max(tag, V(now) + remaining / w)``, that of an agent arriving now with that
        work (it counts among the active agents again if GPS had finished it); in a tenant, the same
        one level down. With ``revealed_cost`` (a session's burst: all it has revealed since its
        start), also at least ``S + revealed / w``, where GPS would finish it had it been priced at
        what it revealed: never past its GPS finish, which counts all its work from ``S``. The new
        tag (the inner one, in a tenant), or None if the agent is not known here (never arrived, or
        settled). ``anchored``: only the last rule, ``S + revealed / w`` (a price
        repriced as its distribution's index: ``core.gittins``)."""
        self._advance(now_s)
        tenant = self._tenant_of.get(agent_id)
        if tenant is not None:
            tag = self._inner(tenant).retag(agent_id, remaining_cost, self._v, revealed_cost, anchored)
            pampering = self._tenants[tenant].schedule
            left = pampering.left(agent_id)
            if tag is not None and remaining_cost > left:
                order = pampering.order(agent_id) if self.chained else tag
                pampering.put(agent_id, order, remaining_cost, pampering.work(agent_id) + remaining_cost - left)
            self._refile_tenant(tenant)
            return tag
        known = self._agents.get(agent_id)
        if known is None:
            return None
        start, old, weight = known[:3]
        tag = old if anchored else max(old, self._v + (remaining_cost if weight == 1 else remaining_cost / weight))
        if revealed_cost is not None:
            tag = max(tag, start + revealed_cost / weight)
        if tag > old:
            known[1] = tag
            if tag > self._v:
                self._file(agent_id, tag, weight)
        return tag

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        """The agent left the engine (finished, cancelled, released) having asked for ``cost`` in all:
        GPS keeps it no longer than that work would have kept it, that is until ``V`` reaches
        ``min(tag, S + cost / w)`` (at once if ``V`` is past it). An honest agent keeps its tag; one
        that declared more than it asked for (a cost of 1e19) stops slowing ``V`` for the others (in
        a tenant: its tenant's inner V, and the tenant's root entry)."""
        self._advance(now_s)
        tenant = self._tenant_of.pop(agent_id, None)
        if tenant is not None:
            state = self._tenants[tenant]
            tag = state.inner.inner_tag(agent_id)
            state.inner.settle(agent_id, cost, self._v)
            tag = state.inner._active.get(agent_id, (0, 0, tag))[2]  # the settled inner tag, if still active
            pampering = state.schedule
            work = pampering.work(agent_id)
            left = pampering.left(agent_id)
            if left > 0 and cost < work:  # what it asked for and was not yet served, at most
                order = pampering.order(agent_id) if self.chained else tag
                pampering.put(agent_id, order, min(left, max(0.0, cost - (work - left))), cost)
            pampering.forget(agent_id)
            self._refile_tenant(tenant)
            state.agents -= 1
            if state.agents == 0 and not state.inner._active and pampering.total <= 0 and not self.record:
                del self._tenants[tenant]  # nothing of it left in GPS: long-running servers forget it
            return
        known = self._agents.pop(agent_id, None)
        if known is None or agent_id not in self._active:
            return
        start, tag, weight = known[:3]
        settled = start + (cost if weight == 1 else cost / weight)
        if settled >= tag:
            return
        if settled <= self._v:
            self._retire(agent_id, now_s)
            self._drop_stale()
        else:
            self._file(agent_id, settled, weight)

    def virtual_time(self, now_s: float) -> float:
        """V(now_s), in cost units; ``now_s`` must not be earlier than any earlier call's."""
        self._advance(now_s)
        return self._v

    def arrive(
        self,
        agent_id: str,
        cost: float,
        now_s: float,
        weight: float = 1.0,
        tenant: str | None = None,
        tenant_weight: float | None = None,
    ) -> float:
        """Register an agent of ``cost`` and ``weight`` arriving at ``now_s``, in ``tenant`` (None: a
        root entry of its own) of weight ``tenant_weight`` (default: ``weight``; a tenant's weight is
        its newest agent's); return its tag: its flat tag, or its root key now (``root_key``). An
        agent that arrives again (a session back from a pause, settled when it left) while GPS is
        still serving its earlier work starts where that work ends: ``f = max(V, f_before) + C / w``."""
        if not (cost >= 0 and math.isfinite(cost)):
            raise ValueError(f"agent '{agent_id}': cost must be a finite number >= 0, got {cost}.")
        positive_finite(weight, f"agent '{agent_id}': weight")
        self._advance(now_s)
        if tenant is not None:
            return self._arrive_in(agent_id, cost, weight, tenant, weight if tenant_weight is None else tenant_weight)
        start = self._v
        if agent_id in self._active:  # a flow that returns before GPS has finished its last work: it
            start = self._active[agent_id][2]  # queues behind it, S = max(V, f) (a pause buys no place)
        tag = start + (cost if weight == 1 else cost / weight)
        self._agents[agent_id] = [start, tag, float(weight), now_s]  # [S, f, w, arrival]
        if tag <= self._v:  # no work: GPS finishes it at once (retag can move it back)
            if self.record:
                self._gps_finish_s[agent_id] = now_s
        else:
            self._file(agent_id, tag, float(weight))
        return tag

    def _arrive_in(self, agent_id: str, cost: float, weight: float, tenant: str, tenant_weight: float) -> float:
        positive_finite(tenant_weight, f"tenant '{tenant}': weight")
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(
                VirtualClock(float(tenant_weight), record=self.record), float(tenant_weight), Pampering(self._v)
            )
            state.inner._now_s = self._v
            self._note()
        inner = self._inner(tenant)
        if tenant_weight != state.weight:
            inner.set_capacity(float(tenant_weight), self._v)
            state.weight = float(tenant_weight)
        tag = inner.arrive(agent_id, cost, self._v, weight)
        self._arrivals += 1
        state.schedule.put(agent_id, self._arrivals if self.chained else tag, float(cost), float(cost))
        self._tenant_of[agent_id] = tenant
        state.agents += 1
        self._refile_tenant(tenant)
        return self.root_key(agent_id)

    def start(self, agent_id: str) -> float | None:
        """The agent's GPS start ``S`` in root virtual time (``V(a)``), or None if it is not known."""
        tenant = self._tenant_of.get(agent_id)
        if tenant is not None:
            known = self._tenants[tenant].inner._agents.get(agent_id)
            return None if known is None else known[3]
        known = self._agents.get(agent_id)
        return None if known is None else known[0]

    def gps_finish_s(self, agent_id: str) -> float | None:
        """When the agent finished under GPS, or None if it has not finished by the clock's time."""
        if agent_id in self._gps_finish_s:
            return self._gps_finish_s[agent_id]
        for state in self._tenants.values():
            v = state.inner._gps_finish_s.get(agent_id)
            if v is not None:
                return self._to_seconds(v)
        return None

    def drain(self) -> dict[str, float]:
        """Run GPS until every registered agent has finished; return all GPS finish times."""
        if self._tags:
            last_tag = max(entry[0] for entry in self._tags if self._live(entry))
            # Upper bound on the time left: serving at the slowest rate, capacity / Σ w.
            horizon = self._now_s + (last_tag - self._v) * self._weight / self.capacity
            self._advance(horizon)
            while self._tags:  # float rounding can leave the last tag a hair ahead
                entry = heapq.heappop(self._tags)
                if self._live(entry):
                    del self._active[entry[2]]
                    if not isinstance(entry[2], tuple):
                        self._gps_finish_s[entry[2]] = self._now_s
            self._weight = 0.0
        out = dict(self._gps_finish_s)
        for state in self._tenants.values():
            state.inner._advance(max(self._v, state.inner._now_s))
            for agent_id, v in state.inner.drain().items():  # a hair of inner work left: finished now
                out[agent_id] = self._to_seconds(min(v, self._v))
        return out
