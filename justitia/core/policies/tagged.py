"""Tagged: serve requests in the order of the tag a front end stamped on each.

A cluster keeps one GPS clock in front of its engines (``justitia serve --ray``, the simulator's
cluster): the front end runs justitia and stamps every request with its agent's virtual finish tag
(``RequestMeta.agent_tag``); each engine runs this policy and orders its own queue by the tags, so
every engine serves in the one clock's order. Requests without a tag go last, in arrival order.
The engine's meter still measures what it delivers (``reports_capacity``): the front end's M is the
sum of its engines'.
"""

import math

from justitia.core.policies.base import Policy, RequestInfo


class Tagged(Policy):
    """The front end's tag, then request arrival order."""

    name = "tagged"
    agent_level = False
    reports_capacity = True

    def key(self, req: RequestInfo) -> tuple:
        """The request's tag (none: last), then arrival order."""
        return (math.inf if req.tag is None else req.tag, req.seq)
