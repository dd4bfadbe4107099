"""The learned cost predictor: per agent type, TF-IDF of the prompt then a 4-layer MLP (the paper's).

Training uses scikit-learn (``TfidfVectorizer``, ``MLPRegressor`` with MSE + L2 ``alpha``);
prediction uses only numpy on weights stored in a non-executable format:

    DIR/predictor.json   schema "justitia.predictor/2": per model its vocabulary, target
                         transform, layer names, and the SHA-256 of the weights file
    DIR/weights.npz      idf vector, input scaling, linear base and layer matrices, loaded
                         with ``allow_pickle=False``

Loading never unpickles anything; a weights file whose hash does not match the manifest is
refused. What a model sees of an agent at arrival: the first 600 characters of each first-stage
prompt, 4,000 in all (TF-IDF, sublinear tf, l2-normalized, as sklearn computes it), plus two
numbers, log(1 + first-stage prompt tokens) and log(1 + first-stage tasks), standardized with the
training set's mean and deviation. Target: log C. A least-squares line on the two numbers is the
base, and the MLP (MSE + L2 ``alpha``, default 10) learns what the text adds to it on the
standardized residual; predictions are ``exp(base + MLP)``, so they are never negative. The first
hidden layer's width scales with the type's mean prompt length (``clip(mean_tokens / 8, 32, 256)``),
then 64 and 32.

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
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from justitia.cost import CostModel
from justitia.predictor import Predictor
from justitia.workload import Agent, Task

SCHEMA = "justitia.predictor/2"
ALL_TYPES = "*"
TOKEN = re.compile(r"(?u)\b\w\w+\b")  # sklearn's default token_pattern
CORRECTION_WEIGHT = 0.3  # weight of the newest observation in the per-type correction
MAX_FEATURES = 1024  # TF-IDF vocabulary per model
# L2 penalty: with ~25 agents per type and ~1,000 TF-IDF features, a weak penalty lets the MLP
# memorize its training agents. On splits 1-3 of the committed profile (the README's table is
# split 0), mean relative errors were 60/49/46 % at 1e-3, 58/41/45 % at 1, 55/30/32 % at 10 and
# 55/30/31 % at 100: the smaller of the two that tied.
DEFAULT_ALPHA = 10.0
# Prompts put their instructions (and length hints) first; reading only the head keeps a
# prediction well under a millisecond however long the documents are. Lengths enter as numbers.
PROMPT_HEAD_CHARS = 600
AGENT_TEXT_CHARS = 4000
MAX_REQUESTS_PER_TYPE = 500  # requests sampled per type to fit the request-cost model


class PredictorFileError(ValueError):
    """A predictor directory that is missing, malformed, tampered with or not ours."""


def agent_text(agent: Agent) -> str:
    """What the predictor reads of an agent at arrival: the head of each first-stage prompt."""
    return "\n".join(t.prompt[:PROMPT_HEAD_CHARS] for t in agent.stages[0])[:AGENT_TEXT_CHARS]


def request_text(task: Task) -> str:
    """What the predictor reads of a request: the head of its prompt."""
    return task.prompt[:AGENT_TEXT_CHARS]


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
    num_mean: np.ndarray  # the numbers are standardized with the training set's mean and std
    num_std: np.ndarray
    base: np.ndarray  # log C = base . [1, numbers] + MLP output (the MLP learns what text adds)

    def features(self, text: str, numbers: list[float]) -> np.ndarray:
        """TF-IDF (sublinear tf, l2 norm) of ``text`` followed by ``numbers``."""
        vocab = self.vocab
        counts: dict[int, int] = {}
        for token, n in Counter(TOKEN.findall(text.lower())).items():  # distinct tokens only
            j = vocab.get(token)
            if j is not None:
                counts[j] = n
        x = np.zeros(len(self.idf) + len(numbers))
        if counts:
            idx = np.fromiter(counts, dtype=np.int64)
            tf = 1.0 + np.log(np.fromiter(counts.values(), dtype=float))
            vals = tf * self.idf[idx]
            x[idx] = vals / np.linalg.norm(vals)
        x[len(self.idf):] = (np.asarray(numbers, dtype=float) - self.num_mean) / self.num_std
        return x

    def predict(self, text: str, numbers: list[float]) -> float:
        """The predicted cost (>= 0, finite)."""
        x = self.features(text, numbers)
        nz = np.flatnonzero(x)  # the first layer touches only the rows of present terms
        offset = float(self.base @ np.concatenate([[1.0], numbers]))
        return mlp_cost(x[nz] @ self.weights[0][nz] + self.biases[0], self.weights, self.biases, self.mean, self.std,
                        offset)


def mlp_cost(h: np.ndarray, weights: list[np.ndarray], biases: list[np.ndarray], mean: float, std: float,
             offset: float = 0.0) -> float:
    """Finish an MLP forward pass from its first layer's pre-activation ``h``; undo the log target."""
    for w, b in zip(weights[1:], biases[1:]):
        h = np.maximum(h, 0.0) @ w + b
    z = float(np.clip(h[0] * std + mean + offset, -50.0, 60.0))  # guard exp() on wild inputs
    return math.exp(z)


