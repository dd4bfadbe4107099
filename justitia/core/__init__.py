"""The scheduling core: costs, the GPS clock, the policies and ``AgentScheduler``, the verbs an
engine drives them through. It imports no engine, server or harness; everything outside it uses
only the names below (``docs/design.md``, "The core's contract")."""

from justitia.core.book import AGENT_IDLE_S, SESSION_KEEP_S, AgentBook, int_priority
from justitia.core.capacity import WINDOW_STEPS, CapacityMeter, calibrated_capacity
from justitia.core.clock import VirtualClock
from justitia.core.gittins import CostDist
from justitia.core.cost import (COMPUTE, COST_MODELS, KV, KV_PREFIX, NO_CHARGE, Charge, CostModel, attention_pairs, capacity_per_s,
                                compute_tokens, cost_model, kv_token_iters, prefill_attention, prefix_step_charges,
                                shared_kv_charge, shared_kv_savings, step_charges, step_delivered)
from justitia.core.policies import (BASELINE_NAMES, CLOCK_POLICY_NAMES, OPTION_NAMES, POLICY_NAMES, STATIC_POLICY_NAMES, AgentInfo, Policy,
                                    RequestInfo, has_clock, keeps_front_clock, make_policy)
from justitia.core.protocol import (ENGINE_UTILITY, META_KEYS, PRICE_KEYS, REGISTER, RESET, RETIRE, SESSION, STATE, TURN_START,
                                    ControlCall, PolicyState, RequestMeta)
from justitia.core.routing import ROUTER_NAMES, ReplicaLoad, Replicas, RouteRequest, Router, make_router
from justitia.core.scheduler import AgentScheduler, ClockReading, LookAhead, Standing, Traits
from justitia.core.validate import is_positive_finite, positive_finite

__all__ = [
    "AgentBook", "AgentInfo", "BASELINE_NAMES", "CostDist", "AgentScheduler", "CapacityMeter", "calibrated_capacity", "Charge", "ControlCall", "CostModel", "PolicyState", "RequestInfo",
    "RequestMeta", "VirtualClock", "STATE", "COMPUTE", "COST_MODELS", "ENGINE_UTILITY", "KV", "KV_PREFIX", "META_KEYS", "SESSION", "TURN_START", "PRICE_KEYS", "NO_CHARGE",
    "OPTION_NAMES", "POLICY_NAMES", "Policy", "REGISTER", "RETIRE", "RESET", "STATIC_POLICY_NAMES", "WINDOW_STEPS", "capacity_per_s", "compute_tokens",
    "attention_pairs", "cost_model", "int_priority", "kv_token_iters", "make_policy", "prefill_attention", "step_charges",
    "step_delivered", "prefix_step_charges", "shared_kv_charge", "shared_kv_savings",
    "ROUTER_NAMES", "ReplicaLoad", "Replicas", "RouteRequest", "Router", "make_router",
    "CLOCK_POLICY_NAMES", "ClockReading", "LookAhead", "Standing", "Traits", "has_clock", "keeps_front_clock",
    "AGENT_IDLE_S", "SESSION_KEEP_S", "is_positive_finite", "positive_finite",
]
