"""The scheduling core: costs, the GPS clock, the policies and ``AgentScheduler``, the verbs an
engine drives them through. It imports no engine, server or harness, and reads no engine's fields;
everything outside it uses only the names below, each there because an engine or a front end needs
it (``docs/design.md``, "What the core exports")."""

from justitia.core.book import AGENT_IDLE_S, SESSION_KEEP_S, AgentBook
from justitia.core.capacity import WINDOW_STEPS, CapacityMeter, calibrated_capacity
from justitia.core.clock import VirtualClock
from justitia.core.cost import (
    COMPUTE,
    KV,
    KV_PREFIX,
    Charge,
    CostModel,
    capacity_per_s,
    cost_model,
    kv_token_iters,
    shared_kv_savings,
)
from justitia.core.gittins import CostDist
from justitia.core.guard import LAG_FACTOR
from justitia.core.ledger import BURST_BUCKETS, ERROR_BUCKETS
from justitia.core.policies import (
    BASELINE_NAMES,
    OPTION_NAMES,
    POLICIES,
    POLICY_NAMES,
    STATIC_POLICY_NAMES,
    AgentInfo,
    Policy,
    RequestInfo,
    has_clock,
    keeps_front_clock,
    make_policy,
)
from justitia.core.protocol import (
    ENGINE_UTILITY,
    META_KEYS,
    PRICE_KEYS,
    REGISTER,
    RESET,
    RETIRE,
    SESSION,
    STATE,
    TURN_START,
    ControlCall,
    PolicyState,
    Registration,
    RequestMeta,
)
from justitia.core.routing import ROUTER_NAMES, ReplicaLoad, Replicas, RouteRequest
from justitia.core.scheduler import AgentScheduler, Standing
from justitia.core.validate import is_positive_finite, positive_finite

__all__ = [
    "Registration",
    "POLICIES",
    # the scheduler, the book over it, and what their verbs take and give
    "AgentScheduler",
    "AgentBook",
    "AgentInfo",
    "RequestInfo",
    "Standing",
    "AGENT_IDLE_S",
    "SESSION_KEEP_S",
    # policies: building one, and the names a command line offers
    "Policy",
    "make_policy",
    "has_clock",
    "keeps_front_clock",
    "POLICY_NAMES",
    "BASELINE_NAMES",
    "STATIC_POLICY_NAMES",
    "OPTION_NAMES",
    # costs and service
    "KV",
    "KV_PREFIX",
    "COMPUTE",
    "CostModel",
    "cost_model",
    "Charge",
    "kv_token_iters",
    "shared_kv_savings",
    "CostDist",
    # the lag guard's bound factor (B = 2 c_max + LAG_FACTOR C_max / M, justitia-guarded)
    "LAG_FACTOR",
    # the clock's M
    "VirtualClock",
    "CapacityMeter",
    "WINDOW_STEPS",
    "capacity_per_s",
    "calibrated_capacity",
    # what crosses a process: request metadata and control calls
    "RequestMeta",
    "META_KEYS",
    "PRICE_KEYS",
    "SESSION",
    "TURN_START",
    "ControlCall",
    "PolicyState",
    "ENGINE_UTILITY",
    "STATE",
    "REGISTER",
    "RETIRE",
    "RESET",
    # what the server shows of each tenant (core.ledger): its histograms' buckets
    "BURST_BUCKETS",
    "ERROR_BUCKETS",
    # routing across replicas
    "ROUTER_NAMES",
    "ReplicaLoad",
    "Replicas",
    "RouteRequest",
    # checking numbers a client sends
    "is_positive_finite",
    "positive_finite",
]
