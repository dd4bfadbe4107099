"""``AgentScheduler``: the scheduling core an engine drives, and the whole of its contract.

NOTE: engines (the simulator, the vLLM plug-in, front ends that tag requests) call the verbs
below and nothing else; the policy and its waiting queue are private. The scheduler decides the
order; the engine decides what fits, and reports what it admitted, served and finished. It knows
nothing about KV blocks or iterations. The verbs, and nothing more (``tests/test_architecture.py``):

    agents     agent_arrived, agent_finished, agent (an agent's standing: its info, open requests,
               attained service and virtual finish; None once it has finished); a session that
               waits on a tool leaves with ``agent_finished(..., pause=True)`` and arrives again
    requests   request_arrived (queued), requeue (preempted), dequeue (taken out to run),
               request_finished (finished or aborted), charge (service scheduled)
    order      advance (before a step; it names the agents whose keys moved since the last one: an
               engine re-keys only theirs), peek, len (``len(core)``: how many wait), priority
               (vLLM's ``priority``; the request to preempt first is the one with the largest),
               stamp (a front end's tag for engines that run ``tagged``)
    clock      clock (V(now), N_t, M and every M it ran at), observe_service (what the engine
               delivered while backlogged: M follows it), set_capacity (M measured elsewhere: a
               cluster's front end sets the sum of its engines')
    traits     what the policy needs from an engine, fixed for its life (``Traits``), and its name

An engine that skips steps must know the order a few steps ahead: it reads ``lookahead`` (a
``LookAhead``), a view that only such an engine uses.

The file is a little longer than the house's 400 lines: it is the whole contract, the verbs with their
docstrings, and the look-ahead view that reads the same private state.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, NamedTuple

from justitia.core.capacity import CapacityMeter
from justitia.core.cost import KV, NO_CHARGE, Charge, CostModel, cost_model
from justitia.core.gittins import CostDist
from justitia.core.policies import make_policy
from justitia.core.policies.base import AgentInfo, Policy, RequestInfo
from justitia.core.protocol import Registration
from justitia.core.queue import WaitingQueue
from justitia.core.validate import positive_finite

RETAG_STEP = 1.25  # after a retag on attained service, the next one waits for this much more of it


class Traits(NamedTuple):
    """What a policy needs from the engine that drives it; fixed for the policy's life."""

    policy_name: str
    keys_move: bool  # keys change as service is charged (vtc, srjf, las): stamped keys are refreshed every step
    keys_shift: bool  # keys move at events other than the agent's own service (justitia and vtc with
    # tenants: a tenant's arrival, settle or service): stamped keys of ``advance``'s agents are refreshed every step
    pools_service: bool  # a tenant's agents share one service counter (vtc): an engine that charges
    # lazily, agent by agent, must charge every step when agents name tenants
    uses_service: bool  # the policy reads the service charged to it (engines may skip charging if not)
    retags_on_service: bool  # the core retags agents charged beyond their price (``charge`` with
    # ``now_s``): an engine that can charge every step as it schedules it does so under any policy
    measures_capacity: bool  # the clock's M follows what the engine delivers (``observe_service``)
    timed: bool  # keys also move with time (justitia-eligible): ``advance`` before each step, no skipping
    keys_rise: bool = False  # keys only grow as service is charged (las, vtc, justitia-guarded): a timed
    # policy whose keys also rise may be stepped with event skipping, advanced before each pass
    holds_place: bool = False  # an agent whose last open request finished keeps its place for the next
    # admission pass (justitia): the engine calls ``advance`` before every step's admission


class Standing(NamedTuple):
    """An agent as the core knows it now."""

    info: AgentInfo
    open_requests: int  # requests arrived and not finished
    attained: float  # service charged to it, in the core's cost unit
    virtual_finish: float | None  # its GPS virtual finish tag (None under a policy without a clock)
    paused: bool = False  # a session between two bursts (``agent_finished(..., pause=True)``)


