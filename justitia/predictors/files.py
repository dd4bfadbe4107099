"""The predictor directory format: ``predictor.json`` (a manifest naming its schema and the SHA-256
of the weights) and ``weights.npz`` (arrays only, loaded with ``allow_pickle=False``). Loading never
unpickles anything, and a weights file whose hash does not match the manifest is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


class PredictorFileError(ValueError):
    """A predictor directory that is missing, malformed, tampered with or not ours."""


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


def manifest_schema(d: str | Path) -> str | None:
    """The schema a predictor directory's manifest names, or None if ``d`` is not one."""
    path = Path(d, "predictor.json")
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return str(doc.get("schema", "")) if isinstance(doc, dict) else None
