"""The committed real-LM profile and predictors trained on it, cached between runs.

``justitia/data/profile-smollm2.jsonl.gz`` was made by ``make profile`` (``justitia profile``:
SmolLM2-135M-Instruct on vLLM-CPU, natural stopping; see the README). Predictors trained on a
profile are cached under ``$JUSTITIA_CACHE/predictors`` (default ``~/.cache/justitia``), keyed by
a SHA-256 of the training agents and the predictors' formats and defaults, and the seed, so that
a preset trains each one once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from justitia.core import KV
from justitia.defaults import cache_dir
from justitia.predictors import lm, mlp
from justitia.predictors.registry import KINDS, kinds
from justitia.workload import Agent, save_workload

DEFAULT_PROFILE = Path(__file__).parents[1] / "data" / "profile-smollm2.jsonl.gz"


def lm_available() -> bool:
    """Whether the ``lm`` baseline can run here (torch, transformers and the MiniLM wheel)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", lm.ENCODER_PACKAGE))


def trained_predictors(train: list[Agent], seed: int = 0, names: tuple[str, ...] = tuple(KINDS)) -> dict[str, str]:
    """name -> predictor spec (``mlp:DIR``, ``lm:DIR``, ``mean:FILE``, ``linear:FILE``) for
    predictors trained on ``train``, training (and caching) the ones not trained before."""
    # what was trained on, and how: a change to either trains anew
    recipe = [mlp.SCHEMA, mlp.DEFAULT_ALPHA, lm.SCHEMA, [a.to_json() for a in train]]
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_dir() / "predictors" / f"{key}-seed{seed}"
    data = root / "train.jsonl"
    if not data.is_file():
        save_workload(train, data)
    out = {}
    for name, kind in kinds(names).items():
        if kind.load is None:  # trained on the spot from the file: nothing to cache
            out[name] = f"{name}:{data}"
            continue
        d = root / name
        if not (d / "predictor.json").is_file():
            kind.train(train, KV, seed).save(d)
        out[name] = f"{name}:{d}"
    return out
