"""``justitia workload generate``: agents of the nine workflows into a JSONL file."""

from __future__ import annotations

from pathlib import Path

from justitia.cli.common import add_workload_args, workload_from_args


def add_parser(sub) -> None:
    wl = sub.add_parser("workload", help="workload files")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    gen = wl_sub.add_parser("generate", help="generate agents of the nine workflows into a JSONL file")
    add_workload_args(gen)
    gen.add_argument("--out", type=Path, required=True, help="output JSONL file")


def run(args) -> int:
    from justitia.workload import save_workload

    agents, info = workload_from_args(args)
    save_workload(agents, args.out)
    print(f"wrote {len(agents)} agents to {args.out} ({info['arrivals']} arrivals, seed {args.seed})")
    return 0
