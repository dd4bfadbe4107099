"""tau2-engine's conversations off the engine and on it, to read what its runs measure.

    python -m justitia.lab.studies.tau2_engine --engine-speeds 1 4 8 16 [--profile-from RESULTS_JSON] [--gpu-steps]
    python -m justitia.lab.studies.tau2_engine --door-idle justitia las-turn fcfs
    python -m justitia.lab.studies.tau2_engine --self-fit fcfs [--profile-from RESULTS_JSON]

``--engine-speeds``: the preset's conversations on the simulator at the profile a vLLM bench
calibrated, its step times slowed by each factor: where the engine keeps up, every policy gives the
same turn times; where turns queue, the order counts. ``--gpu-steps``: the same, with a GPU's step
times (the simulator's default profile, LLaMA-7B on an A100) in place of the CPU's, the engine's KV
cache, block size, batching and the door's front end kept: how much of what the engine gives is its
step times' shape (a GPU step costs its floor until its batch is large; a CPU step grows with every
token it computes). ``--door-idle``: the first ten of them through ``justitia serve``'s door on the
real engine (the tiny model), one every 4 s, so that nothing queues: what a call and a turn take on
the door's own path, per policy. ``--self-fit``: one run of the preset's conversations through the
door, its engine's steps logged, and the simulator against it at the bench's profile slowed to the
run's speed (as the preset judges it) and at a profile fitted to the run's own steps, each with the
door's front end fitted to the run: how much of the simulator's error is the step times' shape, and
how much is left.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np

from justitia.engine.launch import EngineSpec
from justitia.lab.bench import RunSpec, simulate
from justitia.lab.metrics import turn_stats
from justitia.lab.presets import CPU_BLOCK_SIZE, ENGINE_OPTIONS
from justitia.lab.studies.tau2 import GUARDED, ONLINE, ORACLE, REFERENCE, WARM, disjoint_history, tau2_engine_workload


def engine_speeds(config, speeds: list[float], seed: int = 0) -> list[dict[str, float]]:
    """``tau2-engine``'s conversations on the simulated engine ``config`` (a vLLM bench's, as
    ``lab.live.vllm_bench.load_bench`` reads it), its step times x each of ``speeds``: per speed,
    each run's mean turn time over every turn. At the calibrated speed the simulated engine is
    seldom backlogged; a slower engine (or more traffic for it) is where the order counts."""
    spec = EngineSpec(**ENGINE_OPTIONS)
    agents, _ = tau2_engine_workload(seed, spec.usable_blocks * CPU_BLOCK_SIZE, spec.max_model_len)
    specs = [RunSpec(p, p) for p in ("fcfs", "las", REFERENCE, "las-decay")] + [
        RunSpec(ORACLE, "justitia"),
        RunSpec(ONLINE, "justitia", "online"),
        RunSpec(WARM, "justitia", "online", history=tuple(disjoint_history(agents))),
        RunSpec(GUARDED, "justitia-guarded", "online"),
    ]
    rows = []
    for speed in speeds:
        run = replace(config, profile=replace(config.profile, scale=config.profile.scale * speed))
        rows.append({s.label: turn_stats(simulate(agents, s, run, seed).agents)["mean_turn_s"] for s in specs})
    return rows


def gpu_steps(config):
    """``config`` (a vLLM bench's calibrated engine) with the simulator's GPU step times in place of
    its own: the same KV cache, block size, batching, prefix cache and front end (the door's path
    to the engine and back), another step-time shape."""
    from justitia.lab.bench import SIM_DEFAULT_PROFILE
    from justitia.sim.config import load_profile

    own = config.profile
    steps = replace(
        load_profile(SIM_DEFAULT_PROFILE),
        request_latency_ms=own.request_latency_ms,
        answer_latency_ms=own.answer_latency_ms,
        frontend_ms_per_request=own.frontend_ms_per_request,
    )
    return replace(config, profile=steps, kv_blocks=config.blocks, block_size=config.block_size)


def speeds_table(speeds: list[float], rows: list[dict[str, float]]) -> list[str]:
    """``engine_speeds``' rows as lines: each run's mean turn time, and / las-turn's."""
    labels = list(rows[0]) if rows else []
    lines = [
        "speed   " + " ".join(f"{label:>22s}" for label in labels) + "   (mean turn s over every turn; / las-turn)"
    ]
    for speed, turns in zip(speeds, rows):
        lines.append(
            f"x{speed:<6g} " + " ".join(f"{turns[k]:14.3f} ({turns[k] / turns[REFERENCE]:.2f})" for k in labels)
        )
    return lines


def door_idle(policies: list[str], sessions: int = 10, gap_s: float = 4.0, seed: int = 0) -> list[str]:
    """The first ``sessions`` of ``tau2-engine``'s conversations through ``justitia serve``'s door
    (the tiny model, each policy on a fresh server), one every ``gap_s`` seconds, so that the
    engine is seldom backlogged: what a call and a turn take on the door's own path."""
    from transformers import AutoTokenizer

    from justitia.engine.models import resolve_model
    from justitia.lab.live.door import door_server, run_through_door
    from justitia.lab.live.servers import stop

    spec = EngineSpec(**ENGINE_OPTIONS)
    agents, _ = tau2_engine_workload(seed, spec.usable_blocks * CPU_BLOCK_SIZE, spec.max_model_len)
    agents = [replace(a, arrival_s=i * gap_s) for i, a in enumerate(agents[:sessions])]
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(spec.model)))
    lines = [f"{sessions} conversations, one every {gap_s:g} s, through the door: per call and per turn (s)"]
    for policy in policies:
        proc, url = door_server(policy, spec)
        try:
            run = asyncio.run(run_through_door(url, agents, policy, tokenizer, spec.max_model_len, seed))
        finally:
            stop(proc)
        calls = np.array([done - sent for _, sent, done in run.requests])
        turns = [t for r in run.result.agents for t in (r.turns_s or [])]
        cache = run.result.prefix_cache
        lines.append(
            f"{policy:12s} {len(calls)} calls: mean {calls.mean():.3f}, p50 {np.median(calls):.3f}, "
            f"p90 {np.percentile(calls, 90):.3f}; {len(turns)} turns: mean {np.mean(turns):.3f}; "
            f"vLLM's prefix cache held {100 * cache['hit_rate'] if cache else 0:.1f} % of prompt tokens"
        )
    return lines


