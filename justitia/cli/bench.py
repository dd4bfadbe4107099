"""``justitia bench``: run policies over a workload (generated, a file, or a preset's) on the simulator
or on real vLLM, and report JCT and fairness."""

from __future__ import annotations

import sys
from pathlib import Path

from justitia.cli.common import add_engine_args, add_workload_args, engine_spec, in_tenant, workload_from_args


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="run policies over a workload and report JCT and fairness")
    _run_args(b.add_argument_group("what to run"))
    _pricing_args(b.add_argument_group("pricing and the clock"))
    _sim_args(b.add_argument_group("the engine (simulated, or real where it says vllm)"))
    _vllm_args(b.add_argument_group("the real engine (--engine vllm)"))
    _output_args(b.add_argument_group("output"))


def _run_args(g) -> None:
    from justitia.core import POLICIES, POLICY_NAMES
    from justitia.lab.presets import PRESET_NAMES

    g.add_argument("--engine", choices=["sim", "vllm"], help="engine to run on (default sim; the cpu preset: vllm)")
    g.add_argument(
        "--preset", choices=PRESET_NAMES, help="one of the paper's experiments, or cpu and engine (real vLLM)"
    )
    g.add_argument("--workload", type=Path, help="JSONL workload file (instead of generating one)")
    add_workload_args(g)
    g.add_argument("--scale", type=float, default=1.0, help="divide every token length by this (small engines)")
    g.add_argument(
        "--policies",
        default=",".join(POLICY_NAMES),
        help=f"comma-separated policies (default: the paper's seven, {','.join(POLICY_NAMES)}); also: "
        + "; ".join(f"{n}, {e.summary}" for n, e in POLICIES.items() if e.kind != "paper")
        + " (docs/design.md)",
    )


def _pricing_args(g) -> None:
    from justitia.predictors import SPEC_HELP

    g.add_argument(
        "--predictor",
        help=f"{SPEC_HELP} (default oracle; with --preset: every run of the preset that "
        "uses the oracle's costs uses this instead, or the bench fails saying why)",
    )
    g.add_argument(
        "--cost",
        choices=["kv", "kv-prefix", "compute"],
        default="kv",
        help="cost model (default kv; kv-prefix: a prefix requests sent together share is held once)",
    )
    g.add_argument(
        "--capacity",
        choices=["measured", "formula"],
        default="measured",
        help="the clock's M: measured from what the engine delivers (default), or the formula's "
        "(KV tokens / nominal step, the paper's rule)",
    )
    g.add_argument(
        "--no-retag",
        action="store_true",
        help="keep each agent's first tag even when its stages reveal more work than predicted",
    )
    g.add_argument(
        "--pricing",
        choices=["first-stage", "all-stages"],
        default="first-stage",
        help="price an agent on arrival from its first stage (the predictor's, default) or at least "
        "the sum of every stage's predicted requests (an agent submitted whole)",
    )
    g.add_argument(
        "--burst",
        choices=["turn", "pause"],
        default="turn",
        help="sessions: price and tag a session by user turn (default) or by the calls between two pauses "
        "of any kind (docs/sessions.md)",
    )
    g.add_argument(
        "--subagents",
        choices=["share", "flows"],
        default="share",
        help="sessions: a session's subagents share its flow (default) or are flows of their own",
    )


