"""Whether a run's steps keep one speed: the ``engine`` preset's agents once per policy on one engine
(each run after a probe of the calibration agents under fcfs, as the bench's speed probes), with
step logs, against the profile a bench calibrated.

    python scripts/step_drift.py [--results results/engine/results.json] [--policies justitia,vtc,fcfs]
                                 [--layout default|core0|core0+prio|nice]

For each run it reports the run's speed (its steps' measured time over the profile's time for
them), the simulator's error at that speed (so the order of service and the profile's form are
what is left), and the speed in each sixth of the run, under the calibrated profile and under one
refitted to all the runs' steps (``calibrate.fit_profile``): if a run's steps slowed or sped up
against their token counts, a uniform speed cannot follow it. Then each sixth's mean step time and
the scheduler's share of it (the plug-in's step log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

SIXTHS = 6


def window_speeds(profile, rows, n: int = SIXTHS) -> list[float]:
    """Measured over predicted time of the steps followed at once, in ``n`` equal spans of the run."""
    from justitia.lab.calibrate import timed_steps

    steps = timed_steps(profile, rows)
    edges = np.linspace(rows[0][0], rows[-1][0], n + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (steps[:, 0] >= lo) & (steps[:, 0] <= hi)
        out.append(float(steps[m, 1].sum() / steps[m, 2].sum()) if steps[m, 2].sum() > 0 else float("nan"))
    return out


def step_model(p) -> str:
    """A profile's step time as a formula."""
    return (f"step_ms = {p.base_ms:.3f} + {p.per_batched_token_ms:.5f} * batched + {p.per_context_token_ms:.6f} * context"
            f" + {p.per_request_ms:.4f} * requests + {p.per_arrival_ms:.4f} * arrivals")


def window_steps(rows, n: int = SIXTHS) -> list[tuple[float, float]]:
    """(mean step ms, mean scheduler ms) in ``n`` equal spans of the run."""
    t = np.array([r[0] for r in rows])
    edges = np.linspace(t[0], t[-1], n + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        idx = [i for i in range(len(rows) - 1) if lo <= rows[i][0] <= hi]
        out.append((1000 * float(np.mean([rows[i + 1][0] - rows[i][0] for i in idx])),
                    float(np.mean([rows[i][9] for i in idx])) / 1000))
    return out


def set_layout(layout: str) -> None:
    """Try another placement of vLLM's engine-core process (the scheduler; the model runs in its
    worker, on the cores the runner binds): ``core0`` pins it to the first core, beside the front
    end; ``prio`` raises its priority (nice -5, needs the privilege); ``nice`` lowers the front
    end's (nice 5)."""
    from justitia.vllm.reaper import descendants

    for pid in descendants(os.getpid()):
        try:
            name = open(f"/proc/{pid}/comm").read()
        except OSError:  # gone meanwhile
            continue
        if name.startswith("VLLM::EngineCor"):
            for tid in os.listdir(f"/proc/{pid}/task"):
                if "core0" in layout:
                    os.sched_setaffinity(int(tid), {0})
                if "prio" in layout:
                    os.setpriority(os.PRIO_PROCESS, int(tid), -5)
    if "nice" in layout:
        for tid in os.listdir("/proc/self/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), 5)


async def run_engine(agents, calibration, policies, spec, layout: str = "default") -> dict:
    from justitia.lab.runner import VllmEngine

    out = {}
    async with VllmEngine(spec) as engine:
        set_layout(layout)
        for _ in range(3):  # warm-up
            await engine.run(calibration, "fcfs")
        for policy in policies:
            for kind, run_agents, run_policy in (("probe", calibration, "fcfs"), ("run", agents, policy)):
                fd, log = tempfile.mkstemp(suffix=".csv")
                os.close(fd)
                out[(policy, kind)] = await engine.run(run_agents, run_policy, step_log=log)
                os.unlink(log)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/engine/results.json"))
    ap.add_argument("--policies", default="justitia,vtc,fcfs")
    ap.add_argument("--layout", default="default", choices=("default", "core0", "core0+prio", "nice"),
                    help="where vLLM's engine-core process runs (set_layout; default: as the runner leaves it)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.calibrate import fit_profile, run_speed
    from justitia.lab.presets import make_preset
    from justitia.lab.vllm_bench import load_bench

    doc, profile, spec, config = load_bench(args.results)
    seed = doc["workload"]["seed"]
    preset = make_preset("engine", seed)
    policies = args.policies.split(",")
    runs = asyncio.run(run_engine(preset.agents, preset.calibration_agents, policies, spec, args.layout))
    refit, stats = fit_profile([r.steps for (_, kind), r in runs.items() if kind == "run"], "refit",
                               profile.kv_blocks, profile.block_size, "the runs' steps")
    print(f"calibrated: {step_model(profile)}; refitted to the runs' steps: {step_model(refit)} (R^2 {stats['r2']:.2f})")
    report = {}
    for (policy, kind), run in runs.items():
        agents = preset.calibration_agents if kind == "probe" else preset.agents
        speed = run_speed(profile, run.steps)
        sim_policy = "fcfs" if kind == "probe" else policy
        sim = simulate(agents, RunSpec(sim_policy, sim_policy), replace(config, profile=replace(profile, scale=speed)), seed)
        engine_jct = sum(a.jct_s for a in run.result.agents) / len(agents)
        sim_jct = sum(a.jct_s for a in sim.agents) / len(agents)
        entry = {"engine_mean_jct_s": engine_jct, "speed": speed, "sim_mean_jct_s_at_speed": sim_jct,
                 "sim_error_at_speed": sim_jct / engine_jct - 1, "steps": len(run.steps), "sim_steps": sim.iterations,
                 "speed_by_sixth": window_speeds(profile, run.steps),
                 "speed_by_sixth_refit": window_speeds(refit, run.steps),
                 "step_ms_sched_ms_by_sixth": window_steps(run.steps)}
        report[f"{policy}/{kind}"] = entry
        print(f"{policy + '/' + kind:16s} engine {engine_jct:5.2f} s  speed {speed:.3f}  sim at that speed {sim_jct:5.2f} s "
              f"({entry['sim_error_at_speed']:+.1%})  steps {entry['steps']} (sim {sim.iterations})")
        print(f"{'':16s} speed by sixth {' '.join(f'{x:.2f}' for x in entry['speed_by_sixth'])}; refitted "
              f"{' '.join(f'{x:.2f}' for x in entry['speed_by_sixth_refit'])}; step/sched ms "
              f"{' '.join(f'{a:.2f}/{b:.2f}' for a, b in entry['step_ms_sched_ms_by_sixth'])}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
