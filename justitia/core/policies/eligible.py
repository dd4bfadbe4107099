"""Justitia with WF2Q-style eligibility: an option for the tail against VTC, not the paper's rule.

WF2Q serves, among the packets whose GPS start has passed, the one with the smallest finish tag.
For an agent, GPS gives service continuously from its start ``S`` (``V(a)``, or behind its
tenant's earlier agents) until ``V`` reaches its tag, at ``w`` cost units per unit of ``V``; so the
next unit of its service starts, in GPS, at ``E = S + attained / w``. An agent is *eligible* while
``E <= V(now)``: it has not received more than GPS would have given it by now. This policy serves
eligible agents by Justitia's tag first, then (so that the engine never idles with work waiting)
the others by tag. An agent that ran ahead of GPS waits while agents that fell behind, such as a
large agent that smaller tags keep overtaking, catch up.

Its keys move with service (an agent becomes ineligible) and with time (it becomes eligible again
as ``V`` grows), so it is ``dynamic`` and ``timed``: the engine calls ``advance`` before each step,
and the simulator runs it with plain stepping. docs/design.md, "The tail against VTC", has what
it does on the main preset.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from justitia.core.cost import KV, NO_CHARGE, Charge, CostModel
from justitia.core.policies.base import AgentInfo, Policy
from justitia.core.policies.justitia import Justitia


class EligibleJustitia(Justitia):
    """Justitia's tags, served eligible agents first (WF2Q-style)."""

    name = "justitia-eligible"
    dynamic = True
    timed = True
    groups = False  # tenants' agents keep the root key they were stamped with (not hierarchical inside)
    reads_service = True

    def __init__(self, capacity_per_s: float, cost: CostModel = KV) -> None:
        super().__init__(capacity_per_s)
        self.cost = cost
        self._start: dict[str, tuple[float, float]] = {}  # agent -> (S, w)
        self._attained: dict[str, float] = {}
        self._v = 0.0  # V at the last step
        self._later: list[tuple[float, str]] = []  # (E, agent) of agents that were not eligible

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Stamp the tag; the agent is eligible from its GPS start."""
        super().agent_arrived(agent, now_s)
        self._eligible_from_start(agent, now_s)

    def _eligible_from_start(self, agent: AgentInfo, now_s: float) -> None:
        """The agent is eligible from its GPS start (later than now: behind its earlier work)."""
        start = self.clock.start(agent.agent_id)
        self._start[agent.agent_id] = (start, agent.weight)
        self._attained[agent.agent_id] = 0.0
        self._v = self.clock.virtual_time(now_s)
        if start > self._v:  # behind its tenant's earlier agents
            heapq.heappush(self._later, (start, agent.agent_id))

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        """A paused session's next burst: eligible from its new GPS start, its service counted anew."""
        super().agent_returned(agent, now_s)
        self._start.pop(agent.agent_id, None)
        self._eligible_from_start(agent, now_s)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        super().agent_finished(agent_id, now_s)
        self._start.pop(agent_id, None)
        self._attained.pop(agent_id, None)

    def _eligible_at(self, agent_id: str, extra: float = 0.0) -> float:
        start, weight = self._start[agent_id]
        return start + (self._attained[agent_id] + extra) / weight

    def charge(self, req, service: Charge) -> None:
        """Add the service; an agent now ahead of GPS waits for ``V`` to reach its next start."""
        if req.agent_id not in self._attained:
            return
        self._attained[req.agent_id] += self.cost.service(service)
        e = self._eligible_at(req.agent_id)
        if e > self._v:
            heapq.heappush(self._later, (e, req.agent_id))

    def advance(self, now_s: float) -> Iterable[str]:
        """``V(now)``; the agents it made eligible."""
        self._v = self.clock.virtual_time(now_s)
        moved = []
        while self._later and self._later[0][0] <= self._v:
            _, agent_id = heapq.heappop(self._later)
            if agent_id in self._attained:
                moved.append(agent_id)
        return moved

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Eligible first (0, then 1), then the finish tag, then arrival order."""
        entry = self._tags.get(agent_id)
        if entry is None:
            return (1, float("inf"), 0)
        late = agent_id in self._attained and self._eligible_at(agent_id, self.cost.service(extra)) > self._v
        return (int(late),) + entry

    key = Policy.key  # agent-level: the agent's key, then request arrival order
