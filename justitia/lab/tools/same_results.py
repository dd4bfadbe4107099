"""Check that two results documents are the same, wall times aside.

    python -m justitia.lab.tools.same_results BEFORE/results.json AFTER/results.json [--ignore KEY ...]

Used when code is reshaped without changing behaviour: every number of every run, every agent's
finish time included, must be equal to the last bit. Keys that measure the machine rather than the
schedule (``wall_s``, ``run_wall_s``, ``bench_wall_s``) are left out. Exits 1 and prints the first
differences if the documents differ.
"""

from __future__ import annotations

import argparse
import json
import sys

MACHINE_KEYS = ("wall_s", "run_wall_s", "bench_wall_s")


def differences(a, b, path: str = "", ignore: tuple[str, ...] = ()) -> list[str]:
    """Where ``a`` and ``b`` differ, as JSON paths with both values; keys in ``ignore`` (paths such as
    ``.workload.trace``) and the machine's keys are left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            where = f"{path}.{key}"
            if key in MACHINE_KEYS or where in ignore:
                continue
            if key not in a or key not in b:
                out.append(f"{where}: only in {'the second' if key in b else 'the first'}")
            else:
                out += differences(a[key], b[key], where, ignore)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]", ignore)]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--ignore", nargs="*", default=[], help="JSON paths to leave out, e.g. .workload.trace")
    args = ap.parse_args()
    with open(args.before) as f1, open(args.after) as f2:
        diffs = differences(json.load(f1), json.load(f2), ignore=tuple(args.ignore))
    if diffs:
        print(f"{len(diffs)} differences; the first:", *diffs[:20], sep="\n  ")
        return 1
    print(f"same results (wall times aside): {args.before} = {args.after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
