"""Write the package's copy of the Mooncake conversation trace's arrival times.

    python -m justitia.lab.tools.ship_arrivals [--trace ../shared/traces/mooncake_conversation_trace.jsonl]

The Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake, Apache-2.0) has one request a line
with ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``. The presets use only
the timestamps, so the package ships those alone, in the same format (``{"timestamp": ms}`` a
line, gzip without a file time, so the bytes are reproducible): ``justitia/data/`` then needs no
file beside the repository to reproduce every preset.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "justitia" / "data" / "mooncake_conversation_arrivals.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=ROOT.parent / "shared/traces/mooncake_conversation_trace.jsonl")
    args = ap.parse_args()
    lines = [
        json.dumps({"timestamp": json.loads(line)["timestamp"]})
        for line in args.trace.read_text().splitlines()
        if line.strip()
    ]
    data = ("\n".join(lines) + "\n").encode()
    OUT.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {len(lines)} arrival times to {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
