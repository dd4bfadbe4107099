"""Workloads: agents, sessions and their data model (``agents``), the JSONL file that carries them
(``files``), the nine workflow generators of the paper's benchmark (``workflows``: its parameter
file in ``parameters``, phrase banks in ``text``, stage construction in ``stages``), coding-agent
sessions (``sessions``, from ``data/sessions.json``), arrival times (``arrivals``: the shipped
Mooncake arrivals, any Mooncake-format trace, or a gamma renewal process), and whole workloads
(``build_workload``, ``build_sessions``)."""

from justitia.workload.agents import (
    Agent,
    Segment,
    Stage,
    Task,
    WorkloadError,
    context_tokens,
    fit_tokens,
    scale_tokens,
    tasks_by_id,
)
from justitia.workload.arrivals import DEFAULT_RATE_PER_S
from justitia.workload.files import append_agent, load_workload, read_jsonl, save_workload
from justitia.workload.sessions import build_sessions, generate_sessions
from justitia.workload.text import shared_text
from justitia.workload.workflows import build_workload

__all__ = [
    "Agent",
    "Segment",
    "Stage",
    "Task",
    "WorkloadError",
    "context_tokens",
    "fit_tokens",
    "scale_tokens",
    "tasks_by_id",
    "DEFAULT_RATE_PER_S",
    "append_agent",
    "load_workload",
    "read_jsonl",
    "save_workload",
    "build_sessions",
    "generate_sessions",
    "build_workload",
    "shared_text",
]
