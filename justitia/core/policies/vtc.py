"""VTC: the Virtual Token Counter fair scheduler, one counter per agent.

As in VTC's reference queue: input tokens weigh 1 and output tokens 2 (LAS's counter on the
compute cost model); an agent that becomes backlogged again is lifted to the smallest counter
among the other backlogged agents, so idling earns no credit; the next request comes from the
backlogged agent with the smallest counter.
"""

from typing import Iterable

from justitia.core.cost import COMPUTE
from justitia.core.policies.las import LAS


class VTC(LAS):
    """Serve the backlogged agent that has received the least weighted service."""

    name = "vtc"

    def __init__(self) -> None:
        super().__init__(COMPUTE)

    def backlogged(self, agent_id: str, others: Iterable[str]) -> None:
        """Lift the counter to the smallest counter among the other backlogged agents."""
        lows = [self._attained[a] for a in others if a != agent_id and a in self._attained]
        if lows:
            self._attained[agent_id] = max(self._attained.get(agent_id, 0), min(lows))
