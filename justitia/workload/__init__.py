"""Workloads: agents and their JSONL file format (``agents``), the nine workflow generators of the
paper's benchmark (``workflows``: its parameter file in ``parameters``, phrase banks in ``text``,
stage construction in ``stages``), arrival times (``arrivals``: the shipped Mooncake arrivals, any
Mooncake-format trace, or a gamma renewal process), and whole workloads of both
(``build_workload``)."""

from justitia.workload.agents import (Agent, Segment, Stage, Task, WorkloadError, append_agent, context_tokens,
                                      fit_tokens, load_workload, read_jsonl, save_workload, scale_tokens, tasks_by_id)
from justitia.workload.arrivals import DEFAULT_RATE_PER_S
from justitia.workload.workflows import build_workload
from justitia.workload.sessions import generate_sessions  # the session generator (--kind sessions)

__all__ = ["Agent", "Segment", "Stage", "Task", "WorkloadError", "context_tokens", "tasks_by_id", "append_agent", "load_workload", "read_jsonl", "save_workload",
           "scale_tokens", "fit_tokens", "DEFAULT_RATE_PER_S", "build_workload"]