def _sim_args(g) -> None:
    from justitia.core import ROUTER_NAMES
    from justitia.sim import CLOCKS
    from justitia.sim.config import PROFILES

    g.add_argument(
        "--prefix-caching",
        action="store_true",
        help="sim: vLLM's prefix cache on (the sessions presets turn it on; default off, as the paper)",
    )
    g.add_argument(
        "--kv-eviction",
        choices=["lru", "tag"],
        help="sim, prefix cache on: evict the least recently freed blocks (vLLM's, default), or first "
        "those of the sessions whose next tag comes last",
    )
    g.add_argument(
        "--latency",
        help=f"simulator latency profile: {', '.join(sorted(PROFILES))} (sim default) "
        "or a file from 'justitia calibrate' (vllm default: calibrate first)",
    )
    add_engine_args(g)
    g.add_argument(
        "--replicas",
        type=int,
        help="sim: simulate a cluster of this many engines behind one router (default 1; the cluster "
        "presets set their own)",
    )
    g.add_argument(
        "--router",
        choices=ROUTER_NAMES,
        help="sim, --replicas > 1: least-load (default), affinity or round-robin (docs/design.md, Clusters)",
    )
    g.add_argument(
        "--cluster-clock",
        choices=CLOCKS,
        help="sim, --replicas > 1: justitia's clock, one in front of every engine (global, default) or "
        "one per engine (replica); other policies keep their state per engine",
    )


def _vllm_args(g) -> None:
    g.add_argument("--tagging", action="store_true", help="vllm: also run justitia by front-end tagging on stock vLLM")
    g.add_argument(
        "--calibration-agents", type=int, default=20, help="vllm: agents in the calibration run (default 20)"
    )
    g.add_argument(
        "--repeats", type=int, help="vllm: runs per policy, JCTs averaged per agent (default 1; cpu preset 2)"
    )
    g.add_argument(
        "--speed-probes",
        action="store_true",
        help="vllm: run the calibration agents again before and after every run and simulate each run "
        "at the engine's mean speed over the two (the engine preset does)",
    )


def _output_args(g) -> None:
    g.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory")
    g.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def with_predictor(preset, predictor: str) -> list:
    """The preset's runs with ``predictor`` in place of the oracle's costs; a ValueError naming why
    when the preset compares predictors itself (its own choice would be silently overridden)."""
    from dataclasses import replace

    from justitia.predictors import make_predictor

    if preset.compares_predictors:
        own = sorted({s.predictor for s in preset.specs if s.predictor != "oracle"})
        raise ValueError(
            f"--predictor {predictor}: preset '{preset.name}' compares predictors itself (its runs use "
            f"{', '.join(own)}); drop --predictor, or run --workload with --predictor."
        )
    make_predictor(predictor)  # validate before running anything
    return [replace(s, predictor=predictor) if s.predictor == "oracle" else s for s in preset.specs]


def run(args) -> int:
    from justitia.lab.bench import run_bench, write_results
    from justitia.lab.report import print_results

    if args.preset:
        preset, agents, info, specs, title = _from_preset(args)
    else:
        preset, title = None, ""
        agents, info, specs = _from_flags(args)
    engine = args.engine or (preset.engine if preset else "sim")
    replicas = preset.replicas if preset else (1 if args.replicas is None else args.replicas)
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}.")
    if replicas > 1 and engine == "vllm":
        raise ValueError("--replicas simulates a cluster; the vLLM bench runs one engine (use --engine sim).")
    if engine == "vllm":
        doc = _bench_vllm(args, agents, specs, info, preset)
    else:
        doc = run_bench(
            agents,
            specs,
            _sim_config(args, preset.sim_options if preset else {}),
            info,
            args.seed,
            progress=not args.no_progress,
            replicas=replicas,
        )
    if args.preset:
        doc["preset"] = args.preset
        if preset.notes:
            doc["notes"] = preset.notes
    path = write_results(doc, args.out, plots=not args.no_plots)
    print_results(doc, title)
    if preset is not None and preset.summary is not None:
        print("\n".join(preset.summary(doc)))
    elif any("mean_turn_s" in e for e in doc["policies"].values()):  # sessions: their turns, whatever ran them
        from justitia.lab.studies.sessions import sessions_summary

        print("\n".join(sessions_summary(doc)))
    print(f"results: {path}")
    return 0


