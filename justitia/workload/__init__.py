"""Workloads: agents and their JSONL file format (``agents``), the nine workflow generators of the
paper's benchmark (``workflows``: its parameter file in ``parameters``, phrase banks in ``text``,
stage construction in ``stages``), arrival times (``arrivals``: the shipped Mooncake arrivals, any
Mooncake-format trace, or a gamma renewal process), and whole workloads of both
(``build_workload``)."""

from justitia.workload.agents import (Agent, Task, WorkloadError, append_agent, load_workload, read_jsonl,
                                      save_workload, scale_tokens, fit_tokens)
from justitia.workload.arrivals import DEFAULT_RATE_PER_S
from justitia.workload.workflows import build_workload

__all__ = ["Agent", "Task", "WorkloadError", "append_agent", "load_workload", "read_jsonl", "save_workload",
           "scale_tokens", "fit_tokens", "DEFAULT_RATE_PER_S", "build_workload"]
