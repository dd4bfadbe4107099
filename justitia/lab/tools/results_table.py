"""Print a results document's table in Markdown, as the docs show it.

    python -m justitia.lab.tools.results_table results/main/results.json

One row per run: mean, p50, p90 and p99 JCT, makespan, the change against VTC, and the
distribution of each agent's JCT change against VTC (share not delayed, mean of the delayed, p50,
p90, p99, max), then Justitia's delay-bound line.
"""

from __future__ import annotations

import json
import sys


def markdown(doc: dict) -> str:
    """The table of ``doc``, in Markdown."""
    cols = [
        "run",
        "mean JCT s",
        "p50 s",
        "p90 s",
        "p99 s",
        "makespan s",
        "vs VTC",
        "not delayed vs VTC",
        "mean delay of delayed",
        "delay p50",
        "delay p90",
        "delay p99",
        "max delay",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    digits = 2 if doc.get("engine") == "vllm" else 1
    for label, e in doc["policies"].items():
        f = doc["fairness"].get(f"{label}_vs_vtc")
        imp = e.get("improvement_vs_vtc")
        row = [label] + [
            f"{e[k]:.{digits}f}" for k in ("mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "makespan_s")
        ]
        row.append("-" if imp is None or label == "vtc" else f"{imp:+.1%}")
        if f:
            row += [
                f"{f['not_delayed_frac']:.1%}",
                f"{f['mean_delay_of_delayed']:.1%}",
                f"{f['delay_p50']:+.1%}",
                f"{f['delay_p90']:+.1%}",
                f"{f['delay_p99']:+.1%}",
                f"{f['max_delay']:.1%}",
            ]
        else:
            row += ["-"] * 6
        lines.append("| " + " | ".join(row) + " |")
    j = doc["policies"].get("justitia")
    if j and "delay_bound_s" in j:
        lines.append("")
        lines.append(
            "Justitia delay bound `2c_max + C_max/M` (GPS at the M the engine delivered) = "
            f"{j['delay_bound_s']:.1f} s; the largest `finish - GPS "
            f"finish` was {j['max_delay_vs_gps_s']:.1f} s; {j['bound_violations']} of {len(j['agents'])} agents "
            "over the bound."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as fh:
            print(markdown(json.load(fh)))