def fit_mlp(x: np.ndarray, costs: list[float], width: int, seed: int, alpha: float, offset: np.ndarray | None = None):
    """MLPRegressor (``width``, 64, 32), MSE + L2 ``alpha``, on standardized log costs (less
    ``offset``, when given); returns (weights, biases, mean, std)."""
    from sklearn.neural_network import MLPRegressor

    y = np.log(np.maximum(np.asarray(costs, dtype=float), 1.0))
    if offset is not None:
        y = y - offset
    mean, std = float(y.mean()), float(y.std() or 1.0)
    mlp = MLPRegressor(hidden_layer_sizes=(width, 64, 32), activation="relu", alpha=alpha, max_iter=300,
                       learning_rate_init=1e-3, random_state=seed, n_iter_no_change=15, tol=1e-4)
    with warnings.catch_warnings():  # stopping at max_iter is the intended budget, not a failure
        warnings.simplefilter("ignore", category=UserWarning)
        mlp.fit(x, (y - mean) / std)
    return [np.asarray(w) for w in mlp.coefs_], [np.asarray(b) for b in mlp.intercepts_], mean, std


def write_weights(out: Path, arrays: dict[str, np.ndarray], manifest: dict) -> None:
    """``weights.npz`` and ``predictor.json`` (``manifest`` plus the weights' SHA-256) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    weights = out / "weights.npz"
    np.savez(weights, **arrays)
    manifest = manifest | {"weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    (out / "predictor.json").write_text(json.dumps(manifest, indent=1))


def read_weights(d: Path, schema: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The manifest and arrays of a directory from ``write_weights``; never unpickles anything."""
    manifest_path, weights = d / "predictor.json", d / "weights.npz"
    if not manifest_path.is_file() or not weights.is_file():
        raise PredictorFileError(f"{d}: not a predictor directory (needs predictor.json and weights.npz).")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PredictorFileError(f"{manifest_path}: not valid JSON ({exc}).") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != schema:
        raise PredictorFileError(f"{manifest_path}: not a justitia predictor of this kind (expected schema {schema}).")
    if hashlib.sha256(weights.read_bytes()).hexdigest() != manifest.get("weights_sha256"):
        raise PredictorFileError(f"{weights}: its SHA-256 does not match predictor.json; refusing to load it.")
    try:
        with np.load(weights, allow_pickle=False) as npz:
            return manifest, {k: npz[k] for k in npz.files}
    except (ValueError, OSError) as exc:
        raise PredictorFileError(f"{d}: malformed predictor ({type(exc).__name__}: {exc}).") from None


def _fit(texts: list[str], numbers: list[list[float]], costs: list[float], width: int, seed: int,
         alpha: float) -> Model:
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(lowercase=True, sublinear_tf=True, max_features=MAX_FEATURES, norm="l2", dtype=np.float64)
    tfidf = vec.fit_transform(texts).toarray()
    nums = np.asarray(numbers, dtype=float)
    num_mean, num_std = nums.mean(axis=0), nums.std(axis=0)
    num_std[num_std == 0] = 1.0
    design = np.hstack([np.ones((len(nums), 1)), nums])
    y = np.log(np.maximum(np.asarray(costs, dtype=float), 1.0))
    base = np.linalg.lstsq(design, y, rcond=None)[0]
    x = np.hstack([tfidf, (nums - num_mean) / num_std])
    weights, biases, mean, std = fit_mlp(x, costs, width, seed, alpha, design @ base)
    vocab = {term: int(j) for term, j in vec.vocabulary_.items()}
    return Model(vocab, np.asarray(vec.idf_, dtype=float), weights, biases, mean, std, num_mean, num_std, base)


