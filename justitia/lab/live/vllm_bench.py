"""``justitia bench --engine vllm`` and ``justitia calibrate``: policies on a real vLLM engine.

One engine (with the plug-in) serves every run; a second one, stock vLLM's priority scheduling
under the plug-in's step-log base, serves the front-end tagging run when asked. Each run's mean JCT is set against
the simulator's on the same workload,
with a latency profile fitted to a separate calibration run of the same engine (or one given).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from justitia.agent import RunResult
from justitia.engine.launch import EngineSpec
from justitia.lab.bench import RunSpec, check_labels, simulate, summarize
from justitia.lab.live.calibrate import (
    delivered_capacity,
    fcfs_mean_jct,
    fit_frontend,
    fit_profile,
    fit_speed,
    probe_speed,
    run_speed,
    step_durations,
)
from justitia.lab.live.door import SUFFIX as DOOR_SUFFIX
from justitia.lab.live.runner import VllmEngine
from justitia.lab.metrics import paired_bootstrap, turn_stats
from justitia.lab.progress import progress_bar
from justitia.sim import EngineConfig, LatencyProfile
from justitia.sim.config import FRONTEND_FIELDS
from justitia.workload import Agent, fit_tokens

TAGGING_LABEL = "justitia@tagging"
DOOR_PER_REQUEST_MS_MAX = 30.0  # the door's front end: the largest time per request its fit tries
WARM_RUNS_MAX, WARM_TOLERANCE = 4, 0.05  # the calibration's warm-up: runs at most, agreement of two in a row


def _mean_step_ms(rows) -> float:
    """The mean duration of a run's steps that were followed at once (the plug-in's step log)."""
    steps = step_durations(rows)
    return float(steps[:, 4].mean()) if len(steps) else 0.0


async def _calibrate(
    engine: VllmEngine, agents: list[Agent], seed: int, repeats: int = 1
) -> tuple[LatencyProfile, dict]:
    # the calibration's agents are the bench's own: scaled down until each task fits this engine's
    # context and KV cache, whatever the workload being benched
    agents, factor = fit_tokens(agents, min(engine.spec.max_model_len, engine.kv_tokens))
    # warm-up: a fresh engine's first runs are slow (the first 1.2-1.4x, the noise study); runs are
    # thrown away until two in a row take steps of the same mean time, within WARM_TOLERANCE
    warmup = [_mean_step_ms((await engine.run(agents, "fcfs", seed=seed)).steps)]
    while len(warmup) < WARM_RUNS_MAX:
        warmup.append(_mean_step_ms((await engine.run(agents, "fcfs", seed=seed)).steps))
        if abs(warmup[-1] - warmup[-2]) <= WARM_TOLERANCE * warmup[-2]:
            break
    runs, jcts = [], []
    for _ in range(repeats):
        run = await engine.run(agents, "fcfs", seed=seed)
        runs.append(run)
        jcts.append(sum(a.jct_s for a in run.result.agents) / len(agents))
    spec = engine.spec
    name = f"{spec.model}-cpu-calibrated"
    source = (
        f"fitted by 'justitia calibrate' to {sum(len(r.steps) for r in runs)} steps of {len(agents)} agents "
        f"under fcfs on vLLM ({spec.model}, {spec.kv_blocks} blocks of {engine.block_size}, "
        f"max_num_seqs {spec.max_num_seqs}, max_num_batched_tokens {spec.max_num_batched_tokens}); "
        f"the front end's latencies measured on their requests"
    )
    profile, stats = fit_profile([r.steps for r in runs], name, spec.usable_blocks, engine.block_size, source)
    # what the steps leave out: the front end, measured on the same runs' requests
    frontend = fit_frontend([(r.steps, r.requests) for r in runs])
    engine_jct = sum(jcts) / len(jcts)
    config = engine_config(profile, spec, engine.block_size)
    at_zero = fcfs_mean_jct(agents, config, seed)
    profile = replace(profile, **{k: frontend[k] for k in FRONTEND_FIELDS})
    fitted = fcfs_mean_jct(agents, engine_config(profile, spec, engine.block_size), seed)
    return profile, stats | {
        "scaled_down_by": factor,
        "warmup_step_ms": warmup,
        "engine_mean_jct_s": engine_jct,
        "sim_mean_jct_s_steps_only": at_zero,
        "sim_mean_jct_s": fitted,
        "frontend": frontend,
    }


def calibrate(
    engine_spec: EngineSpec, agents: list[Agent], seed: int = 0, repeats: int = 1
) -> tuple[LatencyProfile, dict]:
    """Run ``agents`` under fcfs on the engine and fit a latency profile to its steps."""

    async def go():
        async with VllmEngine(engine_spec) as engine:
            return await _calibrate(engine, agents, seed, repeats)

    return asyncio.run(go())


def merge_repeats(runs: list) -> RunResult:
    """One result from repeated runs of a policy: each agent's mean JCT (and finish) and, for a
    session, each turn's mean time; summed counts (the prefix cache's too), and the first repeat's
    capacity schedule and bursts (its GPS reference)."""
    first = runs[0].result
    agents = []
    for k, a in enumerate(first.agents):
        jct = sum(run.result.agents[k].jct_s for run in runs) / len(runs)
        turns = a.turns_s
        if turns:
            turns = [float(np.mean([run.result.agents[k].turns_s[t] for run in runs])) for t in range(len(turns))]
        agents.append(replace(a, jct_s=jct, finish_s=a.arrival_s + jct, turns_s=turns))
    cache = None
    if first.prefix_cache is not None:
        cache = {key: sum(r.result.prefix_cache[key] for r in runs) for key in ("queried_tokens", "hit_tokens")}
        cache["hit_rate"] = cache["hit_tokens"] / cache["queried_tokens"] if cache["queried_tokens"] else 0.0
        cache["hit_rate_per_repeat"] = [r.result.prefix_cache["hit_rate"] for r in runs]
    return RunResult(
        first.policy,
        agents,
        sum(r.result.makespan_s for r in runs) / len(runs),
        sum(r.result.iterations for r in runs),
        sum(r.result.steps for r in runs),
        sum(r.result.preemptions for r in runs),
        sum(r.result.wall_s for r in runs),
        first.capacity_schedule,
        prefix_cache=cache,
    )


def engine_config(profile: LatencyProfile, spec: EngineSpec, block_size: int) -> EngineConfig:
    """The simulator's view of the vLLM engine ``spec`` describes."""
    return EngineConfig(
        profile=profile,
        kv_blocks=spec.usable_blocks,
        block_size=block_size,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
        prefix_caching=spec.prefix_caching is not False,
    )


