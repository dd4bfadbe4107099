"""Generators for the nine task-parallel agent workflows of the paper's benchmark.

NOTE: every number lives in ``justitia/data/workflows.json`` (``parameters`` reads and checks it);
this module only draws from it. An agent is drawn in three steps: its fan-out ``n`` from the size
class, its stages in order (``stages``: each task's output length first, then its prompt), and its
prompt text (``text``: real sentences from a per-workflow phrase bank, with noisy hints of the true
lengths in the instructions, so that a text-based predictor has something to learn). All
randomness comes from the ``numpy.random.Generator`` passed in. ``build_workload`` draws a whole
workload: arrival times (``arrivals``), then one agent per arrival.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from justitia.core import is_positive_finite
from justitia.workload.agents import Agent
from justitia.workload.arrivals import DEFAULT_RATE_PER_S, arrival_times
from justitia.workload.parameters import SIZE_CLASSES, WORKFLOW_TYPES, dist_max, for_size, load_workflow_params
from justitia.workload.stages import Ctx, agent_stages, draw
from justitia.workload.text import Bank, make_bank

__all__ = [
    "WORKFLOW_TYPES",
    "SIZE_CLASSES",
    "DEFAULT_RATE_PER_S",
    "load_workflow_params",
    "generate_agent",
    "generate_agents",
    "output_cap",
    "staged_agent",
    "build_workload",
]


@lru_cache(maxsize=1)
def _compiled() -> tuple[dict, dict[str, Bank]]:
    params = load_workflow_params()
    banks = {name: make_bank(params["workflows"][name]["vocabulary"]) for name in WORKFLOW_TYPES}
    return params, banks


def _check_names(workflow: str, size: str) -> None:
    if workflow not in WORKFLOW_TYPES:
        raise ValueError(f"unknown workflow '{workflow}'; expected one of: {', '.join(WORKFLOW_TYPES)}.")
    if size not in SIZE_CLASSES:
        raise ValueError(f"unknown size class '{size}'; expected one of: {', '.join(SIZE_CLASSES)}.")


def _start(workflow: str, size: str, rng: np.random.Generator, scale: float) -> tuple[Ctx, dict]:
    _check_names(workflow, size)
    if not is_positive_finite(scale):
        raise ValueError(f"scale must be a number > 0, got {scale}.")
    params, banks = _compiled()
    wf = params["workflows"][workflow]
    bank = banks[workflow]
    n = int(draw(wf["fanout"], size, rng, 1)[0])
    topic = bank.topics[int(rng.integers(len(bank.topics)))]
    return Ctx(params, bank, size, n, topic, rng, scale), wf


def generate_agent(
    workflow: str, size: str, agent_id: str, arrival_s: float, rng: np.random.Generator, scale: float = 1.0
) -> Agent:
    """Draw one agent of ``workflow`` in size class ``size`` arriving at ``arrival_s``; ``scale``
    divides every drawn length (the same shapes, shorter texts)."""
    if not (isinstance(arrival_s, (int, float)) and math.isfinite(arrival_s) and arrival_s >= 0):
        raise ValueError(f"arrival_s must be a finite number >= 0, got {arrival_s!r}.")
    ctx, wf = _start(workflow, size, rng, scale)
    meta = {"size": size} if scale == 1 else {"size": size, "scale": scale}
    return Agent(agent_id, workflow, float(arrival_s), tuple(agent_stages(ctx, wf)), meta)


def output_cap(workflow: str, size: str, scale: float = 1.0, limit: int | None = None) -> int:
    """A ``max_tokens`` for a real model answering ``workflow``'s tasks: the longest output its
    stages can draw in ``size``, divided by ``scale``, at least 32 and at most ``limit``."""
    _check_names(workflow, size)
    wf = _compiled()[0]["workflows"][workflow]
    cap = max(dist_max(for_size(st["output_tokens"], size)) for st in wf["stages"])
    cap = max(32, math.ceil(cap / scale))
    return cap if limit is None else min(cap, limit)


def staged_agent(workflow: str, size: str, rng: np.random.Generator, scale: float = 1.0):
    """Generate an agent stage by stage around a real model: a generator that yields each stage's
    tasks (their ``output_tokens`` are the drawn lengths, which the instructions hint at) and must
    be sent, per task, the model's (output text, output tokens) before it yields the next stage.
    Later stages quote those real outputs, as a map-reduce agent would."""
    ctx, wf = _start(workflow, size, rng, scale)
    return agent_stages(ctx, wf)


def generate_agents(
    arrivals_s: Sequence[float],
    rng: np.random.Generator,
    types: Sequence[str] | None = None,
    size_probs: Sequence[float] | None = None,
    id_prefix: str = "agent",
) -> list[Agent]:
    """One agent per arrival time, its type uniform over ``types`` and its size drawn from ``size_probs``
    (small, medium, large; default: the parameter file's ``size_mix``)."""
    if size_probs is None:
        mix = _compiled()[0]["size_mix"]
        size_probs = tuple(mix[s] for s in SIZE_CLASSES)
    types = tuple(WORKFLOW_TYPES if types is None else types)
    if not types:
        raise ValueError(f"types must name at least one workflow; expected some of: {', '.join(WORKFLOW_TYPES)}.")
    for t in types:
        _check_names(t, "small")
    probs = np.asarray(size_probs, dtype=float)
    if probs.shape != (3,) or not np.all(np.isfinite(probs)) or np.any(probs < 0) or abs(probs.sum() - 1) > 1e-6:
        raise ValueError(
            f"size_probs must be three non-negative probabilities for {', '.join(SIZE_CLASSES)} summing to 1, "
            f"got {tuple(size_probs)}."
        )
    m = len(arrivals_s)
    type_idx = rng.integers(0, len(types), size=m)
    size_idx = rng.choice(len(SIZE_CLASSES), size=m, p=probs / probs.sum())
    return [
        generate_agent(types[int(t)], SIZE_CLASSES[int(s)], f"{id_prefix}-{i:04d}", float(a), rng)
        for i, (a, t, s) in enumerate(zip(arrivals_s, type_idx, size_idx))
    ]


def build_workload(
    n_agents: int,
    seed: int,
    trace: str | Path | None = None,
    density: float = 1.0,
    rate_per_s: float = DEFAULT_RATE_PER_S,
    cv: float = 1.0,
) -> tuple[list[Agent], dict]:
    """Agents of the nine workflows with trace or synthetic arrivals, and a description of them."""
    if n_agents < 1:
        raise ValueError(f"--agents must be >= 1, got {n_agents}.")
    if density <= 0:
        raise ValueError(f"--density must be > 0, got {density}.")
    rng = np.random.default_rng(seed)
    arrivals, info = arrival_times(n_agents, rng, trace, density, rate_per_s, cv)
    agents = generate_agents(arrivals, rng)
    return agents, info | {"agents": n_agents, "seed": seed}
