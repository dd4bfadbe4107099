"""Agent-level shortest remaining job first on predicted cost."""

from justitia.policies.base import NO_CHARGE, AgentInfo, Charge, Policy


class SRJF(Policy):
    """Serve the agent with the least predicted remaining KV token-time."""

    name = "srjf"
    agent_level = True
    dynamic = True

    def __init__(self, cost: str = "kv") -> None:
        self.cost = cost  # the unit service is counted in, the predictor's unit
        self._predicted: dict[str, float] = {}
        self._attained: dict[str, int] = {}  # an int, so that charging is exact in any grouping
        self._seq: dict[str, int] = {}

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Remaining cost starts at the predicted total."""
        self._predicted[agent.agent_id] = agent.predicted_cost
        self._attained[agent.agent_id] = 0
        self._seq[agent.agent_id] = agent.seq

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent."""
        self._predicted.pop(agent_id, None)
        self._attained.pop(agent_id, None)
        self._seq.pop(agent_id, None)

    def charge(self, req, service: Charge) -> None:
        """Subtract the service received from the remaining cost."""
        if req.agent_id in self._attained:
            self._attained[req.agent_id] += service.amount(self.cost)

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Predicted remaining cost (never below zero), then agent arrival order."""
        attained = self._attained.get(agent_id, 0) + extra.amount(self.cost)
        left = self._predicted.get(agent_id, 0.0) - attained
        return (max(left, 0.0), self._seq.get(agent_id, 0))