class ClockReading(NamedTuple):
    """The GPS clock as of a reading (every field None under a policy without a clock, except M
    under ``tagged``, which measures it for a front end's clock)."""

    virtual_time: float | None  # V(now), when read with a time
    active: int | None  # agents the clock counts as active (N_t) as of its last reading
    capacity_per_s: float | None  # M, in cost units per second
    schedule: list[tuple[float, float]] | None  # every (time, M) the clock ran at, when M is measured


class AgentScheduler:
    """Agent-aware request ordering for one engine, under one policy."""

    def __init__(
        self,
        policy: Policy,
        meter: CapacityMeter | None = None,
        retag: bool = True,
        cost: str | CostModel | None = None,
        hold_passes: int = 1,
        step_s: float = 0.0,
    ):
        """``hold_passes``: the admission passes for which an agent whose last open request finished
        keeps its place, under a policy that keeps places (``advance``; 2 where the engine schedules a
        step ahead, as vLLM's async scheduling does; 0: never). ``retag``: when an agent's requests
        reveal more work than its predicted cost, or it is charged more service than that
        (``charge`` with ``now_s``), its policy may move it back (``Policy.revise``: justitia's tag
        ``f = max(f, V(now) + remaining / w)``). ``cost``: the unit of predicted costs and of attained
        service (default: the meter's, else KV token-time). ``step_s``: the engine's nominal step (one
        iteration at saturation, in seconds; 0: not known), for a policy that reads it
        (``Policy.set_step``: justitia-guarded's ``L``)."""
        self._policy = policy
        if step_s:
            policy.set_step(positive_finite(step_s, "step_s"))
        self._cost = cost_model(cost) if cost is not None else (meter.cost if meter is not None else cost_model(KV))
        self._attained: dict[str, list[float]] = {}  # agent id -> [service charged, the next retag's threshold]
        # only a clock needs M (or a policy that measures it for a clock elsewhere: tagged)
        self._meter = meter if policy.clock is not None or policy.reports_capacity else None
        self._retag = retag
        self._waiting = WaitingQueue(policy)
        self._agents: dict[str, AgentInfo] = {}
        self._open: dict[str, int] = {}  # agent id -> requests not yet finished
        self._revealed: dict[str, list[float]] = {}  # agent id -> [its requests' predicted costs, those finished]
        self._agent_seq = 0
        self._request_seq = 0
        self._moved: set[str] = set()  # dynamic policies: agents whose keys may have moved (advance)
        self._paused: set[str] = set()  # sessions waiting on a tool: they arrive again
        self._shifts = policy.groups
        # an agent's place kept across a hand-off (``advance``): agents whose last open request
        # finished -> the pass it finished in; those keeping their place in this pass
        self._hold_passes = max(0, int(hold_passes)) if policy.holds_place else 0
        self._pass, self._pass_s = 0, None  # admission passes begun; the time of the last
        self._armed: dict[str, int] = {}
        self._held: list[str] = []
        self._open_total = 0  # requests arrived and not finished, of every agent (``_open`` summed)
        self._traits = Traits(
            policy.name,
            policy.dynamic,
            policy.groups,
            policy.pools,
            policy.reads_service,
            retag and policy.revises,
            self._meter is not None,
            policy.timed,
            policy.rising,
            policy.holds_place,
        )
        self._lookahead = LookAhead(self._policy, self._waiting, self)

    @classmethod
    def for_policy(
        cls,
        name: str,
        capacity_per_s: float | None = None,
        cost: str | CostModel = KV,
        measure_every_s: float | None = None,
        retag: bool = True,
        guard_scale: float = 0.0,
        hold_passes: int = 1,
        step_s: float = 0.0,
    ) -> "AgentScheduler":
        """A core running the policy ``name``; ``capacity_per_s`` is the clock's M to start from,
        then measured every ``measure_every_s`` busy seconds (``CapacityMeter``), or kept (None);
        ``guard_scale``: justitia-guarded's lag guard starts from this largest burst seen;
        ``hold_passes``, ``step_s``: as the constructor's."""
        cost = cost_model(cost)
        meter = CapacityMeter(capacity_per_s, cost, measure_every_s) if measure_every_s and capacity_per_s else None
        return cls(make_policy(name, capacity_per_s, cost, guard_scale), meter, retag, cost, hold_passes, step_s)

    # ------------------------------------------------------------------------------ agents
    def agent_arrived(self, reg: Registration, now_s: float) -> AgentInfo:
        """Register an agent (``Registration``: its predicted total cost, its weight, its share under
        weighted fairness, and its tenant: justitia runs hierarchical GPS, vtc one counter per
        tenant); justitia's clock stamps it here. ``resume_cost``: an agent resumed after a restart,
        with this much of its predicted cost still owed by GPS (clipped to ``[0, predicted_cost]``):
        justitia stamps it ``V(now) + resume_cost / w``, its old place; its predicted cost stays
        whole (retagging and settling read it). ``session``: the agent is a session, priced burst by
        burst: a burst that reveals more work than predicted also moves back to ``S + revealed /
        w`` (justitia). ``dist``: its price as a distribution (``core.gittins``): it is priced at its
        Gittins index, ``dist.index(0)`` on arrival (``predicted_cost`` is then ignored), and
        repriced at ``dist.index(attained)`` as the engine charges it service past each of the
        distribution's atoms (``charge`` with ``now_s``), anchored at its start; it settles at the
        service it was charged."""
        agent_id, agent_type, predicted_cost = reg.agent_id, reg.agent_type, reg.predicted_cost
        weight, tenant, resume_cost, session, dist = reg.weight, reg.tenant, reg.resume_cost, reg.session, reg.dist
        if dist is not None:
            predicted_cost = dist.index(0.0)
        if agent_id in self._paused:
            return self._returned(agent_id, predicted_cost, now_s, dist)
        if agent_id in self._agents:
            raise ValueError(f"agent '{agent_id}' has already arrived.")
        positive_finite(weight, f"agent '{agent_id}': weight")
        if self._meter is not None and (m := self._meter.update(now_s)) is not None:
            self._policy.set_capacity(m, now_s)
        if tenant is not None and not (isinstance(tenant, str) and tenant):
            raise ValueError(f"agent '{agent_id}': tenant must be a non-empty string or None, got {tenant!r}.")
        if resume_cost is not None:
            if not math.isfinite(resume_cost):
                raise ValueError(f"agent '{agent_id}': resume_cost must be a finite number, got {resume_cost}.")
            resume_cost = min(max(float(resume_cost), 0.0), predicted_cost)
        info = AgentInfo(
            agent_id,
            agent_type,
            self._agent_seq,
            now_s,
            predicted_cost,
            float(weight),
            tenant,
            resume_cost,
            session,
            dist,
        )
        self._agent_seq += 1
        self._agents[agent_id] = info
        self._open[agent_id] = 0
        self._policy.agent_arrived(info, now_s)
        return info

    def _returned(self, agent_id: str, predicted_cost: float, now_s: float, dist: CostDist | None = None) -> AgentInfo:
        """A paused session arrives again with its next burst's predicted cost: its policy keeps what
        it knew (attained service, arrival order; justitia: its flow in GPS, ``f = max(f, V(now)) +
        C / w``); retagging counts from the burst's start."""
        if self._meter is not None and (m := self._meter.update(now_s)) is not None:
            self._policy.set_capacity(m, now_s)
        self._paused.discard(agent_id)
        info = dataclasses.replace(self._agents[agent_id], predicted_cost=predicted_cost, resume_cost=None, dist=dist)
        self._agents[agent_id] = info
        self._revealed.pop(agent_id, None)
        self._attained.pop(agent_id, None)
        self._policy.agent_returned(info, now_s)
        if self._policy.dynamic:
            self._moved.add(agent_id)
        return info

    def agent_finished(self, agent_id: str, now_s: float, pause: bool = False) -> None:
        """The agent is done (or cancelled): drop its waiting requests and every bit of its state. The
        policy settles it at the work it asked for: its finished requests, at their predicted costs.
        ``pause``: a session whose requests have all finished waits on a tool (or its client) and
        will arrive again (``agent_arrived`` with the same id and its next burst's cost): it is
        settled for the burst it ran, and its policy keeps the rest (``docs/sessions.md``)."""
        self._armed.pop(agent_id, None)  # a session between bursts, or gone: nothing of it is on its way
        if pause:
            if agent_id not in self._agents or self._open[agent_id] or agent_id in self._paused:
                raise ValueError(f"agent '{agent_id}' cannot pause: it is not known, has requests open, or is paused.")
            revealed = self._revealed.pop(agent_id, None)
            attained = self._attained.pop(agent_id, None)
            self._policy.settle(agent_id, self._asked(agent_id, revealed, attained), now_s)
            self._paused.add(agent_id)
            return
        self._paused.discard(agent_id)
        revealed = self._revealed.pop(agent_id, None)
        attained = self._attained.pop(agent_id, None)
        if agent_id in self._agents:
            self._policy.settle(agent_id, self._asked(agent_id, revealed, attained), now_s)
        for req in self._waiting.requests_of(agent_id):
            self.request_finished(req)
        self._agents.pop(agent_id, None)
        self._open_total -= self._open.pop(agent_id, 0)
        self._moved.discard(agent_id)
        self._policy.agent_finished(agent_id, now_s)

    def _asked(self, agent_id: str, revealed: list[float] | None, attained: list[float] | None) -> float:
        """What a leaving agent asked for, to settle it at: its finished requests' predicted costs;
        for an agent priced as a distribution, or under a policy that settles on service
        (justitia-guarded), the service it was charged (the truth, when the engine charges it), if any."""
        info = self._agents[agent_id]
        if (info.dist is not None or self._policy.settles_on_service) and attained is not None and attained[0] > 0:
            return attained[0]
        return revealed[1] if revealed else 0.0

    def agent(self, agent_id: str) -> Standing | None:
        """The agent's standing, or None if it has not arrived or has finished."""
        info = self._agents.get(agent_id)
        if info is None:
            return None
        attained = self._attained.get(agent_id)
        return Standing(
            info,
            self._open[agent_id],
            attained[0] if attained else 0.0,
            self._policy.virtual_finish(agent_id),
            agent_id in self._paused,
        )

    # ---------------------------------------------------------------------------- requests
    def request_arrived(
        self,
        request_id: str,
        agent_id: str,
        prompt_tokens: int,
        predicted_cost: float,
        now_s: float | None = None,
        tag: float | None = None,
        rank: float | None = None,
    ) -> RequestInfo:
        """Queue a new request of a registered agent (``tag``, ``rank``: the front end's stamp, for
        ``tagged``). Its
        predicted cost adds to what the agent has revealed; once that exceeds the agent's predicted
        total, the agent is revised at ``now_s`` with the work it still has (its revealed requests not
        finished), if the core retags."""
        info = self._agents.get(agent_id)
        if info is None:
            raise KeyError(f"request '{request_id}': agent '{agent_id}' has not arrived.")
        revealed = self._revealed.setdefault(agent_id, [0.0, 0.0])
        revealed[0] += predicted_cost
        # an agent priced as a distribution moves on the service it is charged (the truth), not on
        # its requests' predicted costs (``charge``)
        if self._retag and now_s is not None and info.dist is None and revealed[0] > info.predicted_cost * (1 + 1e-9):
            self._policy.revise(agent_id, revealed[0], revealed[0] - revealed[1], now_s)
            if self._policy.dynamic:
                self._waiting.touch(agent_id)
        req = RequestInfo(request_id, agent_id, self._request_seq, prompt_tokens, predicted_cost, tag, rank)
        self._request_seq += 1
        self._armed.pop(agent_id, None)  # what it kept its place for has come: it waits by its own key
        self._open[agent_id] += 1
        self._open_total += 1
        if self._open[agent_id] == 1:
            self._policy.requests_opened(agent_id, now_s)
        self._waiting.add(req)
        if self._policy.dynamic:  # revised, or lifted on becoming backlogged (vtc)
            self._moved.add(agent_id)
        return req

    def requeue(self, req: RequestInfo) -> None:
        """A preempted request waits again."""
        self._waiting.add(req)
        if self._policy.dynamic:
            self._moved.add(req.agent_id)

    def dequeue(self, req: RequestInfo) -> None:
        """The engine takes a waiting request out of the queue (to run it, or to drop it)."""
        self._waiting.remove(req)

    def request_finished(self, req: RequestInfo, output_tokens: int | None = None) -> None:
        """A waiting or running request finished or was aborted (having produced ``output_tokens``,
        where the engine says: ``Policy.request_done``). An agent left with no request open keeps
        its place for the next admission passes (``advance``)."""
        if req in self._waiting:
            self._waiting.remove(req)
        if output_tokens:
            self._policy.request_done(req, output_tokens)
        self._open[req.agent_id] -= 1
        self._open_total -= 1
        if not self._open[req.agent_id] and self._hold_passes:
            self._armed[req.agent_id] = self._pass
        revealed = self._revealed.get(req.agent_id)
        if revealed is not None:
            revealed[1] += req.predicted_cost
        if not self._open[req.agent_id]:
            self._policy.requests_drained(req.agent_id)

    def charge(self, req: RequestInfo, service: Charge, now_s: float | None = None) -> None:
        """Report service the engine scheduled for ``req`` (charges of one agent may be summed).

        With ``now_s`` (an engine that charges every step as it schedules it: ``retags_on_service``),
        the core also retags on attained service: once an agent has been charged more than its
        price, whatever its requests' predicted costs said, its policy revises it as an agent
        arriving now with the work it has taken beyond its price (justitia: ``f = max(f, V(now) +
        (attained - price) / w)``), and again each time that grows by ``RETAG_STEP``."""
        self._policy.charge(req, service)
        agent_id = req.agent_id
        info = self._agents.get(agent_id)
        if info is not None:
            attained = self._attained.get(agent_id)
            if attained is None:
                first = info.predicted_cost if info.dist is None else info.dist.next_level(0.0)
                attained = self._attained[agent_id] = [0.0, first * (1 + 1e-9)]
            attained[0] += self._cost.service(service)
            if now_s is not None and self._retag and info.dist is not None:
                if attained[0] > attained[1]:  # past an atom: priced at its index now, anchored at its start
                    self._policy.reprice(agent_id, info.dist.index(attained[0]), attained[0], now_s)
                    attained[1] = info.dist.next_level(attained[0]) * (1 + 1e-9)
                    self._rekey(agent_id)
            elif now_s is not None and self._retag:
                if attained[0] > attained[1]:
                    self._policy.revise(agent_id, attained[0], attained[0] - info.predicted_cost, now_s)
                    attained[1] = max(attained[0] * RETAG_STEP, attained[0] + 1.0)
                    self._rekey(agent_id)
        if self._policy.dynamic:
            self._waiting.touch(agent_id)
            self._moved.add(agent_id)

    def _rekey(self, agent_id: str) -> None:
        """The agent was retagged on its service: its waiting requests take the new key too."""
        if not self._policy.dynamic:
            for waiting in self._waiting.requests_of(agent_id):
                self._waiting.remove(waiting)
                self._waiting.add(waiting)
        self._moved.add(agent_id)

    # ------------------------------------------------------------------------------- order
    def advance(self, now_s: float) -> set[str]:
        """The engine is about to take a step at ``now_s``: keys that moved with time are refreshed
        (a no-op unless ``traits.timed``). Returns the agents whose keys may have moved with service
        or their tenant since the last advance (charged, revised or lifted; or their tenant's key
        moved), and starts afresh: an engine that stamps keys on running requests re-keys only
        theirs. Empty under a static policy without tenants.

        It also begins the step's admission pass (once per moment: a second call at the same
        ``now_s`` begins none). An agent whose last open request finished in the last
        ``hold_passes`` passes, and that has neither finished nor paused, keeps its place in this
        one: no waiting request whose agent's key comes after its key is admitted (``peek``) while
        some request runs. vLLM's engine loop schedules the next step before a client can answer the
        last one's outputs, so an agent's next call, sent on its answer, misses that step; in it the
        engine would hand the memory the agent just freed, and often its cached blocks, to the
        requests behind it in the order. Keeping its place is what keeps pampering an agent that
        works call after call (docs/design.md, "An agent's place across a hand-off")."""
        if self._armed or self._held:
            self._begin_pass(now_s)
        if self._policy.timed:
            for agent_id in self._policy.advance(now_s):
                self._waiting.touch(agent_id)
                self._moved.add(agent_id)
        moved, self._moved = self._moved, set()
        if self._shifts:
            shifted = self._policy.take_moved()
            if shifted:
                moved |= shifted
        return moved

    def _begin_pass(self, now_s: float) -> None:
        """The admission pass at ``now_s`` begins (``advance``): the places kept in it."""
        if self._pass_s is not None and now_s <= self._pass_s:
            return
        self._pass_s = now_s
        self._pass += 1
        passes, agents = self._hold_passes, self._agents
        self._held = [a for a, p in self._armed.items() if self._pass - p <= passes and a in agents]
        for agent_id in [a for a, p in self._armed.items() if self._pass - p >= passes]:
            del self._armed[agent_id]

    def _passes_place(self, req: RequestInfo) -> bool:
        """Whether admitting ``req`` now would pass an agent that keeps its place (``advance``)."""
        if not self._held or self._open_total <= len(self._waiting):  # nothing runs: nothing to keep it from
            return False
        key = self._policy.agent_key(req.agent_id)
        return any(
            a != req.agent_id and a in self._agents and not self._open[a] and self._policy.agent_key(a) < key
            for a in self._held
        )

    def peek(self) -> RequestInfo | None:
        """The request to admit next, or None (nothing waits, or the next would pass an agent that
        keeps its place: ``advance``)."""
        head = self._waiting.peek()
        if head is not None and self._held and self._passes_place(head):
            return None
        return head

    def __len__(self) -> int:
        """Requests waiting for admission (``len(core)``, as vLLM's queues answer it; so an idle core
        is falsy: an engine tests a core it may lack with ``is None``)."""
        return len(self._waiting)

    def priority(self, req: RequestInfo) -> tuple:
        """The request's key now; smaller is served first (vLLM's ``priority``), and of running
        requests the one with the largest is preempted first."""
        return self._policy.key(req)

    def stamp(self, req: RequestInfo) -> tuple[float, float | None]:
        """What a front end stamps on the request for engines that run ``tagged`` (``agent_tag``,
        ``agent_rank``): its key's head, and its agent's place among its tenant's agents (None: no
        tenant, or a policy without tenants)."""
        return self._policy.stamp(req)

    # ------------------------------------------------------------------------------- clock
    def clock(self, now_s: float | None = None) -> ClockReading:
        """The clock now: V(``now_s``) if a time is given, N_t, M and every M it ran at."""
        clock, meter = self._policy.clock, self._meter
        if clock is None:
            return ClockReading(
                None,
                None,
                meter.capacity_per_s if meter is not None else None,
                None if meter is None else list(meter.schedule),
            )
        return ClockReading(
            None if now_s is None else clock.virtual_time(now_s),
            clock.active,
            clock.capacity,
            None if meter is None else list(meter.schedule),
        )

    def set_capacity(self, capacity_per_s: float, now_s: float) -> None:
        """The clock's M, measured elsewhere (a cluster's front end: the sum of its engines'); the
        clock runs at it from ``now_s``."""
        self._policy.set_capacity(positive_finite(capacity_per_s, "capacity"), now_s)

    def observe_service(self, busy_s: float, service: Charge, steps: int | None = None) -> None:
        """The engine was backlogged (some request waiting) for ``busy_s`` seconds, in ``steps``
        steps if it counts them, and delivered ``service`` in them, summed over its requests; the
        clock's M follows at the next arrival (``CapacityMeter.observe``: an interval far longer than
        the steps measured so far held an idle gap and is not counted)."""
        if self._meter is not None:
            self._meter.observe(busy_s, service, steps)

    # ------------------------------------------------------------------------------ traits
    @property
    def traits(self) -> Traits:
        """What the policy needs from the engine (fixed for its life), and its name."""
        return self._traits

    @property
    def lookahead(self) -> "LookAhead":
        """The order a few steps ahead, for an engine that skips steps (nothing else reads it)."""
        return self._lookahead


