"""``Cluster``: N identical simulated engines behind one router and one clock.

NOTE: each engine is a stepper (``stepping``) with its own ``AgentScheduler``; the loop, the agents
and the routing are the single engine's (``simulator.EngineLoop``, ``core.Replicas``). Each request
is routed when it is submitted (``least-load``, ``affinity``, ``round-robin``; under affinity a
stage's requests share the prefix ``agent/stage``, but the simulator models no prefix cache, so
affinity only changes where requests go). Justitia keeps its clock one of two ways (``clock``):

    global   one front-end core runs justitia and only stamps (requests arrive there and are
             dequeued at once, as a front end's ``AgentBook.tag`` does); every request carries its agent's tag
             to whichever engine serves it, and each engine runs ``tagged`` (orders by the tags).
             The front's M is the sum of the engines' (each engine's meter measures what it
             delivers, read at every agent arrival), or N x the formula's M.
    replica  each engine runs its own justitia clock at its own M. An engine's clock learns of an
             agent when the agent's first request reaches it, and stamps it with the agent's whole
             predicted cost (the engine cannot know how much of the agent it will serve).

Every other policy (fcfs, vtc, srjf, las, ...) runs per engine: each keeps its own policy state,
as a cluster of independent engines does, and learns of an agent as ``replica`` does. Every engine
that saw an agent forgets it when the agent finishes. The GPS reference of a cluster is one server
of the engines' total M.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from justitia.agent import AgentResult, Call, RunResult
from justitia.core import (
    ROUTER_NAMES,
    WINDOW_STEPS,
    AgentBook,
    AgentScheduler,
    CapacityMeter,
    CostModel,
    Registration,
    cost_model,
    keeps_front_clock,
    make_policy,
)
from justitia.predictors import Predictor
from justitia.sim.config import EngineConfig
from justitia.sim.simulator import EngineLoop
from justitia.sim.stepping import PlainRun
from justitia.workload import Agent

CLOCKS = ("global", "replica")


@dataclass
class ClusterResult(RunResult):
    """A cluster's run: the single engine's result summed over engines, and how it was set up."""

    replicas: int = 1
    router: str = "least-load"
    clock: str = "replica"  # global: one front-end clock (justitia only); replica: each engine's own state
    requests_per_replica: list[int] = field(default_factory=list)


class GlobalClock:
    """One justitia core in front of the engines, tagging as ``AgentBook.tag`` does for ``serve --ray``:
    it stamps every request with its agent's tag; its M is the sum of the engines' measured M
    (``meters``), or stays where it started (None)."""

    def __init__(self, core: AgentScheduler, meters: Sequence[CapacityMeter] | None):
        self.core = core
        self.book = AgentBook(core)
        self.meters = meters
        self.schedule: list[tuple[float, float]] = [(0.0, core.clock().capacity_per_s)]  # every (t_s, M) it ran at

    def arrived(self, agent: Agent, predicted_cost: float, now_s: float, engines: Sequence[PlainRun]) -> None:
        """Read what every engine delivered, move M to their sum, then stamp the agent."""
        if self.meters:
            for e, meter in zip(engines, self.meters):
                e.report_service()
                meter.update(now_s)
            total = sum(m.capacity_per_s for m in self.meters)
            if total != self.core.clock().capacity_per_s:
                self.core.set_capacity(total, now_s)
                self.schedule.append((now_s, total))
        self.book.register(Registration(agent.agent_id, agent.type, predicted_cost, agent.weight, agent.tenant), now_s)

    def tag(self, call: Call, now_s: float) -> tuple[float, float | None]:
        """The request's stamp: its agent's virtual finish tag (after any retag; in a tenant, its root
        key now) and, in a tenant, its inner tag. Its cost comes with its metadata, so no
        ``max_tokens`` is needed to price it."""
        info, _ = self.book.tag(call.request_id, call.meta, call.task.prompt_tokens, 0, now_s)
        return self.core.stamp(info)

    def request_finished(self, request_id: str, now_s: float) -> None:
        """The request came back: it counts as done work for the agent's settlement (the book
        releases the agent with its last stage's last request)."""
        self.book.finish(request_id, now_s)

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """The agent is done: the clock settles it (if its last request has not already)."""
        self.book.release(agent_id, now_s)


