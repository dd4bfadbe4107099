"""Request-level shortest job first on the predicted request cost."""

from justitia.core.policies.base import Policy, RequestInfo


class SJF(Policy):
    """Serve the request with the smallest predicted cost first."""

    name = "sjf"
    agent_level = False

    def key(self, req: RequestInfo) -> tuple:
        """Predicted request cost, then arrival order."""
        return (req.predicted_cost, req.seq)
