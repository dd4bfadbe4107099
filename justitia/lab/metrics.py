"""Job-completion-time statistics, finish-time fairness, the GPS reference and the delay bound."""

from __future__ import annotations

import math

import numpy as np

from justitia.core import KV, LAG_FACTOR, VirtualClock
from justitia.sim import EngineConfig
from justitia.workload import Agent


def jct_stats(jcts_s: list[float]) -> dict:
    """Mean, p50, p90 and p99 of agent JCTs, in seconds."""
    arr = np.asarray(jcts_s, dtype=float)
    return {
        "mean_jct_s": float(arr.mean()),
        "p50_jct_s": float(np.percentile(arr, 50)),
        "p90_jct_s": float(np.percentile(arr, 90)),
        "p99_jct_s": float(np.percentile(arr, 99)),
    }


def turn_stats(results: list) -> dict:
    """Sessions' turn times (first request sent to last answer, tool pauses inside included), in
    seconds, over every turn of every session: mean, p50, p90, p99, and how many."""
    arr = np.asarray([t for r in results for t in (r.turns_s or ())], dtype=float)
    if not len(arr):
        return {}
    return {
        "turns": int(len(arr)),
        "mean_turn_s": float(arr.mean()),
        **{f"p{q}_turn_s": float(np.percentile(arr, q)) for q in (50, 90, 99)},
    }


def turn_prediction(results: list) -> dict:
    """How well sessions' turn costs were predicted as each turn started, by turn index (the first
    five, then ``all``): the share within a factor of 2 and the median |log2(predicted / true)|."""
    by: dict = {}
    for r in results:
        for k, (pred, true) in enumerate(r.turn_costs or ()):
            if pred > 0 and true > 0:
                err = abs(math.log2(pred / true))
                by.setdefault(str(k) if k < 5 else "5+", []).append(err)
                by.setdefault("all", []).append(err)
    return {
        k: {
            "turns": len(v),
            "within_2x": float(np.mean(np.asarray(v) <= 1.0)),
            "median_abs_log2_error": float(np.median(v)),
        }
        for k, v in sorted(by.items(), key=lambda kv: kv[0] == "all")
    }


def fairness(reference: dict[str, float], other: dict[str, float]) -> dict:
    """Relative JCT increase of ``other`` over ``reference``, paired by agent id.

    ``not_delayed_frac``: agents that finished no later than under the reference;
    ``mean_delay_of_delayed``: mean relative increase among the others; ``max_delay``: the largest;
    ``delay_p50``, ``delay_p90``, ``delay_p99``: percentiles of the relative increase over all agents
    (negative: faster than under the reference). A relative increase below one part in a million
    counts as not delayed (float noise).
    """
    missing = set(reference) ^ set(other)
    if missing:
        raise ValueError(f"cannot pair runs: agent '{sorted(missing)[0]}' is in only one of them.")
    delays = np.array([(other[a] - reference[a]) / reference[a] for a in sorted(reference)])
    delayed = delays[delays > 1e-6]
    return {
        "agents": int(len(delays)),
        "not_delayed_frac": float(1 - len(delayed) / len(delays)),
        "mean_delay_of_delayed": float(delayed.mean()) if len(delayed) else 0.0,
        "max_delay": float(max(delays.max(), 0.0)),
        **{f"delay_p{q}": float(np.percentile(delays, q)) for q in (50, 90, 99)},
    }


def gps_finish_times(
    agents: list[Agent],
    capacity_per_s: float,
    schedule: list[tuple[float, float]] | None = None,
    bursts: dict[str, list] | None = None,
) -> dict[str, float]:
    """Each agent's finish time, in seconds, under ideal GPS with its true KV token-time cost, at
    ``capacity_per_s``, or at the measured capacity ``schedule`` ((time, M) pairs: M from that time on).
    For a cluster, both are the engines' together: N engines are one GPS server of N x M.
    ``bursts``: a session's work as it came, ``[sent at, true cost]`` per burst (a run's; the
    session is one flow that each burst joins, ``docs/sessions.md``): its GPS finish is its last
    burst's, given the times the run sent them."""
    changes = sorted(schedule or [(0.0, capacity_per_s)])
    clock = VirtualClock(changes[0][1])
    k = 1
    bursts = bursts or {}
    events = sorted(
        ((t, i, a, c) for a in agents for i, (t, c) in enumerate(bursts.get(a.agent_id) or [(a.arrival_s, None)])),
        key=lambda e: (e[0], e[1]),
    )
    last: dict[str, float] = {}
    for t, i, a, cost in events:
        while k < len(changes) and changes[k][0] <= t:
            clock.set_capacity(changes[k][1], changes[k][0])
            k += 1
        if i:  # the burst before it left the engine (a pause): settled at its true cost, as the core does
            clock.settle(a.agent_id, last[a.agent_id], t)
        last[a.agent_id] = a.cost(KV) if cost is None else cost
        clock.arrive(a.agent_id, last[a.agent_id], t, a.weight, a.tenant)
    for t, m in changes[k:]:  # changes after the last arrival still pace the drain
        clock.set_capacity(m, t)
    return clock.drain()


