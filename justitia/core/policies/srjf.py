"""Agent-level shortest remaining job first on predicted cost."""

from justitia.core.cost import KV, NO_CHARGE, Charge, CostModel
from justitia.core.policies.base import AgentInfo
from justitia.core.policies.las import LAS


class SRJF(LAS):
    """Serve the agent with the least predicted remaining cost: LAS's attained service,
    subtracted from the prediction."""

    name = "srjf"
    rising = False  # remaining cost falls as service is added
    revises = True

    def __init__(self, cost: CostModel = KV) -> None:
        super().__init__(cost)
        self._predicted: dict[str, float] = {}

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Remaining cost starts at the predicted total."""
        super().agent_arrived(agent, now_s)
        self._predicted[agent.agent_id] = agent.predicted_cost

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        """A paused session's next burst: its remaining cost is that burst's prediction."""
        if agent.agent_id in self._predicted:
            self._predicted[agent.agent_id] = super().agent_key(agent.agent_id)[0] + agent.predicted_cost

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent."""
        super().agent_finished(agent_id, now_s)
        self._predicted.pop(agent_id, None)

    def revise(self, agent_id: str, revealed_cost: float, remaining_cost: float, now_s: float) -> None:
        """An agent that reveals more work than predicted: its predicted total becomes at least what
        it has received plus what it has revealed and not finished (else its remaining cost, clamped at
        zero, would put it first for good)."""
        if agent_id in self._predicted:
            attained = super().agent_key(agent_id)[0]
            self._predicted[agent_id] = max(self._predicted[agent_id], attained + remaining_cost)

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Predicted remaining cost (never below zero), then agent arrival order."""
        attained, seq = super().agent_key(agent_id, extra)
        return (max(self._predicted.get(agent_id, 0.0) - attained, 0.0), seq)
