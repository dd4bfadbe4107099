"""``justitia calibrate``: fit the simulator's latency profile to a real vLLM engine."""

from __future__ import annotations

from pathlib import Path

from justitia.cli.common import add_engine_args, add_workload_args, engine_spec, workload_from_args


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="fit the simulator's latency profile to a real vLLM engine")
    add_workload_args(c, agents=20, density=1 / 3)
    c.add_argument("--scale", type=float, default=8.0, help="divide every token length by this (default 8)")
    add_engine_args(c)
    c.add_argument("--repeats", type=int, default=1, help="runs of the workload to fit (default 1)")
    c.add_argument("--out", type=Path, default=Path("results/latency.json"), help="latency profile file to write")


def run(args) -> int:
    import json

    from justitia.lab.live.vllm_bench import calibrate, engine_config
    from justitia.workload import scale_tokens

    spec = engine_spec(args)
    agents, _ = workload_from_args(args)
    profile, stats = calibrate(spec, scale_tokens(agents, args.scale), args.seed, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    formula = engine_config(profile, spec, profile.block_size).capacity_per_s("kv")
    stats["formula_capacity_per_s"] = formula
    args.out.write_text(json.dumps(profile.to_json() | {"fit": stats}, indent=1))
    measured = stats["delivered_capacity_per_s"]
    print(
        "the clock's M: "
        + (
            f"{measured:,.0f} KV token-iterations/s delivered while requests waited "
            f"({stats['backlogged_s']:.1f} s), {measured / formula:.2f} of the formula's {formula:,.0f}"
            if measured
            else f"no request waited in this run; the formula's {formula:,.0f} /s stands"
        )
    )
    print(
        f"fitted over {stats['steps']} steps: step_ms = {profile.base_ms:.3f} + {profile.per_batched_token_ms:.5f} "
        f"* batched_tokens + {profile.per_context_token_ms:.3g} * decode_context_tokens  "
        f"(R^2 {stats['r2']:.2f}, median |error| {stats['median_abs_rel_error']:.0%})"
    )
    print(f"profile: {args.out}  (use: justitia bench --engine vllm --latency {args.out})")
    return 0
