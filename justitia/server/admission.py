"""What a server lets in, and what it has let in: ``Admission``, the limits of ``runs.Settings`` on
inference requests and agents in flight (the server's and each key's) and on each key's rate,
with the counts they are checked against; and ``Sessions``, the identified agents the door has seen.

One ``Admission`` per server, made by the agent manager (``agents.AgentManager.admission``) and
shared through its methods alone: the door (``door.Door``) asks it for each inference request
(``refuse_request``, then ``open_request``), the agent API (``app``) for each agent
(``refuse_agent``, then ``admit``) and turn (``refuse_rate``), and the manager tells it when an
agent starts and ends (``agent_started``, ``agent_ended``). A check and its count are made with no
await between them, so that concurrent requests cannot all pass. A refusal is ``(status, message,
headers)``: a 429 or 503 with ``Retry-After``, each message written once, here.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from justitia.backends.wire import once
from justitia.server.identity import Identity
from justitia.server.limits import RateLimit, retry_after

Refusal = tuple[int, str, dict[str, str]]  # (status, message, headers)
MAX_SESSIONS = 100_000  # sessions remembered for GET /v1/sessions; the least recently seen go first


class Admission:
    """The server's limits on what is in flight, and the counts behind them (the module's docstring)."""

    def __init__(self, settings):
        self.settings = settings
        self.sessions = Sessions()  # the identified agents of the OpenAI and Anthropic endpoints
        self._rate = RateLimit(settings.key_rate, settings.key_burst)  # per key, agents and requests alike
        self._requests, self._owner_requests = 0, {}  # OpenAI and Anthropic requests in flight, in all and per owner
        self._agents: dict[str, int] = {}  # agents started and not ended, per owner
        # agents past the checks and not yet started (their prediction, journal and registration
        # awaited): counted at once, so that concurrent submissions cannot all pass
        self._admitting: dict[str, int] = {}

    def refuse_rate(self, owner: str) -> Refusal | None:
        """Take one of the key's tokens (agents, turns and requests alike); the 429 if it has none."""
        if (wait := self._rate.take(owner)) is not None:
            return (
                429,
                f"your key's rate limit ({self.settings.key_rate:g} requests a second); retry later.",
                retry_after(wait),
            )
        return None

    # ------------------------------------------------------------------ inference requests (the door)
    def requests_in_flight(self, owner: str | None = None) -> int:
        return self._requests if owner is None else self._owner_requests.get(owner, 0)

    def refuse_request(self, owner: str) -> Refusal | None:
        """The server's requests in flight (503), the key's (429), then its rate (429)."""
        if self._requests >= self.settings.max_requests_in_flight:
            return 503, f"{self._requests} requests are in flight, this server's limit; retry later.", retry_after(1)
        mine = self.requests_in_flight(owner)
        if mine >= self.settings.key_requests_in_flight:
            return 429, f"your key has {mine} requests in flight, its limit; retry later.", retry_after(1)
        return self.refuse_rate(owner)

    def open_request(self, owner: str, session: Session | None = None) -> Callable[[], None]:
        """Count one request of ``owner`` (and of its ``session``) in flight; returns its release,
        which counts only once, whichever way the request ends."""
        self._requests += 1
        self._owner_requests[owner] = self._owner_requests.get(owner, 0) + 1
        if session is not None:
            session.in_flight += 1

        @once
        def release() -> None:
            self._requests -= 1
            self._owner_requests[owner] -= 1
            if session is not None:
                session.in_flight -= 1

        return release

    # ------------------------------------------------------------------ agents (the agent API, the manager)
    def agents_in_flight(self, owner: str | None = None) -> int:
        """Agents started and not ended, and those being admitted now (``admit``): in all, or ``owner``'s."""
        if owner is None:
            return sum(self._agents.values()) + sum(self._admitting.values())
        return self._agents.get(owner, 0) + self._admitting.get(owner, 0)

    def refuse_agent(self, owner: str) -> Refusal | None:
        """The server's agents in flight, the key's, then its rate (each a 429)."""
        settings = self.settings
        if (total := self.agents_in_flight()) >= settings.max_agents_in_flight:
            return 429, f"{total} agents are in flight, this server's limit; retry later.", retry_after(1)
        mine, cap = self.agents_in_flight(owner), settings.key_agents_in_flight or settings.max_agents_in_flight
        if mine >= cap:
            return 429, f"your key has {mine} agents in flight, its limit; retry later.", retry_after(1)
        return self.refuse_rate(owner)

    @contextlib.contextmanager
    def admit(self, owner: str):
        """Hold one agent's place for ``owner`` while it is being accepted (started, and counted by
        ``agent_started``, or refused when this ends)."""
        self._admitting[owner] = self._admitting.get(owner, 0) + 1
        try:
            yield
        finally:
            self._admitting[owner] -= 1

    def agent_started(self, owner: str) -> None:
        self._agents[owner] = self._agents.get(owner, 0) + 1

    def agent_ended(self, owner: str) -> None:
        """An agent no longer in flight: it ended, or the server stops (or its engine died) under it."""
        self._agents[owner] -= 1


@dataclass
class Session:
    """What the door saw of one identified agent (one session): for ``GET /v1/sessions``."""

    session_id: str  # as the client named it
    owner: str
    source: str  # the header or field that named it
    first_s: float
    last_s: float
    requests: dict[str, int] = field(default_factory=dict)  # by endpoint
    subagents: set[str] = field(default_factory=set)
    in_flight: int = 0
    turns: int = 0  # requests that opened a user turn (sent on with turn_start)
    opener: str | None = None  # what opened the current turn (identity.turn_opener): its repeats open none

    def doc(self) -> dict:
        return {
            "session_id": self.session_id,
            "source": self.source,
            "requests": sum(self.requests.values()),
            "by_endpoint": dict(self.requests),
            "turns": self.turns,
            "subagents": sorted(self.subagents),
            "in_flight": self.in_flight,
            "first_seen": self.first_s,
            "last_seen": self.last_s,
        }


class Sessions:
    """The identified agents the door has seen, the most recently seen ``limit`` of them."""

    def __init__(self, limit: int = MAX_SESSIONS):
        self.limit = limit
        self._known: OrderedDict[str, Session] = OrderedDict()  # namespaced id -> session

    def get(self, agent_id: str) -> Session | None:
        return self._known.get(agent_id)

    def seen(self, who: Identity, owner: str, kind: str) -> Session:
        now = time.time()
        s = self._known.get(who.agent_id)
        if s is None:
            s = self._known[who.agent_id] = Session(who.given, owner, who.source, now, now)
            while len(self._known) > self.limit:
                self._known.popitem(last=False)
        self._known.move_to_end(who.agent_id)
        s.last_s = now
        s.requests[kind] = s.requests.get(kind, 0) + 1
        s.turns += who.turn_start
        if who.turn_start:
            s.opener = who.opener
        if who.subagent is not None and len(s.subagents) < 1024:
            s.subagents.add(who.subagent)
        return s

    def of(self, owner: str) -> list[Session]:
        return [s for s in self._known.values() if s.owner == owner]
