"""A simulator that follows vLLM v1's scheduling rules, driving the same scheduling core.

``config`` (engines and latency profiles), ``stepping`` (the engine's state and its two ways of
stepping), ``simulator`` (agents on simulated time, on one engine), ``cluster`` (N engines behind
one router and one clock).
"""

from justitia.sim.cluster import CLOCKS, Cluster, ClusterResult
from justitia.sim.config import PROFILES, EngineConfig, LatencyProfile
from justitia.sim.simulator import Simulator

__all__ = ["CLOCKS", "PROFILES", "Cluster", "ClusterResult", "EngineConfig", "LatencyProfile", "Simulator"]
