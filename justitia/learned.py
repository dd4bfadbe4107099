"""The learned cost predictor: per agent type, TF-IDF of the prompt then a 4-layer MLP (the paper's).

Training uses scikit-learn (``TfidfVectorizer``, ``MLPRegressor`` with MSE + L2 ``alpha``);
prediction uses only numpy on weights stored in a non-executable format:

    DIR/predictor.json   schema "justitia.predictor/1": per model its vocabulary, target
                         transform, layer names, and the SHA-256 of the weights file
    DIR/weights.npz      idf vector and layer matrices, loaded with ``allow_pickle=False``

Loading never unpickles anything; a weights file whose hash does not match the manifest is
refused. What a model sees of an agent at arrival: the text of its first stage's prompts (TF-IDF,
sublinear tf, l2-normalized, as sklearn computes it), plus two numbers, log(1 + first-stage prompt
tokens) and log(1 + first-stage tasks). Target: log C, standardized; predictions are
``exp(.)``, so they are never negative. The first hidden layer's width scales with the type's mean
prompt length (``clip(mean_tokens / 8, 32, 256)``), then 64 and 32.

Per type there are two models: ``agent`` (total cost C, for justitia and srjf) and ``request``
(one request's cost, for sjf). A model over all types (``*``) serves types never seen in training;
after each finished agent, ``observe`` updates a per-type correction (an exponentially weighted
mean of log(actual / predicted)), so an unseen type improves as it runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from justitia.cost import CostModel
from justitia.predictor import Predictor
from justitia.workload import Agent, Task

SCHEMA = "justitia.predictor/1"
ALL_TYPES = "*"
TOKEN = re.compile(r"(?u)\b\w\w+\b")  # sklearn's default token_pattern
CORRECTION_WEIGHT = 0.3  # weight of the newest observation in the per-type correction


class PredictorFileError(ValueError):
    """A predictor directory that is missing, malformed, tampered with or not ours."""


def agent_text(agent: Agent) -> str:
    """What the predictor reads of an agent at arrival: its first stage's prompts."""
    return "\n".join(t.prompt for t in agent.stages[0])


def agent_numbers(agent: Agent) -> list[float]:
    """Known at arrival: first-stage prompt tokens and tasks, log-scaled."""
    first = agent.stages[0]
    return [math.log1p(sum(t.prompt_tokens for t in first)), math.log1p(len(first))]


def request_numbers(task: Task) -> list[float]:
    """Known when a request is submitted: its prompt tokens, log-scaled."""
    return [math.log1p(task.prompt_tokens), 0.0]


@dataclass
class Model:
    """One fitted regressor: vocabulary, idf, MLP layers and the target transform."""

    vocab: dict[str, int]
    idf: np.ndarray
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    mean: float
    std: float

    def features(self, text: str, numbers: list[float]) -> np.ndarray:
        """TF-IDF (sublinear tf, l2 norm) of ``text`` followed by ``numbers``."""
        counts: dict[int, int] = {}
        for token in TOKEN.findall(text.lower()):
            j = self.vocab.get(token)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        x = np.zeros(len(self.idf) + len(numbers))
        if counts:
            idx = np.fromiter(counts, dtype=np.int64)
            tf = 1.0 + np.log(np.fromiter(counts.values(), dtype=float))
            vals = tf * self.idf[idx]
            x[idx] = vals / np.linalg.norm(vals)
        x[len(self.idf):] = numbers
        return x

    def predict(self, text: str, numbers: list[float]) -> float:
        """The predicted cost (>= 0, finite)."""
        h = self.features(text, numbers)
        last = len(self.weights) - 1
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if k < last:
                h = np.maximum(h, 0.0)
        z = float(np.clip(h[0] * self.std + self.mean, -50.0, 60.0))  # guard exp() on wild inputs
        return math.exp(z)


def _fit(texts: list[str], numbers: list[list[float]], costs: list[float], width: int, seed: int,
         alpha: float) -> Model:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.neural_network import MLPRegressor

    vec = TfidfVectorizer(lowercase=True, sublinear_tf=True, max_features=4096, norm="l2", dtype=np.float64)
    tfidf = vec.fit_transform(texts).toarray()
    x = np.hstack([tfidf, np.asarray(numbers, dtype=float)])
    y = np.log(np.maximum(np.asarray(costs, dtype=float), 1.0))
    mean, std = float(y.mean()), float(y.std() or 1.0)
    mlp = MLPRegressor(hidden_layer_sizes=(width, 64, 32), activation="relu", alpha=alpha, max_iter=600,
                       learning_rate_init=1e-3, random_state=seed, n_iter_no_change=30, tol=1e-5)
    mlp.fit(x, (y - mean) / std)
    vocab = {term: int(j) for term, j in vec.vocabulary_.items()}
    return Model(vocab, np.asarray(vec.idf_, dtype=float), [np.asarray(w) for w in mlp.coefs_],
                 [np.asarray(b) for b in mlp.intercepts_], mean, std)