def self_fit(config, policy: str, seed: int = 0) -> list[str]:
    """One run of ``tau2-engine``'s conversations through the door under ``policy`` (real engine),
    its steps logged; the simulator's mean turn time against the engine's at ``config``'s profile
    slowed to the run's speed, and at a profile fitted to the run's own steps (``--self-fit``)."""
    import tempfile

    from transformers import AutoTokenizer

    from justitia.engine.models import resolve_model
    from justitia.lab.live.calibrate import fit_frontend, fit_profile, run_speed
    from justitia.lab.live.door import door_server, run_through_door
    from justitia.lab.live.servers import stop
    from justitia.lab.live.vllm_bench import DOOR_PER_REQUEST_MS_MAX
    from justitia.sim.config import FRONTEND_FIELDS

    spec = EngineSpec(**ENGINE_OPTIONS)
    agents, _ = tau2_engine_workload(seed, spec.usable_blocks * CPU_BLOCK_SIZE, spec.max_model_len)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(spec.model)))
    with tempfile.NamedTemporaryFile(prefix="justitia-self-fit-", suffix=".csv") as log:
        proc, url = door_server(policy, spec, log.name)
        try:
            run = asyncio.run(
                run_through_door(url, agents, policy, tokenizer, spec.max_model_len, seed, step_log=log.name)
            )
        finally:
            stop(proc, 120)
    engine = turn_stats(run.result.agents)["mean_turn_s"]
    frontend = fit_frontend([(run.steps, run.requests)], DOOR_PER_REQUEST_MS_MAX)
    speed = run_speed(config.profile, run.steps) or 1.0  # (1: no step of the run was measurable)
    own, stats = fit_profile([run.steps], "self-fit", config.blocks, config.block_size, "the run's own steps")
    hit = run.result.prefix_cache
    lines = [
        f"{policy} through the door: mean turn {engine:.3f} s; vLLM's prefix cache held "
        f"{100 * hit['hit_rate'] if hit else 0:.1f} % of prompt tokens; steps at {speed:.2f}x the bench's profile; "
        f"the front end {frontend['frontend_ms_per_request']:g} ms a request, "
        f"then {frontend['request_latency_ms']:g} ms, "
        f"answers {frontend['answer_latency_ms']:.1f} ms after their step",
    ]
    rs = RunSpec(policy, policy, "online" if policy == "justitia" else "oracle")
    for name, profile in (
        ("the bench's profile at the run's speed", replace(config.profile, scale=config.profile.scale * speed)),
        (f"a profile fitted to the run's {stats['steps']} steps (R^2 {stats['r2']:.2f})", own),
    ):
        profile = replace(profile, **{k: frontend[k] for k in FRONTEND_FIELDS})
        sim = simulate(agents, rs, replace(config, profile=profile), seed)
        t = turn_stats(sim.agents)["mean_turn_s"]
        lines.append(
            f"  the simulator, {name}: {t:.3f} s ({t / engine - 1:+.1%}); its prefix cache held "
            f"{100 * sim.prefix_cache['hit_rate']:.1f} %"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-speeds", type=float, nargs="+", default=None, help="step times x each (e.g. 1 4 8 16)")
    ap.add_argument(
        "--profile-from",
        type=Path,
        default=Path("results/tau2-engine/results.json"),
        help="the vLLM bench whose calibrated profile the simulator runs at",
    )
    ap.add_argument(
        "--gpu-steps",
        action="store_true",
        help="--engine-speeds at a GPU's step times (the simulator's LLaMA-7B on an A100), the engine's cache kept",
    )
    ap.add_argument(
        "--door-idle",
        nargs="+",
        default=None,
        metavar="POLICY",
        help="the first conversations through the door, one at a time, on the real engine",
    )
    ap.add_argument(
        "--self-fit",
        default=None,
        metavar="POLICY",
        help="one run through the door, the simulator at a profile fitted to its own steps (real engine)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not (args.engine_speeds or args.door_idle or args.self_fit):
        ap.error("give --engine-speeds, --door-idle or --self-fit")
    from justitia.core import OPTION_NAMES, POLICY_NAMES

    names = POLICY_NAMES + OPTION_NAMES
    if unknown := [p for p in args.door_idle or [] if p not in names]:
        ap.error(f"--door-idle: unknown policy '{unknown[0]}'; expected some of: {', '.join(names)}")
    if args.self_fit is not None and args.self_fit not in names:
        ap.error(f"--self-fit: unknown policy '{args.self_fit}'; expected one of: {', '.join(names)}")
    if args.gpu_steps and not args.engine_speeds:
        ap.error("--gpu-steps goes with --engine-speeds")
    if args.engine_speeds and any(s <= 0 for s in args.engine_speeds):
        ap.error("--engine-speeds: each must be above 0")
    if (args.engine_speeds or args.self_fit) and not args.profile_from.is_file():
        ap.error(f"--profile-from: no such file {args.profile_from} (make tau2-engine writes one)")
    if args.door_idle:  # every flag read before anything runs
        print("\n".join(door_idle(args.door_idle, seed=args.seed)))
    if args.engine_speeds or args.self_fit:
        from justitia.lab.live.vllm_bench import load_bench

        config = load_bench(args.profile_from)[3]
        if args.engine_speeds:
            run = gpu_steps(config) if args.gpu_steps else config
            print(f"step times: {run.profile.name} (x1 as the profile has them); KV cache {run.kv_tokens} tokens")
            print("\n".join(speeds_table(args.engine_speeds, engine_speeds(run, args.engine_speeds, args.seed))))
        if args.self_fit:
            print("\n".join(self_fit(config, args.self_fit, args.seed)))


if __name__ == "__main__":
    main()
