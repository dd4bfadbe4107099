"""``CapacityMeter``: the clock's M, measured from what the engine delivers rather than assumed.

The formula's M (``capacity_per_s``: the KV cache over a nominal saturated step) is what a cache
full of decoding requests would deliver. Engines deliver less: prefill steps, whole-sequence
admission and recompute after preemption take their share (0.90 M on the main preset, 0.72 M on a
sustained stream). A GPS clock that runs faster than the engine runs ahead of it without limit.

The meter adds up the service the engine delivers while it is backlogged (some request waiting:
an engine with nothing to wait for delivers less because it has less to do, not because it is
slower), in the cost model's unit, and the busy time it took (``window_s``: ``WINDOW_STEPS`` nominal
steps of the engine, 4.5 s on the simulator's A100 profile, 2 s at the default 0.02 s step). KV token-time counts the tokens held
by requests that sample a token in a step (decodes, and the chunk that completes a prefill), which
is what agents' costs ``p*d + d^2/2`` count: partial prefill chunks and recomputing a preempted
request's tokens are the engine's overhead, not service. Each time the clock may change rate
(``update``, called at an agent's arrival), once ``window_s`` of busy time has gathered, the
window's rate moves M part of the way (``weight``), within ``[floor, ceiling]`` times the formula's
M, and the window starts again. M therefore changes only at arrivals, which every engine sees at
the same moments; between them it is constant. ``schedule`` lists every (time, M) it took.
"""

from __future__ import annotations

from justitia.core.cost import Charge, CostModel

WINDOW_STEPS = 100  # a measurement covers this many nominal steps of busy time
WEIGHT = 0.5  # how far one window's rate moves M
FLOOR, CEILING = 0.25, 2.0  # M stays within these multiples of the formula's


class CapacityMeter:
    """The delivered capacity of one engine, in ``cost``'s unit per second."""

    def __init__(self, initial_per_s: float, cost: CostModel, window_s: float, weight: float = WEIGHT,
                 floor: float = FLOOR, ceiling: float = CEILING):
        if not (initial_per_s > 0 and window_s > 0 and 0 < weight <= 1 and 0 < floor <= 1 <= ceiling):
            raise ValueError("capacity meter: need initial > 0, window > 0, 0 < weight <= 1, 0 < floor <= 1 <= ceiling.")
        self.cost = cost
        self.capacity_per_s = float(initial_per_s)
        self.window_s, self.weight = window_s, weight
        self.low, self.high = floor * initial_per_s, ceiling * initial_per_s
        self.schedule: list[tuple[float, float]] = [(0.0, self.capacity_per_s)]
        self._busy_s = 0.0
        self._service = 0.0
        self.busy_s = 0.0  # all the busy time observed
        self.service = 0.0  # and all the service delivered in it

    def observe(self, busy_s: float, service: Charge) -> None:
        """The engine was backlogged for ``busy_s`` seconds and delivered ``service`` in them."""
        amount = self.cost.service(service)
        self._busy_s += busy_s
        self._service += amount
        self.busy_s += busy_s
        self.service += amount

    def update(self, now_s: float) -> float | None:
        """The new M if a full window has gathered since the last update (else None)."""
        if self._busy_s < self.window_s:
            return None
        rate = self._service / self._busy_s
        self._busy_s = self._service = 0.0
        m = (1 - self.weight) * self.capacity_per_s + self.weight * rate
        m = min(max(m, self.low), self.high)
        if m == self.capacity_per_s:
            return None
        self.capacity_per_s = m
        self.schedule.append((now_s, m))
        return m