class Cluster:
    """Runs a workload on ``replicas`` identical engines under one policy (see the module's NOTE)."""

    def __init__(
        self,
        config: EngineConfig,
        policy: str,
        predictor: Predictor,
        cost: str | CostModel = "kv",
        replicas: int = 2,
        router: str = "least-load",
        clock: str = "global",
        event_skipping: bool = True,
        on_agent_finish: Callable[[AgentResult], None] | None = None,
        measure_capacity: bool = False,
        retag: bool = True,
        pricing: str = "first-stage",
    ):
        """``clock``: global or replica (justitia only; other policies always keep state per engine).
        ``measure_capacity``, ``retag``, ``pricing``: as ``Simulator``'s."""
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"--replicas must be an integer >= 1, got {replicas!r}.")
        if router not in ROUTER_NAMES:
            raise ValueError(f"unknown router '{router}'; expected one of: {', '.join(ROUTER_NAMES)}.")
        if clock not in CLOCKS:
            raise ValueError(f"--cluster-clock must be one of {', '.join(CLOCKS)}, got '{clock}'.")
        self.cost = cost_model(cost)
        make_policy(policy, config.capacity_per_s(self.cost), self.cost)  # an unknown name fails here
        self.config, self.policy, self.predictor = config, policy, predictor
        self.replicas, self.router = replicas, router
        self.clock = "global" if keeps_front_clock(policy) and clock == "global" else "replica"
        self.event_skipping, self.on_agent_finish = event_skipping, on_agent_finish
        self.measure_capacity, self.retag, self.pricing = measure_capacity, retag, pricing

    def run(self, agents: list[Agent]) -> ClusterResult:
        """Simulate ``agents`` to completion on the cluster."""
        cfg, cost, n = self.config, self.cost, self.replicas
        m = cfg.capacity_per_s(cost)
        meters = (
            [CapacityMeter(m, cost, WINDOW_STEPS * cfg.nominal_iteration_s) for _ in range(n)]
            if self.measure_capacity
            else [None] * n
        )
        front = None
        if self.clock == "global":
            cores = [AgentScheduler(make_policy("tagged"), meter, self.retag) for meter in meters]
            clock = make_policy("justitia", sum([m] * n), cost)
            front = GlobalClock(AgentScheduler(clock, None, self.retag), meters if self.measure_capacity else None)
        else:
            cores = [
                AgentScheduler(make_policy(self.policy, m, cost), meter, self.retag, step_s=cfg.nominal_iteration_s)
                for meter in meters
            ]
        loop = EngineLoop(
            cfg,
            cores,
            self.predictor,
            cost,
            self.policy,
            self.router,
            self.event_skipping,
            self.on_agent_finish,
            self.pricing,
            front,
        )
        result = loop.run(agents)
        if front is not None:
            schedule = front.schedule
        elif cores[0].clock().active is not None:  # a clock on every engine: the cluster's M is their sum
            schedule = total_schedule([c.clock().schedule or [(0.0, m)] for c in cores])
        else:
            schedule = None
        return ClusterResult(
            **vars(result) | {"capacity_schedule": schedule},
            replicas=n,
            router=self.router,
            clock=self.clock,
            requests_per_replica=[r.sent_total for r in loop.book.replicas],
        )


def total_schedule(schedules: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The sum of several (t_s, M) step functions, each starting at 0, as one."""
    current = [s[0][1] for s in schedules]
    out = [(0.0, sum(current))]
    changes = sorted((t, i, m) for i, s in enumerate(schedules) for t, m in s[1:])
    for t, i, m in changes:
        current[i] = m
        total = sum(current)
        if out[-1][0] == t:
            out[-1] = (t, total)
        else:
            out.append((t, total))
    return out
