"""One rule for "a finite number > 0" (a capacity, a weight, a step time), in the core so that
every layer may use it (through ``justitia.core``)."""

from __future__ import annotations

import math


def is_positive_finite(value) -> bool:
    """Whether ``value`` is a number, finite and > 0 (NaN and infinities are not; a non-number is not)."""
    try:
        return value > 0 and math.isfinite(value)
    except TypeError:
        return False


def positive_finite(value, name: str) -> float:
    """``value`` as a float if it is a finite number > 0; else ValueError: ``{name} must be a finite
    number > 0, got {value}.`` (``name`` says what it is, e.g. ``agent 'a7': weight``)."""
    if not is_positive_finite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value}.")
    return float(value)