def load_bench(path: str | Path) -> tuple[dict, LatencyProfile, EngineSpec, EngineConfig]:
    """A vLLM bench's ``results.json``: the document, the profile the simulator ran with, the engine,
    and the simulator's view of it (``engine_config``)."""
    doc = json.loads(Path(path).read_text())
    profile = LatencyProfile.from_json(doc["profile"], str(path))
    spec = EngineSpec(**{k: v for k, v in doc["vllm"].items() if k in EngineSpec.__dataclass_fields__})
    return doc, profile, spec, engine_config(profile, spec, doc["vllm"]["block_size"])


def run_bench_vllm(
    agents: list[Agent],
    specs: list[RunSpec],
    engine_spec: EngineSpec,
    workload_info: dict,
    seed: int = 0,
    progress: bool = True,
    profile: LatencyProfile | None = None,
    calibration_agents: list[Agent] | None = None,
    tagging: bool = False,
    repeats: int = 1,
    speed_probes: bool = False,
    door: list[RunSpec] | None = None,
) -> dict:
    """Run every spec on one vLLM engine (plus a tagging run on stock vLLM) and compare with the simulator.

    With ``repeats`` > 1 every run is repeated (interleaved) and each agent's JCT is its mean over
    the repeats: one run on a shared 2-core machine varies by tens of percent. With
    ``speed_probes`` (and calibration agents) the calibration's agents run again under fcfs before
    the first run and after every run on an engine, and the simulator predicts each run at the mean
    of the speeds its two probes found (the one just before it and the one just after), the
    profile's form kept: from the probes' steps where the engine logs them (``probe_speed``), else
    from their mean JCTs (``fit_speed``).

    ``door``: runs of sessions through the door of ``justitia serve`` (``lab.live.door``), each repeat on
    a fresh server once the in-process engines have stopped, priced by the server itself.
    """
    door = list(door or [])
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}.")
    check_labels(specs + door)
    if profile is None and not calibration_agents:
        raise ValueError("the vLLM bench needs a latency profile (--latency) or calibration agents.")
    if speed_probes and not calibration_agents:
        raise ValueError("speed probes run the calibration agents: give calibration agents.")
    tries: dict[str, list] = {}  # label -> EngineRun per repeat
    walls: dict[str, float] = {}
    calibration: dict = {}
    # label -> per repeat, (before, after): the mean JCTs of the probes around the run, and their step logs
    probes: dict[str, list[tuple[float, float]]] = {}
    probe_steps: dict[str, list[tuple[list, list]]] = {}  # (empty logs on an engine without one)
    probe_agents: list[Agent] = []
    predictor = specs[0].predictor if specs else "oracle"

    async def go():
        nonlocal profile, calibration, probe_agents
        async with VllmEngine(replace(engine_spec, scheduler="plugin")) as engine:
            block_size = engine.block_size
            if speed_probes:  # the calibration's agents as _calibrate fits them to this engine
                probe_agents = fit_tokens(calibration_agents, min(engine_spec.max_model_len, engine.kv_tokens))[0]
            if profile is None:
                t = time.perf_counter()
                profile, stats = await _calibrate(engine, calibration_agents, seed)
                calibration = {"agents": len(calibration_agents), "wall_s": time.perf_counter() - t} | stats
            config = engine_config(profile, engine_spec, block_size)
            measured = calibration.get("delivered_capacity_per_s")  # the M calibration measured (KV units)
            if calibration:
                calibration["formula_capacity_per_s"] = config.capacity_per_s("kv")

            def start_m(spec: RunSpec) -> float:
                """The clock's M to start from: the calibration's measured one, when the run measures M."""
                if measured and spec.capacity == "measured" and spec.cost == "kv":
                    return measured
                return config.capacity_per_s(spec.cost)

            tagged = RunSpec(TAGGING_LABEL, "justitia", predictor)
            total = len(agents) * (len(specs) + tagging) * repeats
            total += len(probe_agents) * ((len(specs) + tagging) * repeats + 1 + tagging)

            async def probe(eng: VllmEngine) -> tuple[float, list] | None:
                """The calibration's agents under fcfs, between runs: how fast the engine is now."""
                if not probe_agents:
                    return None
                run = await eng.run(probe_agents, "fcfs", seed=seed, on_agent_finish=lambda _r: advance("probe"))
                return sum(a.jct_s for a in run.result.agents) / len(probe_agents), run.steps

            async def probed_run(eng: VllmEngine, label: str, before, **kw):
                """One run and the probe just after it (the next run's before); the run is kept with both."""
                t = time.perf_counter()
                run = await eng.run(agents, seed=seed, **kw)
                walls[label] = walls.get(label, 0.0) + time.perf_counter() - t
                tries.setdefault(label, []).append(run)
                after = await probe(eng)
                if before is not None:
                    probes.setdefault(label, []).append((before[0], after[0]))
                    probe_steps.setdefault(label, []).append((before[1], after[1]))
                return after

            with progress_bar(total, progress, "vllm") as advance:
                last = await probe(engine)
                for _ in range(repeats):  # interleaved: a slow spell of the machine hits every policy
                    for spec in specs:
                        last = await probed_run(
                            engine,
                            spec.label,
                            last,
                            policy=spec.policy,
                            predictor=spec.predictor,
                            cost=spec.cost,
                            capacity_per_s=start_m(spec),
                            on_agent_finish=lambda _r, s=spec: advance(s.label),
                            measure_capacity=spec.capacity == "measured",
                            retag=spec.retag,
                            pricing=spec.pricing,
                        )
                if tagging:
                    # stock vLLM's priority scheduling, its steps logged as the plug-in's are
                    async with VllmEngine(replace(engine_spec, scheduler="priority-logged")) as stock:
                        # A fresh engine's first steps of each batch shape are slow (CPU kernels get
                        # built); the plug-in engine warmed up before calibrating, this one does here.
                        await stock.run(
                            calibration_agents or agents, "justitia", predictor, "kv", start_m(tagged), seed
                        )
                        last = await probe(stock)
                        for _ in range(repeats):
                            last = await probed_run(
                                stock,
                                TAGGING_LABEL,
                                last,
                                policy="justitia",
                                predictor=predictor,
                                cost="kv",
                                capacity_per_s=start_m(tagged),
                                on_agent_finish=lambda _r: advance(TAGGING_LABEL),
                            )
        if door:
            await door_runs(agents, door, engine_spec, seed, repeats, progress, tries, walls)
        return config

    t0 = time.perf_counter()
    config = asyncio.run(go())
    bench_wall_s = time.perf_counter() - t0
    all_specs = list(specs)
    if tagging:
        all_specs.append(RunSpec(TAGGING_LABEL, "justitia", predictor))
    all_specs += door
    runs = {label: merge_repeats(label_tries) for label, label_tries in tries.items()}
    doc = summarize(agents, all_specs, runs, config, workload_info, engine="vllm")
    doc["repeats"] = repeats
    doc["vllm"] = engine_spec.to_json() | {"block_size": config.block_size, "kv_tokens": config.kv_tokens}
    doc["profile"] = profile.to_json()
    doc["bench_wall_s"] = bench_wall_s  # engine start-ups, calibration and every run
    if calibration:
        doc["calibration"] = calibration
    doc["comparisons"] = comparisons(tries, seed)
    if any(a.is_session for a in agents):
        doc["turn_comparisons"] = comparisons(tries, seed, "turn")

    door_config = config
    door_tries = [run for spec in door for run in tries[spec.label]]
    if door_tries and all(run.steps for run in door_tries):  # the door's own front end: HTTP, the chat
        # template, tokenizing (its runs' step logs against their requests, as calibrate fits the in-process one)
        doc["door_frontend"] = fit_frontend([(r.steps, r.requests) for r in door_tries], DOOR_PER_REQUEST_MS_MAX)
        door_profile = replace(config.profile, **{k: doc["door_frontend"][k] for k in FRONTEND_FIELDS})
        door_config = replace(config, profile=door_profile)
    for spec in all_specs:
        _judge_against_simulator(
            doc["policies"][spec.label],
            spec,
            agents,
            door_config if spec in door else config,
            seed,
            _Observed(
                tries[spec.label], walls[spec.label], probes.get(spec.label), probe_steps.get(spec.label), probe_agents
            ),
        )
    return doc