def delay_bound_s(
    agents: list[Agent],
    config: EngineConfig,
    capacity_per_s: float | None = None,
    replicas: int = 1,
    bursts: dict[str, list] | None = None,
    guard: bool = False,
    guard_lag_s: float | None = None,
) -> float:
    """The paper's bound ``2 c_max + C_max / M`` on ``finish - gps_finish``, in seconds.

    ``C_max / M``: the largest agent's KV token-time over the capacity per second (``capacity_per_s``,
    by default the formula M of ``replicas`` engines together; with a measured M, its smallest
    value, a cluster's summed over its engines). ``c_max``, the non-preemption term, is the longest
    time one inference holds its memory once it starts: its prefill chunks plus its decode
    iterations, at the nominal (memory-saturated) iteration time of the one engine that runs it.

    ``guard``: the bound ``B`` that justitia-guarded's lag guard keeps whatever the prices
    (``core.guard``): ``2 c_max + max(L, LAG_FACTOR * C_max / M)``, ``L`` the largest lag the guard
    ran at (``guard_lag_s``; docs/design.md, "A bound that holds whatever the prices").
    """
    iters = max(
        math.ceil(t.prompt_tokens / config.max_num_batched_tokens) + t.output_tokens - 1
        for a in agents
        for t in a.tasks
    )
    c_max_s = iters * config.nominal_iteration_s
    bursts = bursts or {}  # a session's largest burst is what it waits behind (docs/sessions.md)
    big_c = max(max(c for _, c in bursts[a.agent_id]) if bursts.get(a.agent_id) else a.cost(KV) for a in agents)
    m = capacity_per_s or replicas * config.capacity_per_s(KV)
    if not guard:
        return 2 * c_max_s + big_c / m
    return 2 * c_max_s + max(guard_lag_s or 0.0, LAG_FACTOR * big_c / m)


def largest_burst(agents: list[Agent]) -> float:
    """The largest burst of work among ``agents``, in KV token-time, as the GPS yardstick counts
    bursts: an agent's whole cost; a session's largest group of calls sent together (its work
    comes as calls sent while none is open: docs/sessions.md). What justitia's lag guard is scaled
    by (``core.guard``)."""
    best = 0.0
    for a in agents:
        if not a.is_session:
            best = max(best, a.cost(KV))
            continue
        for turn in range(a.turn_count):
            for group in a.turn_groups(turn):
                best = max(
                    best,
                    sum(KV.request_cost(t.prompt_tokens, t.output_tokens) for t in (a.task(s, i) for s, i in group)),
                )
    return best


def paired_bootstrap(a: np.ndarray, b: np.ndarray, resamples: int = 4000, seed: int = 0) -> dict:
    """The ratio of mean JCTs ``mean(a) / mean(b)`` and its 95 % interval, by a paired bootstrap over
    agents and repeats.

    ``a`` and ``b`` hold JCTs of shape (repeats, agents): row ``r`` of each is the ``r``-th
    interleaved repeat, column ``i`` the same agent. Each resample draws repeats and agents with
    replacement, the same draw for both runs (paired: an agent's own size and a repeat's own engine
    speed cancel out of the ratio), and takes the ratio of the two means over the drawn cells.
    """
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired runs must have the same repeats and agents, got {a.shape} and {b.shape}.")
    repeats, agents = a.shape
    rng = np.random.default_rng(seed)
    w = rng.multinomial(agents, np.full(agents, 1 / agents), size=resamples)  # (B, agents): draws per agent
    v = rng.multinomial(repeats, np.full(repeats, 1 / repeats), size=resamples)  # (B, repeats)
    num = (v * (a @ w.T).T).sum(axis=1)  # sum over drawn (repeat, agent) cells, per resample
    den = (v * (b @ w.T).T).sum(axis=1)
    ratios = num / den
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return {
        "ratio": float(a.mean() / b.mean()),
        "ci95": [float(lo), float(hi)],
        "repeats": int(repeats),
        "agents": int(agents),
        "resamples": int(resamples),
    }
