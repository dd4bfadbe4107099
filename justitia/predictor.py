"""Cost predictors: what an engine believes an agent or request will cost when it arrives.

``oracle`` knows the true cost. ``noisy:L`` multiplies the true cost by a factor drawn
log-uniformly from [1/L, L], one draw per agent and one per request, seeded per agent id so that a
result does not depend on the order agents are seen in.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np

from justitia.cost import CostModel
from justitia.workload import Agent


class Predictor:
    """Predicts costs from what is known at arrival; subclasses override both methods."""

    name = "predictor"

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """The predicted total cost of ``agent``."""
        raise NotImplementedError

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """The predicted cost of task ``index`` of stage ``stage`` of ``agent``."""
        raise NotImplementedError

    def observe(self, agent_type: str, predicted: float, actual: float) -> None:
        """An agent finished: what was predicted for it and what it cost (learning predictors use it)."""


class OraclePredictor(Predictor):
    """The true cost."""

    name = "oracle"

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """True total cost."""
        return agent.cost(model)

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """True request cost."""
        task = agent.stages[stage][index]
        return model.request_cost(task.prompt_tokens, task.output_tokens)


class NoisyPredictor(OraclePredictor):
    """The true cost times a log-uniform factor in [1/lam, lam]."""

    def __init__(self, lam: float, seed: int = 0):
        if not (lam >= 1 and math.isfinite(lam)):
            raise ValueError(f"predictor noisy:{lam:g}: the noise factor L must be a number >= 1.")
        self.lam = lam
        self.seed = seed
        self.name = f"noisy:{lam:g}"

    def _factor(self, *where: int) -> float:
        rng = np.random.default_rng([self.seed, *where])
        return math.exp(rng.uniform(-math.log(self.lam), math.log(self.lam)))

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """Noisy total cost."""
        return super().agent_cost(agent, model) * self._factor(_hash(agent.agent_id))

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """Noisy request cost."""
        return super().request_cost(agent, stage, index, model) * self._factor(_hash(agent.agent_id), stage + 1, index + 1)


def _hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def make_predictor(spec: str, seed: int = 0) -> Predictor:
    """Build a predictor from its name: ``oracle``, ``noisy:L`` (L >= 1), ``mlp:DIR`` or ``lm:DIR``
    (trained predictor directories; a bare ``DIR`` is read as the kind its manifest names), plain
    ``mlp``, ``lm``, ``mean`` or ``linear`` (trained on the committed SmolLM2 profile, once, then
    cached), or the baselines ``mean:FILE`` / ``linear:FILE`` (trained on the spot on a profile or
    workload file)."""
    if spec == "oracle":
        return OraclePredictor()
    if Path(spec, "predictor.json").is_file():  # a bare trained directory: its manifest says which kind
        import json

        schema = json.loads(Path(spec, "predictor.json").read_text()).get("schema", "")
        spec = ("lm:" if schema.startswith("justitia.lm-predictor/") else "mlp:") + spec
    kind, _, arg = spec.partition(":")
    if kind in ("mlp", "lm", "mean", "linear") and not arg:  # trained on the committed profile (cached)
        from justitia.profiles import DEFAULT_PROFILE, trained_predictors
        from justitia.workload import load_workload

        return make_predictor(trained_predictors(load_workload(DEFAULT_PROFILE), 0, (kind,))[kind], seed)
    if kind in ("mlp", "lm", "mean", "linear") and arg:
        from justitia import learned

        if kind == "mlp":
            return learned.LearnedPredictor.load(arg)
        if kind == "lm":
            from justitia.embedding import LmPredictor

            return LmPredictor.load(arg)
        from justitia.cost import cost_model
        from justitia.workload import load_workload

        trainer = learned.MeanPredictor if kind == "mean" else learned.LinearPredictor
        return trainer.train(load_workload(arg), cost_model("kv"))
    if spec.startswith("noisy:"):
        try:
            lam = float(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"predictor '{spec}': expected noisy:L with a number L >= 1, e.g. noisy:3.") from None
        return NoisyPredictor(lam, seed)
    raise ValueError(f"unknown predictor '{spec}'; expected oracle, noisy:L (e.g. noisy:3), mlp, lm, mean, "
                     "linear, mlp:DIR, lm:DIR, mean:FILE or linear:FILE.")