async def door_runs(
    agents: list[Agent],
    door: list[RunSpec],
    engine_spec: EngineSpec,
    seed: int,
    repeats: int,
    progress: bool,
    tries: dict,
    walls: dict,
) -> None:
    """Each door spec's runs through ``justitia serve`` (``lab.live.door``), interleaved over ``repeats``,
    each on a fresh server with the engine ``engine_spec`` describes, its steps logged (the simulator
    is read at the run's own speed); into ``tries`` and ``walls``."""
    from transformers import AutoTokenizer

    from justitia.defaults import process_cpus
    from justitia.engine.models import resolve_model
    from justitia.lab.live.door import door_server, run_through_door
    from justitia.lab.live.runner import pin_process
    from justitia.lab.live.servers import stop

    pin_process(set(process_cpus()))  # the in-process engine pinned this process; the server gets every core
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(engine_spec.model)))
    with progress_bar(len(agents) * len(door) * repeats, progress, "door") as advance:
        for _ in range(repeats):
            for spec in door:
                fd, steps = tempfile.mkstemp(prefix="justitia-door-steps-", suffix=".csv")
                os.close(fd)
                proc, url = door_server(spec.policy, engine_spec, steps)
                try:
                    t = time.perf_counter()
                    run = await run_through_door(
                        url,
                        agents,
                        spec.policy,
                        tokenizer,
                        engine_spec.max_model_len,
                        seed,
                        on_agent_finish=lambda _r, s=spec: advance(s.label),
                        served=engine_spec.model,
                        step_log=steps,
                    )
                    walls[spec.label] = walls.get(spec.label, 0.0) + time.perf_counter() - t
                    tries.setdefault(spec.label, []).append(run)
                finally:
                    stop(proc, 120)
                    os.unlink(steps)


