"""What prediction costs on the server's request path: ``online`` pricing with agents in flight,
and whether its background refits stall the event loop.

    python -m justitia.lab.costs.bench_pricing --agents 1000 --out results/pricing.json

The server's predictor (``server.learning.server_predictor``: refits in a worker thread), having
learned 1,000 finished agents of the main workload's generator, prices ``--agents`` more, each left
in flight (priced and not finished). Reported: pricing's p50 and p99 (one ``agent_dist`` call, what
``AgentProcess.predict`` makes), and the event loop's lag: how far a 1 ms sleep overshoots on an
loop that hands the worker a finished agent every millisecond (as a server's answer path does), 500
of them with refits held off, then 500 more with the worker refitting every ``REFIT_EVERY`` of a
type.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from justitia.core import KV
from justitia.workload import build_workload
from justitia.workload.arrivals import MOONCAKE_ARRIVALS


async def _lags(seconds: float, busy) -> list[float]:
    """The overshoot of a 1 ms sleep on this loop, sampled for ``seconds`` while ``busy()`` is true."""
    lags: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and busy():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t0 - 0.001)
    return lags


async def measure(agents: int, seed: int) -> dict:
    from justitia.server.learning import server_predictor

    pred = server_predictor("online")
    pool, _ = build_workload(agents, seed, MOONCAKE_ARRIVALS, 1.0)
    history, _ = build_workload(2000, seed + 1, MOONCAKE_ARRIVALS, 1.0)
    # what finished before: learned first, so that every model is past its cold start
    for h in history[:1000]:
        pred.learn(h, h.cost(KV))
    pred.flush(60.0)
    costs = []
    for a in pool:  # every agent stays in flight: none of them is learned
        t0 = time.perf_counter()
        pred.agent_dist(a, KV)
        costs.append(time.perf_counter() - t0)
    # the loop feeds the worker finished agents, one a millisecond (as a server's answer path does),
    # while a ticker measures its lag: once with refits held off, once with them
    from justitia.predictors import online

    async def feed(agents_done) -> list[float]:
        done = asyncio.Event()

        async def run() -> None:
            for h in agents_done:
                pred.learn(h, h.cost(KV))
                await asyncio.sleep(0.001)
            await asyncio.get_running_loop().run_in_executor(None, pred.flush, 60.0)
            done.set()

        task = asyncio.create_task(run())
        lags = await _lags(120.0, lambda: not done.is_set())
        await task
        return lags

    held, online.MIN_FIT = online.MIN_FIT, 10**9
    try:
        quiet = await feed(history[1000:1500])
    finally:
        online.MIN_FIT = held
    refits0 = pred.refits
    busy = await feed(history[1500:])
    pred.close()
    ms = np.array(costs) * 1000
    q, b = np.array(quiet) * 1000, np.array(busy) * 1000
    return {
        "agents_in_flight": agents,
        "pricing_p50_ms": float(np.percentile(ms, 50)),
        "pricing_p99_ms": float(np.percentile(ms, 99)),
        "pricing_max_ms": float(ms.max()),
        "refits_during_lag_run": pred.refits - refits0,
        "learned": pred.observations,
        "loop_lag_p99_ms_quiet": float(np.percentile(q, 99)),
        "loop_lag_p99_ms_refitting": float(np.percentile(b, 99)),
        "loop_lag_max_ms_quiet": float(q.max()),
        "loop_lag_max_ms_refitting": float(b.max()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/pricing.json"))
    args = p.parse_args(argv)
    doc = asyncio.run(measure(args.agents, args.seed))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(
        f"online pricing with {doc['agents_in_flight']:,} agents in flight: p50 {doc['pricing_p50_ms']:.3f} ms, "
        f"p99 {doc['pricing_p99_ms']:.3f} ms (max {doc['pricing_max_ms']:.2f}); a 1 ms sleep on the event loop "
        f"overshoots by p99 {doc['loop_lag_p99_ms_quiet']:.2f} ms with no refit and "
        f"{doc['loop_lag_p99_ms_refitting']:.2f} ms "
        f"during {doc['refits_during_lag_run']} background refits (max {doc['loop_lag_max_ms_quiet']:.2f} / "
        f"{doc['loop_lag_max_ms_refitting']:.2f} ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
