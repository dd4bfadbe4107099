"""What a bound that holds whatever the prices asks of the order: ``justitia-guarded`` watching
(urgency counted, never acted on: the paper's order) and acting, at ``L`` floored at 0, half and
all of the largest ``L`` that keeps ``B`` within 1.5x the paper's bound.

    python -m justitia.lab.studies.guard_watch [--preset tau2] [--floors 0,0.5,1]

A price cannot say that a waiting burst is large: whatever it was priced at, its true work may be
one token, and GPS then ends it as soon as its pace clock reaches its start. So a policy whose
bound holds whatever the prices must serve every burst that falls more than ``L`` behind its GPS
pace, and ``L`` is at most ``B - 2 c_max``. The watch row counts how many bursts the paper's order
leaves that far behind; the acting rows show what serving them costs. Each row is judged as the
preset judges it (its first run with a clock sets the yardstick's M), so the preset's own runs are
not repeated here beyond that one. ``--floors`` are fractions of that largest ``L``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from justitia.core import LAG_FACTOR, cost_model, has_clock, make_policy
from justitia.lab.bench import simulate, summarize
from justitia.lab.metrics import delay_bound_s
from justitia.lab.presets import SIM_DEFAULT_PROFILE, make_preset
from justitia.sim import EngineConfig
from justitia.sim.config import load_profile

GUARDED = "justitia-guarded@online"


def mean_turn(run) -> float:
    """Mean turn time, a task-parallel agent's run counted as one turn (the ``tau2`` presets' rule)."""
    return float(np.mean([t for a in run.agents for t in (a.turns_s or (a.jct_s,))]))


def study(preset_name: str, floors: list[float], seed: int = 0) -> list[dict]:
    preset = make_preset(preset_name, seed)
    options = {"max_num_batched_tokens": 2048, "max_num_seqs": 256} | preset.sim_options  # as the bench runs it
    config = EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE), **options)
    spec = next(s for s in preset.specs if s.label == GUARDED)
    first = next(s for s in preset.specs if has_clock(s.policy))  # the preset's yardstick
    runs = {first.label: simulate(preset.agents, first, config, seed)}
    doc = summarize(preset.agents, [first], runs, config, preset.workload_info)
    m, plain = doc["gps_reference"]["capacity_per_s"], doc["gps_reference"]["delay_bound_s"]
    bursts = {a.agent_id: a.bursts for a in runs[first.label].agents if a.bursts}
    ceiling = delay_bound_s(preset.agents, config, m, bursts=bursts, guard=True) - plain  # (LAG_FACTOR - 1) C_max/M
    big_over_m = ceiling / (LAG_FACTOR - 1)
    c_max = (plain - big_over_m) / 2
    top = 1.5 * plain - 2 * c_max  # the largest L with B = 2 c_max + L <= 1.5x the plain bound
    cost = cost_model(spec.cost)
    built = config.capacity_per_s(cost)
    specs, policies = [first], {}
    for label, floor, watch in [(f"watch, L >= {top:.1f} s", top, True)] + [
        (f"guard, L >= {f * top:.1f} s", f * top, False) for f in floors
    ]:
        specs.append(replace(spec, label=label))
        policy = policies[label] = make_policy(spec.policy, built, cost, spec.guard_scale)
        policy.lag_floor_s, policy.watch = floor, watch
    for s in specs[1:]:
        runs[s.label] = simulate(preset.agents, s, config, seed, policy=policies[s.label])
    doc = summarize(preset.agents, specs, runs, config, preset.workload_info)
    rows = []
    for s in specs:
        e, run, pol = doc["policies"][s.label], runs[s.label], policies.get(s.label)
        rows.append(
            {
                "run": s.label,
                "mean_turn_s": mean_turn(run),
                "bound_s": e["delay_bound_s"],
                "plain_bound_s": plain,
                "past": e["bound_violations"],
                "agents": len(run.agents),
                "bursts": pol.bursts if pol else None,
                "urgent_events": pol.urgent_events if pol else None,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tau2", help="a simulator preset with a justitia-guarded@online run")
    ap.add_argument("--floors", default="0,0.5,1", help="L's floors, as fractions of the largest L within 1.5x")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        floors = [float(x) for x in args.floors.split(",")]
    except ValueError:
        ap.error(f"--floors: expected numbers separated by commas, got '{args.floors}'")
    if any(not 0 <= f <= 1 for f in floors):
        ap.error("--floors: each must be within [0, 1]")
    rows = study(args.preset, floors, args.seed)
    print(f"{args.preset}: the paper's bound {rows[0]['plain_bound_s']:.1f} s")
    print(f"{'run':<30} {'mean turn s':>11} {'bound s':>8} {'x paper':>7} {'past':>11} {'urgent / bursts':>16}")
    for r in rows:
        urgent = "-" if r["bursts"] is None else f"{r['urgent_events']} / {r['bursts']}"
        print(
            f"{r['run']:<30} {r['mean_turn_s']:>11.1f} {r['bound_s']:>8.1f} {r['bound_s'] / r['plain_bound_s']:>7.2f} "
            f"{r['past']:>4} of {r['agents']:<4} {urgent:>16}"
        )


if __name__ == "__main__":
    main()
