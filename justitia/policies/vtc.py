"""VTC: the Virtual Token Counter fair scheduler, one counter per agent.

As in VTC's reference queue: input tokens weigh 1 and output tokens 2; an agent that becomes
backlogged again is lifted to the smallest counter among the other backlogged agents, so idling
earns no credit; the next request comes from the backlogged agent with the smallest counter.
"""

from typing import Iterable

from justitia.policies.base import NO_CHARGE, AgentInfo, Charge, Policy, RequestInfo

INPUT_WEIGHT = 1
OUTPUT_WEIGHT = 2


class VTC(Policy):
    """Serve the backlogged agent that has received the least weighted service."""

    name = "vtc"
    agent_level = True
    dynamic = True

    def __init__(self) -> None:
        self._counter: dict[str, int] = {}  # ints: charging is exact in any grouping
        self._seq: dict[str, int] = {}

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Open a counter at zero (the lift rule raises it when the agent queues)."""
        self._counter[agent.agent_id] = 0
        self._seq[agent.agent_id] = agent.seq

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Drop the agent's counter."""
        self._counter.pop(agent_id, None)
        self._seq.pop(agent_id, None)

    def backlogged(self, agent_id: str, others: Iterable[str]) -> None:
        """Lift the counter to the smallest counter among the other backlogged agents."""
        lows = [self._counter[a] for a in others if a != agent_id and a in self._counter]
        if lows:
            self._counter[agent_id] = max(self._counter.get(agent_id, 0), min(lows))

    def charge(self, req: RequestInfo, service: Charge) -> None:
        """Add the weighted tokens served."""
        if req.agent_id in self._counter:
            self._counter[req.agent_id] += _weighted(service)

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Counter (as if charged ``extra``), then agent arrival order."""
        return (self._counter.get(agent_id, 0) + _weighted(extra), self._seq.get(agent_id, 0))


def _weighted(service: Charge) -> int:
    return INPUT_WEIGHT * service.prefill_tokens + OUTPUT_WEIGHT * service.decode_tokens
