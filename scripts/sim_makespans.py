"""The simulator's steps, preemptions and makespan against the engine's, per policy, for a vLLM
bench's results (the profile it calibrated, the preset's agents).

    python scripts/sim_makespans.py [results/engine/results.json]
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.presets import make_preset
    from justitia.lab.vllm_bench import TAGGING_LABEL, load_bench

    doc, _, _, config = load_bench(Path(sys.argv[1] if len(sys.argv) > 1 else "results/engine/results.json"))
    seed = doc["workload"]["seed"]
    agents = make_preset(doc["preset"], seed).agents
    repeats = doc.get("repeats", 1)
    print("| run | mean JCT s, engine / simulator | makespan s, engine / simulator | steps a run, engine / simulator "
          "| ms a step, engine / simulator | preemptions a run, engine / simulator |")
    print("|---|---|---|---|---|---|")
    for label, e in doc["policies"].items():
        if label == TAGGING_LABEL:  # a stock engine: no step log
            continue
        sim = simulate(agents, RunSpec(label, e.get("policy", label)), config, seed)
        steps = e["iterations"] / repeats
        print(f"| {label} | {e['mean_jct_s']:.2f} / {sum(a.jct_s for a in sim.agents) / len(agents):.2f} "
              f"| {e['makespan_s']:.2f} / {sim.makespan_s:.2f} | {steps:,.0f} / {sim.iterations:,} "
              f"| {1000 * e['makespan_s'] / steps:.2f} / {1000 * sim.makespan_s / sim.iterations:.2f} "
              f"| {e['preemptions'] / repeats:.0f} / {sim.preemptions} |")


if __name__ == "__main__":
    main()
