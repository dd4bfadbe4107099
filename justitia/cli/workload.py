"""``justitia workload generate``: agents of the nine workflows (``--kind workflows``, the default)
or coding-agent sessions (``--kind sessions``, from ``justitia/data/sessions.json``) into a JSONL file."""

from __future__ import annotations

from pathlib import Path

from justitia.cli.common import add_workload_args, in_tenant, workload_from_args

KINDS = ("workflows", "sessions")


def add_parser(sub) -> None:
    wl = sub.add_parser("workload", help="workload files")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    gen = wl_sub.add_parser("generate", help="generate agents of the nine workflows, or sessions, into a JSONL file")
    add_workload_args(gen)
    gen.add_argument("--kind", choices=KINDS, default="workflows",
                     help="workflows: the paper's nine task-parallel workflows (default); sessions: coding-agent "
                          "sessions with turns, tool pauses, subagents and shared prompts (--rate default: "
                          "justitia/data/sessions.json's)")
    gen.add_argument("--out", type=Path, required=True, help="output JSONL file")


def run(args) -> int:
    from justitia.workload import save_workload

    if args.kind == "sessions":
        from justitia.workload.sessions import build_sessions

        if args.trace is not None and args.rate is not None:
            raise ValueError("--rate applies to synthetic arrivals; it cannot be combined with --trace.")
        agents, info = in_tenant(args, *build_sessions(args.agents, args.seed, args.trace, args.density,
                                                       args.rate, args.cv))
        what = "sessions"
    else:
        agents, info = workload_from_args(args)
        what = "agents"
    save_workload(agents, args.out)
    print(f"wrote {len(agents)} {what} to {args.out} ({info['arrivals']} arrivals, seed {args.seed})")
    return 0
