"""Workloads: agents and their JSONL file format (``agents``), the nine workflow generators of the
paper's benchmark (``workflows``), and arrival times (``arrivals``: the shipped Mooncake arrivals,
any Mooncake-format trace, or a gamma renewal process)."""

from justitia.workload.agents import (Agent, Task, WorkloadError, append_agent, load_workload, read_jsonl,
                                      save_workload, scale_tokens, fit_tokens)

__all__ = ["Agent", "Task", "WorkloadError", "append_agent", "load_workload", "read_jsonl", "save_workload",
           "scale_tokens", "fit_tokens"]
