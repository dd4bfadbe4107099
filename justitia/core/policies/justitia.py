"""Justitia: serve agents in the order of their GPS virtual finish tags (selective pampering)."""

from justitia.core.clock import VirtualClock
from justitia.core.policies.base import AgentInfo, Policy, RequestInfo


class Justitia(Policy):
    """Each agent gets ``f = V(arrival) + C`` once; all its requests inherit ``f``."""

    name = "justitia"
    agent_level = True

    def __init__(self, capacity_per_s: float) -> None:
        self.clock = VirtualClock(capacity_per_s, record=False)  # engines may run for days
        self._tags: dict[str, tuple[float, int]] = {}

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Stamp the agent with its virtual finish tag."""
        tag = self.clock.arrive(agent.agent_id, agent.predicted_cost, now_s, agent.weight, agent.tenant)
        self._tags[agent.agent_id] = (tag, agent.seq)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent's tag (the clock keeps it as ``settle`` left it)."""
        self._tags.pop(agent_id, None)

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        """GPS keeps a leaving agent no longer than the work it asked for (``VirtualClock.settle``)."""
        self.clock.settle(agent_id, cost, now_s)

    def revise(self, agent_id: str, revealed_cost: float, remaining_cost: float, now_s: float) -> None:
        """An agent that reveals more work than its tag assumed moves back to where an agent arriving
        now with its remaining work would be: ``f = max(f, V(now) + remaining / w)``; requests queued
        from now on carry the new tag."""
        entry = self._tags.get(agent_id)
        if entry is None:
            return
        tag = self.clock.retag(agent_id, remaining_cost, now_s)
        if tag is not None and tag > entry[0]:
            self._tags[agent_id] = (tag, entry[1])

    def virtual_finish(self, agent_id: str) -> float | None:
        """The agent's virtual finish tag, or None if it is not (or no longer) known."""
        entry = self._tags.get(agent_id)
        return None if entry is None else entry[0]

    def key(self, req: RequestInfo) -> tuple:
        """Finish tag, then agent arrival order, then request arrival order."""
        return self._tags.get(req.agent_id, (float("inf"), req.seq)) + (req.seq,)