class LearnedPredictor(Predictor):
    """Per-type TF-IDF + MLP predictions with an all-types fallback and online per-type correction."""

    name = "mlp"

    def __init__(self, models: dict[str, dict[str, Model]], cost: str, meta: dict | None = None):
        self.models = models
        self.cost = cost
        self.meta = meta or {}
        self.correction: dict[str, float] = {}  # type -> log factor

    # ----------------------------------------------------------------------------- predict
    def _model(self, agent_type: str, target: str) -> Model:
        return self.models.get(agent_type, self.models[ALL_TYPES])[target]

    def _check(self, model: CostModel) -> None:
        if model.name != self.cost:
            raise ValueError(f"this predictor was trained on '{self.cost}' costs, not '{model.name}'.")

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """Predicted total cost of ``agent``, corrected by what its type has shown so far."""
        self._check(model)
        raw = self._model(agent.type, "agent").predict(agent_text(agent), agent_numbers(agent))
        return raw * math.exp(self.correction.get(agent.type, 0.0))

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """Predicted cost of one request."""
        self._check(model)
        task = agent.stages[stage][index]
        return self._model(agent.type, "request").predict(request_text(task), request_numbers(task))

    def observe(self, agent_type: str, predicted: float, actual: float) -> None:
        """An agent of ``agent_type`` finished: move the type's correction toward log(actual / predicted)."""
        if predicted > 0 and actual > 0:
            err = math.log(actual / predicted) + self.correction.get(agent_type, 0.0)  # against the raw prediction
            old = self.correction.get(agent_type)
            self.correction[agent_type] = err if old is None else (1 - CORRECTION_WEIGHT) * old + CORRECTION_WEIGHT * err

    # ----------------------------------------------------------------------------- training
    @classmethod
    def train(cls, agents: list[Agent], cost: CostModel, seed: int = 0, alpha: float = DEFAULT_ALPHA,
              min_agents_per_type: int = 10, per_type: bool = True) -> "LearnedPredictor":
        """Fit per-type models (types with at least ``min_agents_per_type`` agents, unless not
        ``per_type``) and the all-types one."""
        if len(agents) < min_agents_per_type:
            raise ValueError(f"training needs at least {min_agents_per_type} agents, got {len(agents)}.")
        by_type: dict[str, list[Agent]] = {}
        for a in agents:
            by_type.setdefault(a.type, []).append(a)
        groups = {t: g for t, g in by_type.items() if per_type and len(g) >= min_agents_per_type}
        groups[ALL_TYPES] = agents
        models = {}
        for agent_type, group in groups.items():
            tasks = [t for a in group for t in a.tasks]
            if len(tasks) > MAX_REQUESTS_PER_TYPE:  # requests of one type are alike; a sample suffices
                pick = np.random.default_rng(seed).choice(len(tasks), MAX_REQUESTS_PER_TYPE, replace=False)
                tasks = [tasks[i] for i in sorted(pick)]
            mean_tokens = sum(t.prompt_tokens for a in group for t in a.stages[0]) / len(group)
            width = int(min(max(mean_tokens / 8, 32), 256))
            models[agent_type] = {
                "agent": _fit([agent_text(a) for a in group], [agent_numbers(a) for a in group],
                              [a.cost(cost) for a in group], width, seed, alpha),
                "request": _fit([request_text(t) for t in tasks], [request_numbers(t) for t in tasks],
                                [cost.request_cost(t.prompt_tokens, t.output_tokens) for t in tasks], width, seed, alpha),
            }
        meta = {"agents": len(agents), "types": {t: len(g) for t, g in by_type.items()}, "alpha": alpha, "seed": seed}
        return cls(models, cost.name, meta)

    # ----------------------------------------------------------------------------- files
    def save(self, out_dir: str | Path) -> Path:
        """Write ``predictor.json`` and ``weights.npz`` into ``out_dir``."""
        out = Path(out_dir)
        arrays: dict[str, np.ndarray] = {}
        manifest_models = {}
        for k, (agent_type, targets) in enumerate(sorted(self.models.items())):
            manifest_models[agent_type] = {}
            for target, m in targets.items():
                prefix = f"m{k}_{target}"
                arrays[f"{prefix}_idf"] = m.idf
                arrays[f"{prefix}_num_mean"], arrays[f"{prefix}_num_std"] = m.num_mean, m.num_std
                arrays[f"{prefix}_base"] = m.base
                for i, (w, b) in enumerate(zip(m.weights, m.biases)):
                    arrays[f"{prefix}_w{i}"] = w
                    arrays[f"{prefix}_b{i}"] = b
                vocab = sorted(m.vocab, key=m.vocab.__getitem__)
                manifest_models[agent_type][target] = {
                    "prefix": prefix, "vocabulary": vocab, "layers": len(m.weights),
                    "target": {"transform": "log", "mean": m.mean, "std": m.std},
                }
        write_weights(out, arrays, {"schema": SCHEMA, "cost": self.cost, "meta": self.meta, "models": manifest_models})
        return out

    @classmethod
    def load(cls, in_dir: str | Path) -> "LearnedPredictor":
        """Read a predictor directory written by ``save``; refuses anything else, pickles included."""
        d = Path(in_dir)
        manifest, arrays = read_weights(d, SCHEMA)
        try:
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
                        arrays[f"{p}_num_mean"], arrays[f"{p}_num_std"], arrays[f"{p}_base"],
                    )
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise PredictorFileError(f"{d}: malformed predictor ({type(exc).__name__}: {exc}).") from None
        if ALL_TYPES not in models:
            raise PredictorFileError(f"{d}: the all-types model '{ALL_TYPES}' is missing.")
        return cls(models, str(manifest.get("cost", "kv")), manifest.get("meta"))


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
            request_means[agent_type] = float(np.mean([cost.request_cost(t.prompt_tokens, t.output_tokens)
                                                       for a in group for t in a.tasks]))
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
        task = agent.stages[stage][index]
        return math.exp(float(np.clip(c @ np.array([1.0, request_numbers(task)[0]]), -50, 60)))


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


