"""The ``tau2`` presets: real agent traffic, tau2-bench's simulations, replayed on the simulator
with vLLM's prefix cache on (``workload.imports``; docs/results.md, "Real agent traffic").

    justitia bench --preset tau2            # 280 simulations at 2 a second, lengths halved (the shipped copy)
    justitia bench --preset tau2-overload   # three copies of them, shuffled, at the same rate

The 200 conversational simulations are sessions (a user turn per ``user`` message, each call one
stage, tool and think times from the timestamps); the 40 solo ones of each agent model are
task-parallel agents of one turn. Each simulation's type names its domain and its agent model
(gpt-4.1 or the fine-tuned one): two agent programs a deployment would tell apart.

Rows: the policies a user would pick (fcfs, vtc, las, las-turn, las-decay, srjf), Justitia with the
oracle's costs (a labelled reference, never the headline), with ``online`` (what ships), behind its
lag guard, and with ``online`` started warm from a disjoint history: each simulation's prices start
from what the *other* agent model's simulations taught (the same tasks, another agent: what a
deployment that keeps its online state across a model upgrade has), then learn in the run; and
with ``online`` but no agent keeping its place across a hand-off (``RunSpec.hold``: what that rule
buys, docs/design.md, "An agent's place across a hand-off").

The load: 2 simulations a second with lengths halved (``TAU2_RATE_PER_S``, ``TAU2_SCALE``), where
the user who first replayed them looked. ``python -m justitia.lab.studies.tau2`` runs fcfs, las-turn and
Justitia at several rates: at 1 a second or less the engine keeps up with the 280 simulations and
every policy gives the same turn times (1.3-2.3 s); from about 1.25 a second their work outruns
it, turns queue, and the policies part (Justitia ``online`` 0.67x las-turn at 1.25, 0.60-0.69x from
1.5 to 4). 2 a second is well inside that range without being the deepest backlog; ``tau2-overload``
is three copies of the simulations, shuffled, at the same rate.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from justitia.core import BASELINE_NAMES
from justitia.lab.bench import RunSpec
from justitia.lab.metrics import paired_bootstrap
from justitia.workload import Agent, scale_tokens
from justitia.workload.arrivals import synthetic_arrivals
from justitia.workload.imports import TAU2_COMPACT, conversations_to_agents, read_tau2

TAU2_RATE_PER_S = 2.0  # simulations a second, Poisson
TAU2_SCALE = 2.0  # token lengths divided by it
TAU2_OVERLOAD_COPIES = 3
TAU2_POLICIES = ("fcfs", "vtc", "las", *BASELINE_NAMES, "srjf")
REFERENCE = "las-turn"  # what the rows are compared with: the non-clairvoyant rule a user would pick
ONLINE = "justitia@online"
GUARDED = "justitia-guarded@online"
WARM = "justitia@online/warm"
NO_HOLD = "justitia@online/no-hold"  # no agent keeps its place across a hand-off: what that rule buys
ORACLE = "justitia"  # the oracle's costs: a reference row


def tau2_workload(
    seed: int, copies: int = 1, rate_per_s: float = TAU2_RATE_PER_S, scale: float = TAU2_SCALE, source=None
) -> tuple[list[Agent], dict]:
    """tau2-bench's simulations (``copies`` of each, shuffled by ``seed``), arriving as a Poisson
    process at ``rate_per_s``, lengths divided by ``scale``."""
    paths = source or [TAU2_COMPACT]  # the shipped copy: a clone alone replays the same workload
    convs = read_tau2(paths)
    rng = np.random.default_rng(seed)
    order = [c for _ in range(copies) for c in convs]
    order = [order[i] for i in rng.permutation(len(order))]
    arrivals = synthetic_arrivals(len(order), rng, rate_per_s)
    agents = scale_tokens(conversations_to_agents(order, arrivals), scale)
    info = {
        "source": "tau2-bench ("
        + ("the package's compact file" if paths and str(paths[0]).endswith(".gz") else "../shared/traces/tau2-bench")
        + ")",
        "simulations": len(convs),
        "copies": copies,
        "agents": len(agents),
        "arrivals": "poisson",
        "rate_per_s": rate_per_s,
        "scale": scale,
        "seed": seed,
        "sessions": sum(a.is_session for a in agents),
        "solo_agents": sum(not a.is_session for a in agents),
    }
    return agents, info


def other_model(agent_type: str) -> str:
    """The same domain's type for the other agent model (``.../gpt41`` <-> ``.../ft``)."""
    kind, _, model = agent_type.rpartition("/")
    return f"{kind}/{'ft' if model == 'gpt41' else 'gpt41'}"


