"""Request-level first-come-first-served: vLLM's default."""

from justitia.core.policies.base import Policy, RequestInfo


class FCFS(Policy):
    """Serve requests in the order they arrived, whatever agent they belong to."""

    name = "fcfs"
    agent_level = False

    def key(self, req: RequestInfo) -> tuple:
        """Arrival order."""
        return (req.seq,)
