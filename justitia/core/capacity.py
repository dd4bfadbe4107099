"""``CapacityMeter``: the clock's M, measured from what the engine delivers rather than assumed.

The formula's M (``capacity_per_s``: the KV cache over a nominal saturated step, 20 ms unless
``JUSTITIA_ITERATION_S`` says otherwise) is a guess at what a cache full of decoding requests
would deliver. Engines deliver something else: prefill steps, whole-sequence admission and
recompute after preemption take their share (0.90 M on the main preset, 0.72 M on a sustained
stream), and a real step is rarely the nominal one (a CPU engine's is several times longer). A GPS
clock that runs faster than the engine runs ahead of it without limit; one that runs slower
lets agents that arrive later overtake the ones it owes. So the guess only starts the clock.

The meter adds up the service the engine delivers while it is backlogged (some request waiting:
an engine with nothing to wait for delivers less because it has less to do, not because it is
slower), in the cost model's unit, and the busy time it took. Busy time is the duration of the
steps that started with a request waiting, and nothing else: a gap in which the engine had
nothing to run is no step, and a caller that times a step to the next one's start must not count
a step the engine went idle after (the simulator counts step durations only; the plug-in drops
the step before an idle gap, as ``lab.live.calibrate`` does). A caller that counts its steps passes
``steps``; an interval longer than ``GAP_STEPS`` times the mean step measured so far is taken
for one that held such a gap, and dropped (``dropped_s``).

KV token-time counts the tokens held by requests that sample a token in a step (decodes, and the
chunk that completes a prefill), which is what agents' costs ``p*d + d^2/2`` count: partial
prefill chunks and recomputing a preempted request's tokens are the engine's overhead, not
service.

The rule. Each time the clock may change rate (``update``, called at an agent's arrival), once
``window_s`` of busy time has gathered (``WINDOW_STEPS`` nominal steps: 4.5 s on the simulator's
A100 profile, 2 s at the default 0.02 s step), the window's rate sets M and the window starts
again:

- the first window with any service replaces the starting M outright (weight 1): after it, the
  guess has no say;
- later windows move M part of the way to their rate (``weight``), within ``[floor, ceiling]``
  times the rate measured over all the busy time so far (``measured_per_s``): the band follows
  what was measured, so a window that is far off the engine's record (a burst of recompute, an
  idle gap that slipped through) cannot carry M with it, while a real change of pace moves the
  record and the band with it.

M therefore changes only at arrivals, which every engine sees at the same moments; between them
it is constant. ``schedule`` lists every (time, M) it took.
"""

from __future__ import annotations

from justitia.core.cost import Charge, CostModel
from justitia.core.validate import is_positive_finite

WINDOW_STEPS = 100  # a measurement covers this many nominal steps of busy time
WEIGHT = 0.5  # how far a window's rate moves M (the first window's: all the way)
FLOOR, CEILING = 0.25, 2.0  # M stays within these multiples of the rate measured over all busy time
GAP_STEPS = 50  # a counted interval longer than this many mean measured steps per step held an idle gap
GAP_AFTER_STEPS = 20  # ... judged once this many steps have been measured


class CapacityMeter:
    """The delivered capacity of one engine, in ``cost``'s unit per second."""

    def __init__(
        self,
        initial_per_s: float,
        cost: CostModel,
        window_s: float,
        weight: float = WEIGHT,
        floor: float = FLOOR,
        ceiling: float = CEILING,
    ):
        """``initial_per_s``: M until the first window has been measured (the formula's guess, or a
        calibration's measurement); ``window_s``: the busy time a window gathers."""
        if not (initial_per_s > 0 and window_s > 0 and 0 < weight <= 1 and 0 < floor <= 1 <= ceiling):
            raise ValueError(
                "capacity meter: need initial > 0, window > 0, 0 < weight <= 1, 0 < floor <= 1 <= ceiling."
            )
        self.cost = cost
        self.capacity_per_s = float(initial_per_s)
        self.window_s, self.weight = window_s, weight
        self.floor, self.ceiling = floor, ceiling
        self.measured = False  # whether a window has replaced the starting M
        self.schedule: list[tuple[float, float]] = [(0.0, self.capacity_per_s)]
        self._busy_s = 0.0
        self._service = 0.0
        self.busy_s = 0.0  # all the busy time observed (and counted)
        self.service = 0.0  # and all the service delivered in it
        self.steps = 0  # the steps counted, from callers that count them
        self._step_busy_s = 0.0  # ... and their busy time
        self.dropped_s = 0.0  # busy time dropped as holding an idle gap

    @property
    def measured_per_s(self) -> float | None:
        """The rate over all the busy time observed so far (None before any)."""
        return self.service / self.busy_s if self.busy_s > 0 else None

    def observe(self, busy_s: float, service: Charge, steps: int | None = None) -> bool:
        """The engine was backlogged for ``busy_s`` seconds, in ``steps`` steps if the caller counts
        them, and delivered ``service`` in them. Returns whether it was counted: an interval
        longer than ``GAP_STEPS`` mean measured steps per step is not (it held an idle gap)."""
        if steps:
            if self.steps >= GAP_AFTER_STEPS and busy_s > GAP_STEPS * steps * self._step_busy_s / self.steps:
                self.dropped_s += busy_s
                return False
            self.steps += steps
            self._step_busy_s += busy_s
        amount = self.cost.service(service)
        self._busy_s += busy_s
        self._service += amount
        self.busy_s += busy_s
        self.service += amount
        return True

    def update(self, now_s: float) -> float | None:
        """The new M if a full window has gathered since the last update (else None)."""
        if self._busy_s < self.window_s:
            return None
        rate = self._service / self._busy_s
        self._busy_s = self._service = 0.0
        if not self.measured:
            if rate <= 0:
                return None  # nothing delivered yet: nothing to replace the starting M with
            self.measured = True
            m = rate
        else:
            record = self.service / self.busy_s  # > 0: the first window delivered
            m = (1 - self.weight) * self.capacity_per_s + self.weight * rate
            m = min(max(m, self.floor * record), self.ceiling * record)
        if m == self.capacity_per_s:
            return None
        self.capacity_per_s = m
        self.schedule.append((now_s, m))
        return m


def calibrated_capacity(doc: dict, kv_tokens: int | None = None) -> float | None:
    """The clock's M a calibration measured (a ``justitia calibrate`` file's document), or None if
    it measured none (no request waited) or, given ``kv_tokens``, it was measured on an engine with
    another KV cache (M grows with the tokens a cache holds: it does not carry over; within one
    block counts as the same, vLLM keeping one block back as its null block). The plug-in
    starts its clock from it (``JUSTITIA_CALIBRATION``) rather than from the formula's guess."""
    fit = doc.get("fit") or {}
    measured = fit.get("delivered_capacity_per_s")
    if not is_positive_finite(measured):
        return None
    block = doc.get("block_size", 0)
    if kv_tokens is not None and abs(doc.get("kv_blocks", 0) * block - kv_tokens) > block:
        return None
    return float(measured)
