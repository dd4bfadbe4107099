"""A simulator that follows vLLM v1's scheduling rules, driving the same scheduling core."""

from justitia.sim.config import PROFILES, EngineConfig, LatencyProfile
from justitia.sim.engine import AgentResult, SimResult, Simulator

__all__ = ["PROFILES", "EngineConfig", "LatencyProfile", "Simulator", "SimResult", "AgentResult"]
