"""Time the cluster simulator: agents x engines, three policies (justitia with one clock, vtc, srjf).

    python -m justitia.lab.studies.bench_cluster [--agents 1200,2400,4800] [--replicas 4,16,64]
                                    [--policies justitia,vtc,srjf] [--seed 0] [--out FILE.json]
    python -m justitia.lab.studies.bench_cluster --bound 150


Each workload is the main preset's (the nine workflows at the Mooncake trace's arrivals) at N times
its arrival rate on N engines (density N), least-load routing, measured M, oracle predictions, as
`justitia bench --replicas N --density N` runs it. Prints, per cell, the seconds of each policy
(wall and this process's CPU time: other processes on the machine inflate the first, not the
second), the engine iterations and loop passes, and writes every row as JSON.

``--bound K`` instead runs K random single-stage workloads (tests/core/test_bound.py's kind, on 2-4
engines) under justitia with one clock (least-load, round-robin) and a clock per engine, and
counts the workloads where some agent finishes past its GPS finish (one server of the engines'
total M) + the bound.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from justitia.lab.bench import RunSpec, simulate
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.lab.presets import SIM_DEFAULT_PROFILE, build_workload
from justitia.predictors import make_predictor
from justitia.sim import Cluster, EngineConfig, LatencyProfile
from justitia.sim.config import load_profile
from justitia.workload import Agent, Task
from justitia.workload.arrivals import MOONCAKE_ARRIVALS


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def bound_check(workloads: int) -> None:
    """Workloads with an agent past the bound, per clock and router (see the module's docstring)."""
    flat = LatencyProfile("const-10ms", 10.0, 0.0, 0.0, 0.0, 1.0, 64, "every iteration 10 ms")
    cases = {("least-load", "global"): [], ("round-robin", "global"): [], ("least-load", "replica"): []}
    for seed in range(workloads):
        rng = np.random.default_rng(seed)
        replicas, blocks, n = int(rng.integers(2, 5)), int(rng.integers(90, 200)), int(rng.integers(2, 40))
        t, agents = 0.0, []
        for i in range(n * replicas // 2 + 2):  # test_bound's single-stage agents, more of them
            t += float(rng.exponential(0.15))
            tasks = tuple(
                Task("t", int(rng.integers(1, 200)), int(rng.integers(1, 150))) for _ in range(rng.integers(1, 12))
            )
            agents.append(Agent(f"a{i:03d}", "t", round(t, 3), (tasks,)))
        cfg = EngineConfig(profile=flat, kv_blocks=blocks, max_num_batched_tokens=512, max_num_seqs=256)
        gps = gps_finish_times(agents, replicas * cfg.capacity_per_s("kv"))
        bound = delay_bound_s(agents, cfg, replicas=replicas)
        for (router, clock), over in cases.items():
            run = Cluster(cfg, "justitia", make_predictor("oracle"), replicas=replicas, router=router, clock=clock).run(
                agents
            )
            over.append(max(a.finish_s - gps[a.agent_id] for a in run.agents) / bound - 1)
    for (router, clock), over in cases.items():
        late = [x for x in over if x > 0]
        print(
            f"{clock} clock, {router}: {len(late)} of {workloads} workloads with an agent past the bound"
            + (f" (by up to {max(late):.0%} of it)" if late else f" (largest finish - GPS: {max(over) + 1:.0%} of it)")
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=_ints, default=[1200, 2400, 4800])
    ap.add_argument("--replicas", type=_ints, default=[4, 16, 64])
    ap.add_argument("--policies", default="justitia,vtc,srjf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/bench_cluster.json"))
    ap.add_argument("--bound", type=int, metavar="K", help="check the delay bound on K random workloads instead")
    args = ap.parse_args()
    if args.bound:
        bound_check(args.bound)
        return 0
    policies = [p for p in args.policies.split(",") if p]
    config = EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE))
    rows = []
    for n_agents in args.agents:
        for replicas in args.replicas:
            agents, _ = build_workload(n_agents, args.seed, MOONCAKE_ARRIVALS, float(replicas))
            for policy in policies:
                cpu0, wall0 = time.process_time(), time.perf_counter()
                run = simulate(agents, RunSpec(policy, policy), config, args.seed, replicas=replicas)
                rows.append(
                    {
                        "agents": n_agents,
                        "replicas": replicas,
                        "policy": policy,
                        "wall_s": time.perf_counter() - wall0,
                        "cpu_s": time.process_time() - cpu0,
                        "iterations": run.iterations,
                        "steps": run.steps,
                        "mean_jct_s": sum(a.jct_s for a in run.agents) / len(run.agents),
                    }
                )
                r = rows[-1]
                print(
                    f"{n_agents} agents, {replicas} engines, {policy}: {r['wall_s']:.1f} s wall, "
                    f"{r['cpu_s']:.1f} s CPU, {r['iterations']:,} iterations",
                    flush=True,
                )
    table = Table(title="cluster simulator: seconds per run (CPU; wall in brackets), three policies")
    for col in ("agents", "engines", *policies, "all three", "iterations (all three)", "CPU us per iteration"):
        table.add_column(col, justify="right")
    for n_agents in args.agents:
        for replicas in args.replicas:
            cell = [r for r in rows if r["agents"] == n_agents and r["replicas"] == replicas]
            cpu, wall, iters = (sum(r[k] for r in cell) for k in ("cpu_s", "wall_s", "iterations"))
            table.add_row(
                f"{n_agents:,}",
                str(replicas),
                *(f"{r['cpu_s']:.1f} ({r['wall_s']:.1f})" for r in cell),
                f"{cpu:.1f} ({wall:.1f})",
                f"{iters:,}",
                f"{1e6 * cpu / iters:.0f}",
            )
    Console(width=160).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seed": args.seed, "policies": policies, "rows": rows}, indent=1))
    print(f"rows: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
