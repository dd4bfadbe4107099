"""How the ``sessions-engine`` preset's arrival rate was chosen: its sessions at several rates on the
simulator, at an engine bench's calibrated profile, and each policy's mean turn time; Justitia's
and SRJF's (ordering by the oracle's true costs) against VTC's, seed by seed.

    python -m justitia.lab.studies.sessions_rates [--profile-from results/sessions-engine/results.json]
                                          [--rates 2,3.5,5,6,7,8,10,15] [--seeds 4] [--speed S]

Any vLLM bench's ``results.json`` will do (``make sessions-engine`` or ``make engine`` writes one),
but the rate at which queueing dominates moves with the engine's speed: ``--speed`` scales the
profile's step times (the ``speed_scale_per_repeat`` a bench reports).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from justitia.engine.launch import EngineSpec
from justitia.lab.bench import RunSpec, simulate
from justitia.lab.live.vllm_bench import load_bench
from justitia.lab.metrics import turn_stats
from justitia.lab.presets import CPU_BLOCK_SIZE, ENGINE_OPTIONS
from justitia.lab.studies.sessions import sessions_engine_workload

POLICIES = ("fcfs", "vtc", "las", "srjf", "justitia")


def rate_table(config, rates: list[float], seeds: int) -> list[dict]:
    """Per rate: each policy's mean turn time per seed (the preset's sessions, drawn afresh per seed)."""
    kv_tokens = EngineSpec(**ENGINE_OPTIONS).usable_blocks * CPU_BLOCK_SIZE
    rows = []
    for rate in rates:
        turns = {p: [] for p in POLICIES}
        for seed in range(seeds):
            agents, _ = sessions_engine_workload(seed, kv_tokens, CPU_BLOCK_SIZE, rate_per_s=rate)
            for p in POLICIES:
                turns[p].append(turn_stats(simulate(agents, RunSpec(p, p), config, seed).agents)["mean_turn_s"])
        rows.append({"rate_per_s": rate, "mean_turn_s": turns})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--profile-from",
        type=Path,
        default=Path("results/sessions-engine/results.json"),
        help="a vLLM bench's results.json, whose calibrated profile the simulator runs at",
    )
    ap.add_argument("--speed", type=float, default=1.0, help="step times x this (default 1: as calibrated)")
    ap.add_argument("--rates", default="2,3.5,5,6,7,8,10,15", help="sessions a second, comma-separated")
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    if not args.profile_from.is_file():
        ap.error(f"--profile-from: no such file {args.profile_from} (make sessions-engine writes one)")
    if args.speed <= 0:
        ap.error("--speed: must be above 0")
    _, profile, _, config = load_bench(args.profile_from)
    config = replace(config, profile=replace(profile, scale=profile.scale * args.speed))
    print(
        f"{'rate/s':>6}  {'vtc turn s':>10}  {'justitia / vtc, per seed':<28} {'mean':>5}  "
        f"{'srjf / vtc, per seed':<28} {'mean':>5}  justitia / las"
    )
    for row in rate_table(config, [float(r) for r in args.rates.split(",")], args.seeds):
        t = {p: np.array(v) for p, v in row["mean_turn_s"].items()}
        j, s = t["justitia"] / t["vtc"], t["srjf"] / t["vtc"]
        print(
            f"{row['rate_per_s']:6.1f}  {t['vtc'].mean():10.2f}  {' '.join(f'{x:.2f}' for x in j):<28} "
            f"{j.mean():5.2f}  "
            f"{' '.join(f'{x:.2f}' for x in s):<28} {s.mean():5.2f}  {(t['justitia'] / t['las']).mean():.2f}"
        )


if __name__ == "__main__":
    main()
