"""The ``justitia`` command line: generate workloads and benchmark policies."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from justitia.workload import WorkloadError


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, default=300, help="number of agents (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace to take arrival times from")
    p.add_argument("--density", type=float, default=1.0, help="arrival density: 2 packs arrivals twice as tight")
    p.add_argument("--rate", type=float, help="synthetic arrivals per second before density (no --trace)")
    p.add_argument("--cv", type=float, default=1.0, help="synthetic inter-arrival coefficient of variation (1 = Poisson)")


def _parser() -> argparse.ArgumentParser:
    from justitia.policies import POLICY_NAMES
    from justitia.presets import PRESET_NAMES
    from justitia.sim.config import PROFILES

    ap = argparse.ArgumentParser(prog="justitia", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    wl = sub.add_parser("workload", help="workload files")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    gen = wl_sub.add_parser("generate", help="generate agents of the nine workflows into a JSONL file")
    _add_workload_args(gen)
    gen.add_argument("--out", type=Path, required=True, help="output JSONL file")

    b = sub.add_parser("bench", help="run policies over a workload and report JCT and fairness")
    b.add_argument("--engine", choices=["sim"], default="sim", help="engine to run on (default sim)")
    b.add_argument("--preset", choices=PRESET_NAMES, help="one of the paper's experiments")
    b.add_argument("--workload", type=Path, help="JSONL workload file (instead of generating one)")
    _add_workload_args(b)
    b.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated policies")
    b.add_argument("--predictor", default="oracle", help="oracle or noisy:L (default oracle)")
    b.add_argument("--cost", choices=["kv", "compute"], default="kv", help="cost model (default kv)")
    b.add_argument("--profile", choices=sorted(PROFILES), default="llama7b-a100-40gb", help="latency profile")
    b.add_argument("--kv-blocks", type=int, help="KV cache size in blocks of 16 tokens (default: the profile's)")
    b.add_argument("--max-num-batched-tokens", type=int, default=2048)
    b.add_argument("--max-num-seqs", type=int, default=256)
    b.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory")
    b.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    b.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return ap


def _workload_from_args(args) -> tuple[list, dict]:
    from justitia.presets import DEFAULT_RATE_PER_S, build_workload

    if args.trace is not None and args.rate is not None:
        raise ValueError("--rate applies to synthetic arrivals; it cannot be combined with --trace.")
    return build_workload(
        args.agents, args.seed, args.trace, args.density,
        DEFAULT_RATE_PER_S if args.rate is None else args.rate, args.cv,
    )


def _cmd_generate(args) -> int:
    from justitia.workload import save_workload

    agents, info = _workload_from_args(args)
    save_workload(agents, args.out)
    print(f"wrote {len(agents)} agents to {args.out} ({info['arrivals']} arrivals, seed {args.seed})")
    return 0


def _cmd_bench(args) -> int:
    from justitia.bench import RunSpec, run_bench, write_results
    from justitia.policies import POLICY_NAMES
    from justitia.presets import make_preset
    from justitia.report import print_results
    from justitia.sim import PROFILES, EngineConfig
    from justitia.workload import load_workload

    config = EngineConfig(
        profile=PROFILES[args.profile], kv_blocks=args.kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
    )
    title = ""
    if args.preset:
        preset = make_preset(args.preset, args.seed)
        agents, info, specs = preset.agents, preset.workload_info, preset.specs
        title = f"preset '{preset.name}': {preset.description}"
        if args.workload:
            raise ValueError("--preset builds its own workload; drop --workload.")
    else:
        if args.workload:
            agents = load_workload(args.workload)
            info = {"arrivals": "file", "file": str(args.workload), "agents": len(agents)}
        else:
            agents, info = _workload_from_args(args)
        names = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in names if p not in POLICY_NAMES]
        if unknown or not names:
            raise ValueError(f"--policies: unknown policy '{(unknown or [''])[0]}'; expected some of: {', '.join(POLICY_NAMES)}.")
        from justitia.predictor import make_predictor

        make_predictor(args.predictor)  # validate before running anything
        specs = [RunSpec(p, p, args.predictor, args.cost) for p in names]
    doc = run_bench(agents, specs, config, info, args.seed, progress=not args.no_progress)
    if args.preset:
        doc["preset"] = args.preset
    path = write_results(doc, args.out, plots=not args.no_plots)
    print_results(doc, title)
    if args.preset == "starvation":
        _print_elephant(doc)
    print(f"results: {path}")
    return 0


def _print_elephant(doc: dict) -> None:
    last_arrival = max(a["arrival_s"] for a in next(iter(doc["policies"].values()))["agents"])
    print(f"elephant JCT per policy (small agents keep arriving until t={last_arrival:.0f} s):")
    for label, entry in doc["policies"].items():
        e = next(a for a in entry["agents"] if a["agent_id"] == "elephant")
        extra = ""
        if "gps_finish_s" in e:
            extra = f"  (GPS finish {e['gps_finish_s']:.1f} s, bound {entry['delay_bound_s']:.1f} s)"
        print(f"  {label:<10} finish {e['finish_s']:8.1f} s{extra}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``justitia`` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "workload":
            return _cmd_generate(args)
        return _cmd_bench(args)
    except (WorkloadError, ValueError) as exc:
        print(f"justitia: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
