"""How well predictors do on agents they were not trained on: a per-type split, errors and
latency per predictor, and how fast an unseen type's error drops (``justitia predictor eval``)."""

from __future__ import annotations

import time

import numpy as np

from justitia.core import CostModel
from justitia.predictors.mlp import LearnedPredictor
from justitia.predictors.registry import kinds
from justitia.workload import Agent


def split(agents: list[Agent], test_frac: float = 0.2, seed: int = 0) -> tuple[list[Agent], list[Agent]]:
    """(train, test): ``test_frac`` of each type's agents held out (at least one), drawn with ``seed``."""
    if not 0 < test_frac < 1:
        raise ValueError(f"the held-out share must be between 0 and 1, got {test_frac}.")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for agent_type in sorted({a.type for a in agents}):
        group = [a for a in agents if a.type == agent_type]
        order = rng.permutation(len(group))
        n_test = max(1, round(test_frac * len(group)))
        test += [group[i] for i in order[:n_test]]
        train += [group[i] for i in order[n_test:]]
    return train, test


def evaluate(
    agents: list[Agent],
    cost: CostModel,
    test_frac: float = 0.2,
    seed: int = 0,
    names: tuple[str, ...] = ("mlp", "mean", "linear"),
) -> dict:
    """Train the ``names`` predictors on a per-type split of ``agents``; score them on the held-out part.

    Per predictor, per type and overall: mean relative error |predicted - true| / true of the agent
    cost, median and p99 prediction latency, and training time.
    """
    train, test = split(agents, test_frac, seed)
    out = {"train_agents": len(train), "test_agents": len(test), "predictors": {}}
    for name, kind in kinds(names).items():
        t = time.perf_counter()
        pred = kind.train(train, cost, seed)
        train_s = time.perf_counter() - t
        per_type: dict[str, list[float]] = {}
        latencies = []
        for a in test:
            t = time.perf_counter()
            p = pred.agent_cost(a, cost)
            latencies.append(time.perf_counter() - t)
            per_type.setdefault(a.type, []).append(abs(p - a.cost(cost)) / a.cost(cost))
        errors = [e for es in per_type.values() for e in es]
        out["predictors"][name] = {
            "train_s": train_s,
            "mean_rel_error": float(np.mean(errors)),
            "per_type_mean_rel_error": {t: float(np.mean(es)) for t, es in sorted(per_type.items())},
            "latency_ms_p50": 1000 * float(np.median(latencies)),
            "latency_ms_p99": 1000 * float(np.percentile(latencies, 99)),
        }
    return out


def cold_start(
    agents: list[Agent],
    cost: CostModel,
    seed: int = 0,
    checkpoints: tuple[int, ...] = (1, 5, 10, 20),
) -> dict:
    """How fast an unseen type's error drops. For each type: train the all-types model on the
    other types only, then predict that type's agents one after another, each finished agent
    feeding ``observe``. Returns, per type and averaged over types, the mean relative error of the
    (up to) five agents ending at each checkpoint: 1 is the first agent alone, before any feedback;
    10 is agents 6 to 10."""
    per_type: dict[str, dict[int, float]] = {}
    for agent_type in sorted({a.type for a in agents}):
        others = [a for a in agents if a.type != agent_type]
        mine = [a for a in agents if a.type == agent_type]
        pred = LearnedPredictor.train(others, cost, seed, per_type=False)
        errors = []
        for a in mine:
            p, true = pred.agent_cost(a, cost), a.cost(cost)
            errors.append(abs(p - true) / true)
            pred.observe(a.type, p, true)
        per_type[agent_type] = {k: float(np.mean(errors[max(0, k - 5) : k])) for k in checkpoints if k <= len(errors)}
    mean = {
        k: float(np.mean([e[k] for e in per_type.values() if k in e]))
        for k in checkpoints
        if any(k in e for e in per_type.values())
    }
    return {"window": 5, "per_type": per_type, "mean": mean}
