"""Write the package's compact copy of tau2-bench's simulations (``justitia/data/tau2_bench.jsonl.gz``).

    python -m justitia.lab.tools.ship_tau2 [--source ../shared/traces/tau2-bench]

tau2-bench's eight results files (sierra-research/tau2-bench, MIT; the notice is in
``justitia/data/NOTICE``) are 14 MB of conversations. The presets need each agent call's token
counts (the API's ``usage``), the pauses before them, its user turn and the text that opens each
turn: ``workload.imports.write_compact`` keeps those (gzip without a file time, so the bytes are
reproducible), and ``read_tau2`` reads it as it reads the results files, so that a clone with
nothing beside it replays tau2-bench.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from justitia.workload.imports import TAU2_COMPACT, read_tau2, write_compact

ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=ROOT.parent / "shared/traces/tau2-bench")
    args = ap.parse_args()
    convs = read_tau2([args.source])
    write_compact(convs, TAU2_COMPACT)
    print(f"wrote {len(convs)} simulations, {sum(len(c.calls) for c in convs)} calls to {TAU2_COMPACT}")


if __name__ == "__main__":
    main()
