"""Where the simulator's mean JCT parts from the engine's, agent by agent: the ``engine`` preset's
agents on a fresh engine (calibrated as the bench calibrates), once per policy, against the
simulator with that calibration.

    python scripts/jct_gap.py [--policies fcfs,vtc,justitia] [--out results/jct_gap.json]

Per policy it reports the mean gap (engine JCT - simulator JCT) and a least-squares fit of each
agent's gap to its number of stages (``gap = a + b * stages``): a per-stage hand-off that the
simulator leaves out shows as ``b``, a per-agent one as ``a``. From the front end's side it also
reports how long each request took from its submission to its answer, and how long an agent's
next stage took to leave the front end after the last answer of the stage before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np


async def run_engine(preset, policies, seed):
    from justitia.lab.runner import VllmEngine
    from justitia.lab.vllm_bench import _calibrate
    from justitia.vllm.engine import EngineSpec

    times: dict[str, tuple[float, float]] = {}
    out = {}
    async with VllmEngine(EngineSpec(**preset.engine_options)) as engine:
        profile, stats = await _calibrate(engine, preset.calibration_agents, seed)
        generate = engine._generate

        async def timed(prompt_ids, max_tokens, request_id, extra_args=None, priority=0):
            t = time.monotonic()
            n = await generate(prompt_ids, max_tokens, request_id, extra_args, priority)
            times[request_id] = (t, time.monotonic())
            return n

        engine._generate = timed
        drift = []  # the calibration's agents again: does the engine's speed move after the fit?
        for _ in range(2):
            again = await engine.run(preset.calibration_agents, "fcfs", seed=seed)
            drift.append(step_time(again.steps, profile))
        stats["again"] = drift
        for policy in policies:
            times.clear()
            run = await engine.run(preset.agents, policy, seed=seed)
            out[policy] = (run, dict(times))
        return profile, stats, out, engine.spec, engine.block_size


def step_time(rows, profile) -> dict:
    """The measured time of a run's steps followed at once, and what ``profile`` predicts for them."""
    from justitia.lab.calibrate import step_durations, timed_steps

    data = step_durations(rows)
    timed = timed_steps(profile, rows)
    return {"steps": len(data), "measured_s": float(timed[:, 1].sum()), "predicted_s": float(timed[:, 2].sum()),
            "mean_batched": float(data[:, 0].mean()), "mean_context": float(data[:, 1].mean())}


def front_end_times(times: dict[str, tuple[float, float]]) -> dict:
    """Per request: submission to answer; per stage hand-off: the stage's last answer to the next
    stage's first submission (both on the front end's clock)."""
    stages: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for request_id, span in times.items():
        _, agent_id, stage, _ = request_id.rsplit("/", 3)  # <run>/<agent>/<stage>/<task>
        stages.setdefault((agent_id, int(stage)), []).append(span)
    handoffs = []
    for (agent_id, stage), spans in stages.items():
        nxt = stages.get((agent_id, stage + 1))
        if nxt:
            handoffs.append(min(s for s, _ in nxt) - max(e for _, e in spans))
    waits = [e - s for s, e in times.values()]
    return {"requests": len(waits), "request_s_mean": float(np.mean(waits)),
            "handoffs": len(handoffs), "handoff_ms_mean": 1000 * float(np.mean(handoffs)) if handoffs else None,
            "handoff_ms_max": 1000 * float(np.max(handoffs)) if handoffs else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fcfs,vtc,justitia")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.presets import make_preset
    from justitia.lab.vllm_bench import engine_config

    preset = make_preset("engine", args.seed)
    policies = args.policies.split(",")
    profile, stats, runs, spec, block_size = asyncio.run(run_engine(preset, policies, args.seed))
    config = engine_config(profile, spec, block_size)
    stages = np.array([len(a.stages) for a in preset.agents], dtype=float)
    print(f"calibration: front end {profile.frontend_ms_per_request:.2f} ms a request, then {profile.request_latency_ms:.1f} ms, "
          f"answers {profile.answer_latency_ms:.1f} ms; its agents' mean JCT "
          f"{stats['engine_mean_jct_s']:.2f} s on the engine, {stats['sim_mean_jct_s_steps_only']:.2f} s from the steps alone")
    for k, again in enumerate(stats["again"]):
        print(f"calibration agents again ({k + 1}): steps' time {again['measured_s']:.2f} s, the profile says "
              f"{again['predicted_s']:.2f} s")
    report = {"frontend_ms": profile.frontend_ms, "calibration": stats, "policies": {}}
    for policy in policies:
        run, times = runs[policy]
        sim = simulate(preset.agents, RunSpec(policy, policy), config, args.seed)
        engine_jct = np.array([a.jct_s for a in run.result.agents])
        sim_jct = np.array([a.jct_s for a in sim.agents])
        gap = engine_jct - sim_jct
        b, a = np.polyfit(stages, gap, 1)
        by_stages = {int(k): float(gap[stages == k].mean()) for k in np.unique(stages)}
        row = {"engine_mean_jct_s": float(engine_jct.mean()), "sim_mean_jct_s": float(sim_jct.mean()),
               "mean_gap_s": float(gap.mean()), "gap_fit_per_agent_s": float(a), "gap_fit_per_stage_s": float(b),
               "mean_gap_by_stages_s": by_stages, "engine_makespan_s": run.result.makespan_s,
               "sim_makespan_s": sim.makespan_s, "max_arrival_lag_s": run.max_arrival_lag_s,
               "front_end": front_end_times(times), "step_time": step_time(run.steps, profile)}
        report["policies"][policy] = row
        fe = row["front_end"]
        print(f"{policy:9s} engine {row['engine_mean_jct_s']:6.2f} s  sim {row['sim_mean_jct_s']:6.2f} s  gap "
              f"{row['mean_gap_s']:+.2f} s = {a:+.2f} + {b:+.3f} x stages  makespan {run.result.makespan_s:.1f} / "
              f"{sim.makespan_s:.1f} s  by stages {', '.join(f'{k}: {v:+.2f}' for k, v in by_stages.items())}  "
              f"hand-off {fe['handoff_ms_mean']:.1f} ms (max {fe['handoff_ms_max']:.1f})  lag {run.max_arrival_lag_s:.3f} s",
              flush=True)
        st = row["step_time"]
        print(f"{'':9s} steps' time {st['measured_s']:.2f} s, the profile says {st['predicted_s']:.2f} s "
              f"({st['steps']} steps, mean batched {st['mean_batched']:.0f}, mean context {st['mean_context']:.0f})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
