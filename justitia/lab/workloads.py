"""The workloads of the lab's presets (``justitia.lab.presets``) that ``justitia.workload`` does not
build by itself: the held-out profile agents of the predictor ablation and their trojans, the
elephant among small agents (starvation, sustained, elephant-stream), and main's agents in tenants
beside a streaming tenant; with the constants that size them. Each is built from
``justitia.workload`` (its agents, arrival times and generators)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from justitia.workload import Agent, Task, build_workload, load_workload
from justitia.workload.arrivals import MOONCAKE_ARRIVALS, arrival_times
from justitia.workload.workflows import generate_agent

# The ablation replays the held-out 30 % of the committed profile three times.
# Density 2 as in the paper's predictor ablation.
ABLATION_TEST_FRAC, ABLATION_COPIES, ABLATION_DENSITY = 0.3, 3, 2.0


def profile_workload(
    seed: int,
    trace: str | Path | None,
    density: float,
    copies: int = ABLATION_COPIES,
    test_frac: float = ABLATION_TEST_FRAC,
    profile: str | Path | None = None,
) -> tuple[list[Agent], dict, list[Agent]]:
    """Held-out agents of a real-LM profile, each replayed ``copies`` times at trace (or synthetic)
    arrivals, and the agents to train predictors on. Returns (workload, description, train)."""
    from justitia.lab.studies.evaluate import split
    from justitia.predictors.committed import DEFAULT_PROFILE

    path = Path(profile) if profile else DEFAULT_PROFILE
    train, test = split(load_workload(path), test_frac, seed)
    rng = np.random.default_rng(seed)
    arrivals, info = arrival_times(len(test) * copies, rng, trace, density)
    picks = [(a, k) for k in range(copies) for a in test]
    order = rng.permutation(len(picks))
    agents = [
        Agent(f"{picks[j][0].agent_id}#{picks[j][1]}", picks[j][0].type, t, picks[j][0].stages, picks[j][0].meta)
        for j, t in zip(order, arrivals)
    ]
    return (
        agents,
        info
        | {
            "profile": str(path),
            "held_out": len(test),
            "copies": copies,
            "trained_on": len(train),
            "agents": len(agents),
            "seed": seed,
        },
        train,
    )


# Light small agents: together they ask for about 40 % of the engine, so that under GPS the
# elephant gets most of it, while a shortest-first policy always has a mouse to serve first.
MICE_TYPES = ("search", "kqa", "fv", "alfworld")


def starvation_workload(seed: int, small_agents: int = 400, rate_per_s: float = 1.0) -> list[Agent]:
    """One large map-reduce elephant at t=0, then small agents arriving at ``rate_per_s``."""
    rng = np.random.default_rng(seed)
    elephant = generate_agent("mrs", "large", "elephant", 0.0, rng)
    smalls = [
        generate_agent(str(rng.choice(MICE_TYPES)), "small", f"mouse-{i:04d}", (i + 1) / rate_per_s, rng)
        for i in range(small_agents)
    ]
    return [elephant, *smalls]


# The sustained workloads: an elephant, then a stream of small single-stage agents for 10 simulated
# minutes at a multiple of what the engine really serves (measured, not assumed: see saturated_rate).
SUSTAINED_S = 600.0


def stream_mouse(rng: np.random.Generator, agent_id: str, arrival_s: float) -> Agent:
    """A small single-stage agent: 1-3 tasks of 300-900 prompt and 40-160 output tokens."""
    tasks = tuple(
        Task(
            f"Check claim {agent_id}/{i} against the sources and answer in a few sentences.",
            int(rng.integers(300, 901)),
            int(rng.integers(40, 161)),
        )
        for i in range(int(rng.integers(1, 4)))
    )
    return Agent(agent_id, "fv", arrival_s, (tasks,))


def saturated_rate(config, seed: int, n: int = 600) -> float:
    """Small agents per second the engine serves when it has nothing else to do: ``n`` of them at
    once, under fcfs, divided by the time they take."""
    from justitia.lab.bench import RunSpec, simulate

    rng = np.random.default_rng([seed, 1])
    burst = [stream_mouse(rng, f"probe-{i:04d}", 0.0) for i in range(n)]
    return n / simulate(burst, RunSpec("fcfs", "fcfs"), config, seed).makespan_s


def sustained_workload(seed: int, load: float, config) -> tuple[list[Agent], dict]:
    """One large two-stage map-reduce elephant at t=0, then small agents for ``SUSTAINED_S`` seconds at
    ``load`` times the engine's saturated rate (Poisson arrivals)."""
    rate = load * saturated_rate(config, seed)
    rng = np.random.default_rng(seed)
    elephant = generate_agent("mrs", "large", "elephant", 0.0, rng)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * SUSTAINED_S * 1.2)))
    mice = [stream_mouse(rng, f"mouse-{i:05d}", float(t)) for i, t in enumerate(arrivals[arrivals < SUSTAINED_S])]
    info = {
        "arrivals": f"elephant at 0 s, then small agents at {load:g}x the engine's saturated rate for "
        f"{SUSTAINED_S:.0f} s",
        "rate_per_s": rate,
        "load": load,
        "agents": 1 + len(mice),
        "seed": seed,
    }
    return [elephant, *mice], info


