"""Agent-level first-come-first-served, as Parrot schedules at run time."""

from justitia.core.policies.base import AgentInfo, Policy, RequestInfo


class Parrot(Policy):
    """Serve agents in the order they arrived; an agent's requests go together."""

    name = "parrot"
    agent_level = True

    def __init__(self) -> None:
        self._agent_seq: dict[str, int] = {}

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Remember the agent's arrival order."""
        self._agent_seq[agent.agent_id] = agent.seq

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent."""
        self._agent_seq.pop(agent_id, None)

    def key(self, req: RequestInfo) -> tuple:
        """Agent arrival order, then request arrival order."""
        return (self._agent_seq.get(req.agent_id, req.seq), req.seq)
