"""The GPS virtual clock that stamps each agent with its fair finish tag.

Units (see docs/design.md): costs are in the cost model's unit (``token_iters`` for KV token-time),
time is in seconds, and ``capacity`` is the service the whole engine delivers per second when it is
saturated, in cost units per second. Under Generalized Processor Sharing each of the ``N_t`` active
agents is served at ``capacity / N_t``, so the virtual time ``V`` (in cost units) grows at
``dV/dt = capacity / N_t`` and an agent of cost ``C`` arriving at ``a`` finishes, in GPS, when
``V`` reaches its tag ``f = V(a) + C``. Weighted GPS: an agent of weight ``w`` is served at
``capacity * w / Σ w`` over the active agents, ``dV/dt = capacity / Σ w`` and ``f = V(a) + C / w``
(all weights 1 is the unweighted clock, to the last bit). An agent is active in GPS from its arrival until ``V``
passes its tag, whatever the real engine is doing. While no agent is active, ``V`` stands still.

``V`` is piecewise linear: it changes slope only when an agent arrives, its tag is reached, or the
capacity changes (``set_capacity``, at an event), so the clock keeps the pending tags in a heap and
does O(log n) work per event.
"""

from __future__ import annotations

import heapq
import math


class VirtualClock:
    """Exact GPS virtual time for agents sharing ``capacity`` cost units per second."""

    def __init__(self, capacity: float, record: bool = True):
        if not (capacity > 0 and math.isfinite(capacity)):
            raise ValueError(f"capacity must be a positive finite number, got {capacity}.")
        self.capacity = float(capacity)
        self.record = record  # keep every GPS finish time (off for long-running servers)
        self._now_s = 0.0
        self._v = 0.0
        self._tags: list[tuple[float, int, str, float]] = []  # (finish tag, arrival seq, agent id, weight)
        self._weight = 0.0  # Σ w over the active agents
        self._seq = 0
        self._gps_finish_s: dict[str, float] = {}

    @property
    def active(self) -> int:
        """Number of agents still active in GPS at the last time the clock was advanced to."""
        return len(self._tags)

    def _advance(self, now_s: float) -> None:
        """Move the clock to ``now_s``, retiring every tag that ``V`` reaches on the way."""
        if now_s < self._now_s:
            raise ValueError(f"the clock cannot go back from t={self._now_s} to t={now_s}.")
        while self._tags:
            rate = self.capacity / self._weight
            tag = self._tags[0][0]
            reach_s = self._now_s + (tag - self._v) / rate
            if reach_s > now_s:
                self._v += rate * (now_s - self._now_s)
                break
            self._now_s, self._v = reach_s, tag
            while self._tags and self._tags[0][0] <= tag:
                _, _, agent_id, weight = heapq.heappop(self._tags)
                self._weight = self._weight - weight if self._tags else 0.0  # no float dust when none is left
                if self.record:
                    self._gps_finish_s[agent_id] = reach_s
        self._now_s = now_s

    def set_capacity(self, capacity: float, now_s: float) -> None:
        """From ``now_s`` on, the engine delivers ``capacity`` cost units per second (V up to ``now_s``
        moved at the old rate)."""
        if not (capacity > 0 and math.isfinite(capacity)):
            raise ValueError(f"capacity must be a positive finite number, got {capacity}.")
        self._advance(now_s)
        self.capacity = float(capacity)

    def virtual_time(self, now_s: float) -> float:
        """V(now_s), in cost units; ``now_s`` must not be earlier than any earlier call's."""
        self._advance(now_s)
        return self._v

    def arrive(self, agent_id: str, cost: float, now_s: float, weight: float = 1.0) -> float:
        """Register an agent of ``cost`` and ``weight`` arriving at ``now_s`` and return its finish tag."""
        if not (cost >= 0 and math.isfinite(cost)):
            raise ValueError(f"agent '{agent_id}': cost must be a finite number >= 0, got {cost}.")
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"agent '{agent_id}': weight must be a finite number > 0, got {weight}.")
        self._advance(now_s)
        tag = self._v + (cost if weight == 1 else cost / weight)
        if cost == 0:
            if self.record:
                self._gps_finish_s[agent_id] = now_s
        else:
            heapq.heappush(self._tags, (tag, self._seq, agent_id, float(weight)))
            self._weight += weight
        self._seq += 1
        return tag

    def gps_finish_s(self, agent_id: str) -> float | None:
        """When the agent finished under GPS, or None if it has not finished by the clock's time."""
        return self._gps_finish_s.get(agent_id)

    def drain(self) -> dict[str, float]:
        """Run GPS until every registered agent has finished; return all GPS finish times."""
        if self._tags:
            last_tag = max(entry[0] for entry in self._tags)
            # Upper bound on the time left: serving at the slowest rate, capacity / Σ w.
            horizon = self._now_s + (last_tag - self._v) * self._weight / self.capacity
            self._advance(horizon)
            while self._tags:  # float rounding can leave the last tag a hair ahead
                agent_id = heapq.heappop(self._tags)[2]
                self._gps_finish_s[agent_id] = self._now_s
            self._weight = 0.0
        return dict(self._gps_finish_s)
