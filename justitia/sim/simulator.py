"""The simulator: a workload's agents, on vLLM v1-style engines over a paged KV cache, on simulated
time. Agents are ``AgentProcess``es; each engine (``stepping``) drives its own scheduling core
through its verbs, as the vLLM plug-in does. ``Simulator`` runs one engine; ``cluster.Cluster``
runs several behind a router, on the same loop (``EngineLoop``).

It is longer than the house's 400 lines: the loop (set-up, events in time order, an engine's step)
and the handlers of its events (an arrival, a dispatch, a delivery, a finish) share the loop's
heaps and its agents' runs, and are read together."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from justitia.agent import AgentProcess, AgentResult, Answer, Call, Options, RunResult
from justitia.core import (
    WINDOW_STEPS,
    AgentScheduler,
    CapacityMeter,
    CostDist,
    CostModel,
    Policy,
    Registration,
    ReplicaLoad,
    Replicas,
    RouteRequest,
    cost_model,
    kv_token_iters,
    make_policy,
)
from justitia.predictors import Predictor
from justitia.sim.config import PS_PER_S, EngineConfig
from justitia.sim.skipping import SkippingRun
from justitia.sim.stepping import PlainRun, SimRequest
from justitia.workload import Agent


@dataclass(eq=False)
class _AgentRun:
    """An agent inside one simulation: its process, when it arrives, and the engines whose cores
    know it (in the order they learnt of it)."""

    process: AgentProcess
    arrival_ps: int
    engines: list[tuple[int, str]] = field(default_factory=list)  # (engine, flow) whose core knows it
    burst: set[tuple[int, str]] = field(default_factory=set)  # ... that it arrived at in its burst (it pauses there)
    burst_cost: float | None = None  # a session: its burst's predicted cost, which engines learn it arrive with
    burst_dist: CostDist | None = None  # ... and as a distribution, if the predictor gives one


@dataclass(eq=False)
class _Paused:
    """Calls an agent sends when their pause ends."""

    run: _AgentRun
    calls: list[Call]


def prefix_stats(engines: Sequence[PlainRun]) -> dict:
    """The engines' prefix cache over a run, as vLLM counts it: prompt tokens looked up at
    admission, tokens found cached, and their ratio."""
    queried = sum(e.prefix_queries for e in engines)
    hit = sum(e.prefix_hits for e in engines)
    again = sum(e.prefix_preempted_queries for e in engines)  # vLLM counts preempted requests apart
    again_hit = sum(e.prefix_preempted_hits for e in engines)
    return {
        "queried_tokens": queried,
        "hit_tokens": hit,
        "hit_rate": hit / queried if queried else 0.0,
        "preempted_queried_tokens": again,
        "preempted_hit_tokens": again_hit,
    }


class Front(Protocol):
    """A front end that keeps the clock for every engine (``cluster.GlobalClock``): it sees each agent
    arrive and each request go and come back, and stamps each request with its tag."""

    def arrived(self, agent: Agent, predicted_cost: float, now_s: float, engines: Sequence[PlainRun]) -> None:
        """An agent arrived (the engines, to read what they delivered)."""

    def tag(self, call: Call, now_s: float) -> tuple[float, float | None]:
        """The tag (and, in a tenant, the rank) a request carries to whichever engine serves it."""

    def request_finished(self, request_id: str, now_s: float) -> None:
        """A request came back."""

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """An agent is done."""


class EngineLoop:
    """Agents on simulated time over one engine per core, each request routed on submission
    (``core.Replicas``), each engine stepped by ``stepping``.

    NOTE on time: events are an agent's arrival, a request's finish (when its agent learns of it)
    and the front end's delivery of requests an agent sent (the profile's ``frontend_ms``; with
    none, an agent's requests reach the engines when it sends them). Between events, the engine
    whose next step starts first takes it (ties by index). A finish is handled at its step's end
    (the stepper reports it; the loop handles it once every step that starts earlier has run). An
    agent's arrival is handled at the first moment at or after it at which some engine is between
    two steps or idle: with one engine, the step boundary where the engine takes the agent in, as a
    real engine does; with many, at most the shortest of their steps in progress later. At the same
    moment finishes come first, then arrivals. A request handed to an engine in the middle of a step
    waits for its end; one an agent sends the moment it learns of an answer reaches the engine a
    picosecond later, after the step that starts then was scheduled (``_dispatch``). An engine's
    span of skipped steps never starts a step at or past the next event, nor past the moment another
    engine could end a step (its next step's start plus the shortest step), so both stepping modes
    handle every event at the same moment, with the same steps behind it.
    """

    def __init__(
        self,
        config: EngineConfig,
        cores: Sequence[AgentScheduler],
        predictor: Predictor,
        cost: CostModel,
        policy_name: str,
        router: str = "least-load",
        event_skipping: bool = True,
        on_agent_finish: Callable[[AgentResult], None] | None = None,
        pricing: str = "first-stage",
        front: Front | None = None,
        burst: str = "turn",
        subagents: str = "share",
    ):
        """``router``: a ``core.ROUTER_NAMES`` name; under ``affinity`` a stage's requests share the
        prefix ``agent/stage`` (with the prefix cache off, affinity changes only where requests go). ``front``: the
        clock in front of the engines, if one is; else each core learns
        of an agent when its first request reaches that engine, with the agent's whole predicted
        cost, and measures its own M."""
        self.config = config
        self.cores = list(cores)
        self.predictor = predictor
        self.cost = cost
        self.policy_name = policy_name
        self.router = router
        self.event_skipping = event_skipping
        self.on_agent_finish = on_agent_finish
        self.front = front
        self.options = Options(pricing, burst, subagents)  # how its agents' processes run (AgentProcess)
        self.book: Replicas | None = None  # the routing book of the last run

    def run(self, agents: list[Agent]) -> RunResult:
        """Simulate ``agents`` to completion and return per-agent results (``capacity_schedule``: left
        to the caller, who knows which clock ran)."""
        validate(agents, self.config)
        if self.front is not None and any(a.is_session for a in agents):
            raise ValueError(
                "sessions run on one engine, or on a cluster with a clock per engine (--cluster-clock "
                "replica): the clock in front of a cluster does not yet follow a session's bursts."
            )
        wall0 = time.perf_counter()
        pending = self._set_up(agents)
        self._loop(pending)
        engines = self._engines
        return RunResult(
            policy=self.policy_name,
            agents=sorted(self._results, key=lambda r: r.agent_id),
            makespan_s=max(e.now_ps for e in engines) / PS_PER_S,
            iterations=sum(e.iterations for e in engines),
            steps=sum(e.steps for e in engines),
            preemptions=sum(e.preemptions for e in engines),
            wall_s=time.perf_counter() - wall0,
            served=self._served,
            prefix_cache=prefix_stats(engines) if self._caching else None,
        )

    def _set_up(self, agents: list[Agent]) -> list:
        """The engines (a stepper each, plain or event skipping, as their cores' traits allow), the
        router's book, the event heaps; the agents' runs in arrival order."""
        cfg = self.config
        tenants = any(a.tenant is not None for a in agents)
        # every step: timed keys (but those that rise with service: they are read only where a
        # waiting request may be admitted, and advanced before each pass), and counters a tenant's agents share (charged
        # as they are served)
        self._engines = [
            (
                SkippingRun
                if self.event_skipping
                and (not core.traits.timed or core.traits.keys_rise)
                and not (tenants and (core.traits.pools_service or (core.traits.keys_move and core.traits.keys_shift)))
                else PlainRun
            )(cfg, core, lambda r, i=i: self._reported(i, r))
            for i, core in enumerate(self.cores)
        ]
        engines = self._engines
        if tenants:  # justitia-guarded with tenants: charged every step without the time, so not retagged
            for e in engines:  # or repriced on service (either moved the tenants' shares: design.md)
                e.charge_now = False
        # only a predictor that prices by distributions has agents the core reprices on their service
        prices_dists = any(
            getattr(type(self.predictor), m) is not getattr(Predictor, m) for m in ("agent_dist", "turn_dist")
        )
        for e in engines:
            e.charge_finished = e.charge_finished and prices_dists
        self.book = Replicas([ReplicaLoad(str(i), cfg.kv_tokens) for i in range(len(engines))], self.router)
        self._affinity = self.router == "affinity"
        self._caching = cfg.prefix_caching  # requests carry their text as runs, for the engines' prefix cache
        # (time ps, engine (-1: a delivery), seq, the request finished or (run, calls) delivered)
        self._finishes: list[tuple[int, int, int, Any]] = []
        self._ready: list[tuple[int, int]] = []  # (next step's start ps, engine) of engines with work
        self._queued = [False] * len(engines)
        self._seq = 0
        self._results: list[AgentResult] = []
        self._served: list[tuple[float, str, float]] = []
        # the front end (the profile's frontend_ms): the requests an agent sends reach the engines after
        # the front end took them in turn and the request latency; a finish reaches its agent the
        # answer latency after its step. Deliveries wait in the heap of finishes, in time order.
        self._in_ps, self._out_ps, self._per_request_ps = cfg.profile.frontend_ps()
        self._frontend_free_ps = 0  # when the front end has taken in every request sent so far
        pending = sorted(
            (
                _AgentRun(self.options.process(a, self.predictor, self.cost), round(a.arrival_s * PS_PER_S))
                for a in agents
            ),
            key=lambda r: r.arrival_ps,
        )
        return pending

    def _loop(self, pending: list) -> None:
        """The events in time order: a finish or a delivery, an arrival, or an engine's next step."""
        shortest_step_ps = self.config.profile.iteration_ps(1, 0, 1)
        engines = self._engines
        nxt = 0
        finishes, ready = self._finishes, self._ready
        while True:
            soonest = ready[0][0] if ready else None  # the next step's start
            finish = finishes[0][0] if finishes and (soonest is None or finishes[0][0] <= soonest) else None
            arrival = None
            if nxt < len(pending) and (soonest is None or pending[nxt].arrival_ps <= soonest):
                a = pending[nxt].arrival_ps
                if finish is None or finish > a:
                    arrival = max(a, min(e.now_ps for e in engines))  # the first moment some engine is free
            if finish is not None and (arrival is None or finish <= arrival):
                r = heapq.heappop(finishes)[3]
                if isinstance(r, SimRequest):
                    self._finished(r, finish)
                elif isinstance(r, _Paused):  # calls whose pause ends now: the agent sends them
                    self._dispatch(r.run, r.calls, finish)
                else:  # requests the front end delivers now
                    self._submit(*r, finish)
            elif arrival is not None:
                self._arrived(pending[nxt], arrival)
                nxt += 1
            elif soonest is not None:
                self._step(heapq.heappop(ready)[1], pending, nxt, shortest_step_ps)
            else:
                break

    def _step(self, i: int, pending: list, nxt: int, shortest_step_ps: int) -> None:
        """Engine ``i`` steps (a span of steps, under event skipping) up to the next event that could
        change what it does: an arrival, a finish, or another engine's next step."""
        finishes, ready = self._finishes, self._ready
        e = self._engines[i]
        stops = [
            t
            for t in (
                pending[nxt].arrival_ps if nxt < len(pending) else None,
                finishes[0][0] if finishes else None,
                ready[0][0] + shortest_step_ps if ready else None,
            )
            if t is not None
        ]
        e.next_arrival_ps = min(stops) if stops else None
        e.advance()
        if e.busy:
            heapq.heappush(ready, (e.now_ps, i))
        else:
            self._queued[i] = False

    # --------------------------------------------------------------------------- events
    def _reported(self, i: int, r: SimRequest) -> None:
        """Engine ``i`` finished ``r`` at the end of the step it is taking: handled in time order."""
        self._seq += 1
        heapq.heappush(self._finishes, (self._engines[i].now_ps + self._out_ps, i, self._seq, r))

    def _arrived(self, run: _AgentRun, now_ps: int) -> None:
        calls = run.process.start()
        if self.front is not None:
            self.front.arrived(run.process.agent, run.process.predicted_cost, now_ps / PS_PER_S, self._engines)
        self._send(run, calls, now_ps)

    def _send(self, run: _AgentRun, calls: list[Call], now_ps: int, answered: bool = False) -> None:
        """An agent has ``calls`` at ``now_ps``: each is sent after its pause (tool time, a client's own
        work; the agent holds nothing in any engine meanwhile). ``answered``: they follow an answer
        the agent learned of now."""
        due: dict[float, list[Call]] = {}
        for c in calls:
            due.setdefault(c.pause_s, []).append(c)
        for pause_s, batch in due.items():
            if pause_s > 0:
                self._seq += 1
                heapq.heappush(self._finishes, (now_ps + round(pause_s * PS_PER_S), -1, self._seq, _Paused(run, batch)))
            else:
                self._dispatch(run, batch, now_ps, answered)

    def _dispatch(self, run: _AgentRun, calls: list[Call], now_ps: int, answered: bool = False) -> None:
        """An agent sends ``calls`` at ``now_ps``: through the front end (one at a time, then the request
        latency) to the engines; at once when the front end takes no time, except calls that answer a
        step's output the moment it ends (``answered``, no answer latency): they reach the engine a
        picosecond later, after it has scheduled its next step. vLLM's engine loop schedules the next
        step as soon as it has handed out the last one's outputs, before any client can answer them
        (``EngineCore.step``; with async scheduling, ``step_with_batch_queue``, the step after too)."""
        proc = run.process
        if proc.agent.is_session and proc.opens_burst(calls):  # the session's first burst, or its next
            if run.burst:  # a next turn sent with no pause before it: the last one leaves first
                self._leave(run, now_ps)
            run.burst_cost = proc.burst_cost(calls)
            run.burst_dist = proc.burst_dist(calls)
        proc.sent(calls, now_ps / PS_PER_S)
        if not (self._in_ps or self._per_request_ps):
            if answered and not self._out_ps:
                self._deliver(run, calls, now_ps + 1)
            else:
                self._submit(run, calls, now_ps)
            return
        batch: list[Call] = []
        due = None
        for c in calls:
            self._frontend_free_ps = max(now_ps, self._frontend_free_ps) + self._per_request_ps
            at = self._frontend_free_ps + self._in_ps
            if batch and at != due:
                self._deliver(run, batch, due)
                batch = []
            batch.append(c)
            due = at
        self._deliver(run, batch, due)

    def _deliver(self, run: _AgentRun, calls: list[Call], at_ps: int) -> None:
        self._seq += 1
        heapq.heappush(self._finishes, (at_ps, -1, self._seq, (run, calls)))

    def _finished(self, r: SimRequest, now_ps: int) -> None:
        self.book.done(r.request_id)
        now_s = now_ps / PS_PER_S
        run, call = r.owner
        proc = run.process
        self._served.append((now_s, proc.agent.agent_id, kv_token_iters(r.prompt_tokens, r.output_tokens)))
        if self.front is not None:
            self.front.request_finished(r.request_id, now_s)
        upcoming = proc.answered(call, Answer("", r.prompt_tokens, r.output_tokens), now_s)
        if upcoming:
            self._send(run, upcoming, now_ps, answered=True)
        while proc.ended_flows:  # a subagent's own flow ended (subagents="flows"): its engines forget it
            flow = proc.ended_flows.pop()
            for key in [k for k in run.engines if k[1] == flow]:
                e = self._wake(key[0], now_ps)
                e.core.agent_finished(flow, e.now_ps / PS_PER_S)
                run.engines.remove(key)
                run.burst.discard(key)
        if proc.paused:  # a session waits on its pause: it leaves the engines until it sends again
            self._leave(run, now_ps)
        elif proc.done:
            for i, flow in run.engines:  # every engine that knew the agent forgets it
                e = self._wake(i, now_ps)
                e.core.agent_finished(flow, e.now_ps / PS_PER_S)
            run.engines.clear()
            agent_id = proc.agent.agent_id
            if self.front is not None:
                self.front.agent_finished(agent_id, now_s)
            result = proc.result(proc.agent.arrival_s, now_s)  # when it learns
            self._results.append(result)
            if self.on_agent_finish:
                self.on_agent_finish(result)

    def _leave(self, run: _AgentRun, now_ps: int) -> None:
        """A session's burst is over: every engine it arrived at in it pauses it."""
        for i, flow in sorted(run.burst):
            e = self._wake(i, now_ps)
            e.core.agent_finished(flow, e.now_ps / PS_PER_S, pause=True)
        run.burst.clear()

    def _submit(self, run: _AgentRun, calls: list[Call], now_ps: int) -> None:
        """Route each call, then hand each engine its share (an engine's core learns of the agent
        first, if it has not yet)."""
        agent = run.process.agent
        now_s = now_ps / PS_PER_S
        shares: dict[tuple[int, str], list[SimRequest]] = {}
        first: dict[str, Call] = {}  # a flow's first call here
        for c in calls:
            tag, rank = (None, None) if self.front is None else self.front.tag(c, now_s)
            prefix = f"{agent.agent_id}/{c.stage}" if self._affinity else None
            i = int(self.book.route(RouteRequest(c.request_id, c.meta.request_cost, prefix)).replica_id)
            flow = c.flow or agent.agent_id
            req = SimRequest(
                c.request_id,
                flow,
                c.meta.request_cost,
                c.task.prompt_tokens,
                c.task.output_tokens,
                (run, c),
                tag=tag,
                rank=rank,
            )
            if self._caching:
                req.runs = run.process.runs(c)
            shares.setdefault((i, flow), []).append(req)
            first.setdefault(flow, c)
        for key, reqs in shares.items():
            i, flow = key
            e = self._wake(i, now_ps)
            if key not in run.burst:
                if self.front is None:
                    e.report_service()  # the clock's M may follow what the engine delivered so far
                # the engine sees the agent at the step boundary where it takes it in, as a real one does
                if flow != agent.agent_id:  # a subagent's own flow
                    cost, dist = run.process.flow_cost(first[flow]), None
                elif run.burst_cost is None:
                    cost, dist = run.process.predicted_cost, run.process.predicted_dist
                else:
                    cost, dist = run.burst_cost, run.burst_dist
                e.core.agent_arrived(
                    Registration(
                        flow,
                        agent.type,
                        cost,
                        weight=agent.weight,
                        tenant=agent.tenant,
                        session=agent.is_session and flow == agent.agent_id,
                        dist=dist,
                    ),
                    e.now_ps / PS_PER_S,
                )
                run.burst.add(key)
                if key not in run.engines:
                    run.engines.append(key)
            e.submit(reqs)
            if not self._queued[i]:
                self._queued[i] = True
                heapq.heappush(self._ready, (e.now_ps, i))

    def _wake(self, i: int, now_ps: int) -> PlainRun:
        """Engine ``i`` at ``now_ps``: an idle one moves to it; a busy one is at its next step's start."""
        e = self._engines[i]
        if not e.busy and e.now_ps < now_ps:
            e.now_ps = now_ps
        return e


class Simulator:
    """Runs a workload through a vLLM-like engine under one policy."""

    def __init__(
        self,
        config: EngineConfig,
        policy: str | Policy,
        predictor: Predictor,
        cost: str | CostModel = "kv",
        event_skipping: bool = True,
        on_agent_finish: Callable[[AgentResult], None] | None = None,
        measure_capacity: bool = False,
        retag: bool = True,
        pricing: str = "first-stage",
        burst: str = "turn",
        subagents: str = "share",
        hold: bool = True,
    ):
        """``hold``: False, no agent keeps its place across a hand-off (``AgentScheduler.advance``; a
        what-if, to measure what the rule buys). ``measure_capacity``: the policy's clock starts at the M it
        was made with (the engine's formula M, as a rule) and then follows what the engine delivers
        (``core.CapacityMeter``: the first window's rate replaces it); else it keeps it. The meter counts
        only steps that started with a request waiting, never the time an idle engine waits for work
        (``meter``: the last run's). ``retag``: an agent whose stages reveal more work than predicted moves
        back (``core.AgentScheduler``). ``pricing``: how an agent is priced on arrival (``AgentProcess``).
        ``policy``: a name, built by ``core.make_policy`` at the engine's formula M (as ``Cluster``'s is),
        or a policy object."""
        self.config = config
        self.predictor = predictor
        self.cost = cost_model(cost)
        self.policy = (
            make_policy(policy, config.capacity_per_s(self.cost), self.cost) if isinstance(policy, str) else policy
        )
        self.event_skipping = event_skipping
        self.on_agent_finish = on_agent_finish
        self.measure_capacity = measure_capacity
        self.retag = retag
        self.hold = hold
        self.options = Options(pricing, burst, subagents)
        self.meter: CapacityMeter | None = None

    def run(self, agents: list[Agent]) -> RunResult:
        """Simulate ``agents`` to completion and return per-agent results."""
        cfg = self.config
        clock = self.policy.clock
        start = clock.capacity if clock is not None else cfg.capacity_per_s(self.cost)
        meter = (
            CapacityMeter(start, self.cost, WINDOW_STEPS * cfg.nominal_iteration_s) if self.measure_capacity else None
        )
        self.meter = meter
        core = AgentScheduler(
            self.policy,
            meter,
            self.retag,
            self.cost,
            hold_passes=1 if self.hold else 0,
            step_s=self.config.nominal_iteration_s,
        )
        loop = EngineLoop(
            cfg,
            [core],
            self.predictor,
            self.cost,
            self.policy.name,
            event_skipping=self.event_skipping,
            on_agent_finish=self.on_agent_finish,
            **vars(self.options),
        )
        result = loop.run(agents)
        result.capacity_schedule = core.clock().schedule
        result.guard_lag_s = getattr(self.policy, "lag_max_s", None)  # justitia's lag guard: the largest L
        for e in loop._engines:  # the meter's record covers the whole run (M itself moved only at arrivals)
            e.report_service()
        return result


def validate(agents: list[Agent], config: EngineConfig) -> None:
    """Every agent id once, and every task able to fit the KV cache."""
    ids = set()
    for a in agents:
        if a.agent_id in ids:
            raise ValueError(f"agent '{a.agent_id}' appears twice in the workload.")
        ids.add(a.agent_id)
        for t in a.tasks:
            if t.prompt_tokens + t.output_tokens > config.kv_tokens:
                raise ValueError(
                    f"agent '{a.agent_id}': a task of {t.prompt_tokens}+{t.output_tokens} tokens "
                    f"can never fit the KV cache of {config.kv_tokens} tokens."
                )
