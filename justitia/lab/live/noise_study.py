"""What makes repeats of the same run on the real engine differ: thread binding, the front end and the
engine core sharing two cores, and warm-up.

    python -m justitia.lab.live.noise_study [--agents 100] [--repeats 3] [--out results/noise_study.json]

For each setting it starts one engine (tiny model, the ``engine`` preset's sizes), replays the
``engine`` preset's first ``--agents`` agents once on the cold engine (justitia), then
``--repeats`` times each under justitia and vtc, interleaved, and reports every run's mean JCT.
The spread of a policy is (slowest - fastest) / mean over its warm repeats. Settings:

- ``shared``: the engine's OpenMP threads bound to cores 0-1 (``VLLM_CPU_OMP_THREADS_BIND=0-1``),
  the front end (this process: agents, tokenizer, vLLM's output handling) free to run anywhere;
- ``split``: the engine's threads on core 1, the front end pinned to core 0;
- ``split-all``: as ``split``, and the engine core's process (vLLM's scheduler) on core 0 too, so that
  the model's thread has core 1 to itself;
- ``unbound``: ``VLLM_CPU_OMP_THREADS_BIND=nobind``, the OS places every thread;
- ``passive``: as ``shared``, with ``OMP_WAIT_POLICY=PASSIVE``: an OpenMP thread that finished its
  share of a parallel region sleeps rather than spinning on a core the front end needs.

Each setting runs in a subprocess of its own (the binding is read once, at engine start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {
    "shared": ("0-1", None),
    "split": ("1", {0}),
    "split-all": ("1", {0}),
    "unbound": ("nobind", None),
    "passive": ("0-1", None),
}


def pin_engine_core(cpus: set[int]) -> None:
    """Every thread of this process's descendants but vLLM's model worker on ``cpus``."""
    from justitia.engine.reaper import descendants

    for pid in descendants(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker"):
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def one_setting(name: str, n: int, repeats: int, seed: int) -> dict:
    from dataclasses import replace

    from justitia.engine.launch import EngineSpec
    from justitia.lab.live.runner import VllmEngine, pin_process
    from justitia.lab.presets import CPU_SCALE, ENGINE_DENSITY, ENGINE_OPTIONS, build_workload
    from justitia.workload import scale_tokens
    from justitia.workload.arrivals import MOONCAKE_ARRIVALS

    bind, frontend = SETTINGS[name]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    if name == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    agents, _ = build_workload(n, seed, MOONCAKE_ARRIVALS, ENGINE_DENSITY)
    agents = scale_tokens(agents, CPU_SCALE)

    def mean(run) -> float:
        return sum(a.jct_s for a in run.result.agents) / len(agents)

    async def go() -> dict:
        async with VllmEngine(replace(EngineSpec(**ENGINE_OPTIONS), cpu_threads=bind)) as engine:
            if frontend is not None:
                pin_process(frontend)
            if name == "split-all":
                pin_engine_core(frontend)
            cold = mean(await engine.run(agents, "justitia", seed=seed))
            runs: dict[str, list[float]] = {"justitia": [], "vtc": []}
            for _ in range(repeats):
                for policy in runs:
                    runs[policy].append(mean(await engine.run(agents, policy, seed=seed)))
        spread = {p: (max(v) - min(v)) / (sum(v) / len(v)) for p, v in runs.items()}
        return {
            "setting": name,
            "omp_threads_bind": bind,
            "frontend_cpus": sorted(frontend) if frontend else None,
            "cold_justitia_mean_jct_s": cold,
            "mean_jct_s": runs,
            "spread": spread,
            "cold_over_warm": cold / (sum(runs["justitia"]) / repeats),
        }

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one setting here (the subprocess)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_setting(args.one, args.agents, args.repeats, args.seed)))
        return
    out = []
    for name in args.settings.split(","):
        if name not in SETTINGS:
            raise SystemExit(f"--settings: unknown setting '{name}'; expected some of {', '.join(SETTINGS)}.")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "justitia.lab.live.noise_study",
                "--one",
                name,
                "--agents",
                str(args.agents),
                "--repeats",
                str(args.repeats),
                "--seed",
                str(args.seed),
            ],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[3])),
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise SystemExit(f"setting '{name}' failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        doc = json.loads(lines[-1][len("RESULT ") :])
        out.append(doc)
        print(
            f"{name:8s} bind {doc['omp_threads_bind']:7s} cold/warm {doc['cold_over_warm']:.2f}  "
            + "  ".join(
                f"{p} {' / '.join(f'{x:.2f}' for x in v)} s (spread {doc['spread'][p]:.1%})"
                for p, v in doc["mean_jct_s"].items()
            ),
            flush=True,
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
