"""The ``sessions`` presets: coding-agent sessions (turns, tool pauses, subagents, shared prompts) on
the simulator with vLLM's prefix cache on, as vLLM runs by default (``docs/sessions.md``).

    justitia bench --preset sessions           # the policies
    justitia bench --preset sessions-choices   # justitia's design choices, on the same sessions
    justitia bench --preset sessions-engine    # the policies on real vLLM (tiny model, CPU), cache on

Sessions come from ``justitia/data/sessions.json`` (``workload.sessions``), at a rate where the
one engine is overloaded and queueing dominates a turn's time. ``sessions`` runs fcfs, vtc, las
(program-level least attained service, Autellix's and llm-d's rule), srjf and justitia, each
session priced and tagged turn by turn with the oracle's turn cost. ``sessions-choices`` runs
justitia so, then priced by the calls between two pauses of any kind (``burst="pause"``); with
each subagent a flow of its own (``subagents="flows"``) rather than its session's; with the prefix
cache evicting first the blocks of the sessions whose next tag comes last (``kv_eviction="tag"``,
docs/sessions.md, "KV kept across tool pauses"); priced by the prefix-aware cost (``kv-prefix``:
the others run prefix-blind, ``kv``); and with the ``session`` predictor, which learns turn costs
online (its error turn by turn).
"""

from __future__ import annotations

from justitia.core import BASELINE_NAMES
from justitia.lab.bench import RunSpec
from justitia.workload import build_sessions
from justitia.workload.sessions import load_session_params

SESSIONS_N = 400  # sessions in the preset
SESSIONS_RATE_PER_S = 0.5  # their Poisson arrival rate: the work offered outruns the engine (see docs/results.md)
SESSIONS_POLICIES = ("fcfs", "vtc", "las", "srjf", "justitia")
PAUSE_LABEL = "justitia@pause"
LEARNED_LABEL = "justitia@session-predictor"
ONLINE_LABEL = "justitia@online"  # the row that ships: prices learned in the run (predictors.online)
FLOWS_LABEL = "justitia@subagent-flows"
PREFIX_LABEL = "justitia@prefix-aware"
TAG_EVICTION_LABEL = "justitia@tag-eviction"  # KV kept across tool pauses: evict the latest next tags first


# sessions-engine: the same generator sized for the tiny model on a 2-core CPU (vLLM's CPU backend,
# KV blocks of 128 tokens), sized on the simulator so that queueing dominates a turn (each policy's
# run about 40 s): token lengths / 16 as on the simulator's preset, every call within 60 % of the
# engine's 2,944-token KV cache (and its 2,048-token context); tool pauses and think times / 20, or
# a run would last as long as its users think (minutes); 100 sessions at 8 a second, where the
# simulator's Justitia / VTC in mean turn time stops falling with the rate, at the profile the
# engine was calibrated to (``python -m justitia.lab.studies.sessions_rates``; docs/results.md). The first
# recorded runs were at 5 a second, chosen at the engine preset's older, slower profile: at the
# engine's own, 0.68-0.76 from one seed to the next there.
SESSIONS_ENGINE_N, SESSIONS_ENGINE_RATE_PER_S = 100, 8.0
SESSIONS_ENGINE_SCALE, SESSIONS_ENGINE_TIME_SCALE, SESSIONS_ENGINE_FRACTION = 16, 20, 0.6
SESSIONS_ENGINE_POLICIES = ("fcfs", "vtc", "las", "justitia")


def sessions_workload(seed: int) -> tuple[list, dict]:
    return build_sessions(SESSIONS_N, seed, rate_per_s=SESSIONS_RATE_PER_S)


def engine_session_params(kv_tokens: int, block_size: int) -> dict:
    """The generator's parameters for a small engine (above): the file's, with lengths, the cap on
    a call and the pauses scaled as the constants say."""
    p = load_session_params()
    p["scale"]["factor"] = SESSIONS_ENGINE_SCALE
    p["kv"].update(kv_tokens=kv_tokens, block_size=block_size, max_conversation_fraction=SESSIONS_ENGINE_FRACTION)
    for name in ("tool_pause_s", "think_time_s"):
        for key in ("median", "min", "max"):
            p[name][key] /= SESSIONS_ENGINE_TIME_SCALE
    return p


def sessions_engine_workload(
    seed: int, kv_tokens: int, block_size: int, rate_per_s: float = SESSIONS_ENGINE_RATE_PER_S
) -> tuple[list, dict]:
    agents, info = build_sessions(
        SESSIONS_ENGINE_N, seed, rate_per_s=rate_per_s, params=engine_session_params(kv_tokens, block_size)
    )
    return agents, info | {
        "token_scale": SESSIONS_ENGINE_SCALE,
        "time_scale": SESSIONS_ENGINE_TIME_SCALE,
        "max_conversation_fraction": SESSIONS_ENGINE_FRACTION,
    }


