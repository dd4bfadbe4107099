"""The lag guard: what keeps justitia-guarded's delay bound whatever the prices (docs/design.md, "A
bound that holds whatever the prices"); the policy is ``policies.guarded``.

Selective pampering serves agents in the order of their tags, and a tag is only as good as the
price it was stamped with. The guard watches each agent's *pace* on a GPS clock of its own (each
burst joins it as the bench's yardstick counts bursts): its GPS start ``S`` plus the
service it has attained over its weight, ``E = S + a / w``, the virtual time at which GPS would have
given it what the engine has. An agent is *urgent* once ``E < V(now - L)``: the engine is more than
``L`` seconds behind GPS with it. Urgent agents go first, the one whose pace point was reached
earliest first (EDF on each unit's GPS time plus ``L``); the rest keep their tags. A tenant is
watched the same way on ``R``, the engine shared by weight among the tenants (and lone agents)
present, with its agents' service over its weight since it came in.

``L`` is the larger of ``GUARD_FACTOR`` times the largest burst of work seen so far over M (``Ĉ /
M̄``; attained service: what the engine charged, never a price) and ``ĉ + Ĉ / M̄``, the paper's bound
less one request's hold: ``ĉ`` the most tokens one request produced (its decode steps) times the
engine's nominal step (when the engine names both). No prediction is in it. EDF on each unit's GPS time plus ``L``
gives ``f_j <= F_j + L + 2 c_max``; the bench states ``2 c_max + max(L, LAG_FACTOR * C_max / M)``
(``LAG_FACTOR = 1.5``), at most 1.5x the paper's bound ``2 c_max + C_max / M`` while ``Ĉ / M̄``
stays within its own margin (the margin between the two factors covers the clock's drift from GPS
on the true work). A price cannot say that a waiting burst is large, so a bound whatever the
prices must serve every burst ``L`` behind its pace; the larger ``L`` can be, the less often that
is (``lab.studies.guard_watch`` counts it).

Units: time in seconds, virtual time and service in cost units. ``Trace`` keeps a clock's
recent (time, V) samples, to read ``V(now - L)`` and the time a pace point was reached.
"""

from __future__ import annotations

import bisect

LAG_FACTOR = 1.5  # the bound: 2 c_max + LAG_FACTOR * C_max / M, at most 1.5x the paper's
GUARD_FACTOR = 1.25  # L >= GUARD_FACTOR * (largest burst seen) / M: the margin up to LAG_FACTOR covers the
# clock's drift from GPS on the true work (its N_t counts an over-priced agent until it leaves)


class Trace:
    """A non-decreasing piecewise-linear map x -> y kept as samples, read at and inverted between
    them; samples older than ``keep`` behind the newest are dropped (one is kept before the cut)."""

    def __init__(self) -> None:
        self._x: list[float] = []
        self._y: list[float] = []

    def add(self, x: float, y: float, keep: float) -> None:
        """Sample ``y`` at ``x`` (not before the last sample); forget what lies ``keep`` behind."""
        xs, ys = self._x, self._y
        if xs and x <= xs[-1]:
            ys[-1] = max(ys[-1], y)
            return
        if len(xs) >= 2 and ys[-1] == ys[-2] == y:  # a flat stretch: keep its ends only
            xs[-1] = x
        else:
            xs.append(x)
            ys.append(y)
        cut = bisect.bisect_left(xs, x - keep) - 1
        if cut > 64 and cut > len(xs) // 2:  # amortized
            del xs[:cut], ys[:cut]

    def at(self, x: float) -> float:
        """y at ``x`` (the first sample's y before it; the last one's after it)."""
        return _between(self._x, self._y, x, bisect.bisect_right(self._x, x))

    def when(self, y: float) -> float:
        """The first x at which the map reached ``y`` (the first sample's x before it)."""
        return _between(self._y, self._x, y, bisect.bisect_left(self._y, y))


def _between(keys: list[float], values: list[float], k: float, i: int) -> float:
    """The value at ``k``, linear between samples ``i - 1`` and ``i`` (clamped to the ends; 0 if none)."""
    if not keys:
        return 0.0
    if i == 0:
        return values[0]
    if i == len(keys):
        return values[-1]
    k0, k1, v0, v1 = keys[i - 1], keys[i], values[i - 1], values[i]
    return v0 + (v1 - v0) * (k - k0) / (k1 - k0)
