"""The predictor interface, and the two that need no training: ``oracle`` and ``noisy:L``.

``oracle`` knows the true cost. ``noisy:L`` multiplies the true cost by a factor drawn
log-uniformly from [1/L, L], one draw per agent and one per request, seeded per agent id so that a
result does not depend on the order agents are seen in.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from justitia.core import CostDist, CostModel
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

    def turn_cost(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> float:
        """The predicted cost of a session's user turn ``turn`` as it starts; ``earlier`` holds the
        true costs of its turns before it. By default: its calls' predicted request costs, summed."""
        return sum(float(self.request_cost(agent, s, i, model)) for s, i in agent.turn_calls(turn))

    def agent_dist(self, agent: Agent, model: CostModel) -> CostDist | None:
        """The agent's cost as a distribution, for a predictor that knows what it does not know
        (``core.gittins``: the engine then ranks it by its Gittins index); None: ``agent_cost`` is
        its price."""
        return None

    def turn_dist(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> CostDist | None:
        """A session turn's cost as a distribution (``agent_dist``'s, for a turn); None by default."""
        return None

    def observe_turn(
        self, agent_type: str, turn: int, predicted: float, actual: float, earlier: float | None = None
    ) -> None:
        """A session's turn finished: what was predicted for it, what it cost, and what its turn
        before cost (None for its first); learning predictors use it."""

    def learn(self, agent: Agent, actual: float, turn: int | None = None, earlier: list[float] | None = None) -> None:
        """``agent`` (as it showed itself on arrival) finished, or its user turn ``turn`` did, having
        cost ``actual`` (in the cost model's unit); ``earlier``: the true costs of the turns before
        it. Predictors that learn from a deployment's own traffic use it."""

    def progress(self, agent: Agent, so_far: float, turn: int | None = None) -> None:
        """``agent`` (or its user turn ``turn``) is still running and its answered calls have cost
        ``so_far``: a lower bound on its cost, for a predictor that learns from running traffic."""

    def observe_call(self, agent_type: str, prompt_tokens: int, output_tokens: int) -> None:
        """A session's call was answered with ``output_tokens`` (learning predictors use it)."""

    def observe(self, agent_type: str, predicted: float, actual: float, tenant: str | None = None) -> None:
        """An agent (of ``tenant``) finished: what was predicted for it and what it cost (learning
        predictors use it)."""


class OraclePredictor(Predictor):
    """The true cost."""

    name = "oracle"

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """True total cost."""
        return agent.cost(model)

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """True request cost."""
        task = agent.task(stage, index)
        return model.request_cost(task.prompt_tokens, task.output_tokens)

    def turn_cost(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> float:
        """True turn cost: its calls priced in the groups they are sent in (``CostModel.group_cost``:
        under ``kv-prefix`` a prefix the calls of a group share is held once)."""
        return sum(
            model.group_cost([(agent.runs(s, i)[:-1], agent.task(s, i).output_tokens) for s, i in group])
            for group in agent.turn_groups(turn)
        )


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

    turn_cost = Predictor.turn_cost  # its noisy request costs, summed

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """Noisy request cost."""
        return super().request_cost(agent, stage, index, model) * self._factor(
            _hash(agent.agent_id), stage + 1, index + 1
        )


def _hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))
