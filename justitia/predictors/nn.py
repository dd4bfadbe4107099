"""The small MLP both learned predictors use: fitted with scikit-learn, run with numpy."""

from __future__ import annotations

import math
import warnings

import numpy as np


def mlp_cost(
    h: np.ndarray, weights: list[np.ndarray], biases: list[np.ndarray], mean: float, std: float, offset: float = 0.0
) -> float:
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
    mlp = MLPRegressor(
        hidden_layer_sizes=(width, 64, 32),
        activation="relu",
        alpha=alpha,
        max_iter=300,
        learning_rate_init=1e-3,
        random_state=seed,
        n_iter_no_change=15,
        tol=1e-4,
    )
    with warnings.catch_warnings():  # stopping at max_iter is the intended budget, not a failure
        warnings.simplefilter("ignore", category=UserWarning)
        mlp.fit(x, (y - mean) / std)
    return [np.asarray(w) for w in mlp.coefs_], [np.asarray(b) for b in mlp.intercepts_], mean, std
