"""Fit a simulator latency profile to the steps a real engine took.

The plug-in's step log has one row per engine step: when it was scheduled, the tokens it computed
(``batched_tokens``), the KV tokens its decoding requests attend to (``decode_context_tokens``) and
whether the next step followed at once. A step's duration is the time to the next step's start, so
it includes everything the engine does per step (scheduling, the forward pass, sampling, output
processing), which is what the simulator's iteration time stands for. Only steps followed at once
count; a step before an idle gap has no measurable duration.

The same run measures the clock's M: the KV token-time the engine delivered (held by the requests
that sampled a token) over the duration of the steps that started with requests waiting, the
rule the plug-in's meter follows (``CapacityMeter``), over the whole run at once.

The fit is least squares of ``step_ms = base + per_batched_token * batched + per_context_token * ctx``
with every coefficient kept >= 0 (a negative one is dropped and the rest refitted). The profile's
floor is 0: on a CPU there is no weight-streaming floor separate from the per-token cost.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from justitia.sim.config import LatencyProfile


def step_durations(rows: Sequence[tuple[float, ...]]) -> np.ndarray:
    """(batched_tokens, decode_context_tokens, duration_ms) of every step followed at once."""
    out = []
    for k in range(len(rows) - 1):
        t, batched, ctx, _prefills, _decodes, busy = rows[k][:6]
        if busy and batched > 0:
            out.append((batched, ctx, (rows[k + 1][0] - t) * 1000.0))
    return np.asarray(out, dtype=float).reshape(-1, 3)


def delivered_capacity(runs: Iterable[Sequence[tuple[float, ...]]]) -> tuple[float | None, float]:
    """(KV token-iterations per second delivered while requests waited, or None if they never did;
    the seconds of such steps) over the steps of one or more runs."""
    service, busy_s = 0, 0.0
    for rows in runs:
        for k in range(len(rows) - 1):
            row = rows[k]
            if len(row) >= 9 and row[7] > 0 and row[5]:  # requests waited, and the next step followed at once
                service += row[8]
                busy_s += rows[k + 1][0] - row[0]
    return (service / busy_s if busy_s > 0 else None), busy_s


def fit_profile(
    runs: Iterable[Sequence[tuple[float, ...]]],
    name: str,
    kv_blocks: int,
    block_size: int,
    source: str,
) -> tuple[LatencyProfile, dict]:
    """Fit a profile to the steps of one or more runs; also return fit statistics."""
    runs = list(runs)
    data = np.concatenate([step_durations(rows) for rows in runs] or [np.zeros((0, 3))])
    if len(data) < 10:
        raise ValueError(f"calibration needs at least 10 busy engine steps, got {len(data)}.")
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    y = data[:, 2]
    keep = [0, 1, 2]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(3)
    full[keep] = np.maximum(coef, 0)
    pred = x @ full
    resid = y - pred
    r2 = 1 - float((resid**2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12))
    profile = LatencyProfile(
        name=name, floor_ms=0.0, base_ms=float(full[0]), per_batched_token_ms=float(full[1]),
        per_context_token_ms=float(full[2]), scale=1.0, kv_blocks=kv_blocks, block_size=block_size, source=source,
    )
    stats = {
        "steps": int(len(data)),
        "r2": r2,
        "median_abs_rel_error": float(np.median(np.abs(resid) / np.maximum(y, 1e-9))),
        "mean_step_ms": float(y.mean()),
        "total_measured_s": float(y.sum() / 1000),
        "total_fitted_s": float(pred.sum() / 1000),
    }
    delivered, backlogged_s = delivered_capacity(runs)
    stats["delivered_capacity_per_s"] = delivered  # the clock's M, measured (None: requests never waited)
    stats["backlogged_s"] = backlogged_s
    return profile, stats


def _solve_increasing(fn, target: float, lo: float, hi: float, iterations: int, geometric: bool = False) -> float:
    """The ``x`` in ``[lo, hi]`` at which the increasing ``fn(x)`` reaches ``target`` (bisection;
    ``geometric``: halving ratios rather than differences)."""
    for _ in range(iterations):
        mid = (lo * hi) ** 0.5 if geometric else (lo + hi) / 2
        if fn(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5 if geometric else (lo + hi) / 2


def _fcfs_mean_jct(agents, config, seed: int) -> float:
    from justitia.lab.bench import RunSpec, simulate

    run = simulate(agents, RunSpec("fcfs", "fcfs"), config, seed)
    return sum(a.jct_s for a in run.agents) / len(run.agents)


def fit_request_latency(agents, config, engine_mean_jct_s: float, seed: int = 0, max_ms: float = 1000.0,
                        iterations: int = 24) -> tuple[float, float, float]:
    """The one-way front-end latency (``LatencyProfile.request_latency_ms``) at which the simulator,
    on ``config``, gives ``agents`` under fcfs the mean JCT the engine gave them: what the steps
    alone leave out (a request's way in and out of the engine, an agent's stage hand-offs).

    Bisection: the simulator's mean JCT grows with the latency. Returns (latency ms, the simulator's
    mean JCT at zero latency, and at the fitted one); zero when the steps alone are already as slow.
    """
    from dataclasses import replace

    def mean_jct(latency_ms: float) -> float:
        return _fcfs_mean_jct(agents, replace(config, profile=replace(config.profile, request_latency_ms=latency_ms)),
                              seed)

    at_zero = mean_jct(0.0)
    if at_zero >= engine_mean_jct_s:
        return 0.0, at_zero, at_zero
    latency = _solve_increasing(mean_jct, engine_mean_jct_s, 0.0, max_ms, iterations)
    return latency, at_zero, mean_jct(latency)


SPEED_RANGE = (0.25, 4.0)  # a probe's scale stays within these multiples of the calibration's step times


def fit_speed(agents, config, engine_mean_jct_s: float, seed: int = 0, iterations: int = 16) -> float:
    """A speed probe: the factor on the profile's step times (``LatencyProfile.scale``, the request
    latency kept) at which the simulator gives ``agents`` under fcfs the mean JCT the engine has just
    given them. The engine's speed moves from one run to the next by more than the simulator's goal
    (repeats 16-29 % apart on one engine, docs/results.md); a probe of the calibration's own agents
    run just before a run says how fast the engine is then, without looking at that run."""
    from dataclasses import replace

    def mean_jct(scale: float) -> float:
        return _fcfs_mean_jct(agents, replace(config, profile=replace(config.profile, scale=scale)), seed)

    return _solve_increasing(mean_jct, engine_mean_jct_s, *SPEED_RANGE, iterations, geometric=True)


def run_speed(profile: LatencyProfile, rows: Sequence[tuple[float, ...]]) -> float | None:
    """A run's steps' measured time over the time ``profile`` gives them (the plug-in's step log);
    None without a measurable step. A diagnostic: it reads the run it describes."""
    steps = step_durations(rows)
    if not len(steps):
        return None
    predicted = sum(profile.iteration_s(int(b), int(c)) for b, c, _ in steps)
    return float(steps[:, 2].sum() / 1000 / predicted) if predicted > 0 else None


def probe_speed(profile: LatencyProfile, rows: Sequence[tuple[float, ...]]) -> float | None:
    """A speed probe read from its step log: ``run_speed`` of the probe's steps, kept within
    ``SPEED_RANGE``; None without a step log (stock vLLM logs none)."""
    speed = run_speed(profile, rows)
    return None if speed is None else min(max(speed, SPEED_RANGE[0]), SPEED_RANGE[1])
