"""Fit a simulator latency profile to the steps a real engine took.

The plug-in's step log (``justitia.vllm.steplog``; docs/formats.md) has one row per engine step:
when it was scheduled, the tokens it computed (``batched_tokens``), the KV tokens its decoding
requests attend to (``decode_context_tokens``) and whether the next step followed at once. A
step's duration is the time to the next step's start, so it includes everything the engine does
per step (scheduling, the forward pass, sampling, output processing), which is what the
simulator's iteration time stands for. Only steps followed at once count; a step before an idle
gap has no measurable duration.

The same run measures the clock's M: the KV token-time the engine delivered (held by the requests
that sampled a token) over the duration of the steps that started with requests waiting and were
followed at once (a step before an idle gap has no measurable duration, and the gap is no busy
time), the rule the plug-in's meter follows (``CapacityMeter``), over the whole run at once. The
file ``justitia calibrate`` writes keeps it (``fit.delivered_capacity_per_s``);
``calibrated_capacity`` reads it back for an engine with the same KV cache, to start a clock from
(``JUSTITIA_CAPACITY``). Without one the clock starts from the formula's guess, and the meter's
first window replaces it.

The fit is least squares of ``step_ms = base + per_batched_token * batched + per_context_token * ctx
+ per_request * requests + per_arrival * arrivals`` (the batch's requests; the new requests taken in
before the next step) with every coefficient kept >= 0 (a negative one is dropped and the rest
refitted). Without the last two terms a run's first steps (many requests, many arrivals) were 10-30 %
slower than their tokens said and its last ones 10-20 % faster (docs/results.md, "Where the simulator's error comes
from"). The profile's
floor is 0: on a CPU there is no weight-streaming floor separate from the per-token cost.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from justitia.core import calibrated_capacity  # noqa: F401  (read back where a clock starts)
from justitia.sim.config import LatencyProfile
from justitia.vllm.steplog import StepRow


def _followed_at_once(rows: Sequence[StepRow]):
    """(step, the next step's start s, the new requests taken in before it) of every step with tokens
    that the next followed at once (``arrived_before`` of the next row; 0 in a log without that column)."""
    for row, nxt in zip(rows, rows[1:]):
        if row.busy_after and row.batched_tokens > 0:
            yield row, nxt.t_s, nxt.arrived_before or 0


def step_durations(rows: Sequence[StepRow]) -> np.ndarray:
    """(batched_tokens, decode_context_tokens, requests, arrivals, duration_ms) of every step followed
    at once: its batch's requests (prefilling and decoding), and the new requests the engine took in
    before the next one."""
    out = [
        (
            row.batched_tokens,
            row.decode_context_tokens,
            row.prefill_reqs + row.decode_reqs,
            arrivals,
            (end - row.t_s) * 1000.0,
        )
        for row, end, arrivals in _followed_at_once(rows)
    ]
    return np.asarray(out, dtype=float).reshape(-1, 5)


def delivered_capacity(runs: Iterable[Sequence[StepRow]]) -> tuple[float | None, float]:
    """(KV token-iterations per second delivered while requests waited, or None if they never did;
    the seconds of such steps) over the steps of one or more runs (none in a log without the
    ``waiting_before`` and ``delivered_kv`` columns)."""
    service, busy_s = 0, 0.0
    for rows in runs:
        for row, nxt in zip(rows, rows[1:]):
            # requests waited, and the next step followed at once
            if row.delivered_kv is not None and row.waiting_before > 0 and row.busy_after:
                service += row.delivered_kv
                busy_s += nxt.t_s - row.t_s
    return (service / busy_s if busy_s > 0 else None), busy_s


def fit_profile(
    runs: Iterable[Sequence[StepRow]],
    name: str,
    kv_blocks: int,
    block_size: int,
    source: str,
) -> tuple[LatencyProfile, dict]:
    """Fit a profile to the steps of one or more runs; also return fit statistics."""
    runs = list(runs)
    data = np.concatenate([step_durations(rows) for rows in runs] or [np.zeros((0, 5))])
    if len(data) < 10:
        raise ValueError(f"calibration needs at least 10 busy engine steps, got {len(data)}.")
    x = np.column_stack([np.ones(len(data)), data[:, :4]])
    y = data[:, 4]
    # a term that never varies cannot be told from the base (a log without arrivals fits no arrival cost)
    keep = [k for k in range(5) if k == 0 or np.ptp(x[:, k]) > 0]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(5)
    full[keep] = np.maximum(coef, 0)
    pred = x @ full
    resid = y - pred
    r2 = 1 - float((resid**2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12))
    profile = LatencyProfile(
        name=name,
        floor_ms=0.0,
        base_ms=float(full[0]),
        per_batched_token_ms=float(full[1]),
        per_context_token_ms=float(full[2]),
        scale=1.0,
        kv_blocks=kv_blocks,
        block_size=block_size,
        source=source,
        per_request_ms=float(full[3]),
        per_arrival_ms=float(full[4]),
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


def fit_frontend(
    runs: Iterable[tuple[Sequence[StepRow], Sequence[tuple[str, float, float]]]], per_request_ms_max: float = 3.0
) -> dict:
    """The front end's latencies (``LatencyProfile.frontend_ms``) measured on runs: each a step log
    (``arrived_before`` and ``finished`` columns) and the requests as the agents saw them (``EngineRun.requests``:
    id, sent, answered, seconds into the run; the step log's clock starts up to a millisecond
    earlier, at the plug-in's reset).

    The engine takes requests in the order they are sent, so the ``i``-th sent is the ``i``-th the
    step log counts in, at the start of the step it joined; likewise for answers and the steps in
    which requests finished. The front end is fitted as the simulator models it: one request at a
    time, ``frontend_ms_per_request`` each, then ``request_latency_ms``, then the next step's start
    (least squares over a grid); the answer latency is the mean delay from a finishing step's end to
    the agent's answer. Returns the three fields, and the fit's mean absolute error in ms.
    ``per_request_ms_max``: the grid's largest time per request (sixty steps up to it; an HTTP
    server's door, which renders and tokenizes each request, takes longer than the in-process one)."""
    sends, joins, ends, answers, starts = [], [], [], [], []
    for rows, requests in runs:
        if not requests or len(rows) < 2 or rows[0].finished is None:  # (an older log: no arrivals, no finishes)
            continue
        t = np.array([r.t_s for r in rows])
        joined = np.repeat(t, [r.arrived_before for r in rows])  # each request: the start of the step it joined
        ended = np.repeat(np.append(t[1:], t[-1]), [r.finished for r in rows])  # each finish: its step's end
        sent = np.sort([x[1] for x in requests])
        answered = np.sort([x[2] for x in requests])
        n, m = min(len(sent), len(joined)), min(len(answered), len(ended))
        sends.append(sent[:n]), joins.append(joined[:n]), ends.append(ended[:m]), answers.append(answered[:m])
        starts.append(t)
    if not sends:
        raise ValueError("the front end's latency needs step logs with arrivals and the runs' requests.")
    best = None
    for per_request_ms in np.linspace(0.0, per_request_ms_max, 61):
        s = per_request_ms / 1000
        free = []
        for sent in sends:  # q_i = max_j<=i (sent_j + (i - j + 1) s): the front end, one at a time
            k = np.arange(len(sent))
            free.append(np.maximum.accumulate(sent - k * s) + (k + 1) * s)
        for latency_ms in np.arange(0.0, 80.0001, 0.5):
            err = []
            for q, joined, t in zip(free, joins, starts):
                ready = q + latency_ms / 1000
                idx = np.minimum(np.searchsorted(t, ready), len(t) - 1)
                err.append(np.maximum(t[idx], ready) - joined)
            err = np.concatenate(err)
            score = float((err**2).mean())
            if best is None or score < best[0]:
                best = (score, per_request_ms, latency_ms, float(np.abs(err).mean()))
    answer = float(np.concatenate([a - e for a, e in zip(answers, ends)]).mean())
    return {
        "request_latency_ms": float(best[2]),
        "frontend_ms_per_request": float(round(best[1], 4)),
        "answer_latency_ms": max(answer * 1000, 0.0),
        "join_mean_abs_error_ms": best[3] * 1000,
    }


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


def fcfs_mean_jct(agents, config, seed: int) -> float:
    """The simulator's mean JCT of ``agents`` under fcfs on ``config``."""
    from justitia.lab.bench import RunSpec, simulate

    run = simulate(agents, RunSpec("fcfs", "fcfs"), config, seed)
    return sum(a.jct_s for a in run.agents) / len(run.agents)


SPEED_RANGE = (0.25, 4.0)  # a probe's scale stays within these multiples of the calibration's step times


def fit_speed(agents, config, engine_mean_jct_s: float, seed: int = 0, iterations: int = 16) -> float:
    """A speed probe: the factor on the profile's step times (``LatencyProfile.scale``, the request
    latency kept) at which the simulator gives ``agents`` under fcfs the mean JCT the engine has just
    given them. The engine's speed moves from one run to the next by more than the simulator's goal
    (repeats 16-29 % apart on one engine, docs/results.md); a probe of the calibration's own agents
    run just before a run says how fast the engine is then, without looking at that run."""
    from dataclasses import replace

    def mean_jct(scale: float) -> float:
        return fcfs_mean_jct(agents, replace(config, profile=replace(config.profile, scale=scale)), seed)

    return _solve_increasing(mean_jct, engine_mean_jct_s, *SPEED_RANGE, iterations, geometric=True)


def run_speed(profile: LatencyProfile, rows: Sequence[StepRow]) -> float | None:
    """A run's steps' measured time over the time ``profile`` gives them (the plug-in's step log);
    None without a measurable step. A diagnostic: it reads the run it describes."""
    steps = timed_steps(profile, rows)
    if not len(steps):
        return None
    predicted = steps[:, 2].sum()
    return float(steps[:, 1].sum() / predicted) if predicted > 0 else None


def timed_steps(profile: LatencyProfile, rows: Sequence[StepRow]) -> np.ndarray:
    """(start s, measured s, the time ``profile`` gives it) of every step followed at once (the
    plug-in's step log, ``step_durations``' steps)."""
    out = [
        (
            row.t_s,
            end - row.t_s,
            profile.iteration_s(
                row.batched_tokens, row.decode_context_tokens, row.prefill_reqs + row.decode_reqs, arrivals
            ),
        )
        for row, end, arrivals in _followed_at_once(rows)
    ]
    return np.asarray(out, dtype=float).reshape(-1, 3)


def probe_speed(profile: LatencyProfile, rows: Sequence[StepRow]) -> float | None:
    """A speed probe read from its step log: ``run_speed`` of the probe's steps, kept within
    ``SPEED_RANGE``; None without a step log (stock vLLM logs none)."""
    speed = run_speed(profile, rows)
    return None if speed is None else min(max(speed, SPEED_RANGE[0]), SPEED_RANGE[1])