def disjoint_history(agents: list[Agent]) -> list[Agent]:
    """Each simulation as a history for the other agent model's: its type swapped, so that what it
    teaches prices the other model's simulations and never its own."""
    return [replace(a, type=other_model(a.type)) for a in agents]


def tau2_specs(agents: list[Agent]) -> list[RunSpec]:
    """The rows (the module's docstring). The warm row's state comes from the disjoint history; the
    guard starts cold (its scale is a size, and the history holds the same tasks' calls)."""
    history = tuple(disjoint_history(agents))
    return [RunSpec(p, p) for p in TAU2_POLICIES] + [
        RunSpec(ORACLE, "justitia"),
        RunSpec(ONLINE, "justitia", "online"),
        RunSpec(GUARDED, "justitia-guarded", "online"),
        RunSpec(WARM, "justitia", "online", history=history),
        RunSpec(NO_HOLD, "justitia", "online", hold=False),
    ]


def _turn_sums(entry: dict, solo: bool = True) -> dict[str, float]:
    """Each agent's turn times summed: a session's turns, a solo agent's one turn (its JCT)."""
    return {
        a["agent_id"]: sum(a["turns_s"]) if a.get("turns_s") else a["jct_s"]
        for a in entry["agents"]
        if solo or a.get("turns_s")
    }


def _turn_count(entry: dict) -> int:
    return sum(len(a["turns_s"]) if a.get("turns_s") else 1 for a in entry["agents"])


def tau2_comparisons(doc: dict) -> dict[str, dict]:
    """Each run's mean turn time over every turn (a solo agent's run is one turn) against
    las-turn's, with a paired bootstrap's 95 % interval over the simulations; then over the
    conversations' turns alone, and the solo agents' mean JCT."""
    runs = doc["policies"]
    ref = runs.get(REFERENCE)
    if ref is None:
        return {}
    out = {}
    ref_all, ref_conv = _turn_sums(ref), _turn_sums(ref, solo=False)
    ids, conv = sorted(ref_all), sorted(ref_conv)
    solo = [i for i in ids if i not in ref_conv]
    n = _turn_count(ref)
    for label, e in runs.items():
        all_, mine_conv = _turn_sums(e), _turn_sums(e, solo=False)
        c = paired_bootstrap(np.array([all_[i] for i in ids]), np.array([ref_all[i] for i in ids]))
        cc = paired_bootstrap(np.array([mine_conv[i] for i in conv]), np.array([ref_conv[i] for i in conv]))
        out[label] = {
            "mean_turn_s": sum(all_.values()) / n,
            "ratio": c["ratio"],
            "ci95": c["ci95"],
            "conversation_turn_s": e["mean_turn_s"],
            "conversation_ratio": cc["ratio"],
            "conversation_ci95": cc["ci95"],
            "solo_mean_jct_s": float(np.mean([all_[i] for i in solo])) if solo else math.nan,
            "solo_ratio": (sum(all_[i] for i in solo) / sum(ref_all[i] for i in solo)) if solo else math.nan,
            "past_bound": e.get("bound_violations"),
            "agents": len(e["agents"]),
        }
    return out


def tau2_summary(doc: dict) -> list[str]:
    """``tau2_comparisons`` as lines, one per run."""
    rows = tau2_comparisons(doc)
    lines = [
        f"mean turn time over every turn (a solo agent's run is one turn) / {REFERENCE}'s, 95 % interval over "
        "simulations; then the conversations' turns alone, and the solo agents' mean JCT",
        "run                        all turns s  / las-turn (95 %)         conversation turns s / las-turn"
        "      solo JCT s / las-turn   past the bound",
    ]
    for label, r in rows.items():
        lo, hi = r["ci95"]
        clo, chi = r["conversation_ci95"]
        over = "-" if r["past_bound"] is None else f"{r['past_bound']} of {r['agents']}"
        lines.append(
            f"{label:26s} {r['mean_turn_s']:11.1f}  {r['ratio']:.3f} ({lo:.3f}-{hi:.3f})   "
            f"{r['conversation_turn_s']:11.1f}   {r['conversation_ratio']:.3f} ({clo:.3f}-{chi:.3f})   "
            f"{r['solo_mean_jct_s']:10.1f}   {r['solo_ratio']:.3f}   {over}"
        )
    return lines


