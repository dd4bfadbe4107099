"""``AgentScheduler``: the scheduling core an engine drives, and the whole of its contract.

NOTE: engines (the simulator, the vLLM plug-in, front ends that tag requests) call the verbs
below and nothing else; the policy and its waiting queue are private. The scheduler decides the
order and who is preempted first; the engine decides what fits, and reports what it admitted,
served and finished. It knows nothing about KV blocks or iterations.

    agents     agent_arrived, agent_finished, has_agent, agent_count, open_requests
    requests   request_arrived (queued), requeue (preempted), dequeue (taken out to run),
               request_finished (finished or aborted), charge (service scheduled)
    order      peek, num_waiting, is_waiting, priority, victim, stamp (a front end's tag for engines)
    needs      keys_move, keys_rise, uses_service, reads_service_on_backlog, measures_capacity,
               keys_shift, pools_service, moved_agents (whose keys moved since the last call: an
               engine re-keys only theirs)
    clock      virtual_time, virtual_finish, gps_active, capacity_per_s (None under a policy without
               a clock); observe_service (what the engine delivered while backlogged: the clock's M
               follows it), capacity_schedule; set_capacity (M measured elsewhere: a cluster's
               front end sets the sum of its engines')
    look-ahead is_backlogged, agent_key(agent, extra), peek(extra), best_agent, agent_head,
               backlogged_agents (smallest key first): for engines that skip steps and must know
               the order a few steps ahead
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from justitia.core.capacity import CapacityMeter
from justitia.core.cost import KV, NO_CHARGE, Charge, CostModel, cost_model
from justitia.core.policies import make_policy
from justitia.core.policies.base import AgentInfo, Policy, RequestInfo
from justitia.core.queue import WaitingQueue

RETAG_STEP = 1.25  # after a retag on attained service, the next one waits for this much more of it


class AgentScheduler:
    """Agent-aware request ordering for one engine, under one policy."""

    def __init__(self, policy: Policy, meter: CapacityMeter | None = None, retag: bool = True,
                 cost: str | CostModel | None = None):
        """``retag``: when an agent's requests reveal more work than its predicted cost, or it is
        charged more service than that (``charge`` with ``now_s``), its policy may move it back
        (``Policy.revise``: justitia's tag ``f = max(f, V(now) + remaining / w)``). ``cost``: the unit
        of predicted costs and of attained service (default: the meter's, else KV token-time)."""
        self._policy = policy
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
        self._moved: set[str] = set()  # dynamic policies: agents whose keys may have moved (moved_agents)
        self._shifts = policy.groups

    @classmethod
    def for_policy(cls, name: str, capacity_per_s: float | None = None, cost: str | CostModel = KV,
                   measure_every_s: float | None = None, retag: bool = True) -> "AgentScheduler":
        """A core running the policy ``name``; ``capacity_per_s`` is the clock's M to start from,
        then measured every ``measure_every_s`` busy seconds (``CapacityMeter``), or kept (None)."""
        cost = cost_model(cost)
        meter = CapacityMeter(capacity_per_s, cost, measure_every_s) if measure_every_s and capacity_per_s else None
        return cls(make_policy(name, capacity_per_s, cost), meter, retag, cost)

    # ------------------------------------------------------------------------------ agents
    @property
    def policy_name(self) -> str:
        """The policy's name."""
        return self._policy.name

    def agent_arrived(self, agent_id: str, agent_type: str, predicted_cost: float, now_s: float,
                      weight: float = 1.0, tenant: str | None = None, resume_cost: float | None = None) -> AgentInfo:
        """Register an agent with its predicted total cost, its weight (its share under weighted
        fairness) and its tenant (justitia: hierarchical GPS; vtc: one counter per tenant); justitia's clock
        stamps it here. ``resume_cost``: an agent resumed after a restart, with this much of its
        predicted cost still owed by GPS (clipped to ``[0, predicted_cost]``): justitia stamps it
        ``V(now) + resume_cost / w``, its old place; its predicted cost stays whole (retagging and
        settling read it)."""
        if agent_id in self._agents:
            raise ValueError(f"agent '{agent_id}' has already arrived.")
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"agent '{agent_id}': weight must be a finite number > 0, got {weight}.")
        if self._meter is not None and (m := self._meter.update(now_s)) is not None:
            self._policy.set_capacity(m, now_s)
        if tenant is not None and not (isinstance(tenant, str) and tenant):
            raise ValueError(f"agent '{agent_id}': tenant must be a non-empty string or None, got {tenant!r}.")
        if resume_cost is not None:
            if not math.isfinite(resume_cost):
                raise ValueError(f"agent '{agent_id}': resume_cost must be a finite number, got {resume_cost}.")
            resume_cost = min(max(float(resume_cost), 0.0), predicted_cost)
        info = AgentInfo(agent_id, agent_type, self._agent_seq, now_s, predicted_cost, float(weight), tenant,
                         resume_cost)
        self._agent_seq += 1
        self._agents[agent_id] = info
        self._open[agent_id] = 0
        self._policy.agent_arrived(info, now_s)
        return info

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """The agent is done (or cancelled): drop its waiting requests and every bit of its state. The
        policy settles it at the work it asked for: its finished requests, at their predicted costs."""
        revealed = self._revealed.pop(agent_id, None)
        self._attained.pop(agent_id, None)
        if agent_id in self._agents:
            self._policy.settle(agent_id, revealed[1] if revealed else 0.0, now_s)
        for req in self._waiting.requests_of(agent_id):
            self.request_finished(req)
        self._agents.pop(agent_id, None)
        self._open.pop(agent_id, None)
        self._moved.discard(agent_id)
        self._policy.agent_finished(agent_id, now_s)

    def has_agent(self, agent_id: str) -> bool:
        """Whether the agent has arrived and not finished."""
        return agent_id in self._agents

    @property
    def agent_count(self) -> int:
        """Agents that have arrived and not finished (holding policy state)."""
        return len(self._agents)

    def open_requests(self, agent_id: str) -> int:
        """The agent's requests that have arrived and not finished."""
        return self._open.get(agent_id, 0)

    # ---------------------------------------------------------------------------- requests
    def request_arrived(self, request_id: str, agent_id: str, prompt_tokens: int, predicted_cost: float,
                        now_s: float | None = None, tag: float | None = None, rank: float | None = None) -> RequestInfo:
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
        if self._retag and now_s is not None and revealed[0] > info.predicted_cost * (1 + 1e-9):
            self._policy.revise(agent_id, revealed[0], revealed[0] - revealed[1], now_s)
            if self._policy.dynamic:
                self._waiting.touch(agent_id)
        req = RequestInfo(request_id, agent_id, self._request_seq, prompt_tokens, predicted_cost, tag, rank)
        self._request_seq += 1
        self._open[agent_id] += 1
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

    def request_finished(self, req: RequestInfo) -> None:
        """A waiting or running request finished or was aborted."""
        if req in self._waiting:
            self._waiting.remove(req)
        self._open[req.agent_id] -= 1
        revealed = self._revealed.get(req.agent_id)
        if revealed is not None:
            revealed[1] += req.predicted_cost

    def charge(self, req: RequestInfo, service: Charge, now_s: float | None = None) -> None:
        """Report service the engine scheduled for ``req`` (charges of one agent may be summed).

        With ``now_s`` (an engine that charges every step as it schedules it: ``retags_on_service``),
        the core also retags on attained service: once an agent has been charged more than its
        price, whatever its requests' predicted costs said, its policy revises it as an agent
        arriving now with the work it has taken beyond its price (justitia: ``f = max(f, V(now) +
        (attained - price) / w)``), and again each time that grows by ``RETAG_STEP``."""
        self._policy.charge(req, service)
        agent_id = req.agent_id
        if now_s is not None and self._retag:
            attained = self._attained.get(agent_id)
            info = self._agents.get(agent_id)
            if info is not None:
                if attained is None:
                    attained = self._attained[agent_id] = [0.0, info.predicted_cost * (1 + 1e-9)]
                attained[0] += self._cost.service(service)
                if attained[0] > attained[1]:
                    self._policy.revise(agent_id, attained[0], attained[0] - info.predicted_cost, now_s)
                    attained[1] = max(attained[0] * RETAG_STEP, attained[0] + 1.0)
                    if not self._policy.dynamic:  # its waiting requests take the new key too
                        for waiting in self._waiting.requests_of(agent_id):
                            self._waiting.remove(waiting)
                            self._waiting.add(waiting)
                    self._moved.add(agent_id)
        if self._policy.dynamic:
            self._waiting.touch(agent_id)
            self._moved.add(agent_id)

    # ------------------------------------------------------------------------------- order
    @property
    def timed(self) -> bool:
        """Whether keys also move with time (justitia-eligible): an engine calls ``advance`` before
        each step, and cannot skip steps."""
        return self._policy.timed

    def advance(self, now_s: float) -> None:
        """The engine is about to take a step at ``now_s``: keys that moved with time are refreshed."""
        if self._policy.timed:
            for agent_id in self._policy.advance(now_s):
                self._waiting.touch(agent_id)

    def peek(self, extra: Mapping[str, Charge] | None = None) -> RequestInfo | None:
        """The request to admit next, or None; with ``extra``, as if those agents had been
        charged that much more (a dynamic policy's look-ahead; nothing is charged)."""
        return self._waiting.peek(extra)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission."""
        return len(self._waiting)

    def is_waiting(self, req: RequestInfo) -> bool:
        """Whether the request is in the waiting queue."""
        return req in self._waiting

    def priority(self, req: RequestInfo, agent_key: tuple | None = None) -> tuple:
        """The request's key now; smaller is served first (vLLM's ``priority``). Under a dynamic
        policy, ``agent_key`` (``agent_key(req.agent_id)`` now) saves reading the agent's key again
        for each of its requests."""
        if agent_key is None:
            return self._policy.key(req)
        return self._policy.key_in_agent(agent_key, req)

    def stamp(self, req: RequestInfo) -> tuple[float, float | None]:
        """What a front end stamps on the request for engines that run ``tagged`` (``agent_tag``,
        ``agent_rank``): its key's head, and its agent's place among its tenant's agents (None: no
        tenant, or a policy without tenants)."""
        return self._policy.stamp(req)

    def victim(self, running: Iterable[RequestInfo]) -> RequestInfo:
        """The running request to preempt first: the one with the lowest priority."""
        return max(running, key=self._policy.key)

    # ------------------------------------------------------------------- what the policy needs
    @property
    def keys_move(self) -> bool:
        """Whether keys change as service is charged (vtc, srjf, las): an engine that stamps keys
        on requests must refresh them every step."""
        return self._policy.dynamic

    def moved_agents(self) -> set[str]:
        """The agents whose keys may have moved since the last call (charged, revised or lifted; or
        their tenant's key moved), and a fresh start: an engine that stamps keys on running requests
        re-keys only theirs. Empty under a static policy without tenants."""
        moved, self._moved = self._moved, set()
        if self._shifts:
            shifted = self._policy.take_moved()
            if shifted:
                moved |= shifted
        return moved

    @property
    def keys_shift(self) -> bool:
        """Whether keys may move at events other than an agent's own service (justitia and vtc with
        tenants: a tenant's arrival, settle or service moves its agents' keys): an engine that stamps
        keys on running requests re-keys ``moved_agents`` every step."""
        return self._shifts

    @property
    def pools_service(self) -> bool:
        """Whether agents of one tenant share a service counter (vtc): an engine that charges lazily,
        agent by agent, must charge every step when agents name tenants."""
        return self._policy.pools

    @property
    def keys_rise(self) -> bool:
        """Whether keys only grow as service is charged (vtc, las): an engine that charges lazily
        knows each key as charged so far is a lower bound, and need only charge agents at the front."""
        return self._policy.rising

    @property
    def retags_on_service(self) -> bool:
        """Whether the core retags agents charged beyond their price (``charge`` with ``now_s``): an
        engine that can charge every step as it schedules it does so even under a policy that does
        not read service otherwise (justitia)."""
        return self._retag and type(self._policy).revise is not Policy.revise

    @property
    def uses_service(self) -> bool:
        """Whether the policy reads the service charged to it (engines may skip charging if not)."""
        return type(self._policy).charge is not Policy.charge

    @property
    def reads_service_on_backlog(self) -> bool:
        """Whether queueing a request of an agent with none waiting reads service counters (VTC's
        lift rule: its own, and the front backlogged agent's): an engine that charges lazily must
        charge before such a request arrives."""
        return self.uses_service and type(self._policy).backlogged is not Policy.backlogged

    # ------------------------------------------------------------------------------- clock
    def virtual_time(self, now_s: float) -> float | None:
        """The GPS virtual time V(now), or None under a policy without a clock."""
        clock = self._policy.clock
        return None if clock is None else clock.virtual_time(now_s)

    def virtual_finish(self, agent_id: str) -> float | None:
        """The agent's GPS virtual finish tag, or None (no clock, or an agent not known)."""
        return self._policy.virtual_finish(agent_id)

    @property
    def gps_active(self) -> int | None:
        """Agents the GPS clock counts as active (N_t) as of its last reading, or None."""
        clock = self._policy.clock
        return None if clock is None else clock.active

    @property
    def capacity_per_s(self) -> float | None:
        """The clock's M, in cost units per second (under ``tagged``: the M this engine measured, for
        the front end's clock), or None under a policy without a clock."""
        clock = self._policy.clock
        if clock is None:
            return self._meter.capacity_per_s if self._meter is not None else None
        return clock.capacity

    def set_capacity(self, capacity_per_s: float, now_s: float) -> None:
        """The clock's M, measured elsewhere (a cluster's front end: the sum of its engines'); the
        clock runs at it from ``now_s``."""
        if not (capacity_per_s > 0 and math.isfinite(capacity_per_s)):
            raise ValueError(f"capacity must be a finite number > 0, got {capacity_per_s}.")
        self._policy.set_capacity(float(capacity_per_s), now_s)

    @property
    def measures_capacity(self) -> bool:
        """Whether the clock's M follows what the engine delivers (engines then report it)."""
        return self._meter is not None

    def observe_service(self, busy_s: float, service: Charge, steps: int | None = None) -> None:
        """The engine was backlogged (some request waiting) for ``busy_s`` seconds, in ``steps``
        steps if it counts them, and delivered ``service`` in them, summed over its requests; the
        clock's M follows at the next arrival (``CapacityMeter.observe``: an interval far longer than
        the steps measured so far held an idle gap and is not counted)."""
        if self._meter is not None:
            self._meter.observe(busy_s, service, steps)

    @property
    def capacity_schedule(self) -> list[tuple[float, float]] | None:
        """Every (time, M) the clock ran at, when M is measured; None otherwise."""
        return None if self._meter is None else list(self._meter.schedule)

    # ---------------------------------------------------------------------------- look-ahead
    def is_backlogged(self, agent_id: str) -> bool:
        """Whether the agent has a waiting request."""
        return self._waiting.is_backlogged(agent_id)

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
