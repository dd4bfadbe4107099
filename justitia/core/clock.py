"""The GPS virtual clock that stamps each agent with its fair finish tag.

Units (see docs/design.md): costs are in the cost model's unit (``token_iters`` for KV token-time),
time is in seconds, and ``capacity`` is the service the whole engine delivers per second when it is
saturated, in cost units per second. Under Generalized Processor Sharing each of the ``N_t`` active
agents is served at ``capacity / N_t``, so the virtual time ``V`` (in cost units) grows at
``dV/dt = capacity / N_t`` and an agent of cost ``C`` arriving at ``a`` finishes, in GPS, when
``V`` reaches its tag ``f = V(a) + C``. Weighted GPS: an agent of weight ``w`` is served at
``capacity * w / Σ w`` over the active agents, ``dV/dt = capacity / Σ w`` and ``f = V(a) + C / w``
(all weights 1 is the unweighted clock, to the last bit). An agent is active in GPS from its arrival until ``V``
passes its tag, whatever the real engine is doing. While no agent is active, ``V`` stands still. Tags
follow the truth: ``retag`` moves an agent that revealed more work than it was stamped with back to
``V(now) + remaining / w``, and ``settle`` shortens a leaving agent's stay to ``V(a) + what it asked for / w``.

``V`` is piecewise linear: it changes slope only when an agent arrives, its tag is reached, or the
capacity changes (``set_capacity``, at an event), so the clock keeps the pending tags in a heap and
does O(log n) work per event.
"""

from __future__ import annotations

import heapq
import math


