"""``AgentBook``: agents known only through their requests' metadata, kept in an ``AgentScheduler``.

An engine that receives loose requests (the vLLM plug-in; front ends that tag requests for stock
vLLM) learns about agents from each request's ``RequestMeta``. An agent is registered by its first
request (or ahead of it, ``register``) and released when its ``agent_done`` requests have all
finished, when ``release`` is called, or after ``idle_release_s`` with no open request. A missing
request cost is estimated as the cost model's price of the prompt and ``max_tokens``; a missing
agent cost, on an engine that charges service (the plug-in), as a distribution over the answer's
length up to ``max_tokens`` (``unpriced``), repriced by its Gittins index as it is served.

A **session** (``RequestMeta.session``; docs/sessions.md) is priced and tagged burst by burst. It
leaves the engine between two bursts (``agent_finished(..., pause=True)``: settled for the burst it
ran, its policy state kept) when ``pause`` says so (an engine that knows its client's pauses), or
when a request that opens a new burst (``turn_start``) finds nothing of it open. Its next request
after a pause is a return: ``agent_arrived`` again, at that request's ``agent_cost`` (or its own
price). A pause inside a burst (a tool call in a turn) keeps its place. A session is released only
after ``session_keep_s`` with nothing open (``SESSION_KEEP_S``), or by ``release``.

A front end that tags requests for another engine (``tagging``, ``tag``) sees no engine steps,
only its requests going out and coming back; what it measures of the engine's M from them
(``backends.tagging.DemandMeter``) reaches the clock through ``observe_service``.

Every setting is the constructor's; nothing outside the book sets its attributes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from justitia.core.cost import KV, Charge, CostModel, cost_model
from justitia.core.gittins import CostDist
from justitia.core.ledger import NO_TENANT, Ledger
from justitia.core.policies import STATIC_POLICY_NAMES, AgentInfo, RequestInfo, make_policy
from justitia.core.protocol import PolicyState, Registration, RequestMeta
from justitia.core.scheduler import AgentScheduler, ClockReading, Standing

# An agent with no open request for this long is released even if it never said agent_done (the
# default everywhere: justitia.defaults re-exports it, and JUSTITIA_AGENT_IDLE_S overrides it).
AGENT_IDLE_S = 60.0
# A session with nothing open for this long is released (its policy state dropped); before that it
# is kept across tool pauses and user turns (Copilot's sessions run for minutes between turns).
SESSION_KEEP_S = 600.0


HEAD_AGENTS = 10  # agents at the head of the queue that state(..., detail=True) names
UNPRICED_ATOMS = (
    8  # a burst without a price: its answer's length, log-uniform in [1, max_tokens], at this many quantiles
)


def unpriced(cost: CostModel, prompt_tokens: int, max_tokens: int) -> CostDist:
    """What a request that comes without a price may cost, as a distribution: its prompt, and an
    answer of 1 to ``max_tokens`` tokens, log-uniformly (the client's bound, and nothing else known).
    Its Gittins index prices it as a short answer first and moves it back as it runs; it never
    exceeds ``p*m + m^2/2``, what the point price was."""
    m = max(1, int(max_tokens))
    lengths = [max(1, round(m ** ((k + 1) / UNPRICED_ATOMS))) for k in range(UNPRICED_ATOMS)]  # the last: m
    return CostDist.from_weighted([(float(cost.request_cost(prompt_tokens, d)), 1.0 / UNPRICED_ATOMS) for d in lengths])


class AgentBook:
    """Registers agents from request metadata and releases them when they are done or idle."""

    def __init__(
        self,
        core: AgentScheduler,
        cost: str | CostModel = KV,
        idle_release_s: float = AGENT_IDLE_S,
        session_keep_s: float = SESSION_KEEP_S,
    ):
        self._core = core
        self._cost = cost_model(cost)
        self._idle_release_s = idle_release_s
        self._session_keep_s = session_keep_s
        self._sessions: set[str] = set()  # known agents that are sessions
        self._pause_pending: set[str] = set()  # sessions to pause when their last open request ends
        self._infos: dict[str, RequestInfo] = {}  # open requests
        self._agent_done: set[str] = set()  # agents whose last stage has arrived
        self._known: set[str] = set()  # agents registered and not released (holding policy state)
        self._idle_since: dict[str, float] = {}  # agents with no open request, since when
        self._next_sweep_s = 0.0
        self._ledger = Ledger()  # per-tenant figures for the server (read through state(..., detail=True))
        self._tagged: set[str] = set()  # open requests tagged for an engine elsewhere (tag), which charges none

    @classmethod
    def for_policy(
        cls,
        policy: str,
        capacity_per_s: float,
        cost: str | CostModel = KV,
        idle_release_s: float = AGENT_IDLE_S,
        measure_every_s: float | None = None,
        retag: bool = True,
        session_keep_s: float = SESSION_KEEP_S,
    ) -> "AgentBook":
        """A book over a fresh core running ``policy`` (its clock's M measured every
        ``measure_every_s`` busy seconds, if given; ``retag``: see ``AgentScheduler``)."""
        return cls(
            AgentScheduler.for_policy(policy, capacity_per_s, cost, measure_every_s, retag),
            cost,
            idle_release_s,
            session_keep_s,
        )

    @classmethod
    def tagging(
        cls,
        policy: str,
        capacity_per_s: float,
        cost: str | CostModel = KV,
        idle_release_s: float = AGENT_IDLE_S,
        retag: bool = True,
        measure_every_s: float | None = None,
        session_keep_s: float = SESSION_KEEP_S,
    ) -> "AgentBook":
        """A book for front-end tagging (``tag``): only policies whose keys are fixed on arrival qualify
        (a retagged agent's requests tagged from then on carry its new key). With ``measure_every_s``,
        its clock's M follows what the front end reports (``observe_service``)."""
        if policy not in STATIC_POLICY_NAMES:
            make_policy(policy, capacity_per_s, cost)  # an unknown name gets its own error
            raise ValueError(
                f"policy '{policy}' changes its keys as service accrues, which a front end cannot see; "
                f"front-end tagging supports only {', '.join(STATIC_POLICY_NAMES)}."
            )
        return cls.for_policy(policy, capacity_per_s, cost, idle_release_s, measure_every_s, retag, session_keep_s)

    # ------------------------------------------------------------------------------ agents
    def register(self, reg: Registration, now_s: float) -> AgentInfo | None:
        """Register an agent ahead of its requests (``Registration``); its info if it is new or a
        paused session's return, None if it is known and not paused."""
        agent_id, session = reg.agent_id, reg.session
        standing = self._core.agent(agent_id)
        if standing is not None and not standing.paused:
            if session:  # registered ahead as an agent, its requests say it is a session: kept as one
                self._sessions.add(agent_id)
            return None
        info = self._core.agent_arrived(dataclasses.replace(reg, session=session or agent_id in self._sessions), now_s)
        self._ledger.started(agent_id, now_s)
        self._known.add(agent_id)
        if session:
            self._sessions.add(agent_id)
        return info

    def pause(self, agent_id: str, now_s: float) -> bool:
        """A session waits between two bursts: settled now if none of its requests is open (True),
        else when the last one ends. Not a session, or not known: a no-op (False)."""
        standing = self._core.agent(agent_id)
        if standing is None or agent_id not in self._sessions or standing.paused:
            return False
        if standing.open_requests:
            self._pause_pending.add(agent_id)
            return False
        self._ended(agent_id, standing, now_s)
        self._core.agent_finished(agent_id, now_s, pause=True)
        return True

    def release(self, agent_id: str, now_s: float) -> bool:
        """Release the agent's policy state now (a no-op if it is not known); True if it was."""
        self._agent_done.discard(agent_id)
        self._idle_since.pop(agent_id, None)
        self._known.discard(agent_id)
        self._sessions.discard(agent_id)
        self._pause_pending.discard(agent_id)
        standing = self._core.agent(agent_id)
        if standing is None:
            return False
        if not standing.paused:  # a paused session's burst was settled when it paused
            self._ended(agent_id, standing, now_s)
        self._core.agent_finished(agent_id, now_s)
        return True

    def _ended(self, agent_id: str, standing: Standing, now_s: float) -> None:
        """A burst ends: its service, time and lateness go to the ledger (the clock is read only once
        a server has given a bound to judge by: a simulator's clock is never advanced by it)."""
        late = None
        if standing.virtual_finish is not None and self._ledger.bound_s != math.inf:
            clock = self._core.clock(now_s)
            late = self._ledger.lateness(
                agent_id, standing.virtual_finish, clock.virtual_time, clock.active, clock.capacity_per_s, now_s
            )
        info = standing.info
        self._ledger.ended(
            agent_id,
            info.tenant,
            standing.attained,
            late,
            now_s,
            agent_id in self._sessions,
            info.agent_type,
            info.predicted_cost,
            info.weight,
        )

    def retire(self, agent_id: str, now_s: float) -> bool:
        """Release the agent as soon as none of its requests is open: now (True), or when its last
        open one finishes (an engine must keep serving the requests it still holds)."""
        standing = self._core.agent(agent_id)
        if standing is None or standing.open_requests == 0:
            return self.release(agent_id, now_s)
        self._agent_done.add(agent_id)
        return False

    def sweep(self, now_s: float) -> list[str]:
        """Release the agents idle for ``idle_release_s``, and the sessions for ``session_keep_s``
        (checked at most once a second)."""
        if not self._idle_since or now_s < self._next_sweep_s:
            return []
        self._next_sweep_s = now_s + 1.0
        stale = [
            a
            for a, since in self._idle_since.items()
            if now_s - since >= (self._session_keep_s if a in self._sessions else self._idle_release_s)
        ]
        for agent_id in stale:
            self.release(agent_id, now_s)
        return stale

    def agent(self, agent_id: str) -> Standing | None:
        """The agent's standing in the core (``AgentScheduler.agent``), or None if it is not known."""
        return self._core.agent(agent_id)

    def virtual_finish(self, agent_id: str) -> float | None:
        """The agent's GPS virtual finish tag, or None (no clock, or an agent not known)."""
        standing = self._core.agent(agent_id)
        return None if standing is None else standing.virtual_finish

    def clock(self, now_s: float | None = None) -> ClockReading:
        """The core's clock (``AgentScheduler.clock``)."""
        return self._core.clock(now_s)

    def set_capacity(self, capacity_per_s: float, now_s: float) -> None:
        """The clock's M, measured elsewhere (a front end's engines'), from ``now_s``."""
        self._core.set_capacity(capacity_per_s, now_s)

    def observe_service(self, busy_s: float, service: Charge) -> None:
        """What a front end saw its engine deliver while backlogged (``AgentScheduler.observe_service``)."""
        self._core.observe_service(busy_s, service)

    def state(
        self, now_s: float, detail: bool = False, bound_s: float | None = None, waiting: Iterable[str] = ()
    ) -> PolicyState:
        """The policy's state now: its agents and, under justitia, its clock. With ``detail``, also
        each tenant's figures and the head of the queue (``PolicyState.tenants``, ``head``; docs/
        design.md, "What the server shows"); ``bound_s``: the bound bursts that end from now on are
        judged by; ``waiting``: the ids of the requests the engine holds waiting, counted per tenant."""
        clock = self._core.clock(now_s)
        state = PolicyState(
            self._core.traits.policy_name,
            len(self._known),
            clock.virtual_time,
            clock.active,
            clock.capacity_per_s,
            None if clock.schedule is None else [[t, m] for t, m in clock.schedule],
        )
        if not detail:
            return state
        if bound_s is not None and bound_s > 0:
            self._ledger.bound_s = float(bound_s)
        tenants = self._ledger.doc()
        head = []
        for agent_id in self._known:
            standing = self._core.agent(agent_id)
            if standing is None:
                continue
            info = standing.info
            t = tenants.setdefault(self._ledger.tenant(info.tenant), {"service": 0.0, "violations": 0})
            t["service"] += standing.attained + self._ledger.credited(agent_id)
            t["weight"] = info.weight
            kind = "sessions" if agent_id in self._sessions else "agents"
            t[kind] = t.get(kind, 0) + 1
            if standing.paused:
                continue
            t["requests"] = t.get("requests", 0) + standing.open_requests
            t["price_max"] = max(t.get("price_max", 0.0), info.predicted_cost)
            late = self._ledger.lateness(
                agent_id, standing.virtual_finish, clock.virtual_time, clock.active, clock.capacity_per_s, now_s
            )
            if late is not None and late > t.get("late_s", -math.inf):
                t["late_s"] = late
            if standing.open_requests:
                head.append(
                    (
                        standing.virtual_finish if standing.virtual_finish is not None else float(info.seq),
                        info.seq,
                        agent_id,
                        standing,
                    )
                )
        for request_id in waiting:
            info = self._infos.get(request_id)
            standing = None if info is None else self._core.agent(info.agent_id)
            if standing is not None:
                t = tenants.setdefault(self._ledger.tenant(standing.info.tenant), {"service": 0.0, "violations": 0})
                t["waiting"] = t.get("waiting", 0) + 1
        head.sort(key=lambda row: row[:2])  # by tag (arrival order under a policy without a clock)
        head_doc = [
            {
                "agent_id": agent_id,
                "tenant": s.info.tenant or NO_TENANT,
                "type": s.info.agent_type,
                "session": agent_id in self._sessions,
                "tag": s.virtual_finish,
                "predicted": s.info.predicted_cost,
                "attained": s.attained,
                "requests": s.open_requests,
            }
            for _, _, agent_id, s in head[:HEAD_AGENTS]
        ]
        return dataclasses.replace(state, tenants=tenants, errors=self._ledger.errors(), head=head_doc)

    # ---------------------------------------------------------------------------- requests
    def request(self, request_id: str) -> RequestInfo | None:
        """An open request's info (arrived, not finished), or None."""
        return self._infos.get(request_id)

    @property
    def open_count(self) -> int:
        """Requests arrived and not finished."""
        return len(self._infos)

    def stamp(self, info: RequestInfo) -> tuple[float, float | None]:
        """What a front end stamps on a tagged request for engines that run ``tagged``
        (``AgentScheduler.stamp``)."""
        return self._core.stamp(info)

    def arrive(
        self,
        request_id: str,
        meta: RequestMeta,
        prompt_tokens: int,
        max_tokens: int,
        now_s: float,
        charged: bool = True,
        dist: CostDist | None = None,
    ) -> tuple[RequestInfo, AgentInfo | None]:
        """Queue a new request; returns its info and its agent's if the request brought a new one.
        ``charged``: the engine charges service as it schedules it (the plug-in): a burst that comes
        without a price is priced as a distribution (``dist``, the engine's own price for it, else
        ``unpriced``) and repriced as it is served; else (a tagging front end) at its prompt and
        ``max_tokens``."""
        agent_id = meta.agent_id or request_id
        request_cost = meta.request_cost
        if request_cost is None:
            request_cost = self._cost.request_cost(prompt_tokens, max_tokens)
        agent_cost = request_cost if meta.agent_cost is None else meta.agent_cost
        if not charged or meta.agent_cost is not None:
            dist = None
        elif dist is None:
            dist = unpriced(self._cost, prompt_tokens, max_tokens)
        self._pause_pending.discard(agent_id)  # a request of the burst: the pause waits for it
        standing = self._core.agent(agent_id) if meta.turn_start else None
        if standing is not None and not standing.open_requests:  # a new burst: the session leaves, then returns
            self.pause(agent_id, now_s)
        new = self.register(
            Registration(
                agent_id,
                meta.agent_type,
                agent_cost,
                meta.agent_weight or 1.0,
                meta.tenant,
                session=meta.session and meta.agent_id is not None,
                dist=dist,
            ),
            now_s,
        )
        self._idle_since.pop(agent_id, None)
        if meta.agent_done or meta.agent_id is None:  # an unnamed request is an agent of its own
            self._agent_done.add(agent_id)
        info = self._core.request_arrived(
            request_id, agent_id, prompt_tokens, request_cost, now_s, meta.agent_tag, meta.agent_rank
        )
        self._infos[request_id] = info
        return info, new

    def tag(
        self, request_id: str, meta: RequestMeta, prompt_tokens: int, max_tokens: int, now_s: float
    ) -> tuple[RequestInfo, int]:
        """Front-end tagging: a request that another engine will queue (stock vLLM with
        ``scheduling_policy="priority"``); returns its info and its key as vLLM's int ``priority``.
        ``finish`` it when the engine is done with it."""
        info, _ = self.arrive(request_id, meta, prompt_tokens, max_tokens, now_s, charged=False)
        self._core.dequeue(info)  # the engine queues it; this book only tags it
        self._tagged.add(request_id)  # its service is credited when it comes back (finish)
        return info, int_priority(self._core.priority(info))

    def finish(
        self, request_id: str, now_s: float, output_tokens: int | None = None, cached_tokens: int | None = None
    ) -> RequestInfo | None:
        """A request finished (having produced ``output_tokens``; the first ``cached_tokens`` of its
        prompt held by the engine's prefix cache, where the engine said) or was aborted; its agent
        is released if that was its last."""
        info = self._infos.pop(request_id, None)
        tagged = request_id in self._tagged
        self._tagged.discard(request_id)
        if info is None or self._core.agent(info.agent_id) is None:
            return info
        self._core.request_finished(info, output_tokens)
        self._ledger.finished(info.agent_id, now_s)
        if cached_tokens is not None and cached_tokens >= 0:
            self._ledger.cached(self._core.agent(info.agent_id).info.tenant, info.prompt_tokens, cached_tokens)
        if tagged and output_tokens:  # no engine here charged it: its cost at the tokens it produced
            self._ledger.credit(info.agent_id, self._cost.request_cost(info.prompt_tokens, output_tokens))
        if self._core.agent(info.agent_id).open_requests == 0:
            if info.agent_id in self._agent_done:
                self.release(info.agent_id, now_s)
                return info
            self._idle_since[info.agent_id] = now_s
            if info.agent_id in self._pause_pending:
                self._pause_pending.discard(info.agent_id)
                self.pause(info.agent_id, now_s)
        return info


def int_priority(key: tuple) -> int:
    """vLLM wants an int priority; the key's leading number decides (vLLM breaks ties by arrival)."""
    head = key[0]
    if not isinstance(head, (int, float)):
        raise ValueError(f"cannot turn policy key {key!r} into an int priority.")
    return int(round(head))
