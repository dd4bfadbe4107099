"""Time the simulator on the main preset: every run of the preset (the seven policies and justitia with the formula
M) with event skipping, and the same
runs stepped one iteration at a time, in one process. Prints a table and writes JSON.

    python -m justitia.lab.costs.bench_speed [--out results/speed.json] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from justitia.lab.bench import simulate
from justitia.lab.presets import make_preset
from justitia.lab.report import write_doc
from justitia.sim import EngineConfig


def main() -> None:
    """Run the timing and report it."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("results/speed.json"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    preset = make_preset("main", args.seed)
    build_s = time.perf_counter() - t0
    config = EngineConfig()
    rows = []
    for spec in preset.specs:
        fast = simulate(preset.agents, spec, config, args.seed, event_skipping=True)
        slow = simulate(preset.agents, spec, config, args.seed, event_skipping=False)
        same = [a.finish_s for a in fast.agents] == [a.finish_s for a in slow.agents]
        rows.append(
            {
                "policy": spec.label,
                "iterations": fast.iterations,
                "steps_skipping": fast.steps,
                "skipping_s": fast.wall_s,
                "per_iteration_s": slow.wall_s,
                "speedup": slow.wall_s / fast.wall_s,
                "identical_finish_times": same,
            }
        )
        print(
            f"{spec.label:<9} iterations {fast.iterations:>6}  loop passes {fast.steps:>6}  "
            f"skipping {fast.wall_s:6.2f} s  per-iteration {slow.wall_s:6.2f} s  "
            f"x{slow.wall_s / fast.wall_s:4.1f}  identical={same}"
        )
    total_fast = sum(r["skipping_s"] for r in rows)
    total_slow = sum(r["per_iteration_s"] for r in rows)
    print(
        f"workload build {build_s:.2f} s; all {len(preset.specs)} runs: skipping {total_fast:.2f} s, "
        f"per-iteration {total_slow:.2f} s, x{total_slow / total_fast:.1f}"
    )
    write_doc(
        args.out,
        {
            "workload_build_s": build_s,
            "runs": rows,
            "skipping_total_s": total_fast,
            "per_iteration_total_s": total_slow,
        },
    )


if __name__ == "__main__":
    main()