class VirtualClock:
    """Exact GPS virtual time for agents sharing ``capacity`` cost units per second.

    GPS shares the engine among *flows*: an agent is a flow of its own unless it names one (its
    tenant), and a tenant's agents then queue behind each other in their flow, as packets of one
    flow do in weighted fair queueing. An agent arriving at ``a`` starts at ``S = max(V(a), the
    largest tag of its flow's active agents)`` and is tagged ``f = S + C / w``; ``Σ w`` runs over the
    flows with an agent active, so a tenant of weight 2 is owed twice the service of one of weight 1
    however many agents each has in flight. Without tenants every flow is one agent and
    ``S = V(a)``: the paper's clock."""

    def __init__(self, capacity: float, record: bool = True):
        if not (capacity > 0 and math.isfinite(capacity)):
            raise ValueError(f"capacity must be a positive finite number, got {capacity}.")
        self.capacity = float(capacity)
        self.record = record  # keep every GPS finish time (off for long-running servers)
        self._now_s = 0.0
        self._v = 0.0
        self._tags: list[tuple[float, int, str]] = []  # (finish tag, filing seq, agent id)
        self._weight = 0.0  # Σ w over the active flows
        self._active: dict[str, tuple[int, object]] = {}  # agents active in GPS -> (their heap entry's seq, flow)
        self._flows: dict[object, list] = {}  # flows with an agent active -> [active agents, weight, largest tag]
        self._agents: dict[str, list] = {}  # agents not settled -> [start S, tag, weight, flow]
        self._seq = 0
        self._gps_finish_s: dict[str, float] = {}

    @property
    def active(self) -> int:
        """Number of agents still active in GPS at the last time the clock was advanced to."""
        return len(self._active)

    @property
    def active_flows(self) -> int:
        """Number of flows (tenants, and agents without one) with an agent active in GPS."""
        return len(self._flows)

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
            while self._tags and self._tags[0][0] <= tag:
                self._retire(heapq.heappop(self._tags)[2], reach_s)
                self._drop_stale()
        self._now_s = now_s

    def _live(self, entry: tuple) -> bool:
        """Whether a heap entry is current (not one that ``retag`` or ``settle`` replaced)."""
        return self._active.get(entry[2], (None,))[0] == entry[1]

    def _drop_stale(self) -> None:
        while self._tags and not self._live(self._tags[0]):
            heapq.heappop(self._tags)

    def _retire(self, agent_id: str, now_s: float) -> None:
        """GPS has finished the agent: it stops counting among the active ones (and its flow, if it
        was the flow's last)."""
        flow_id = self._active.pop(agent_id)[1]
        flow = self._flows[flow_id]
        flow[0] -= 1
        if flow[0] == 0:
            del self._flows[flow_id]
            self._weight = self._weight - flow[1] if self._flows else 0.0  # no float dust when none is left
        if self.record:
            self._gps_finish_s[agent_id] = now_s

    def _file(self, agent_id: str, tag: float, weight: float, flow_id: object) -> None:
        """(Re)file an agent under ``tag`` in its flow: any earlier heap entry of it goes stale."""
        if agent_id not in self._active:
            flow = self._flows.get(flow_id)
            if flow is None:
                flow = self._flows[flow_id] = [0, weight, tag]
                self._weight += weight
            elif weight != flow[1]:  # a flow's weight is its newest agent's
                self._weight += weight - flow[1]
                flow[1] = weight
            flow[0] += 1
        else:
            flow = self._flows[flow_id]
        if tag > flow[2]:
            flow[2] = tag
        heapq.heappush(self._tags, (tag, self._seq, agent_id))
        self._active[agent_id] = (self._seq, flow_id)
        self._seq += 1

    def set_capacity(self, capacity: float, now_s: float) -> None:
        """From ``now_s`` on, the engine delivers ``capacity`` cost units per second (V up to ``now_s``
        moved at the old rate)."""
        if not (capacity > 0 and math.isfinite(capacity)):
            raise ValueError(f"capacity must be a positive finite number, got {capacity}.")
        self._advance(now_s)
        self.capacity = float(capacity)

    def retag(self, agent_id: str, remaining_cost: float, now_s: float) -> float | None:
        """The agent has revealed more work than it was stamped with, ``remaining_cost`` of it not done:
        its tag becomes ``max(tag, V(now) + remaining / w)``, that of an agent arriving now with that
        work (it counts among the active agents again if GPS had finished it). The new tag, or None if
        the agent is not known here (never arrived, or settled)."""
        self._advance(now_s)
        known = self._agents.get(agent_id)
        if known is None:
            return None
        _, old, weight, flow_id = known
        tag = max(old, self._v + (remaining_cost if weight == 1 else remaining_cost / weight))
        if tag > old:
            known[1] = tag
            if tag > self._v:
                self._file(agent_id, tag, weight, flow_id)
        return tag

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        """The agent left the engine (finished, cancelled, released) having asked for ``cost`` in all:
        GPS keeps it no longer than that work would have kept it, that is until ``V`` reaches
        ``min(tag, S + cost / w)`` (at once if ``V`` is past it). An honest agent keeps its tag; one
        that declared more than it asked for (a cost of 1e19) stops slowing ``V`` for the others. (The
        agents of its flow stamped after it keep their tags.)"""
        self._advance(now_s)
        known = self._agents.pop(agent_id, None)
        if known is None or agent_id not in self._active:
            return
        start, tag, weight, flow_id = known
        settled = start + (cost if weight == 1 else cost / weight)
        if settled >= tag:
            return
        if settled <= self._v:
            self._retire(agent_id, now_s)
            self._drop_stale()
        else:
            self._file(agent_id, settled, weight, flow_id)

    def virtual_time(self, now_s: float) -> float:
        """V(now_s), in cost units; ``now_s`` must not be earlier than any earlier call's."""
        self._advance(now_s)
        return self._v

    def arrive(self, agent_id: str, cost: float, now_s: float, weight: float = 1.0,
               flow: str | None = None) -> float:
        """Register an agent of ``cost`` and ``weight`` arriving at ``now_s`` in ``flow`` (its tenant;
        None: a flow of its own) and return its finish tag."""
        if not (cost >= 0 and math.isfinite(cost)):
            raise ValueError(f"agent '{agent_id}': cost must be a finite number >= 0, got {cost}.")
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"agent '{agent_id}': weight must be a finite number > 0, got {weight}.")
        self._advance(now_s)
        flow_id = (agent_id,) if flow is None else flow  # a tuple never equals a tenant's name
        queued = self._flows.get(flow_id)
        start = self._v if queued is None else max(self._v, queued[2])
        tag = start + (cost if weight == 1 else cost / weight)
        self._agents[agent_id] = [start, tag, float(weight), flow_id]
        if tag <= self._v:  # no work and nothing ahead in its flow: GPS finishes it at once (retag can move it back)
            if self.record:
                self._gps_finish_s[agent_id] = now_s
        else:
            self._file(agent_id, tag, float(weight), flow_id)
        return tag

    def start(self, agent_id: str) -> float | None:
        """The agent's GPS start ``S`` (``V(a)``, or its flow's last tag), or None if it is not known."""
        known = self._agents.get(agent_id)
        return None if known is None else known[0]

    def gps_finish_s(self, agent_id: str) -> float | None:
        """When the agent finished under GPS, or None if it has not finished by the clock's time."""
        return self._gps_finish_s.get(agent_id)

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
                    self._gps_finish_s[entry[2]] = self._now_s
            self._flows.clear()
            self._weight = 0.0
        return dict(self._gps_finish_s)