class LearnedPredictor(Predictor):
    """Per-type TF-IDF + MLP predictions with an all-types fallback and online per-type correction."""

    name = "mlp"

    def __init__(self, models: dict[str, dict[str, Model]], cost: str, meta: dict | None = None):
        self.models = models
        self.cost = cost
        self.meta = meta or {}
        self.correction: dict[str, float] = {}  # type -> log factor
        self.latencies_s: list[float] = []

    # ----------------------------------------------------------------------------- predict
    def _model(self, agent_type: str, target: str) -> Model:
        return self.models.get(agent_type, self.models[ALL_TYPES])[target]

    def _check(self, model: CostModel) -> None:
        if model.name != self.cost:
            raise ValueError(f"this predictor was trained on '{self.cost}' costs, not '{model.name}'.")

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """Predicted total cost of ``agent``, corrected by what its type has shown so far."""
        self._check(model)
        t = time.perf_counter()
        raw = self._model(agent.type, "agent").predict(agent_text(agent), agent_numbers(agent))
        self.latencies_s.append(time.perf_counter() - t)
        return raw * math.exp(self.correction.get(agent.type, 0.0))

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """Predicted cost of one request."""
        self._check(model)
        task = agent.stages[stage][index]
        return self._model(agent.type, "request").predict(task.prompt, request_numbers(task))

    def observe(self, agent_type: str, predicted: float, actual: float) -> None:
        """An agent of ``agent_type`` finished: move the type's correction toward log(actual / predicted)."""
        if predicted > 0 and actual > 0:
            err = math.log(actual / predicted) + self.correction.get(agent_type, 0.0)  # against the raw prediction
            old = self.correction.get(agent_type)
            self.correction[agent_type] = err if old is None else (1 - CORRECTION_WEIGHT) * old + CORRECTION_WEIGHT * err

    # ----------------------------------------------------------------------------- training
    @classmethod
    def train(cls, agents: list[Agent], cost: CostModel, seed: int = 0, alpha: float = 1e-3,
              min_agents_per_type: int = 10) -> "LearnedPredictor":
        """Fit per-type models (types with at least ``min_agents_per_type`` agents) and the all-types one."""
        if len(agents) < min_agents_per_type:
            raise ValueError(f"training needs at least {min_agents_per_type} agents, got {len(agents)}.")
        by_type: dict[str, list[Agent]] = {}
        for a in agents:
            by_type.setdefault(a.type, []).append(a)
        groups = {t: g for t, g in by_type.items() if len(g) >= min_agents_per_type}
        groups[ALL_TYPES] = agents
        models = {}
        for agent_type, group in groups.items():
            tasks = [t for a in group for t in a.tasks]
            mean_tokens = sum(t.prompt_tokens for a in group for t in a.stages[0]) / len(group)
            width = int(min(max(mean_tokens / 8, 32), 256))
            models[agent_type] = {
                "agent": _fit([agent_text(a) for a in group], [agent_numbers(a) for a in group],
                              [a.cost(cost) for a in group], width, seed, alpha),
                "request": _fit([t.prompt for t in tasks], [request_numbers(t) for t in tasks],
                                [cost.request_cost(t.prompt_tokens, t.output_tokens) for t in tasks], width, seed, alpha),
            }
        meta = {"agents": len(agents), "types": {t: len(g) for t, g in by_type.items()}, "alpha": alpha, "seed": seed}
        return cls(models, cost.name, meta)

    # ----------------------------------------------------------------------------- files
    def save(self, out_dir: str | Path) -> Path:
        """Write ``predictor.json`` and ``weights.npz`` into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        manifest_models = {}
        for k, (agent_type, targets) in enumerate(sorted(self.models.items())):
            manifest_models[agent_type] = {}
            for target, m in targets.items():
                prefix = f"m{k}_{target}"
                arrays[f"{prefix}_idf"] = m.idf
                for i, (w, b) in enumerate(zip(m.weights, m.biases)):
                    arrays[f"{prefix}_w{i}"] = w
                    arrays[f"{prefix}_b{i}"] = b
                vocab = sorted(m.vocab, key=m.vocab.__getitem__)
                manifest_models[agent_type][target] = {
                    "prefix": prefix, "vocabulary": vocab, "layers": len(m.weights),
                    "target": {"transform": "log", "mean": m.mean, "std": m.std},
                }
        weights = out / "weights.npz"
        np.savez(weights, **arrays)
        manifest = {"schema": SCHEMA, "cost": self.cost, "meta": self.meta, "models": manifest_models,
                    "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
        (out / "predictor.json").write_text(json.dumps(manifest, indent=1))
        return out

    @classmethod
    def load(cls, in_dir: str | Path) -> "LearnedPredictor":
        """Read a predictor directory written by ``save``; refuses anything else, pickles included."""
        d = Path(in_dir)
        manifest_path, weights = d / "predictor.json", d / "weights.npz"
        if not manifest_path.is_file() or not weights.is_file():
            raise PredictorFileError(f"{d}: not a predictor directory (needs predictor.json and weights.npz).")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PredictorFileError(f"{manifest_path}: not valid JSON ({exc}).") from None
        if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
            raise PredictorFileError(f"{manifest_path}: not a justitia predictor (expected schema {SCHEMA}).")
        if hashlib.sha256(weights.read_bytes()).hexdigest() != manifest.get("weights_sha256"):
            raise PredictorFileError(f"{weights}: its SHA-256 does not match predictor.json; refusing to load it.")
        try:
            with np.load(weights, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            models = {}
            for agent_type, targets in manifest["models"].items():
                models[agent_type] = {}
                for target, spec in targets.items():
                    p = spec["prefix"]
                    n = int(spec["layers"])
                    models[agent_type][target] = Model(
                        {term: j for j, term in enumerate(spec["vocabulary"])}, arrays[f"{p}_idf"],
                        [arrays[f"{p}_w{i}"] for i in range(n)], [arrays[f"{p}_b{i}"] for i in range(n)],
                        float(spec["target"]["mean"]), float(spec["target"]["std"]),
                    )
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise PredictorFileError(f"{d}: malformed predictor ({type(exc).__name__}: {exc}).") from None
        if ALL_TYPES not in models:
            raise PredictorFileError(f"{d}: the all-types model '{ALL_TYPES}' is missing.")
        return cls(models, str(manifest.get("cost", "kv")), manifest.get("meta"))
