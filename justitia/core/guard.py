"""The lag guard: what makes Justitia's delay bound hold whatever the prices (docs/design.md, "A
bound that holds whatever the prices").

Selective pampering serves agents in the order of their tags, and a tag is only as good as the
price it was stamped with. The guard watches each agent's *pace*: its GPS start ``S`` (in its own
clock: the root's for an agent on its own, its tenant's inner clock for one in a tenant) plus the
service it has attained over its weight, ``E = S + a / w``, is the virtual time at which GPS would
have given it what the engine has. An agent is *urgent* once its clock passed ``E`` more than ``L``
seconds ago (``E <= V(now - L)``): the engine is more than ``L`` behind GPS with it. Urgent agents
go first, the one whose pace point was reached earliest first (EDF on each unit's GPS time plus
``L``); the rest keep their tags. A tenant is watched the same way at the root, with its
attained service over its weight since it last became active in GPS.

``L`` is ``GUARD_FACTOR`` times the largest burst of work seen so far (attained service: what the
engine charged, never a price) over ``M``: a prediction-free quantity. EDF on each unit's GPS time
plus ``L`` gives ``f_j <= F_j + L + 2 c_max``, and the bound stated is ``2 c_max + LAG_FACTOR *
C_max / M`` whatever the prices (``LAG_FACTOR = 1.5``: at most 1.5x the paper's bound); the margin
between the two factors covers the clock's drift from GPS on the true work, which counts an
over-priced agent as active until it leaves. With true prices GPS's order rarely leaves an agent ``L`` behind, so the guard
rarely fires and the paper's order is kept.

Units: time in seconds, virtual time and service in cost units (a tenant's inner clock: its own
virtual time, whose time axis is the root's V).
"""

from __future__ import annotations

import bisect

LAG_FACTOR = 1.5  # the bound: 2 c_max + LAG_FACTOR * C_max / M, at most 1.5x the paper's
GUARD_FACTOR = 1.25  # L = GUARD_FACTOR * (largest burst seen) / M: the margin up to LAG_FACTOR covers the
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
        xs, ys = self._x, self._y
        if not xs:
            return 0.0
        i = bisect.bisect_right(xs, x)
        if i == 0:
            return ys[0]
        if i == len(xs):
            return ys[-1]
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def when(self, y: float) -> float:
        """The first x at which the map reached ``y`` (the first sample's x before it)."""
        xs, ys = self._x, self._y
        if not xs:
            return 0.0
        i = bisect.bisect_left(ys, y)
        if i == 0:
            return xs[0]
        if i == len(ys):
            return xs[-1]
        y0, y1, x0, x1 = ys[i - 1], ys[i], xs[i - 1], xs[i]
        return x0 + (x1 - x0) * (y - y0) / (y1 - y0)
