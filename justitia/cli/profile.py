"""``justitia profile``: run generated agents through a real model (vLLM) and record their costs."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    pf = sub.add_parser("profile", help="run generated agents through a real model (vLLM) and record their costs")
    pf.add_argument(
        "--model", default="smollm2", help="tiny, tiny-long, smollm2 or a model directory (default smollm2)"
    )
    pf.add_argument("--agents-per-type", type=int, default=30, help="agents of each workflow (default 30)")
    pf.add_argument("--types", help="comma-separated workflows (default all nine)")
    pf.add_argument("--size", choices=["small", "medium", "large"], default="small", help="size class (default small)")
    pf.add_argument("--scale", type=float, default=8.0, help="divide every drawn length by this (default 8)")
    pf.add_argument("--max-tokens", type=int, default=128, help="cap on any one answer (default 128)")
    pf.add_argument("--concurrency", type=int, default=32, help="agents in flight (default 32)")
    pf.add_argument("--seed", type=int, default=0)
    pf.add_argument("--out", type=Path, required=True, help="profile file (.jsonl or .jsonl.gz); resumed if it exists")
    pf.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args) -> int:
    from justitia.lab.live.profile import ProfileSpec, run_profile
    from justitia.workload.workflows import WORKFLOW_TYPES

    types = tuple(args.types.split(",")) if args.types else WORKFLOW_TYPES
    if args.max_tokens < 1 or args.concurrency < 1:
        raise ValueError("--max-tokens and --concurrency must be >= 1.")
    spec = ProfileSpec(
        args.model, types, args.agents_per_type, args.size, args.scale, args.max_tokens, args.seed, args.concurrency
    )
    summary = run_profile(spec, args.out, not args.no_progress)
    print(
        f"profile: {summary['agents']} agents in {args.out} ({summary['new']} new, {summary['wall_s'] / 60:.1f} min)  "
        f"(next: justitia predictor eval --profile {args.out})"
    )
    print(_profile_stats(args.out))
    return 0


def _profile_stats(path) -> str:
    """One line on what a profile file holds (rerunning the command on a complete file prints it)."""
    import statistics

    from justitia.workload import load_workload

    agents = load_workload(path)
    answers = [(t.output_tokens, a.meta.get("max_tokens")) for a in agents for t in a.tasks]
    stopped = sum(cap is not None and n < cap for n, cap in answers)
    prompt = statistics.mean(sum(t.prompt_tokens for t in a.tasks) for a in agents)
    output = statistics.mean(sum(t.output_tokens for t in a.tasks) for a in agents)
    return (
        f"profile: {len(answers)} answers, {stopped / len(answers):.0%} ended before their cap, median "
        f"{statistics.median(n for n, _ in answers):g} tokens; per agent {prompt:,.0f} prompt and "
        f"{output:,.0f} output tokens on average"
    )
