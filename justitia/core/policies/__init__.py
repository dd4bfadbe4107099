"""Scheduling policies, one per file, and the factory that builds one by name."""

from justitia.core.cost import KV, CostModel, cost_model
from justitia.core.policies.base import AgentInfo, Policy, RequestInfo
from justitia.core.policies.eligible import EligibleJustitia
from justitia.core.policies.fcfs import FCFS
from justitia.core.policies.guarded import GuardedJustitia
from justitia.core.policies.justitia import Justitia
from justitia.core.policies.las import LAS
from justitia.core.policies.las_decay import DecayedLAS
from justitia.core.policies.las_turn import TurnLAS
from justitia.core.policies.parrot import Parrot
from justitia.core.policies.sjf import SJF
from justitia.core.policies.srjf import SRJF
from justitia.core.policies.tagged import Tagged
from justitia.core.policies.vtc import VTC

POLICY_NAMES = ("fcfs", "sjf", "parrot", "vtc", "srjf", "justitia", "las")
STATIC_POLICY_NAMES = tuple(n for n in POLICY_NAMES if n not in ("vtc", "srjf", "las"))  # keys fixed on arrival
BASELINE_NAMES = ("las-turn", "las-decay")  # the non-clairvoyant baselines a user would pick instead (docs/design.md)
OPTION_NAMES = (
    "justitia-guarded",
    "justitia-eligible",
    "justitia-chained",
    "tagged",
    *BASELINE_NAMES,
)  # options beside the paper's seven (not run unless named);
# justitia-guarded: the paper's rule behind a lag guard, a bound whatever the prices (core.guard);
# justitia-chained: a tenant's agents in arrival order (the tenants rule before hierarchical GPS);
# tagged: an engine behind a front end that keeps the clock (its requests carry their tags)
CLOCK_POLICY_NAMES = (
    "justitia",
    "justitia-guarded",
    "justitia-eligible",
    "justitia-chained",
)  # those that keep a GPS clock


def has_clock(name: str) -> bool:
    """Whether the policy called ``name`` keeps a GPS clock (its runs are judged against GPS)."""
    return name in CLOCK_POLICY_NAMES


def keeps_front_clock(name: str) -> bool:
    """Whether a cluster may run the policy as one clock in front of its engines, which then run
    ``tagged``: justitia's plain clock (the front end builds it with ``make_policy("justitia")``)."""
    return name == "justitia"


def make_policy(
    name: str, capacity_per_s: float | None = None, cost: str | CostModel = KV, guard_scale: float = 0.0
) -> Policy:
    """Build the policy called ``name``; ``justitia`` needs the clock's capacity per second.

    ``cost`` is the unit predicted costs come in; service-counting policies count in it too
    (VTC always counts compute tokens, as the VTC paper does). ``guard_scale``: justitia-guarded's lag guard
    starts from this largest burst of work seen before (``GuardedJustitia``; 0: it learns it).
    """
    cost = cost_model(cost)
    if name in CLOCK_POLICY_NAMES:
        if capacity_per_s is None:
            raise ValueError(f"policy '{name}' needs capacity_per_s for its virtual clock.")
        if name == "justitia-eligible":
            return EligibleJustitia(capacity_per_s, cost)
        if name == "justitia-guarded":
            return GuardedJustitia(capacity_per_s, cost, scale=guard_scale)
        return Justitia(capacity_per_s, chained=name == "justitia-chained")
    if name in ("srjf", "las", "las-turn"):
        return {"srjf": SRJF, "las": LAS, "las-turn": TurnLAS}[name](cost)
    if name == "las-decay":
        return DecayedLAS()
    classes = {"fcfs": FCFS, "sjf": SJF, "parrot": Parrot, "vtc": VTC, "tagged": Tagged}
    if name not in classes:
        raise ValueError(f"unknown policy '{name}'; expected one of: {', '.join(POLICY_NAMES + OPTION_NAMES)}.")
    return classes[name]()


__all__ = [
    "AgentInfo",
    "Policy",
    "RequestInfo",
    "POLICY_NAMES",
    "BASELINE_NAMES",
    "DecayedLAS",
    "TurnLAS",
    "STATIC_POLICY_NAMES",
    "OPTION_NAMES",
    "CLOCK_POLICY_NAMES",
    "has_clock",
    "keeps_front_clock",
    "make_policy",
    "FCFS",
    "SJF",
    "Parrot",
    "VTC",
    "SRJF",
    "Justitia",
    "GuardedJustitia",
    "LAS",
    "EligibleJustitia",
    "Tagged",
]
