"""VTC: the Virtual Token Counter fair scheduler, one counter per agent.

As in VTC's reference queue: input tokens weigh 1 and output tokens 2 (LAS's counter on the
compute cost model); an agent that becomes backlogged again is lifted to the smallest counter
among the other backlogged agents, so idling earns no credit; the next request comes from the
backlogged agent with the smallest counter. Weighted, as in the VTC paper: an agent of weight ``w``
advances its counter by the service over ``w``, kept as an exact fraction (so that charging is
exact in any grouping of steps, as the integer counters of weight-1 agents are). The VTC paper's
clients are the agents here: an agent's ``tenant`` does not pool counters (docs/design.md, "Weights").
"""

from fractions import Fraction
from typing import Iterable

from justitia.core.cost import COMPUTE, NO_CHARGE, Charge
from justitia.core.policies.base import AgentInfo
from justitia.core.policies.las import LAS


class VTC(LAS):
    """Serve the backlogged agent that has received the least weighted service."""

    name = "vtc"

    def __init__(self) -> None:
        super().__init__(COMPUTE)
        self._weight: dict[str, Fraction] = {}  # agents whose weight is not 1

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Open a counter at zero (the lift rule raises it when the agent queues)."""
        super().agent_arrived(agent, now_s)
        if agent.weight != 1:
            self._weight[agent.agent_id] = Fraction(agent.weight)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Drop the agent's counter."""
        super().agent_finished(agent_id, now_s)
        self._weight.pop(agent_id, None)

    def charge(self, req, service: Charge) -> None:
        """Add the weighted tokens served, over the agent's weight."""
        w = self._weight.get(req.agent_id)
        if w is None:
            super().charge(req, service)  # exact integers
        elif req.agent_id in self._attained:
            self._attained[req.agent_id] += Fraction(self.cost.service(service)) / w

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Counter (as if charged ``extra``), then agent arrival order."""
        w = self._weight.get(agent_id)
        if w is None:
            return super().agent_key(agent_id, extra)
        return (self._attained.get(agent_id, 0) + Fraction(self.cost.service(extra)) / w, self._seq.get(agent_id, 0))

    def backlogged(self, agent_id: str, others: Iterable[str]) -> None:
        """Lift the counter to the smallest counter among the other backlogged agents."""
        # ``others`` come smallest key first: the first known one holds the smallest counter
        lowest = next((a for a in others if a != agent_id and a in self._attained), None)
        if lowest is not None:
            self._attained[agent_id] = max(self._attained.get(agent_id, 0), self._attained[lowest])
