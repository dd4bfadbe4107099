"""Does a step's time depend on more than its batched and context tokens? The ``engine`` preset's
calibration agents and then its agents under each policy, on one engine with step logs, and two
least-squares models of a step's time fitted to the calibration's steps only:

    profile's:  base + per_batched_token * batched + per_context_token * context
    split:      base + per_prefill_token * (batched - decodes) + per_decode * decodes + per_context_token * context

    python scripts/step_model.py [--policies fcfs,vtc,justitia]

For each policy it prints its steps' measured time and what each model predicts for them.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np


def rows_to_xy(rows) -> tuple[np.ndarray, np.ndarray]:
    """(batched, prefill tokens, decodes, context) and the duration in ms of every step followed at once."""
    x, y = [], []
    for k in range(len(rows) - 1):
        t, batched, ctx, _prefills, decodes, busy = rows[k][:6]
        if busy and batched > 0:
            x.append((batched, batched - decodes, decodes, ctx))
            y.append((rows[k + 1][0] - t) * 1000.0)
    return np.asarray(x, dtype=float).reshape(-1, 4), np.asarray(y)


def design(x: np.ndarray, split: bool) -> np.ndarray:
    ones = np.ones(len(x))
    return np.column_stack([ones, x[:, 1], x[:, 2], x[:, 3]] if split else [ones, x[:, 0], x[:, 3]])


async def run(policies: list[str]):
    from justitia.lab.presets import make_preset
    from justitia.lab.runner import VllmEngine
    from justitia.vllm.engine import EngineSpec

    preset = make_preset("engine")
    out = {}
    async with VllmEngine(EngineSpec(**preset.engine_options)) as engine:
        for _ in range(3):  # three warm-ups (the calibration throws away up to four)
            await engine.run(preset.calibration_agents, "fcfs")
        out["calibration"] = (await engine.run(preset.calibration_agents, "fcfs")).steps
        for policy in policies:
            out[policy] = (await engine.run(preset.agents, policy)).steps
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fcfs,vtc,justitia")
    args = ap.parse_args()
    logs = asyncio.run(run(args.policies.split(",")))
    x, y = rows_to_xy(logs["calibration"])
    fits = {}
    for split in (False, True):
        coef, *_ = np.linalg.lstsq(design(x, split), y, rcond=None)
        r2 = 1 - ((y - design(x, split) @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum()
        fits[split] = coef
        print(f"{'split' if split else 'profile'} model on {len(y)} calibration steps: coefficients "
              f"{', '.join(f'{c:.5f}' for c in coef)} ms; R^2 {r2:.3f}")
    print("| run | steps | mean batched | mean decodes | measured s | profile's model s | split model s |")
    print("|---|---|---|---|---|---|---|")
    for label, rows in logs.items():
        x, y = rows_to_xy(rows)
        pred = {split: float((design(x, split) @ fits[split]).sum() / 1000) for split in (False, True)}
        print(f"| {label} | {len(y):,} | {x[:, 0].mean():.0f} | {x[:, 2].mean():.1f} | {y.sum() / 1000:.2f} "
              f"| {pred[False]:.2f} | {pred[True]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
