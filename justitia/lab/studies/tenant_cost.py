"""What hierarchical GPS costs the simulator on the full-trace run: `cluster-64`'s 12,000 agents.

    python -m justitia.lab.studies.tenant_cost [--tenants 0,1,4,100] [--replicas 64] [--agents 12000]

Justitia with one clock in front of the engines (the cluster's front stamps every request with its
agent's root key) on the cluster-64 workload, its agents spread at random over N tenants of weight 1
(0: no tenants, the flat clock). Prints the wall time of each run, the front's share of it (its
core's verbs, measured by wrapping them) and the mean JCT.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from justitia.core import AgentScheduler
from justitia.lab.bench import RunSpec, simulate
from justitia.lab.presets import SIM_DEFAULT_PROFILE, build_workload
from justitia.sim import EngineConfig
from justitia.sim.config import load_profile
from justitia.workload.arrivals import MOONCAKE_ARRIVALS

TIMED = ("agent_arrived", "request_arrived", "dequeue", "priority", "agent_finished", "request_finished")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", default="0,1,4,100", help="comma-separated tenant counts (0: none)")
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--agents", type=int, default=12000)
    args = ap.parse_args()
    agents, _ = build_workload(args.agents, 0, MOONCAKE_ARRIVALS, float(args.replicas))
    config = EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE), max_num_batched_tokens=2048, max_num_seqs=256)
    spent = {"s": 0.0}

    def timed(fn):
        def wrapper(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                if self.policy_name == "justitia":  # the front's core (the engines run tagged)
                    spent["s"] += time.perf_counter() - t0

        return wrapper

    for name in TIMED:
        setattr(AgentScheduler, name, timed(getattr(AgentScheduler, name)))
    print(f"{len(agents):,} agents on {args.replicas} engines, justitia with one clock")
    for n in (int(x) for x in args.tenants.split(",")):
        rng = np.random.default_rng(n)
        workload = agents if n == 0 else [replace(a, tenant=f"t{int(rng.integers(n))}") for a in agents]
        spent["s"] = 0.0
        t0 = time.perf_counter()
        run = simulate(workload, RunSpec("justitia", "justitia"), config, replicas=args.replicas)
        wall = time.perf_counter() - t0
        print(
            f"tenants {n:>4}: wall {wall:6.1f} s, the front's core {spent['s']:5.2f} s, "
            f"mean JCT {np.mean([a.jct_s for a in run.agents]):.1f} s"
        )


if __name__ == "__main__":
    main()