def sessions_engine_summary(doc: dict) -> list[str]:
    """Per run: mean turn time on the engine and on the simulator, vLLM's and the simulator's
    prefix-cache hit rates (the simulator's at the run's speed where its steps were logged: a
    slower engine keeps a session's blocks less long), the bound; then Justitia's mean turn time
    against the others, with the paired bootstrap's 95 % intervals."""
    lines = [
        "                                        the simulator's turn s (error)",
        "run                    engine turn s   at the run's speed   at the probes' speeds   vLLM hit   sim hit   "
        "sessions over bound",
    ]
    nan = float("nan")
    for label, e in doc["policies"].items():
        over = f"{e['bound_violations']} of {len(e['agents'])}" if "bound_violations" in e else "-"
        hit = e.get("prefix_cache", {}).get("hit_rate")
        sim_hit = e.get("sim_prefix_hit_rate_at_run_speed", e.get("sim_prefix_hit_rate"))  # beside the engine's
        own = f"{e.get('sim_mean_turn_s_at_run_speed', nan):.2f} ({e.get('sim_turn_error_at_run_speed', nan):+.1%})"
        probed = f"{e.get('sim_mean_turn_s', nan):.2f} ({e.get('sim_turn_error', nan):+.1%})"
        lines.append(
            f"{label:22s} {e['mean_turn_s']:13.2f}   {own:>18s}   {probed:>21s} "
            f"{'-' if hit is None else f'{hit:.1%}':>10s} {'-' if sim_hit is None else f'{sim_hit:.1%}':>9s}   {over}"
        )
    for key, c in doc.get("turn_comparisons", {}).items():
        lo, hi = c["ci95"]
        lines.append(
            f"mean turn time {key.replace('_vs_', ' / ')}: {c['ratio']:.2f} (95 % interval {lo:.2f}-{hi:.2f}, "
            f"{c['repeats']} repeats x {c['agents']} sessions)"
        )
    return lines


GUARDED_ONLINE_LABEL = "justitia-guarded@online"  # behind its lag guard: a bound whatever the prices


def sessions_specs(choices: bool = False) -> list[RunSpec]:
    """The policies, or (``choices``) justitia under each of its design's choices."""
    if not choices:
        return (
            [RunSpec(p, p) for p in SESSIONS_POLICIES]
            + [RunSpec(p, p) for p in BASELINE_NAMES]
            + [RunSpec(ONLINE_LABEL, "justitia", "online"), RunSpec(GUARDED_ONLINE_LABEL, "justitia-guarded", "online")]
        )
    return [
        RunSpec("justitia", "justitia"),
        RunSpec(PAUSE_LABEL, "justitia", burst="pause"),
        RunSpec(FLOWS_LABEL, "justitia", subagents="flows"),
        RunSpec(TAG_EVICTION_LABEL, "justitia", kv_eviction="tag"),
        RunSpec(PREFIX_LABEL, "justitia", cost="kv-prefix"),
        RunSpec(LEARNED_LABEL, "justitia", "session"),
    ]


def sessions_summary(doc: dict) -> list[str]:
    """Mean, p50 and p90 turn time, the prefix cache's hit rate and the bound, per run; Justitia's mean
    turn time against LAS's, VTC's and FCFS's; tag eviction's figures against LRU's."""
    runs = doc["policies"]
    lines = ["run                           mean turn s   p50 turn s   p90 turn s   hit rate   sessions over bound"]
    for label, e in runs.items():
        over = f"{e['bound_violations']} of {len(e['agents'])}" if "bound_violations" in e else "-"
        hit = e.get("prefix_cache", {}).get("hit_rate")
        lines.append(
            f"{label:28s} {e['mean_turn_s']:12.1f} {e['p50_turn_s']:12.1f} {e['p90_turn_s']:12.1f} "
            f"{'-' if hit is None else f'{hit:.1%}':>10s}   {over}"
        )
    for label, e in runs.items():
        errors = e.get("turn_prediction")
        if errors and e["predictor"] != "oracle":
            lines.append(
                f"{label}: turn cost predicted within 2x for "
                + ", ".join(f"turn {k}: {v['within_2x']:.0%}" for k, v in list(errors.items())[:4])
                + f" (all turns: {errors['all']['within_2x']:.0%}, median |log2 error| "
                f"{errors['all']['median_abs_log2_error']:.2f})"
            )
    j = runs.get("justitia")
    for label in (ONLINE_LABEL, "justitia"):
        e = runs.get(label)
        if e is None:
            continue
        ratios = ", ".join(
            f"{other} {e['mean_turn_s'] / runs[other]['mean_turn_s']:.2f}x"
            for other in ("las", *BASELINE_NAMES, "vtc", "fcfs", "justitia")
            if other in runs and other != label
        )
        if ratios:
            lines.append(f"{label}'s mean turn time against {ratios}")
    p = runs.get(PREFIX_LABEL)
    if j is not None and p is not None:
        lines.append(
            f"prefix-aware cost against prefix-blind (justitia): mean turn "
            f"{p['mean_turn_s'] / j['mean_turn_s']:.3f}x, p90 turn {p['p90_turn_s'] / j['p90_turn_s']:.3f}x"
        )
    t = runs.get(TAG_EVICTION_LABEL)
    if j is not None and t is not None:
        hit = (
            f"{t['prefix_cache']['hit_rate'] / j['prefix_cache']['hit_rate']:.3f}x"
            if j.get("prefix_cache", {}).get("hit_rate") and t.get("prefix_cache")
            else "-"
        )
        lines.append(
            f"tag eviction against lru (justitia): mean turn {t['mean_turn_s'] / j['mean_turn_s']:.3f}x, "
            f"p90 turn {t['p90_turn_s'] / j['p90_turn_s']:.3f}x, hit rate {hit}"
        )
    return lines
