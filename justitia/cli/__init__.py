"""The ``justitia`` command line, one module per command: ``workload`` (generate), ``bench``,
``predictor`` (train, eval), ``profile``, ``serve``, ``calibrate`` and ``top``, each with its ``add_parser``
and ``run``; ``common`` holds the options several of them share. ``main`` is the console script.
It sits over both the product and the lab (``justitia.lab``)."""

from __future__ import annotations

import argparse
import sys

from justitia.cli import bench, calibrate, predictor, profile, serve, top, workload
from justitia.workload import WorkloadError

DESCRIPTION = """The ``justitia`` command line: generate workloads, benchmark policies, calibrate the simulator, train
predictors, profile a real model, serve agents. It sits over both the product and the lab (``justitia.lab``)."""
COMMANDS = {
    "workload": workload,
    "bench": bench,
    "predictor": predictor,
    "profile": profile,
    "serve": serve,
    "calibrate": calibrate,
    "top": top,
}  # in the order --help lists them


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="justitia", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``justitia`` console script."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "serve":
        args.vllm_args = extra  # vLLM's own server options, passed through
    try:
        return COMMANDS[args.command].run(args)
    except (WorkloadError, ValueError) as exc:
        print(f"justitia: error: {exc}", file=sys.stderr)
        return 2
