"""A price that is a distribution, and the Gittins rank that orders a burst by what is known of it.

A predictor that knows what it does not know prices a burst (an agent, a session's turn) as a
discrete distribution of its total cost ``X``: atoms ``x_1 < ... < x_K`` with probabilities
``p_k``. Having attained ``a`` of service, the burst's Gittins rank (Scully et al.'s SOAP
convention, the smallest rank is served first) is

    r(a) = min over atoms x_k > a of  E[min(X, x_k) - a | X > a] / P(X <= x_k | X > a)

the least expected service per unit of probability of finishing, over every next quantum that
ends at an atom. Justitia tags the burst with its index ``I(a) = a + min(r(a), r(0))``, the cost
it is priced at now: ``f = S + I(a) / w`` on the GPS clock (``docs/design.md``, "Prices that are
distributions"). With one atom (the cost known) ``I(a) = x_1`` for every ``a``: the paper's tag,
and SRPT inside the clock. With a heavy tail the index grows as the burst attains service without
finishing: it moves back, as LAS would move it, but only as far as its distribution says. The cap
``r(0)`` keeps a tag from running more than the price at arrival past the service attained.

Past the last atom the distribution has said all it can: the rank is 0, and the burst's tag
``S + a / w`` follows its attained service, GPS's pace, rather than being pushed back further,
which would leave it ever further behind its GPS finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CostDist:
    """A discrete cost distribution: ``values`` ascending (>= 0), ``probs`` (> 0) summing to 1."""

    values: tuple[float, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.probs):
            raise ValueError("a cost distribution needs as many probabilities as values, at least one.")
        if any(not (math.isfinite(v) and v >= 0) for v in self.values):
            raise ValueError(f"a cost distribution's values must be finite and >= 0, got {self.values}.")
        if any(b < a for a, b in zip(self.values, self.values[1:])):
            raise ValueError("a cost distribution's values must be ascending.")
        if any(not (math.isfinite(p) and p > 0) for p in self.probs) or abs(sum(self.probs) - 1) > 1e-6:
            raise ValueError(f"a cost distribution's probabilities must be > 0 and sum to 1, got {self.probs}.")

    @classmethod
    def known(cls, cost: float) -> "CostDist":
        """The distribution of a cost known exactly."""
        return cls((float(cost),), (1.0,))

    @classmethod
    def from_samples(cls, samples: list[float] | tuple[float, ...]) -> "CostDist":
        """Equal-weight atoms at ``samples`` (equal values merged)."""
        if not samples:
            raise ValueError("a cost distribution needs at least one sample.")
        merged: dict[float, int] = {}
        for s in sorted(float(x) for x in samples):
            merged[s] = merged.get(s, 0) + 1
        n = len(samples)
        return cls(tuple(merged), tuple(c / n for c in merged.values()))

    @classmethod
    def from_weighted(cls, atoms: list[tuple[float, float]]) -> "CostDist":
        """Atoms ``(value, probability)`` in any order, equal values merged."""
        merged: dict[float, float] = {}
        for v, p in atoms:
            merged[float(v)] = merged.get(float(v), 0.0) + float(p)
        values = sorted(merged)
        return cls(tuple(values), tuple(merged[v] for v in values))

    @property
    def mean(self) -> float:
        return sum(v * p for v, p in zip(self.values, self.probs))

    @property
    def top(self) -> float:
        """The largest value the distribution allows."""
        return self.values[-1]

    def rank(self, attained: float) -> float:
        """The Gittins rank ``r(a)`` (the module's docstring); 0 past the last atom."""
        a = max(0.0, float(attained))
        best = math.inf
        mass = 0.0  # P(a < X <= x_k), built as atoms above a are met
        above = [(v, p) for v, p in zip(self.values, self.probs) if v > a]
        if not above:
            return 0.0
        total = sum(p for _, p in above)
        partial = 0.0  # E[(X - a) 1{a < X <= x_k}]
        for v, p in above:
            mass += p
            partial += (v - a) * p
            tail = total - mass  # P(X > x_k)
            expected = (partial + (v - a) * tail) / total
            best = min(best, expected / (mass / total))
        return best

    def index(self, attained: float = 0.0) -> float:
        """The cost the burst is priced at having attained ``attained``: ``a + min(r(a), r(0))``."""
        a = max(0.0, float(attained))
        return a + min(self.rank(a), self.rank(0.0))

    def next_level(self, attained: float) -> float:
        """The attained service at which the rank next changes shape: the next atom above
        ``attained`` (past the last one, ``attained`` grown by a quarter)."""
        for v in self.values:
            if v > attained * (1 + 1e-12):
                return v
        return max(attained * 1.25, attained + 1.0)
