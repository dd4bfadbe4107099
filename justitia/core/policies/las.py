"""Program-level least attained service (Autellix's PLAS), a non-clairvoyant baseline."""

from justitia.core.cost import KV, NO_CHARGE, Charge, CostModel
from justitia.core.policies.base import AgentInfo, Policy


class LAS(Policy):
    """Serve the agent that has received the least service so far; needs no prediction.

    The counters are exact integers, so charging is exact in any grouping of steps."""

    name = "las"
    agent_level = True
    dynamic = True
    rising = True
    reads_service = True

    def __init__(self, cost: CostModel = KV) -> None:
        self.cost = cost  # the unit service is counted in, the predictor's unit
        self._attained: dict[str, int] = {}
        self._seq: dict[str, int] = {}

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Attained service starts at zero."""
        self._attained[agent.agent_id] = 0
        self._seq[agent.agent_id] = agent.seq

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget the agent."""
        self._attained.pop(agent_id, None)
        self._seq.pop(agent_id, None)

    def charge(self, req, service: Charge) -> None:
        """Add the service received, in the cost model's unit."""
        if req.agent_id in self._attained:
            self._attained[req.agent_id] += self.cost.service(service)

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Attained service (as if charged ``extra``), then agent arrival order."""
        attained = self._attained.get(agent_id, 0)
        if extra is not NO_CHARGE:
            attained += self.cost.service(extra)
        return (attained, self._seq.get(agent_id, 0))
