"""Tagged: serve requests in the order of the tag a front end stamped on each.

A cluster keeps one GPS clock in front of its engines (``justitia serve --ray``, the simulator's
cluster): the front end runs justitia and stamps every request with its agent's virtual finish tag
(``RequestMeta.agent_tag``); each engine runs this policy and orders its own queue by the tags, so
every engine serves in the one clock's order. Requests without a tag go last, in arrival order.
The engine's meter still measures what it delivers (``reports_capacity``): the front end's M is the
sum of its engines'.

With tenants (hierarchical GPS) an agent's tag is its root key, which moves at its tenant's events,
and a stamp is the key when the request was sent: two requests of one tenant stamped at different
times can be out of the tenant's order. So the front end also stamps the agent's place among its
tenant's agents (``agent_rank``, its inner tag, which does not move): here a tenant's requests wait
as one group of the queue in rank order, and the tenant is filed under its first request's tag. A
tenant's request's key (for the preemption victim) is the tenant's place, that tag, then its rank.
"""

import math

from justitia.core.policies.base import AgentInfo, Policy, RequestInfo


class Tagged(Policy):
    """The front end's tag, then request arrival order; a tenant's requests in rank order."""

    name = "tagged"
    agent_level = False
    reports_capacity = True
    groups = True
    holds_place = True  # as justitia's engines do: an agent keeps its place by its last stamped tag

    def __init__(self) -> None:
        self._tenant: dict[str, str] = {}  # agents in a tenant -> the tenant
        self._place: dict[str, float] = {}  # tenants with a request waiting -> their first request's tag
        self._last: dict[str, float] = {}  # agents -> the tag last stamped on one of their requests

    def agent_arrived(self, agent: AgentInfo, now_s: float) -> None:
        """Note the agent's tenant."""
        if agent.tenant is not None:
            self._tenant[agent.agent_id] = agent.tenant

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """Forget it."""
        self._tenant.pop(agent_id, None)
        self._last.pop(agent_id, None)

    def agent_key(self, agent_id: str, extra=None) -> tuple:
        """The tag last stamped on one of the agent's requests (where it keeps its place:
        ``AgentScheduler.advance``)."""
        return (self._last.get(agent_id, math.inf),)

    def key(self, req: RequestInfo) -> tuple:
        """The request's tag (none: last), then arrival order; in a tenant, the tenant's place (its
        first waiting request's tag, or the request's own when none waits), then its rank."""
        tag = math.inf if req.tag is None else req.tag
        self._last[req.agent_id] = tag
        if req.rank is not None and (tenant := self._tenant.get(req.agent_id)) is not None:
            return (self._place.get(tenant, tag), req.rank, req.seq)
        return (tag, req.seq)

    def group_of(self, req: RequestInfo) -> str | None:
        """The tenant of a request stamped with a rank; None otherwise."""
        return None if req.rank is None else self._tenant.get(req.agent_id)

    def inner_key(self, req: RequestInfo) -> tuple:
        """Rank, then arrival order."""
        return (req.rank, req.seq)

    def group_key(self, group: str, head: RequestInfo) -> tuple:
        """The tenant's first request's tag."""
        return (math.inf if head.tag is None else head.tag, head.seq)

    def group_filed(self, group: str, key: tuple | None) -> None:
        """Where the tenant stands now, for its requests' keys."""
        if key is None:
            self._place.pop(group, None)
        else:
            self._place[group] = key[0]
