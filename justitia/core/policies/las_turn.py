"""LAS by turn: least attained service, counted within a session's current burst (its user turn).

What a user reaching for a non-clairvoyant baseline on session traffic would pick: program-level
LAS (``las``) counts a session's whole history, so a long conversation falls behind for good;
``las-turn`` starts each turn afresh, as if it were a new program. Outside sessions it is ``las``."""

from justitia.core.policies.base import AgentInfo
from justitia.core.policies.las import LAS


class TurnLAS(LAS):
    """LAS whose counter restarts when a paused session returns with its next burst."""

    name = "las-turn"

    def agent_returned(self, agent: AgentInfo, now_s: float) -> None:
        """The next turn: service attained in it starts at zero (arrival order is kept)."""
        if agent.agent_id in self._attained:
            self._attained[agent.agent_id] = 0
