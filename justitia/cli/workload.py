"""``justitia workload generate``: agents of the nine workflows (``--kind workflows``, the default)
or coding-agent sessions (``--kind sessions``, from ``justitia/data/sessions.json``) into a JSONL file."""

from __future__ import annotations

from pathlib import Path

from justitia.cli.common import add_workload_args, in_tenant, workload_from_args

KINDS = ("workflows", "sessions")
IMPORT_FORMATS = ("tau2", "chat-log", "mooncake")


def add_parser(sub) -> None:
    wl = sub.add_parser("workload", help="workload files")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    gen = wl_sub.add_parser("generate", help="generate agents of the nine workflows, or sessions, into a JSONL file")
    add_workload_args(gen)
    gen.add_argument(
        "--kind",
        choices=KINDS,
        default="workflows",
        help="workflows: the paper's nine task-parallel workflows (default); sessions: coding-agent "
        "sessions with turns, tool pauses, subagents and shared prompts (--rate default: "
        "justitia/data/sessions.json's)",
    )
    gen.add_argument("--out", type=Path, required=True, help="output JSONL file")
    imp = wl_sub.add_parser(
        "import",
        help="real traffic as a workload: tau2-bench results files, a chat-log JSONL, "
        "or Mooncake's trace linked into conversations (docs/formats.md)",
    )
    imp.add_argument(
        "format",
        choices=IMPORT_FORMATS,
        help="tau2: tau2-bench results files (default: ../shared/traces/tau2-bench, else the package's "
        "compact copy); chat-log: one conversation of OpenAI chat messages a line; mooncake: a "
        "Mooncake-format trace, requests linked by their leading KV blocks (hash_ids)",
    )
    imp.add_argument("paths", nargs="*", type=Path, help="the files (or a directory of tau2-bench results files)")
    imp.add_argument("--out", type=Path, required=True, help="output JSONL workload file")
    imp.add_argument("--scale", type=float, default=1.0, help="divide every token length by this (default 1: exact)")
    imp.add_argument(
        "--rate",
        type=float,
        default=None,
        help="arrivals: Poisson at this many conversations a second (tau2, chat-log; default 1)",
    )
    imp.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="arrivals: the timestamps of this Mooncake-format trace instead of --rate ('mooncake': the "
        "shipped arrivals)",
    )
    imp.add_argument("--copies", type=int, default=1, help="each conversation this many times, shuffled (default 1)")
    imp.add_argument("--limit", type=int, default=None, help="mooncake: read at most this many requests")
    imp.add_argument(
        "--tokenizer",
        default=None,
        help="chat-log: a local Hugging Face tokenizer directory, for lines without usage "
        "(default: estimated at 4 characters a token)",
    )
    imp.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the arrivals (default 0)")


def run(args) -> int:
    from justitia.workload import save_workload

    if args.workload_command == "import":
        return _import(args)

    if args.kind == "sessions":
        from justitia.workload.sessions import build_sessions

        if args.trace is not None and args.rate is not None:
            raise ValueError("--rate applies to synthetic arrivals; it cannot be combined with --trace.")
        agents, info = in_tenant(
            args, *build_sessions(args.agents, args.seed, args.trace, args.density, args.rate, args.cv)
        )
        what = "sessions"
    else:
        agents, info = workload_from_args(args)
        what = "agents"
    save_workload(agents, args.out)
    print(f"wrote {len(agents)} {what} to {args.out} ({info['arrivals']} arrivals, seed {args.seed})")
    return 0


def _import(args) -> int:
    """``justitia workload import``: read, check (nothing is written on a bad input), build, write."""
    import numpy as np

    from justitia.workload import save_workload, scale_tokens
    from justitia.workload.arrivals import MOONCAKE_ARRIVALS, synthetic_arrivals, trace_arrivals
    from justitia.workload.imports import (
        conversations_to_agents,
        default_tau2_source,
        read_chat_log,
        read_mooncake,
        read_tau2,
    )

    if args.copies < 1:
        raise ValueError(f"--copies must be an integer >= 1, got {args.copies}.")
    if args.rate is not None and args.trace is not None:
        raise ValueError("--rate and --trace both set arrivals; give one.")
    if args.format == "tau2":
        convs = read_tau2(args.paths or default_tau2_source())
    elif len(args.paths) != 1:
        raise ValueError(f"{args.format}: name one file, got {len(args.paths)}.")
    elif args.format == "chat-log":
        convs = read_chat_log(args.paths[0], args.tokenizer)
    else:
        if args.rate is not None or args.trace is not None or args.copies != 1:
            raise ValueError(
                "mooncake: the arrivals are the trace's own timestamps; --rate, --trace and --copies do not apply."
            )
        convs = read_mooncake(args.paths[0], args.limit)
    rng = np.random.default_rng(args.seed)
    order = [c for _ in range(args.copies) for c in convs]
    if args.copies > 1:
        order = [order[i] for i in rng.permutation(len(order))]
    arrivals = None
    if args.format != "mooncake":
        if args.trace is not None:
            trace = MOONCAKE_ARRIVALS if str(args.trace) == "mooncake" else args.trace
            arrivals = trace_arrivals(trace, len(order))
        else:
            arrivals = synthetic_arrivals(len(order), rng, args.rate if args.rate is not None else 1.0)
    agents = scale_tokens(conversations_to_agents(order, arrivals), args.scale)
    save_workload(agents, args.out)
    sessions = sum(a.is_session for a in agents)
    calls = sum(len(a.tasks) for a in agents)
    print(
        f"wrote {len(agents)} agents ({sessions} sessions, {len(agents) - sessions} of one turn; {calls} calls) "
        f"to {args.out}"
    )
    return 0
