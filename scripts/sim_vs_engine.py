"""Where the simulator and the real engine part: the ``engine`` preset's agents, once per policy on a
fresh engine, against the simulator with the profile a bench calibrated.

    python scripts/sim_vs_engine.py [--results results/engine/results.json] [--policies vtc,justitia]

For each policy it reports the engine's mean JCT and the simulator's, the steps both took, the
steps' measured time against what the calibrated profile predicts for those same steps (so a gap
there is the engine running slower than its token counts say, not the simulator's scheduling), and
the time the scheduler (vLLM's and the plug-in's) spent per step, from the plug-in's step log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path


def step_stats(rows, profile) -> dict:
    """Measured and predicted time of the steps followed at once, and the scheduler's time per step."""
    from justitia.lab.calibrate import timed_steps

    timed = timed_steps(profile, rows)
    measured, predicted = float(timed[:, 1].sum()), float(timed[:, 2].sum())
    sched = [r[9] for r in rows if len(r) > 9]
    return {"steps": len(rows), "steps_measured_s": measured, "steps_predicted_s": predicted,
            "scheduler_ms_per_step": sum(sched) / len(sched) / 1000 if sched else None}


async def run_engine(agents, calibration, policies, spec):
    from justitia.lab.runner import VllmEngine

    out = {}
    async with VllmEngine(spec) as engine:
        await engine.run(calibration, "fcfs")  # warm-up
        for policy in policies:
            fd, log = tempfile.mkstemp(suffix=".csv")
            os.close(fd)
            run = await engine.run(agents, policy, step_log=log)
            out[policy] = run
            os.unlink(log)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/engine/results.json"))
    ap.add_argument("--policies", default="vtc,justitia")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.presets import make_preset
    from justitia.lab.vllm_bench import load_bench

    doc, profile, spec, config = load_bench(args.results)
    preset = make_preset("engine", doc["workload"]["seed"])
    policies = args.policies.split(",")
    runs = asyncio.run(run_engine(preset.agents, preset.calibration_agents, policies, spec))
    report = {}
    for policy in policies:
        run = runs[policy]
        sim = simulate(preset.agents, RunSpec(policy, policy), config, doc["workload"]["seed"])
        engine_jct = sum(a.jct_s for a in run.result.agents) / len(preset.agents)
        sim_jct = sum(a.jct_s for a in sim.agents) / len(preset.agents)
        report[policy] = {"engine_mean_jct_s": engine_jct, "sim_mean_jct_s": sim_jct, "sim_error": sim_jct / engine_jct - 1,
                          "sim_iterations": sim.iterations, "max_arrival_lag_s": run.max_arrival_lag_s,
                          **step_stats(run.steps, profile)}
        r = report[policy]
        print(f"{policy:10s} engine {engine_jct:6.2f} s  sim {sim_jct:6.2f} s ({r['sim_error']:+.1%})  steps {r['steps']} "
              f"(sim {sim.iterations})  steps' time {r['steps_measured_s']:.2f} s, profile says {r['steps_predicted_s']:.2f} s  "
              f"scheduler {r['scheduler_ms_per_step']:.3f} ms/step", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