def trainers(seed: int = 0, names: tuple[str, ...] = ("mlp", "lm", "mean", "linear")) -> dict:
    """name -> function(train agents, cost model) -> predictor, for every predictor that can be trained."""
    def lm(train, cost):
        from justitia.embedding import LmPredictor

        return LmPredictor.train(train, cost, seed)

    every = {"mlp": lambda train, cost: LearnedPredictor.train(train, cost, seed), "lm": lm,
             "mean": MeanPredictor.train, "linear": LinearPredictor.train}
    unknown = set(names) - set(every)
    if unknown:
        raise ValueError(f"unknown predictor '{sorted(unknown)[0]}'; expected some of: {', '.join(every)}.")
    return {n: every[n] for n in names}


def evaluate(agents: list[Agent], cost: CostModel, test_frac: float = 0.2, seed: int = 0,
             names: tuple[str, ...] = ("mlp", "mean", "linear")) -> dict:
    """Train the ``names`` predictors on a per-type split of ``agents``; score them on the held-out part.

    Per predictor, per type and overall: mean relative error |predicted - true| / true of the agent
    cost, median and p99 prediction latency, and training time.
    """
    train, test = split(agents, test_frac, seed)
    out = {"train_agents": len(train), "test_agents": len(test), "predictors": {}}
    for name, trainer in trainers(seed, names).items():
        t = time.perf_counter()
        pred = trainer(train, cost)
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


def cold_start(agents: list[Agent], cost: CostModel, seed: int = 0, checkpoints: tuple[int, ...] = (1, 5, 10, 20),
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
        per_type[agent_type] = {k: float(np.mean(errors[max(0, k - 5):k])) for k in checkpoints if k <= len(errors)}
    mean = {k: float(np.mean([e[k] for e in per_type.values() if k in e])) for k in checkpoints
            if any(k in e for e in per_type.values())}
    return {"window": 5, "per_type": per_type, "mean": mean}
