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
        tag = self.clock.arrive(agent.agent_id, agent.predicted_cost, now_s, agent.weight)
        self._tags[agent.agent_id] = (tag, agent.seq)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent's tag (the clock keeps running on its own)."""
        self._tags.pop(agent_id, None)

    def virtual_finish(self, agent_id: str) -> float | None:
        """The agent's virtual finish tag, or None if it is not (or no longer) known."""
        entry = self._tags.get(agent_id)
        return None if entry is None else entry[0]

    def key(self, req: RequestInfo) -> tuple:
        """Finish tag, then agent arrival order, then request arrival order."""
        return self._tags.get(req.agent_id, (float("inf"), req.seq)) + (req.seq,)