@dataclass
class _Observed:
    """What one label's runs on the engine left: each repeat's run, their wall time, and the speed
    probes around each repeat (mean JCTs, step logs; None without probes)."""

    tries: list
    wall_s: float
    probes: list[tuple[float, float]] | None
    probe_steps: list[tuple[list, list]] | None
    probe_agents: list[Agent]


def _judge_against_simulator(
    entry: dict, spec: RunSpec, agents: list[Agent], config, seed: int, seen: _Observed
) -> None:
    """The simulator's prediction of one label's mean JCT written into its results ``entry``, at the
    calibration's profile and at the speeds the probes (or the run's own steps) found, with errors.
    Sessions: its mean turn time and prefix-cache hit rate too, at the same speeds."""
    probe_agents = seen.probe_agents
    runs: dict[float, RunResult] = {}  # speed scale -> the simulator's run

    def sim_run(spec: RunSpec, scale: float = 1.0) -> RunResult:
        if scale not in runs:
            cfg = config if scale == 1.0 else replace(config, profile=replace(config.profile, scale=scale))
            runs[scale] = simulate(agents, spec, cfg, seed)
        return runs[scale]

    def sim_mean_jct(spec: RunSpec, scale: float = 1.0) -> float:
        sim = sim_run(spec, scale)
        return sum(a.jct_s for a in sim.agents) / len(sim.agents)

    sim_mean = entry["sim_mean_jct_s_one_profile"] = sim_mean_jct(spec)  # the calibration's profile alone
    if seen.probes is not None:  # each repeat predicted at the mean speed of the probes around it
        by_jct = [float(np.mean([fit_speed(probe_agents, config, jct, seed) for jct in pair])) for pair in seen.probes]
        read = [[probe_speed(config.profile, steps) for steps in pair] for pair in seen.probe_steps]
        by_steps = [float(np.mean(pair)) if None not in pair else None for pair in read]
        entry["probe_mean_jct_s_per_repeat"] = [list(pair) for pair in seen.probes]
        entry["probe_jct_scale_per_repeat"] = by_jct
        at_jct = float(np.mean([sim_mean_jct(spec, s) for s in by_jct]))
        entry["sim_error_probe_jct"] = at_jct / entry["mean_jct_s"] - 1
        # the probes' steps, where the engine logs them (the plug-in, and stock vLLM under its
        # step-log base), read its speed over hundreds of steps rather than from one mean JCT;
        # on an engine without a step log, the JCT it is
        logged = all(by_steps)
        entry["speed_probe"] = "steps" if logged else "jct"
        entry["speed_scale_per_repeat"] = by_steps if logged else by_jct
        if logged:
            entry["probe_step_scale_per_repeat"] = by_steps
            entry["probe_step_scale_before_after_per_repeat"] = read
            before = float(np.mean([sim_mean_jct(spec, pair[0]) for pair in read]))
            entry["sim_error_probe_before"] = before / entry["mean_jct_s"] - 1  # the single probe's
        sim_mean = float(np.mean([sim_mean_jct(spec, s) for s in by_steps])) if logged else at_jct
    entry["mode"] = (
        "tagging" if spec.label == TAGGING_LABEL else "door" if spec.label.endswith(DOOR_SUFFIX) else "plugin"
    )
    entry["run_wall_s"] = seen.wall_s
    entry["max_arrival_lag_s"] = max(run.max_arrival_lag_s for run in seen.tries)
    entry["mean_jct_s_per_repeat"] = [sum(a.jct_s for a in run.result.agents) / len(agents) for run in seen.tries]
    if all(run.steps for run in seen.tries):  # how long requests waited for the engine (its step log)
        waited = [delivered_capacity([run.steps])[1] / run.result.makespan_s for run in seen.tries]
        entry["backlogged_share"] = sum(waited) / len(waited)
        # the simulator at each repeat's own speed (its steps' measured time over the profile's):
        # the engine's speed as it was during the run, which the probes around it cannot follow
        # on a machine whose speed moves within a run; what is left to differ is the schedule
        speeds = [run_speed(config.profile, run.steps) for run in seen.tries]
        if all(speeds):
            entry["run_speed_per_repeat"] = speeds
            at_speed = float(np.mean([sim_mean_jct(spec, s) for s in speeds]))
            entry["sim_error_at_run_speed"] = at_speed / entry["mean_jct_s"] - 1
            if "mean_turn_s" in entry:
                at_speed = float(np.mean([turn_stats(sim_run(spec, s).agents)["mean_turn_s"] for s in speeds]))
                entry["sim_mean_turn_s_at_run_speed"] = at_speed
                entry["sim_turn_error_at_run_speed"] = at_speed / entry["mean_turn_s"] - 1
                if sim_run(spec, speeds[0]).prefix_cache is not None:  # what the cache held at that speed
                    hits = [sim_run(spec, s).prefix_cache["hit_rate"] for s in speeds]
                    entry["sim_prefix_hit_rate_at_run_speed"] = float(np.mean(hits))
    entry["sim_mean_jct_s"] = sim_mean
    entry["sim_error"] = sim_mean / entry["mean_jct_s"] - 1
    if "mean_turn_s" in entry:  # sessions: the turn time at the speeds the JCT was predicted at
        speeds = [1.0]
        if seen.probes is not None:
            speeds = entry["speed_scale_per_repeat"]
        sims = [sim_run(spec, s) for s in speeds]
        entry["sim_mean_turn_s"] = float(np.mean([turn_stats(r.agents)["mean_turn_s"] for r in sims]))
        entry["sim_turn_error"] = entry["sim_mean_turn_s"] / entry["mean_turn_s"] - 1
        if sims[0].prefix_cache is not None:
            entry["sim_prefix_hit_rate"] = float(np.mean([r.prefix_cache["hit_rate"] for r in sims]))
    entry["sim_error_one_profile"] = entry["sim_mean_jct_s_one_profile"] / entry["mean_jct_s"] - 1


