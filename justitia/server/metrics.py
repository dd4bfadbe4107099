"""``GET /metrics``: the server's state in the Prometheus text format."""

from __future__ import annotations

from justitia.core import PolicyState
from justitia.server.agents import JCT_BUCKETS, AgentManager
from justitia.backends.base import metric_lines as _metric


def prometheus_text(manager: AgentManager, state: PolicyState) -> str:
    """The exposition: agents, requests, the policy that orders the engine and its clock, the
    predictor's latency, JCTs per type, then the backend's own lines (queues, replicas)."""
    m, backend = manager, manager.backend
    lines = [
        *_metric("agents_in_flight", "gauge", "Agents submitted and not yet done, failed or cancelled.",
                 f"justitia_agents_in_flight {m.in_flight()}"),
        *_metric("tasks_in_flight", "gauge", "Agent-API requests sent to the engine and not finished.",
                 f"justitia_tasks_in_flight {m.tasks_in_flight}"),
        *_metric("agents_finished_total", "counter", "Agents that ended, by how.",
                 *(f'justitia_agents_finished_total{{status="{k}"}} {v}' for k, v in m.finished.items())),
        *_metric("requests_total", "counter", "Requests received, by endpoint.",
                 *(f'justitia_requests_total{{endpoint="{k}"}} {v}' for k, v in m.requests.items())),
        *_metric("engine_requests_unfinished", "gauge",
                 "Requests the engine holds (waiting or running), all endpoints.",
                 f"justitia_engine_requests_unfinished {backend.unfinished()}"),
        *_metric("policy_agents", "gauge", f"Agents holding state in the policy ({state.policy}) that orders the engine.",
                 f"justitia_policy_agents {state.agents}"),
    ]
    if state.has_clock:
        lines += [
            *_metric("virtual_time", "gauge", "V(now) of the GPS clock that orders the engine, in cost units.",
                     f"justitia_virtual_time {state.virtual_time:.6g}"),
            *_metric("gps_active_agents", "gauge", "Agents the GPS clock counts as active (N_t).",
                     f"justitia_gps_active_agents {state.gps_active}"),
            *_metric("clock_capacity", "gauge", "The GPS clock's M, in cost units per second.",
                     f"justitia_clock_capacity {state.capacity_per_s:.6g}"),
        ]
    else:
        lines.append(f"# justitia_virtual_time: none, policy '{state.policy}' keeps no GPS virtual clock")
    lines += [
        *_metric("predictor_latency_seconds", "summary", "Time to predict an agent's cost.",
                 f"justitia_predictor_latency_seconds_sum {m.predict_s:.6f}",
                 f"justitia_predictor_latency_seconds_count {m.predictions}"),
        *_metric("agent_jct_seconds", "histogram", "Job completion time of finished agents, by type."),
    ]
    for agent_type, counts in sorted(m.jct.items()):
        running = 0
        for bound, n in zip(JCT_BUCKETS, counts):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'justitia_agent_jct_seconds_bucket{{type="{agent_type}",le="{le}"}} {running}')
        lines.append(f'justitia_agent_jct_seconds_sum{{type="{agent_type}"}} {m.jct_sum[agent_type]:.6f}')
        lines.append(f'justitia_agent_jct_seconds_count{{type="{agent_type}"}} {running}')
    return "\n".join(lines + backend.metrics_lines()) + "\n"


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
