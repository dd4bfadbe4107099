"""``GET /metrics``: the server's state in the Prometheus text format (``prometheus_text``), from
what the server counts as it happens (``Counts``: the agent manager's ``counts``)."""

from __future__ import annotations

import contextlib

from justitia.backends.base import histogram_samples, label, with_model
from justitia.backends.base import metric_lines as _metric
from justitia.core import PolicyState
from justitia.server.runs import TERMINAL

JCT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, float("inf"))
MAX_METRIC_TYPES = 64  # agent types with series of their own in /metrics; the rest are counted as "other"


class Counts:
    """What ``/metrics`` reports of a server's agents and requests, counted as they happen."""

    def __init__(self):
        self.finished: dict[str, int] = {s: 0 for s in TERMINAL}
        self.jct: dict[str, list[int]] = {}  # type -> counts per JCT_BUCKETS (cumulative at export)
        self.jct_sum: dict[str, float] = {}
        self.predict_s, self.predictions = 0.0, 0
        self.requests: dict[str, int] = {"agents": 0, "chat": 0, "completions": 0, "responses": 0, "messages": 0}
        self.tasks_in_flight = 0

    def request(self, endpoint: str) -> None:
        self.requests[endpoint] += 1

    def submission(self, predict_s: float) -> None:
        """An agent or a session's turn taken: its request and its prediction."""
        self.predict_s += predict_s
        self.predictions += 1
        self.request("agents")

    @contextlib.contextmanager
    def task(self):
        """One agent-API request in the engine, while this lasts."""
        self.tasks_in_flight += 1
        try:
            yield
        finally:
            self.tasks_in_flight -= 1

    def ended(self, status: str, agent_type: str | None = None, jct_s: float | None = None) -> None:
        """An agent that ended with ``status``; its job completion time, if it counts toward them,
        under its type (the first ``MAX_METRIC_TYPES`` types seen; "other" after them)."""
        self.finished[status] += 1
        if jct_s is None:
            return
        label = agent_type if agent_type in self.jct or len(self.jct) < MAX_METRIC_TYPES else "other"
        counts = self.jct.setdefault(label, [0] * len(JCT_BUCKETS))
        counts[next(k for k, b in enumerate(JCT_BUCKETS) if jct_s <= b)] += 1
        self.jct_sum[label] = self.jct_sum.get(label, 0.0) + jct_s


def prometheus_text(manager, state: PolicyState) -> str:
    """The exposition of ``manager`` (the ``AgentManager``): agents, requests, the policy that orders
    the engine and its clock, the predictor's latency, JCTs per type, each tenant's figures, then
    the backend's own lines (queues, replicas); every sample labelled ``model_name``, as vLLM's are."""
    m, backend = manager.counts, manager.backend
    lines = [
        *_metric(
            "agents_in_flight",
            "gauge",
            "Agents submitted and not yet done, failed or cancelled.",
            f"justitia_agents_in_flight {manager.in_flight()}",
        ),
        *_metric(
            "tasks_in_flight",
            "gauge",
            "Agent-API requests sent to the engine and not finished.",
            f"justitia_tasks_in_flight {m.tasks_in_flight}",
        ),
        *_metric(
            "agents_finished_total",
            "counter",
            "Agents that ended, by how.",
            *(f'justitia_agents_finished_total{{status="{k}"}} {v}' for k, v in m.finished.items()),
        ),
        *_metric(
            "requests_total",
            "counter",
            "Requests received, by endpoint.",
            *(f'justitia_requests_total{{endpoint="{k}"}} {v}' for k, v in m.requests.items()),
        ),
        *_metric(
            "engine_requests_unfinished",
            "gauge",
            "Requests the engine holds (waiting or running), all endpoints.",
            f"justitia_engine_requests_unfinished {backend.unfinished()}",
        ),
        *_metric(
            "policy_agents",
            "gauge",
            f"Agents holding state in the policy ({state.policy}) that orders the engine.",
            f"justitia_policy_agents {state.agents}",
        ),
    ]
    lines += _clock_lines(state)
    lines += [
        *_metric(
            "predictor_latency_seconds",
            "summary",
            "Time to predict an agent's cost.",
            f"justitia_predictor_latency_seconds_sum {m.predict_s:.6f}",
            f"justitia_predictor_latency_seconds_count {m.predictions}",
        ),
        *_metric("agent_jct_seconds", "histogram", "Job completion time of finished agents, by type."),
    ]
    for agent_type, counts in sorted(m.jct.items()):
        lines += histogram_samples(
            "justitia_agent_jct_seconds", f'type="{label(agent_type)}"', JCT_BUCKETS, counts, m.jct_sum[agent_type]
        )
    if manager.watch.last is not None:  # the per-tenant series, as the watch last read them (at most 1 s ago)
        lines += manager.watch.metric_lines()
    return "\n".join(with_model(lines + backend.metrics_lines(), manager.watch.model)) + "\n"


def _clock_lines(state: PolicyState) -> list[str]:
    """The GPS clock's V, N_t and M, or a comment saying the policy keeps none."""
    if not state.has_clock:
        return [f"# justitia_virtual_time: none, policy '{state.policy}' keeps no GPS virtual clock"]
    return [
        *_metric(
            "virtual_time",
            "gauge",
            "V(now) of the GPS clock that orders the engine, in cost units.",
            f"justitia_virtual_time {state.virtual_time:.6g}",
        ),
        *_metric(
            "gps_active_agents",
            "gauge",
            "Agents the GPS clock counts as active (N_t).",
            f"justitia_gps_active_agents {state.gps_active}",
        ),
        *_metric(
            "clock_capacity",
            "gauge",
            "The GPS clock's M, in cost units per second.",
            f"justitia_clock_capacity {state.capacity_per_s:.6g}",
        ),
    ]


def register_collector(holder) -> None:
    """Justitia's metrics beside vLLM's own at vLLM's ``/metrics`` (prometheus_client's default
    registry, which vLLM's single API server exports). ``holder.manager`` is the agent manager;
    ``holder.policy_state`` the policy as the door read it when ``/metrics`` was asked for (a
    collector cannot wait on the engine)."""
    from prometheus_client import REGISTRY
    from prometheus_client.parser import text_string_to_metric_families

    class Collector:
        def collect(self):
            state = getattr(holder, "policy_state", None)
            if holder.manager is not None and state is not None:
                yield from text_string_to_metric_families(prometheus_text(holder.manager, state))

    REGISTRY.register(Collector())
