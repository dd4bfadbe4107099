"""``BurstPricer``: the plug-in's own price for a burst that reaches the engine without one.

A harness's turn through the door (``X-Session-ID``, Claude Code's and Codex's headers) or a named
agent's first request comes with no ``agent_cost``: nothing in front of the engine knows what the
turn will cost. The plug-in prices it when it opens, from what the engine sees then
(``OnlinePredictor.burst_features``: the first request's prompt tokens, the burst's index in its
session, what the session's earlier bursts cost), with the ``online`` predictor's ``burst`` models
per (tenant, type), and learns from every burst that ends: the service the engine charged it.
Refits run in the predictor's background thread; pricing reads the last fit.

A burst opens with a request of an agent the core does not hold, of a paused session, or one that
opens a turn of a session with nothing open. It ends, and is learned, when the door sees its turn
end (an answer that calls no tool: ``turn_ended``); failing that, when its session opens its next
one (the engine pauses it then), or when the agent is released: whichever comes first, and once.
Bursts that come priced (the agent API, a bench, a trusted front end) never reach it.
``JUSTITIA_PRICING=max-tokens`` turns it off: such a burst is then priced by its first request's
``max_tokens`` alone (``core.book.unpriced``). What it learned is kept in
``JUSTITIA_PRICING_STATE``, when set (saved every ``SAVE_EVERY`` bursts from the predictor's
learning thread, never the scheduler's, and at shutdown).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from justitia.core import CostDist, CostModel, RequestMeta, Standing
from justitia.predictors.online import OnlinePredictor, keep, load_kept

EARLIER = 3  # earlier bursts of a session its features read
MAX_AGENTS = 100_000  # agents whose burst count and history are kept (the least recently priced go)
SAVE_EVERY = 32  # bursts learned between two saves of the state


@dataclass
class _Burst:
    tenant: str
    agent_type: str
    ident: tuple
    x: list[float]
    attained: float = 0.0  # the service charged to it, as last seen


class BurstPricer:
    """Prices bursts without a price and learns from them (module docstring)."""

    def __init__(
        self,
        cost: CostModel,
        predictor: OnlinePredictor | None = None,
        state: str | None = None,
        log: logging.Logger | None = None,
    ):
        self.cost = cost
        self.predictor = predictor or OnlinePredictor(background=True)
        self._final = None
        if state:
            said = load_kept(self.predictor, state)
            if log is not None:
                log.info("justitia: online pricing: %s", said)
            self._final = keep(self.predictor, state, SAVE_EVERY, log.warning if log is not None else None)
        self._open: dict[str, _Burst] = {}
        self._seen: OrderedDict[str, tuple[int, list[float]]] = OrderedDict()  # agent -> (bursts, earlier costs)

    @staticmethod
    def opens(meta: RequestMeta, before: Standing | None) -> bool:
        """Whether a request without a price opens a burst the pricer prices."""
        if meta.agent_cost is not None or meta.agent_id is None:
            return False
        return before is None or before.paused or (meta.turn_start and before.open_requests == 0)

    def price(self, agent_id: str, meta: RequestMeta, prompt_tokens: int, before: Standing | None) -> CostDist:
        """The opening burst's price; the agent's previous burst, if one is open here, ends now."""
        self._end(agent_id, None if before is None or before.paused else before.attained)
        bursts, earlier = self._seen.pop(agent_id, (0, []))
        self._seen[agent_id] = (bursts + 1, earlier)
        while len(self._seen) > MAX_AGENTS:
            self._seen.popitem(last=False)
        tenant, agent_type = meta.tenant or "", meta.agent_type or ""
        x = OnlinePredictor.burst_features(prompt_tokens, bursts, earlier, self.cost)
        burst = self._open[agent_id] = _Burst(tenant, agent_type, (agent_id, bursts), x)
        return self.predictor.burst_dist(tenant, agent_type, burst.ident, x)

    def charged(self, agent_id: str, standing: Standing | None) -> None:
        """What the agent's open burst has been charged so far (read before a request of it ends)."""
        burst = self._open.get(agent_id)
        if burst is not None and standing is not None:
            burst.attained = max(burst.attained, standing.attained)

    def turn_ended(self, agent_id: str, standing: Standing | None) -> bool:
        """The door saw the agent's turn end: its open burst is learned now, at what it was charged;
        not while a request of it is still open (its next turn or its release ends it then). True if
        it was learned."""
        if agent_id not in self._open or standing is None or standing.open_requests:
            return False
        self._end(agent_id, None if standing.paused else standing.attained)
        return True

    def gone(self, agent_id: str) -> None:
        """The agent was released: its open burst ends, and what was kept of it goes."""
        self._end(agent_id, None)
        self._seen.pop(agent_id, None)

    def _end(self, agent_id: str, attained: float | None) -> None:
        burst = self._open.pop(agent_id, None)
        if burst is None:
            return
        actual = burst.attained if attained is None else max(attained, burst.attained)
        self.predictor.burst_learn(burst.tenant, burst.agent_type, burst.ident, burst.x, actual)
        if agent_id in self._seen and actual > 0:
            bursts, earlier = self._seen[agent_id]
            self._seen[agent_id] = (bursts, (earlier + [actual])[-EARLIER:])

    def reset(self) -> None:
        """An idle engine's reset: the agents go (what was learned stays)."""
        self._open.clear()
        self._seen.clear()

    def close(self) -> None:
        """At shutdown: what was learned since the last save is saved (``JUSTITIA_PRICING_STATE``)."""
        if self._final is not None:
            self.predictor.flush()
            self._final()
            self._final = None
        else:
            self.predictor.close()
