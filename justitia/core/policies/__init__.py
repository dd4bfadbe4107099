"""Scheduling policies, one per file, and their registry (``POLICIES``): each name, its class, and
the factory that builds it."""

from dataclasses import dataclass
from typing import Callable

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


@dataclass(frozen=True)
class PolicyEntry:
    """One policy of the registry: its name, its class, where it stands, and how it is built."""

    name: str
    cls: type[Policy]
    kind: str  # "paper": the paper's seven, run by default; "baseline": what a user would pick instead
    # (non-clairvoyant); "option": run only when named
    summary: str  # one line, for the command line's help and the docs
    build: Callable[[float | None, CostModel, float], Policy]  # (capacity per second, cost, guard scale)

    @property
    def clock(self) -> bool:
        """Whether it keeps a GPS clock (its runs are judged against GPS; it needs M)."""
        return issubclass(self.cls, Justitia)


def _entry(name, cls, kind, summary, build=None) -> PolicyEntry:
    return PolicyEntry(name, cls, kind, summary, build or (lambda m, cost, scale: cls()))


# Every policy, in the order the command line and the docs list them (vLLM's registry-and-factory
# pattern): a name maps to its class, its traits are the class's declared attributes.
POLICIES: dict[str, PolicyEntry] = {
    e.name: e
    for e in (
        _entry("fcfs", FCFS, "paper", "request arrival order"),
        _entry("sjf", SJF, "paper", "predicted request cost"),
        _entry("parrot", Parrot, "paper", "agent arrival order"),
        _entry("vtc", VTC, "paper", "service counter, lifted when an agent queues again (fair queueing)"),
        _entry("srjf", SRJF, "paper", "predicted cost less service received", lambda m, cost, s: SRJF(cost)),
        _entry(
            "justitia",
            Justitia,
            "paper",
            "virtual finish tag V(a) + C (the paper's rule)",
            lambda m, cost, s: Justitia(m),
        ),
        _entry("las", LAS, "paper", "service received (Autellix's program-level LAS)", lambda m, cost, s: LAS(cost)),
        _entry(
            "las-turn", TurnLAS, "baseline", "service received in the current turn", lambda m, cost, s: TurnLAS(cost)
        ),
        _entry("las-decay", DecayedLAS, "baseline", "weighted tokens received, halved every 60 s (llm-d)"),
        _entry(
            "justitia-guarded",
            GuardedJustitia,
            "option",
            "the paper's rule behind a lag guard: a bound whatever the prices",
            lambda m, cost, s: GuardedJustitia(m, cost, scale=s),
        ),
        _entry(
            "justitia-eligible",
            EligibleJustitia,
            "option",
            "the paper's rule, agents no further ahead than GPS first (WF2Q; for the tail)",
            lambda m, cost, s: EligibleJustitia(m, cost),
        ),
        _entry(
            "justitia-chained",
            Justitia,
            "option",
            "a tenant's agents in arrival order (the tenants rule before hierarchical GPS)",
            lambda m, cost, s: Justitia(m, chained=True),
        ),
        _entry("tagged", Tagged, "option", "the tags a front end stamped (an engine behind one clock)"),
    )
}
POLICY_NAMES = tuple(n for n, e in POLICIES.items() if e.kind == "paper")
BASELINE_NAMES = tuple(n for n, e in POLICIES.items() if e.kind == "baseline")
OPTION_NAMES = tuple(n for n, e in POLICIES.items() if e.kind != "paper")  # not run unless named
CLOCK_POLICY_NAMES = tuple(n for n, e in POLICIES.items() if e.clock)
STATIC_POLICY_NAMES = tuple(n for n in POLICY_NAMES if not POLICIES[n].cls.dynamic)  # keys fixed on arrival


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
    """Build the policy called ``name`` (``POLICIES``); one with a clock needs its capacity per second.

    ``cost`` is the unit predicted costs come in; service-counting policies count in it too
    (VTC always counts compute tokens, as the VTC paper does). ``guard_scale``: justitia-guarded's lag guard
    starts from this largest burst of work seen before (``GuardedJustitia``; 0: it learns it).
    """
    entry = POLICIES.get(name)
    if entry is None:
        raise ValueError(f"unknown policy '{name}'; expected one of: {', '.join(POLICIES)}.")
    if entry.clock and capacity_per_s is None:
        raise ValueError(f"policy '{name}' needs capacity_per_s for its virtual clock.")
    return entry.build(capacity_per_s, cost_model(cost), guard_scale)


__all__ = [
    "POLICIES",
    "PolicyEntry",
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