def _from_preset(args):
    """The preset's workload and runs (``--predictor`` in place of the oracle's costs), its title."""
    from justitia.lab.presets import make_preset

    preset = make_preset(args.preset, args.seed)
    agents, info = in_tenant(args, preset.agents, preset.workload_info)
    specs = preset.specs
    title = f"preset '{preset.name}': {preset.description}"
    if args.predictor is not None:
        specs = with_predictor(preset, args.predictor)
        title += f"; --predictor {args.predictor} for every run that priced by the oracle"
    for note in preset.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.workload:
        raise ValueError("--preset builds its own workload; drop --workload.")
    if args.router or args.cluster_clock or args.replicas not in (None, preset.replicas):
        raise ValueError(
            f"preset '{preset.name}' sets its own replicas, routers and clocks; "
            "drop --replicas, --router and --cluster-clock."
        )
    return preset, agents, info, specs, title


def _from_flags(args):
    """The workload (a file, or generated) and one run per ``--policies`` name, from the flags."""
    from justitia.core import OPTION_NAMES, POLICY_NAMES
    from justitia.lab.bench import RunSpec
    from justitia.predictors import make_predictor
    from justitia.workload import load_workload, scale_tokens

    if args.workload:
        agents = load_workload(args.workload)
        agents, info = in_tenant(args, agents, {"arrivals": "file", "file": str(args.workload), "agents": len(agents)})
    else:
        agents, info = workload_from_args(args)
    if args.scale != 1:
        agents = scale_tokens(agents, args.scale)
        info |= {"token_scale": args.scale}
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICY_NAMES + OPTION_NAMES]
    if unknown or not names:
        raise ValueError(
            f"--policies: unknown policy '{(unknown or [''])[0]}'; expected some of: "
            f"{', '.join(POLICY_NAMES + OPTION_NAMES)}."
        )
    args.predictor = args.predictor or "oracle"
    make_predictor(args.predictor)  # validate before running anything
    specs = [
        RunSpec(
            p,
            p,
            args.predictor,
            args.cost,
            args.capacity,
            not args.no_retag,
            args.pricing,
            args.router,
            args.cluster_clock,
            burst=args.burst,
            subagents=args.subagents,
            kv_eviction=args.kv_eviction,
        )
        for p in names
    ]
    return agents, info, specs


def _sim_config(args, preset_options: dict | None = None):
    """The simulated engine: command-line flags, then the preset's settings, then defaults."""
    from justitia.lab.presets import SIM_DEFAULT_PROFILE
    from justitia.sim import EngineConfig
    from justitia.sim.config import load_profile

    options = {"kv_blocks": None, "max_num_batched_tokens": 2048, "max_num_seqs": 256} | (preset_options or {})
    for name in ("kv_blocks", "max_num_batched_tokens", "max_num_seqs"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    if getattr(args, "prefix_caching", False):  # on by the flag, or by the preset; never off by its absence
        options["prefix_caching"] = True
    return EngineConfig(profile=load_profile(args.latency or SIM_DEFAULT_PROFILE), **options)


def _bench_vllm(args, agents, specs, info, preset) -> dict:
    from justitia.lab.live.vllm_bench import run_bench_vllm
    from justitia.lab.presets import CPU_DENSITY
    from justitia.sim.config import load_profile
    from justitia.workload import build_workload, scale_tokens

    spec = engine_spec(args, preset.engine_options if preset else None)
    profile = load_profile(args.latency) if args.latency else None
    calibration = preset.calibration_agents if preset else []
    if profile is None and not calibration:
        calibration, _ = build_workload(args.calibration_agents, args.seed + 1, args.trace, CPU_DENSITY)
        calibration = scale_tokens(calibration, args.scale)
    tagging = args.tagging or (preset is not None and preset.tagging)
    repeats = args.repeats or (preset.repeats if preset else 1)
    probes = args.speed_probes or (preset is not None and preset.speed_probes)
    if probes and not calibration:
        raise ValueError("--speed-probes runs the calibration agents again: it cannot go with --latency.")
    return run_bench_vllm(
        agents,
        specs,
        spec,
        info,
        args.seed,
        not args.no_progress,
        profile,
        calibration,
        tagging,
        repeats,
        probes,
        preset.door if preset else None,
    )