# tau2-engine: the conversations through justitia serve's door on the tiny model (CPU), as
# sessions-engine sends its sessions: 100 of them (seeded), every call within 60 % of the engine's
# KV cache (lengths divided by what that takes), tool and think times / 20, 8 sessions a second
# (sessions-engine's rate, where queueing dominates a turn on this engine; not swept for tau2).
TAU2_ENGINE_N, TAU2_ENGINE_RATE_PER_S, TAU2_ENGINE_TIME_SCALE, TAU2_ENGINE_FRACTION = 100, 8.0, 20.0, 0.6
TAU2_ENGINE_POLICIES = ("justitia", REFERENCE, "fcfs")


def tau2_engine_workload(seed: int, kv_tokens: int, max_model_len: int, source=None) -> tuple[list[Agent], dict]:
    """``TAU2_ENGINE_N`` of tau2-bench's conversations (the solo ones are not sessions a harness
    sends), arriving at ``TAU2_ENGINE_RATE_PER_S``, shrunk to fit a small engine."""
    from justitia.workload import fit_tokens

    convs = [c for c in read_tau2(source or [TAU2_COMPACT]) if not c.solo]
    rng = np.random.default_rng(seed)
    pick = [convs[i] for i in sorted(rng.choice(len(convs), TAU2_ENGINE_N, replace=False))]
    pick = [pick[i] for i in rng.permutation(len(pick))]
    for c in pick:
        c.calls = [replace(call, pause_s=call.pause_s / TAU2_ENGINE_TIME_SCALE) for call in c.calls]
    arrivals = synthetic_arrivals(len(pick), rng, TAU2_ENGINE_RATE_PER_S)
    room = int(min(kv_tokens * TAU2_ENGINE_FRACTION, max_model_len - 64))
    agents, factor = fit_tokens(conversations_to_agents(pick, arrivals), room)
    info = {
        "source": "tau2-bench",
        "sessions": len(agents),
        "arrivals": "poisson",
        "rate_per_s": TAU2_ENGINE_RATE_PER_S,
        "token_scale": factor,
        "time_scale": TAU2_ENGINE_TIME_SCALE,
        "max_conversation_fraction": TAU2_ENGINE_FRACTION,
        "seed": seed,
    }
    return agents, info


def rate_sweep(rates: list[float], seed: int = 0) -> list[str]:
    """Mean turn time over every turn of fcfs, las-turn, Justitia (oracle) and Justitia ``online``
    at each arrival rate: where the policies differ, the load the ``tau2`` preset runs at."""
    from justitia.lab.bench import SIM_DEFAULT_PROFILE, run_bench
    from justitia.sim import EngineConfig
    from justitia.sim.config import load_profile

    config = EngineConfig(
        profile=load_profile(SIM_DEFAULT_PROFILE), max_num_batched_tokens=2048, max_num_seqs=256, prefix_caching=True
    )
    specs = [
        RunSpec("fcfs", "fcfs"),
        RunSpec(REFERENCE, REFERENCE),
        RunSpec(ORACLE, "justitia"),
        RunSpec(ONLINE, "justitia", "online"),
    ]
    lines = [
        "rate/s   " + "   ".join(f"{s.label:>16s}" for s in specs) + "   (mean turn s over every turn; / las-turn)"
    ]
    for rate in rates:
        agents, info = tau2_workload(seed, rate_per_s=rate)
        rows = tau2_comparisons(run_bench(agents, specs, config, info, seed, progress=False))
        lines.append(
            f"{rate:6.2f}   "
            + "   ".join(f"{rows[s.label]['mean_turn_s']:7.1f} ({rows[s.label]['ratio']:.2f})" for s in specs)
        )
    return lines


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        description="tau2-bench's simulations at several arrival rates (the tau2 preset's load)"
    )
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0, 3.0, 4.0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("\n".join(rate_sweep(args.rates, args.seed)))