# The trojan workload: a tenth of the ablation's agents keep their first stage and follow it with a
# stage of 19 copies of it, so that the first stage is 1/20 of their cost. A predictor reads only the
# first stage (justitia.predictors.features), so it prices them as the ordinary agents they look like.
TROJAN_FRAC, TROJAN_COPIES, TROJAN_PREFIX = 0.1, 19, "trojan-"


def trojan_workload(seed: int) -> tuple[list[Agent], dict, list[Agent]]:
    """The ablation's workload (``profile_workload``) with ``TROJAN_FRAC`` of its agents made trojans:
    their first stage, then ``TROJAN_COPIES`` copies of its tasks. Returns (workload, description, train)."""
    agents, info, train = profile_workload(seed, MOONCAKE_ARRIVALS, ABLATION_DENSITY)
    rng = np.random.default_rng([seed, 2])
    picks = rng.choice(len(agents), size=max(1, round(TROJAN_FRAC * len(agents))), replace=False)
    for j in picks:
        a = agents[j]
        agents[j] = Agent(
            TROJAN_PREFIX + a.agent_id, a.type, a.arrival_s, (a.stages[0], a.stages[0] * TROJAN_COPIES), a.meta
        )
    return agents, info | {"trojans": len(picks), "trojan_first_stage_share": 1 / (1 + TROJAN_COPIES)}, train


# The tenants workloads (hierarchical GPS). ``tenants_workload``: main's agents spread over three
# tenants of weights 1, 1 and 2, and a fourth that streams small agents near the engine's saturated
# rate for STREAM_S seconds (about as long as main's backlog lasts on its own).
# ``elephant_stream_workload``: one large two-stage elephant at t=0 in a tenant of its own, and a
# tenant that streams small agents for 20 minutes at 5 a second.
TENANT_WEIGHTS = {"t1": 1.0, "t2": 1.0, "t3": 2.0}
STREAM_TENANT, STREAM_LOAD, STREAM_S = "stream", 0.9, 1000.0
ELEPHANT_STREAM_S, ELEPHANT_STREAM_RATE = 1200.0, 5.0


def tenants_workload(seed: int, config) -> tuple[list[Agent], dict]:
    """Main's agents, each in t1, t2 or t3 (uniformly at random), and a stream tenant of small agents
    at ``STREAM_LOAD`` times the engine's saturated rate for ``STREAM_S`` seconds."""
    agents, info = build_workload(300, seed, MOONCAKE_ARRIVALS, 1.0)
    rng = np.random.default_rng([seed, 3])
    names = list(TENANT_WEIGHTS)
    agents = [replace(a, tenant=t, weight=TENANT_WEIGHTS[t]) for a, t in zip(agents, rng.choice(names, len(agents)))]
    span = STREAM_S
    rate = STREAM_LOAD * saturated_rate(config, seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * span * 1.5) + 10))
    stream = [
        replace(stream_mouse(rng, f"stream-{i:05d}", float(t)), tenant=STREAM_TENANT)
        for i, t in enumerate(times[times < span])
    ]
    info = info | {
        "tenants": {**TENANT_WEIGHTS, STREAM_TENANT: 1.0},
        "stream_rate_per_s": rate,
        "stream_load": STREAM_LOAD,
        "stream_s": STREAM_S,
        "stream_agents": len(stream),
        "agents": len(agents) + len(stream),
    }
    return sorted(agents + stream, key=lambda a: a.arrival_s), info


def elephant_stream_workload(
    seed: int, rate_per_s: float = ELEPHANT_STREAM_RATE, seconds: float = ELEPHANT_STREAM_S
) -> tuple[list[Agent], dict]:
    """One large two-stage map-reduce elephant at t=0 (tenant ``elephant``), then small agents for
    ``seconds`` at ``rate_per_s`` (Poisson; tenant ``stream``)."""
    rng = np.random.default_rng(seed)
    elephant = replace(generate_agent("mrs", "large", "elephant", 0.0, rng), tenant="elephant")
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=int(rate_per_s * seconds * 1.2) + 10))
    mice = [
        replace(stream_mouse(rng, f"mouse-{i:05d}", float(t)), tenant="stream")
        for i, t in enumerate(arrivals[arrivals < seconds])
    ]
    info = {
        "arrivals": f"elephant at 0 s (tenant elephant), then small agents at {rate_per_s:g}/s for {seconds:.0f} s "
        "(tenant stream)",
        "rate_per_s": rate_per_s,
        "agents": 1 + len(mice),
        "seed": seed,
    }
    return [elephant, *mice], info
