"""Each run of a results file against GPS at the capacity *that run* delivered, beside the preset's
one yardstick (GPS at the M of the first measured Justitia run, ``lab.bench.summarize``).

    python -m justitia.lab.yardstick results/sessions/results.json [--preset sessions] [--runs LABEL ...]

With the prefix cache on, what the engine delivers depends on the order it serves in: a run whose
order hits the cache less delivers less, and GPS at another run's M finishes agents sooner than
that engine could. This reads each run's own delivered M (its capacity schedule, time-weighted)
and counts its agents past the bound the preset reported for it. It rebuilds the preset's
workload (same seed) for the GPS reference.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from justitia.lab.bench import delivered_capacity
from justitia.lab.metrics import gps_finish_times


def own_m_lateness(doc: dict, agents, labels: list[str] | None = None) -> list[str]:
    lines = []
    for label, e in doc["policies"].items():
        if (labels and label not in labels) or "capacity_schedule" not in e:
            continue
        m = delivered_capacity(e["capacity_schedule"], e["makespan_s"])
        bursts = {a["agent_id"]: a["bursts"] for a in e["agents"] if a.get("bursts")}
        gps = gps_finish_times(agents, doc["gps_reference"]["formula_capacity_per_s"], [(0.0, m)], bursts)
        delays = [a["finish_s"] - gps[a["agent_id"]] for a in e["agents"]]
        past = sum(x > e["delay_bound_s"] for x in delays)
        lines.append(
            f"{label}: its own M {m:,.0f} (the preset's {doc['gps_reference']['capacity_per_s']:,.0f}); "
            f"past its bound {e['delay_bound_s']:.1f} s: {past} of {len(delays)} "
            f"(the preset's yardstick: {e['bound_violations']}); worst finish - GPS finish {max(delays):.1f} s"
        )
    return lines


def main() -> None:
    from justitia.lab.presets import make_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--preset", default=None, help="the preset that wrote it (default: the results directory's name)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", nargs="*", default=None)
    args = ap.parse_args()
    name = args.preset or Path(args.results).resolve().parent.name
    doc = json.loads(Path(args.results).read_text())
    print("\n".join(own_m_lateness(doc, make_preset(name, args.seed).agents, args.runs)))


if __name__ == "__main__":
    main()
