"""VTC: the Virtual Token Counter fair scheduler, one counter per client.

As in VTC's reference queue: input tokens weigh 1 and output tokens 2 (LAS's counter on the
compute cost model); a client that becomes backlogged again is lifted to the smallest counter
among the other backlogged clients, so idling earns no credit; the next request comes from the
backlogged client with the smallest counter, first come first served inside it. A client is an
agent's tenant when it names one (the VTC paper counts per client), else the agent itself. Weighted,
as in the VTC paper: a client of weight ``w`` advances its counter by the service over ``w``, kept
as an exact fraction (so that charging is exact in any grouping of steps, as the integer counters
of weight-1 agents are). A tenant is a group of the waiting queue (``Policy.groups``); its counter
moves with every agent's service, so engines charge tenants' agents every step
(``AgentScheduler.pools_service``).
"""

from fractions import Fraction
from typing import Iterable

from justitia.core.cost import COMPUTE, NO_CHARGE, Charge
from justitia.core.policies.base import AgentInfo, RequestInfo, TenantGroups
from justitia.core.policies.las import LAS


class VTC(LAS):
    """Serve the backlogged client that has received the least weighted service."""

    name = "vtc"
    groups = True
    pools = True  # a tenant's agents share one counter
    reads_service = True
    lifts_on_backlog = True

    def __init__(self) -> None:
        super().__init__(COMPUTE)
        self._weight: dict[str, Fraction] = {}  # agents (and tenants) whose weight is not 1
        self._groups = TenantGroups()  # tenants whose counters moved: take_dirty, take_moved
        self._tenant = self._groups.tenant  # agents in a tenant -> the tenant
        self._counter: dict[str, Fraction | int] = {}  # tenant -> its counter
        self._tweight: dict[str, Fraction] = {}  # tenant -> its weight, if not 1

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Open a counter at zero (the lift rule raises it when the agent queues); a tenant's agents
        join its counter (a tenant's weight is its newest agent's)."""
        if agent.tenant is None:
            super().agent_arrived(agent, now_s)
            if agent.weight != 1:
                self._weight[agent.agent_id] = Fraction(agent.weight)
            return
        self._seq[agent.agent_id] = agent.seq
        self._groups.join(agent.agent_id, agent.tenant)
        self._counter.setdefault(agent.tenant, 0)
        if agent.weight != 1:
            self._tweight[agent.tenant] = Fraction(agent.weight)
        else:
            self._tweight.pop(agent.tenant, None)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Drop the agent's counter (a tenant's, with its last agent)."""
        tenant = self._groups.leave(agent_id)
        if tenant is None:
            super().agent_finished(agent_id, now_s)
            self._weight.pop(agent_id, None)
            return
        self._seq.pop(agent_id, None)
        if not self._groups.has(tenant):
            self._counter.pop(tenant, None)
            self._tweight.pop(tenant, None)

    def charge(self, req, service: Charge) -> None:
        """Add the weighted tokens served, over the client's weight."""
        tenant = self._tenant.get(req.agent_id)
        if tenant is not None:
            w = self._tweight.get(tenant)
            served = self.cost.service(service)
            self._counter[tenant] += served if w is None else Fraction(served) / w
            self._groups.moved(tenant)
            return
        w = self._weight.get(req.agent_id)
        if w is None:
            super().charge(req, service)  # exact integers
        elif req.agent_id in self._attained:
            self._attained[req.agent_id] += Fraction(self.cost.service(service)) / w

    def _count(self, agent_id: str):
        """The counter of the agent's client."""
        tenant = self._tenant.get(agent_id)
        return self._counter.get(tenant, 0) if tenant is not None else self._attained.get(agent_id)

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """Client's counter (as if charged ``extra``), then agent arrival order."""
        tenant = self._tenant.get(agent_id)
        if tenant is not None:
            w = self._tweight.get(tenant)
            add = self.cost.service(extra) if extra is not NO_CHARGE else 0
            return (
                self._counter.get(tenant, 0) + (add if w is None else Fraction(add) / w),
                self._seq.get(agent_id, 0),
            )
        w = self._weight.get(agent_id)
        if w is None:
            return super().agent_key(agent_id, extra)
        return (self._attained.get(agent_id, 0) + Fraction(self.cost.service(extra)) / w, self._seq.get(agent_id, 0))

    def backlogged(self, agent_id: str, others: Iterable[str]) -> None:
        """Lift the client's counter to the smallest counter among the other backlogged clients."""
        # ``others`` come smallest key first: the first of another client holds the smallest counter
        tenant = self._tenant.get(agent_id)
        lowest = next(
            (
                a
                for a in others
                if a != agent_id and self._count(a) is not None and (tenant is None or self._tenant.get(a) != tenant)
            ),
            None,
        )
        if lowest is None:
            return
        if tenant is None:
            if agent_id in self._attained:
                self._attained[agent_id] = max(self._attained[agent_id], self._count(lowest))
        elif self._count(lowest) > self._counter[tenant]:
            self._counter[tenant] = self._count(lowest)
            self._groups.moved(tenant)

    # the waiting queue's groups: tenants
    def group_of(self, req: RequestInfo) -> str | None:
        """The request's tenant, or None."""
        return self._tenant.get(req.agent_id)

    def inner_key(self, req: RequestInfo) -> tuple:
        """First come first served inside a tenant: agent, then request arrival order."""
        return (self._seq.get(req.agent_id, 0), req.seq)

    def group_key(self, group: str, head: RequestInfo) -> tuple:
        """A tenant's counter, then its head request's agent and arrival order."""
        return self.agent_key(head.agent_id) + (head.seq,)

    def take_dirty(self) -> set[str]:
        """The tenants whose counters moved since the last call."""
        return self._groups.take_dirty()

    def take_moved(self) -> set[str]:
        """The agents of the tenants whose counters moved since the last call."""
        return self._groups.take_moved()
