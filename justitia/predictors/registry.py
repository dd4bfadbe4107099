"""Every trainable predictor by name: the one list the command line, the presets, the server and
the cache of trained predictors read. ``oracle`` and ``noisy:L`` need no training (``base``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from justitia.core import CostModel
from justitia.predictors import lm, mlp
from justitia.predictors.base import Predictor
from justitia.predictors.baselines import LinearPredictor, MeanPredictor
from justitia.predictors.files import manifest_schema
from justitia.workload import Agent


@dataclass(frozen=True)
class Kind:
    """A trainable predictor: how to train it, and how to load it when it is saved as a directory."""

    name: str
    description: str
    train: Callable[[list[Agent], CostModel, int], Predictor]  # (agents, cost model, seed)
    load: Callable[[str | Path], Predictor] | None = None  # None: trained on the spot from a file
    schema: str | None = None  # the manifest schema of a saved directory


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "mlp",
            "per-type TF-IDF + MLP (the paper's)",
            lambda agents, cost, seed: mlp.LearnedPredictor.train(agents, cost, seed),
            mlp.LearnedPredictor.load,
            mlp.SCHEMA,
        ),
        Kind(
            "lm",
            "MiniLM embedding + MLP over all types (stands in for S3's DistilBERT)",
            lambda agents, cost, seed: lm.LmPredictor.train(agents, cost, seed),
            lm.LmPredictor.load,
            lm.SCHEMA,
        ),
        Kind("mean", "the type's mean cost", lambda agents, cost, seed: MeanPredictor.train(agents, cost)),
        Kind(
            "linear",
            "per type, log C linear in log first-stage prompt tokens and tasks",
            lambda agents, cost, seed: LinearPredictor.train(agents, cost),
        ),
    )
}
SPEC_HELP = (
    "online (learned from the run's own finished agents and turns, cold-started from the prompts alone; "
    "online:KIND for a trained cold start), oracle, noisy:L, session (sessions: turns learned online), "
    + ", ".join(KINDS)
    + " (trained on the committed profile), "
    + ", ".join(f"{k}:DIR" for k, kind in KINDS.items() if kind.load)
    + " or "
    + " / ".join(f"{k}:FILE" for k, kind in KINDS.items() if not kind.load)
)


def kinds(names: tuple[str, ...] | list[str]) -> dict[str, Kind]:
    """The kinds called ``names``, in that order; an unknown name raises ValueError."""
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise ValueError(f"unknown predictor '{unknown[0]}'; expected some of: {', '.join(KINDS)}.")
    return {n: KINDS[n] for n in names}


def kind_of_dir(d: str | Path) -> str | None:
    """Which saved kind the predictor directory ``d`` holds, by its manifest; None if it is none."""
    schema = manifest_schema(d)
    return next((k.name for k in KINDS.values() if k.schema and k.schema == schema), None)