class LookAhead:
    """The waiting queue's order ahead of the next step, read by the simulator's skipping stepper
    (``sim.skipping``), which must know which requests would be admitted over several steps without
    taking them. It reads; it changes nothing."""

    def __init__(self, policy: Policy, waiting: WaitingQueue, core: "AgentScheduler"):
        self._policy = policy
        self._waiting = waiting
        self._core = core
        self.keys_rise = policy.rising  # keys only grow as service is charged (vtc, las): a key as
        # charged so far is a lower bound, and only agents at the front need charging
        # queueing a request of an agent with none waiting reads service counters (VTC's lift rule:
        # its own, and the front backlogged agent's): charge before such a request arrives
        self.reads_service_on_backlog = policy.reads_service and policy.lifts_on_backlog

    @property
    def holding(self) -> bool:
        """Whether some agent keeps its place in this admission pass (``AgentScheduler.advance``)."""
        return bool(self._core._held)

    def passes_place(self, req: RequestInfo) -> bool:
        """Whether admitting ``req`` now would pass an agent that keeps its place."""
        return self._core._passes_place(req)

    def is_waiting(self, req: RequestInfo) -> bool:
        """Whether the request is in the waiting queue."""
        return req in self._waiting

    def is_backlogged(self, agent_id: str) -> bool:
        """Whether the agent has a waiting request."""
        return self._waiting.is_backlogged(agent_id)

    def peek(self, extra: Mapping[str, Charge] | None = None) -> RequestInfo | None:
        """The request to admit next as if the agents in ``extra`` had been charged that much more
        (a dynamic policy's look-ahead; nothing is charged)."""
        return self._waiting.peek(extra)

    def agent_key(self, agent_id: str, extra: Charge = NO_CHARGE) -> tuple:
        """A dynamic policy's key for an agent, as if it had been charged ``extra`` more."""
        return self._policy.agent_key(agent_id, extra)

    def best_agent(self, exclude: set[str] | frozenset = frozenset()) -> str | None:
        """The backlogged agent with the smallest current key, leaving out ``exclude`` (dynamic policies)."""
        return self._waiting.best_agent(exclude)

    def agent_head(self, agent_id: str) -> RequestInfo:
        """The agent's earliest waiting request."""
        return self._waiting.agent_head(agent_id)

    def backlogged_agents(self) -> Iterable[str]:
        """The backlogged agents, smallest current key first (dynamic policies), lazily: read them
        before anything else changes the queue."""
        return self._waiting.in_order()
