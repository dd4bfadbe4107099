"""Scheduling policies and the factory that builds one by name."""

from justitia.policies.base import NO_CHARGE, AgentInfo, Charge, Policy, RequestInfo
from justitia.policies.fcfs import FCFS
from justitia.policies.justitia import Justitia
from justitia.policies.las import LAS
from justitia.policies.parrot import Parrot
from justitia.policies.sjf import SJF
from justitia.policies.srjf import SRJF
from justitia.policies.vtc import VTC

POLICY_NAMES = ("fcfs", "sjf", "parrot", "vtc", "srjf", "justitia", "las")


def make_policy(name: str, capacity_per_s: float | None = None, cost: str = "kv") -> Policy:
    """Build the policy called ``name``; ``justitia`` needs the clock's capacity per second.

    ``cost`` is the unit predicted costs come in; service-counting policies count in it too.
    """
    if name == "justitia":
        if capacity_per_s is None:
            raise ValueError("policy 'justitia' needs capacity_per_s for its virtual clock.")
        return Justitia(capacity_per_s)
    if name in ("srjf", "las"):
        return {"srjf": SRJF, "las": LAS}[name](cost)
    classes = {"fcfs": FCFS, "sjf": SJF, "parrot": Parrot, "vtc": VTC}
    if name not in classes:
        raise ValueError(f"unknown policy '{name}'; expected one of: {', '.join(POLICY_NAMES)}.")
    return classes[name]()


__all__ = [
    "AgentInfo", "Charge", "NO_CHARGE", "Policy", "RequestInfo", "POLICY_NAMES", "make_policy",
    "FCFS", "SJF", "Parrot", "VTC", "SRJF", "Justitia", "LAS",
]