# Justitia against the baselines the paper sets it against, through the plug-in and by tagging.
COMPARED = [("justitia", b) for b in ("vtc", "srjf", "las", "fcfs")] + [
    (TAGGING_LABEL, "vtc"),
    (TAGGING_LABEL, "justitia"),
    ("justitia@prefix-aware", "justitia"),
]
# prices learned in the run: by the bench's driver (online), and by the server through its door
COMPARED += [
    ("justitia@online", "vtc"),
    ("justitia@online", "las"),
    ("justitia@online", "justitia"),
    ("justitia" + DOOR_SUFFIX, "las" + DOOR_SUFFIX),
    ("justitia" + DOOR_SUFFIX, "las"),
    ("justitia" + DOOR_SUFFIX, "justitia"),
    ("justitia" + DOOR_SUFFIX, "las-turn" + DOOR_SUFFIX),
    ("justitia" + DOOR_SUFFIX, "fcfs" + DOOR_SUFFIX),
]


def comparisons(tries: dict[str, list], seed: int = 0, metric: str = "jct") -> dict:
    """``<a>_vs_<b>``: the ratio of mean JCTs with its 95 % interval (``paired_bootstrap`` over agents
    and repeats), for each pair of ``COMPARED`` that ran. ``metric="turn"``: of mean turn times,
    from each session's turn times summed (every run has the same turns, so the ratio of the sums
    is the ratio of the mean turn times)."""

    def value(x) -> float:
        return x.jct_s if metric == "jct" else float(sum(x.turns_s or ()))

    out = {}
    for a, b in COMPARED:
        if a in tries and b in tries:
            cells = [np.array([[value(x) for x in run.result.agents] for run in tries[label]]) for label in (a, b)]
            out[f"{a}_vs_{b}"] = paired_bootstrap(*cells, seed=seed)
    return out
