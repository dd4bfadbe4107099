"""Baselines of the predictor ablation: the type's mean cost, and a line on the two length numbers."""

from __future__ import annotations

import math

import numpy as np

from justitia.core import CostModel
from justitia.predictors.base import Predictor
from justitia.predictors.features import ALL_TYPES, agent_numbers, request_numbers
from justitia.workload import Agent


class MeanPredictor(Predictor):
    """Baseline: the mean cost of the agent's type in the training data (all types' mean if unseen)."""

    name = "mean"

    def __init__(self, agent_means: dict[str, float], request_means: dict[str, float]):
        self.agent_means, self.request_means = agent_means, request_means

    @classmethod
    def train(cls, agents: list[Agent], cost: CostModel) -> "MeanPredictor":
        """Per-type means of agent and request costs."""
        agent_means: dict[str, float] = {}
        request_means: dict[str, float] = {}
        for agent_type in {a.type for a in agents} | {ALL_TYPES}:
            group = [a for a in agents if agent_type in (ALL_TYPES, a.type)]
            agent_means[agent_type] = float(np.mean([a.cost(cost) for a in group]))
            request_means[agent_type] = float(
                np.mean([cost.request_cost(t.prompt_tokens, t.output_tokens) for a in group for t in a.tasks])
            )
        return cls(agent_means, request_means)

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """The type's mean agent cost."""
        return self.agent_means.get(agent.type, self.agent_means[ALL_TYPES])

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """The type's mean request cost."""
        return self.request_means.get(agent.type, self.request_means[ALL_TYPES])


class LinearPredictor(Predictor):
    """Baseline: per type, log C linear in log(first-stage prompt tokens) and log(first-stage tasks)."""

    name = "linear"

    def __init__(self, coefs: dict[str, np.ndarray], request_coefs: dict[str, np.ndarray]):
        self.coefs, self.request_coefs = coefs, request_coefs

    @classmethod
    def train(cls, agents: list[Agent], cost: CostModel) -> "LinearPredictor":
        """Least squares per type (and over all types)."""
        coefs, request_coefs = {}, {}
        for agent_type in {a.type for a in agents} | {ALL_TYPES}:
            group = [a for a in agents if agent_type in (ALL_TYPES, a.type)]
            x = np.array([[1.0, *agent_numbers(a)] for a in group])
            y = np.log(np.maximum([a.cost(cost) for a in group], 1.0))
            coefs[agent_type] = np.linalg.lstsq(x, y, rcond=None)[0]
            tasks = [t for a in group for t in a.tasks]
            xr = np.array([[1.0, request_numbers(t)[0]] for t in tasks])
            yr = np.log(np.maximum([cost.request_cost(t.prompt_tokens, t.output_tokens) for t in tasks], 1.0))
            request_coefs[agent_type] = np.linalg.lstsq(xr, yr, rcond=None)[0]
        return cls(coefs, request_coefs)

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """exp of the type's linear fit."""
        c = self.coefs.get(agent.type, self.coefs[ALL_TYPES])
        return math.exp(float(np.clip(c @ np.array([1.0, *agent_numbers(agent)]), -50, 60)))

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """exp of the type's linear fit on the request's prompt length."""
        c = self.request_coefs.get(agent.type, self.request_coefs[ALL_TYPES])
        task = agent.task(stage, index)
        return math.exp(float(np.clip(c @ np.array([1.0, request_numbers(task)[0]]), -50, 60)))
