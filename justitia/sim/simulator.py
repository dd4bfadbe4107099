"""The simulator: a workload's agents, on a vLLM v1-style engine over a paged KV cache, on
simulated time. Agents are ``AgentProcess``es; the engine (``stepping``) drives the scheduling
core through its verbs, as the vLLM plug-in does."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from justitia.agent import AgentProcess, AgentResult, Answer, Call, RunResult
from justitia.core import WINDOW_STEPS, AgentScheduler, CapacityMeter, CostModel, Policy, cost_model
from justitia.predictors import Predictor
from justitia.sim.config import PS_PER_S, EngineConfig
from justitia.sim.stepping import PlainRun, SimRequest, SkippingRun
from justitia.workload import Agent


@dataclass(eq=False)
class _AgentRun:
    """An agent inside one simulation: its process and when it arrives."""

    process: AgentProcess
    arrival_ps: int


class Simulator:
    """Runs a workload through a vLLM-like engine under one policy."""

    def __init__(
        self,
        config: EngineConfig,
        policy: Policy,
        predictor: Predictor,
        cost: str | CostModel = "kv",
        event_skipping: bool = True,
        on_agent_finish: Callable[[AgentResult], None] | None = None,
        measure_capacity: bool = False,
        retag: bool = True,
        pricing: str = "first-stage",
    ):
        """``measure_capacity``: the policy's clock starts at the engine's formula M and then follows
        what the engine delivers (``core.CapacityMeter``); else it keeps the formula's. ``retag``: an
        agent whose stages reveal more work than predicted moves back (``core.AgentScheduler``). ``pricing``:
        how an agent is priced on arrival (``AgentProcess``)."""
        self.config = config
        self.policy = policy
        self.predictor = predictor
        self.cost = cost_model(cost)
        self.event_skipping = event_skipping
        self.on_agent_finish = on_agent_finish
        self.measure_capacity = measure_capacity
        self.retag = retag
        self.pricing = pricing

    def run(self, agents: list[Agent]) -> RunResult:
        """Simulate ``agents`` to completion and return per-agent results."""
        self._validate(agents)
        wall0 = time.perf_counter()
        cfg = self.config
        meter = (CapacityMeter(cfg.capacity_per_s(self.cost), self.cost, WINDOW_STEPS * cfg.nominal_iteration_s)
                 if self.measure_capacity else None)
        core = AgentScheduler(self.policy, meter, self.retag)
        results: list[AgentResult] = []
        stepper = SkippingRun if self.event_skipping and not core.timed else PlainRun  # time-moved keys: every step

        def submit(run: _AgentRun, calls: list[Call]) -> None:
            agent_id = run.process.agent.agent_id
            engine.submit([SimRequest(c.request_id, agent_id, c.meta.request_cost, c.task.prompt_tokens,
                                      c.task.output_tokens, (run, c)) for c in calls])

        def finished(r: SimRequest) -> None:
            run, call = r.owner
            proc = run.process
            upcoming = proc.answered(call, Answer("", r.prompt_tokens, r.output_tokens))
            if upcoming:
                submit(run, upcoming)
            elif proc.done:
                finish_s = engine.now_ps / PS_PER_S
                core.agent_finished(proc.agent.agent_id, finish_s)
                result = proc.result(proc.agent.arrival_s, finish_s)
                results.append(result)
                if self.on_agent_finish:
                    self.on_agent_finish(result)

        engine = stepper(self.config, core, finished)
        pending = sorted((_AgentRun(AgentProcess(a, self.predictor, self.cost, pricing=self.pricing), round(a.arrival_s * PS_PER_S))
                          for a in agents), key=lambda r: r.arrival_ps)
        nxt = 0
        while True:
            while nxt < len(pending) and pending[nxt].arrival_ps <= engine.now_ps:
                run = pending[nxt]
                nxt += 1
                a = run.process.agent
                calls = run.process.start()
                engine.report_service()  # the clock's M may follow what the engine delivered so far
                # the engine sees the agent at the step boundary where it takes it in, as a real one does
                core.agent_arrived(a.agent_id, a.type, run.process.predicted_cost, engine.now_ps / PS_PER_S, a.weight,
                                   a.tenant)
                submit(run, calls)
            engine.next_arrival_ps = pending[nxt].arrival_ps if nxt < len(pending) else None
            if not engine.busy:
                if nxt == len(pending):
                    break
                engine.now_ps = max(engine.now_ps, pending[nxt].arrival_ps)
                continue
            engine.advance()
        return RunResult(
            policy=self.policy.name,
            agents=sorted(results, key=lambda r: r.agent_id),
            makespan_s=engine.now_ps / PS_PER_S,
            iterations=engine.iterations,
            steps=engine.steps,
            preemptions=engine.preemptions,
            wall_s=time.perf_counter() - wall0,
            capacity_schedule=core.capacity_schedule,
        )

    def _validate(self, agents: list[Agent]) -> None:
        ids = set()
        for a in agents:
            if a.agent_id in ids:
                raise ValueError(f"agent '{a.agent_id}' appears twice in the workload.")
            ids.add(a.agent_id)
            for t in a.tasks:
                if t.prompt_tokens + t.output_tokens > self.config.kv_tokens:
                    raise ValueError(
                        f"agent '{a.agent_id}': a task of {t.prompt_tokens}+{t.output_tokens} tokens "
                        f"can never fit the KV cache of {self.config.kv_tokens} tokens."
                    )
