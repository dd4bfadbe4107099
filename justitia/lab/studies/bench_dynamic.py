"""Time the simulator under deep backlog: the shipped Mooncake conversation arrivals (1x density,
the main preset's workload generator and engine), static policies against dynamic ones. Prints wall
seconds (and CPU seconds, steadier on a shared machine) per policy and the ratio to the slowest
static policy (fcfs, justitia), and writes JSON with each run's counts (and, with --finish-times, every
agent's finish time, to compare two versions of the code).

    python -m justitia.lab.studies.bench_dynamic [--agents N] [--policies fcfs,justitia,srjf,vtc,las] [--seed 0]
                                    [--out results/dynamic.json] [--finish-times]

``--agents`` defaults to the whole trace (12,031 agents, about 9 simulated hours of backlog on one
engine); 2,000 or so is enough to iterate on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from justitia.core import STATIC_POLICY_NAMES
from justitia.lab.bench import RunSpec, simulate
from justitia.lab.presets import build_workload
from justitia.sim import EngineConfig
from justitia.workload.arrivals import MOONCAKE_ARRIVALS
from justitia.workload.files import read_jsonl

DEFAULT_POLICIES = "fcfs,justitia,srjf,vtc,las"


def main() -> None:
    """Run the timing and report it."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, help="agents, at the trace's first arrivals (default: the whole trace)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated (default {DEFAULT_POLICIES})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/dynamic.json"))
    ap.add_argument("--finish-times", action="store_true", help="also write every agent's finish time")
    args = ap.parse_args()
    n = args.agents or sum(1 for _ in read_jsonl(MOONCAKE_ARRIVALS))
    t0 = time.perf_counter()
    agents, info = build_workload(n, args.seed, MOONCAKE_ARRIVALS, 1.0)
    build_s = time.perf_counter() - t0
    print(f"{n} agents, arrivals over {agents[-1].arrival_s:.0f} s; workload built in {build_s:.1f} s")
    config = EngineConfig()
    rows = []
    for policy in args.policies.split(","):
        cpu0 = time.process_time()
        run = simulate(agents, RunSpec(policy, policy), config, args.seed)
        cpu_s = time.process_time() - cpu0
        row = {
            "policy": policy,
            "static": policy in STATIC_POLICY_NAMES,
            "wall_s": run.wall_s,
            "cpu_s": cpu_s,
            "makespan_s": run.makespan_s,
            "iterations": run.iterations,
            "steps": run.steps,
            "preemptions": run.preemptions,
        }
        if args.finish_times:
            row["finish_s"] = {a.agent_id: a.finish_s for a in run.agents}
        rows.append(row)
        print(
            f"{policy:<9} {run.wall_s:8.2f} s (cpu {cpu_s:7.2f} s)  makespan {run.makespan_s:9.1f} s  "
            f"iterations {run.iterations:>9}  loop passes {run.steps:>8}  preemptions {run.preemptions:>6}",
            flush=True,
        )
    static = [r for r in rows if r["static"]] or rows  # fcfs and justitia by default (keys fixed on arrival)
    slowest = max(r["wall_s"] for r in static)
    for r in rows:
        r["vs_slowest_static"] = r["wall_s"] / slowest
    print(
        "wall time against the slowest static policy: "
        + ", ".join(f"{r['policy']} {r['vs_slowest_static']:.2f}x" for r in rows)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workload": info, "workload_build_s": build_s, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
