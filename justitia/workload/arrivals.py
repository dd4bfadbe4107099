"""Agent arrival times: replayed from a Mooncake-format trace, or drawn from a gamma renewal process.

A Mooncake trace is JSONL with one request per line and a ``timestamp`` in milliseconds; every other
field is ignored here. ``density`` compresses the trace in time: density 2 submits the same agents
twice as fast, as in the paper's 1x/2x/3x experiments. The package ships the timestamps of the
Mooncake FAST'25 conversation trace (Apache-2.0; ``justitia/data/NOTICE``) as ``MOONCAKE_ARRIVALS``,
the presets' default, so that a clone alone reproduces them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from justitia.core import is_positive_finite
from justitia.workload.agents import WorkloadError
from justitia.workload.files import read_jsonl

MOONCAKE_ARRIVALS: Path = Path(__file__).parents[1] / "data" / "mooncake_conversation_arrivals.jsonl.gz"

# Mean agent arrival rate of the first 300 requests of the Mooncake conversation trace (300 in
# 102 s): the synthetic default, so that a machine without the trace sees a comparable load.
DEFAULT_RATE_PER_S = 300 / 102


def trace_arrivals(path: str | Path, n: int, density: float = 1.0) -> list[float]:
    """Arrival times in seconds of the first ``n`` trace records, the first at 0, divided by ``density``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}.")
    if isinstance(density, bool) or not is_positive_finite(density):
        raise ValueError(f"density must be a finite number > 0, got {density!r}.")
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such trace file.")
    stamps_ms: list[float] = []
    prev_line = 0
    for lineno, where, doc in read_jsonl(path):
        if not isinstance(doc, dict):
            raise WorkloadError(f"{where}: expected a JSON object for the record, got {type(doc).__name__}.")
        if "timestamp" not in doc:
            raise WorkloadError(f"{where}: field 'timestamp' is missing; expected a number of milliseconds >= 0.")
        ts = doc["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise WorkloadError(
                f"{where}: field 'timestamp' must be a number of milliseconds >= 0, got {json.dumps(ts)[:60]}."
            )
        if stamps_ms and ts < stamps_ms[-1]:
            raise WorkloadError(
                f"{where}: field 'timestamp' is {ts}, earlier than {stamps_ms[-1]} on line "
                f"{prev_line}; timestamps must be non-decreasing."
            )
        stamps_ms.append(float(ts))
        prev_line = lineno
        if len(stamps_ms) == n:
            break  # lines after the n-th record are never read
    if len(stamps_ms) < n:
        raise WorkloadError(f"{path}: asked for {n} arrivals but the trace holds only {len(stamps_ms)} records.")
    first = stamps_ms[0]
    return [(ts - first) / 1000.0 / density for ts in stamps_ms]


def synthetic_arrivals(n: int, rng: np.random.Generator, rate_per_s: float, cv: float = 1.0) -> list[float]:
    """``n`` arrival times in seconds, the first at 0, with gamma gaps of mean ``1/rate_per_s`` and CV ``cv``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}.")
    if not is_positive_finite(rate_per_s):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}.")
    if not is_positive_finite(cv):
        raise ValueError(f"cv must be a finite number > 0, got {cv!r}.")
    shape = 1.0 / (cv * cv)
    gaps_s = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n - 1)
    return [0.0] + np.cumsum(gaps_s).tolist()


def arrival_times(
    n: int,
    rng: np.random.Generator,
    trace: str | Path | None = None,
    density: float = 1.0,
    rate_per_s: float = DEFAULT_RATE_PER_S,
    cv: float = 1.0,
) -> tuple[list[float], dict]:
    """``n`` arrival times from the trace (or synthetic ones), and a description of them."""
    if trace is not None:
        name = "mooncake_conversation" if Path(trace) == MOONCAKE_ARRIVALS else str(trace)  # the shipped one: no path
        return trace_arrivals(trace, n, density), {"arrivals": "trace", "trace": name, "density": density}
    return (
        synthetic_arrivals(n, rng, rate_per_s * density, cv),
        {"arrivals": "synthetic", "rate_per_s": rate_per_s, "cv": cv, "density": density},
    )
