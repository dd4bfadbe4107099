"""llm-d's program-aware fairness: least attained service with a decay (``las-decay``).

llm-d's flow-control plugin ``program-aware-fairness`` (llm-d/llm-d-router,
``pkg/epp/framework/plugins/flowcontrol/fairness/program-aware``, strategy ``las``) keeps one
counter per program (its fairness id): weighted tokens, ``1 x prompt + 2 x completion``, halved
every ``lasHalfLifeSeconds`` (default 60) of wall-clock time, and serves the program whose counter
is least. Here a program is an agent (a session: its whole life, as llm-d keys it by its header).

What is left out: llm-d adds a request's tokens when its stream ends and blends the counter with
the head request's wait (``0.8 x service + 0.2 x head wait``, each min-max normalized over the
queues); here service is counted as the engine charges it, and the key is the decayed counter
alone (a key, so that the waiting queue can order by it). A decay shared by every counter keeps
their order, so each charge is kept scaled by ``2^(t / H)`` at the time of the event the charge is
read at (``now`` as of the last agent event: the simulator charges lazily), and comparisons need
no rescan; the scale is renormalized before it overflows.
"""

import math

from justitia.core.cost import COMPUTE, NO_CHARGE, Charge
from justitia.core.policies.base import AgentInfo
from justitia.core.policies.las import LAS

HALF_LIFE_S = 60.0  # llm-d's lasHalfLifeSeconds default
_RENORMALIZE = 512.0  # exponent (in half-lives) past which every counter is rescaled


class DecayedLAS(LAS):
    """Serve the agent with the least decayed attained service (weighted tokens)."""

    name = "las-decay"

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        super().__init__(COMPUTE)
        self.half_life_s = half_life_s
        self._now_s = 0.0
        self._origin_s = 0.0  # counters are kept scaled by 2^((now - origin) / H)
        self._scaled: dict[str, float] = {}

    def _tick(self, now_s: float) -> None:
        self._now_s = max(self._now_s, now_s)
        if (self._now_s - self._origin_s) / self.half_life_s > _RENORMALIZE:
            shift = 2.0 ** (-(self._now_s - self._origin_s) / self.half_life_s)
            self._scaled = {a: v * shift for a, v in self._scaled.items()}
            self._origin_s = self._now_s

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        super().agent_arrived(agent, now_s)
        self._tick(now_s)
        self._scaled[agent.agent_id] = 0.0

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        self._tick(now_s)

    def settle(self, agent_id: str, cost: float, now_s: float) -> None:
        self._tick(now_s)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        super().agent_finished(agent_id, now_s)
        self._scaled.pop(agent_id, None)

    def _scale(self) -> float:
        return 2.0 ** ((self._now_s - self._origin_s) / self.half_life_s)

    def charge(self, req, service: Charge) -> None:
        """Add the weighted tokens served, scaled to now (a counter only grows: keys rise)."""
        if req.agent_id in self._scaled:
            self._scaled[req.agent_id] += self.cost.service(service) * self._scale()

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """The decayed counter (scaled: the order is the same), then agent arrival order."""
        value = self._scaled.get(agent_id, 0.0)
        if extra is not NO_CHARGE:
            value += self.cost.service(extra) * self._scale()
        return (value, self._seq.get(agent_id, 0))

    def decayed(self, agent_id: str) -> float:
        """The agent's counter as llm-d reads it now: weighted tokens, halved every half-life."""
        return self._scaled.get(agent_id, 0.0) / self._scale() if math.isfinite(self._scale()) else 0.0
