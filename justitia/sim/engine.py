"""The simulator: a vLLM v1-style engine loop over a paged KV cache, driving the scheduling core.

NOTE on the rules followed in each step (as vLLM v1's ``Scheduler.schedule``):
  1. Running requests first, in admission order; each gets its next prefill chunk (chunked prefill,
     limited by the step's token budget) or one decode token. When the KV cache has no block for
     it, the running request with the lowest policy priority is preempted by recompute (its blocks
     are freed, it goes back to waiting and later recomputes prompt and output so far), until the
     request fits or is itself the victim.
  2. Only if nothing was preempted, waiting requests are admitted in policy order until one does
     not fit (head-of-line break) or ``max_num_seqs`` is reached. A request is admitted only if its
     whole sequence so far fits in the free blocks (vLLM 0.32's ``scheduler_reserve_full_isl``,
     on by default, watermark 0); blocks are then allocated chunk by chunk.
  3. The step lasts ``profile.iteration_ps(...)``; a request that completes its prefill or decodes
     samples one token; a request with all its output tokens finishes and frees its blocks.
Event skipping: while every running request is decoding and no admission, preemption, arrival or
finish can happen, steps differ only in context length; such a span (whose last step may finish
requests) is taken in closed form.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from justitia.cost import CostModel, cost_model, kv_token_iters
from justitia.policies import Charge, Policy, RequestInfo
from justitia.predictor import Predictor
from justitia.scheduler import AgentScheduler
from justitia.sim.config import PS_PER_S, EngineConfig
from justitia.workload import Agent


@dataclass
class AgentResult:
    """One agent's outcome."""

    agent_id: str
    type: str
    arrival_s: float
    finish_s: float
    jct_s: float
    cost_token_iters: float
    predicted_cost: float

    def to_json(self) -> dict:
        """The result as a results-file document."""
        return dict(self.__dict__)


@dataclass
class SimResult:
    """One policy's run over one workload."""

    policy: str
    agents: list[AgentResult]
    makespan_s: float
    iterations: int
    steps: int  # loop passes: single iterations plus skipped spans
    preemptions: int
    wall_s: float


@dataclass(eq=False)
class _AgentRun:
    agent: Agent
    arrival_ps: int
    predicted_cost: float = 0.0
    stage: int = 0
    open: int = 0
    finish_ps: int | None = None


@dataclass(eq=False)
class _Req:
    info: RequestInfo
    run: _AgentRun
    prompt_tokens: int
    output_tokens: int
    generated: int = 0
    computed: int = 0
    blocks: int = 0
    running: bool = field(default=False)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def decoding(self) -> bool:
        return self.generated >= 1 and self.computed == self.num_tokens - 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
    ):
        self.config = config
        self.policy = policy
        self.predictor = predictor
        self.cost = cost if isinstance(cost, CostModel) else cost_model(cost)
        self.event_skipping = event_skipping
        self.on_agent_finish = on_agent_finish

    # ----------------------------------------------------------------------------------- run
    def run(self, agents: list[Agent]) -> SimResult:
        """Simulate ``agents`` to completion and return per-agent results."""
        self._validate(agents)
        wall0 = time.perf_counter()
        self.core = AgentScheduler(self.policy)
        self.now_ps = 0
        self.free = self.config.blocks
        self.running: list[_Req] = []
        self.reqs: dict[str, _Req] = {}
        self.iterations = self.steps = self.preemptions = 0
        self.results: list[AgentResult] = []
        runs = sorted(
            (_AgentRun(a, round(a.arrival_s * PS_PER_S)) for a in agents), key=lambda r: r.arrival_ps
        )
        self._next = 0
        self._pending = runs
        while True:
            self._arrive()
            if not self.running and not len(self.core.waiting):
                if self._next == len(runs):
                    break
                self.now_ps = max(self.now_ps, runs[self._next].arrival_ps)
                continue
            self.steps += 1
            if not (self.event_skipping and self._try_span()):
                self._step()
        return SimResult(
            policy=self.policy.name,
            agents=sorted(self.results, key=lambda r: r.agent_id),
            makespan_s=self.now_ps / PS_PER_S,
            iterations=self.iterations,
            steps=self.steps,
            preemptions=self.preemptions,
            wall_s=time.perf_counter() - wall0,
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

    # ------------------------------------------------------------------------ agents, stages
    def _arrive(self) -> None:
        while self._next < len(self._pending) and self._pending[self._next].arrival_ps <= self.now_ps:
            run = self._pending[self._next]
            self._next += 1
            a = run.agent
            run.predicted_cost = self.predictor.agent_cost(a, self.cost)
            self.core.agent_arrived(a.agent_id, a.type, run.predicted_cost, a.arrival_s)
            self._start_stage(run)

    def _start_stage(self, run: _AgentRun) -> None:
        a = run.agent
        stage = a.stages[run.stage]
        run.open = len(stage)
        for i, task in enumerate(stage):
            rid = f"{a.agent_id}/{run.stage}/{i}"
            predicted = self.predictor.request_cost(a, run.stage, i, self.cost)
            info = self.core.request_arrived(rid, a.agent_id, task.prompt_tokens, predicted)
            self.reqs[rid] = _Req(info, run, task.prompt_tokens, task.output_tokens)

    def _finish(self, r: _Req) -> None:
        self.running.remove(r)
        r.running = False
        self.free += r.blocks
        r.blocks = 0
        self.core.request_finished(r.info)
        del self.reqs[r.info.request_id]
        run = r.run
        run.open -= 1
        if run.open:
            return
        run.stage += 1
        if run.stage < len(run.agent.stages):
            self._start_stage(run)
            return
        a = run.agent
        finish_s = self.now_ps / PS_PER_S
        self.core.agent_finished(a.agent_id, finish_s)
        result = AgentResult(
            a.agent_id, a.type, a.arrival_s, finish_s, finish_s - a.arrival_s,
            sum(kv_token_iters(t.prompt_tokens, t.output_tokens) for t in a.tasks), run.predicted_cost,
        )
        self.results.append(result)
        if self.on_agent_finish:
            self.on_agent_finish(result)

    # ------------------------------------------------------------------------- one iteration
    def _charge_for(self, r: _Req, n: int) -> Charge:
        held = r.computed + n
        if r.decoding:
            return Charge(0, 1, held)
        return Charge(n, 1 if held == r.num_tokens else 0, held)

    def _preempt(self, victim: _Req, scheduled: dict[_Req, int]) -> int:
        """Free the victim's blocks and requeue it; return the token budget it gives back."""
        self.running.remove(victim)
        victim.running = False
        self.free += victim.blocks
        victim.blocks = 0
        victim.computed = 0
        self.core.requeue(victim.info)
        self.preemptions += 1
        return scheduled.pop(victim, 0)

    def _step(self) -> None:
        cfg = self.config
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        scheduled: dict[_Req, int] = {}
        preempted = False
        for r in list(self.running):
            if budget <= 0:
                break
            if not r.running:
                continue  # preempted earlier in this step
            n = min(r.num_tokens - r.computed, budget)
            need = _ceil_div(r.computed + n, bs) - r.blocks
            while need > self.free:
                victim = self.reqs[self.core.victim(q.info for q in self.running).request_id]
                budget += self._preempt(victim, scheduled)
                preempted = True
                if victim is r:
                    break
            if not r.running:
                continue
            self.free -= max(need, 0)
            r.blocks += max(need, 0)
            scheduled[r] = n
            budget -= n
        charges = {r: self._charge_for(r, n) for r, n in scheduled.items()}
        for r, c in charges.items():
            self.core.charge(r.info, c)

        if not preempted:
            waiting = self.core.waiting
            while budget > 0 and len(self.running) < cfg.max_num_seqs and len(waiting):
                info = waiting.peek()
                r = self.reqs[info.request_id]
                if _ceil_div(r.num_tokens, bs) > self.free:
                    break  # head-of-line: vLLM does not look past a request that does not fit
                n = min(r.num_tokens, budget)
                need = _ceil_div(n, bs)
                waiting.remove(info)
                self.running.append(r)
                r.running = True
                self.free -= need
                r.blocks = need
                scheduled[r] = n
                budget -= n
                charges[r] = c = self._charge_for(r, n)
                self.core.charge(info, c)

        if not scheduled:
            raise RuntimeError("the engine made no progress in a step; the configuration cannot serve this workload.")
        batched = sum(scheduled.values())
        context = sum(c.kv_token_iters for r, c in charges.items() if c.prefill_tokens == 0)
        self.now_ps += cfg.profile.iteration_ps(batched, context)
        self.iterations += 1
        for r, n in scheduled.items():
            r.computed += n
            if r.computed == r.num_tokens:
                r.generated += 1
                if r.generated == r.output_tokens:
                    self._finish(r)

    # ------------------------------------------------------------------ event-skipping spans
    def _try_span(self) -> bool:
        """Take ``k >= 2`` identical decode iterations at once if nothing can change in them."""
        cfg = self.config
        bs = cfg.block_size
        run = self.running
        n = len(run)
        if n == 0 or n > cfg.max_num_batched_tokens or not all(r.decoding for r in run):
            return False
        k = min(r.output_tokens - r.generated for r in run)  # requests finish only in the last
        if k < 2:
            return False

        def blocks_needed(iters: int) -> int:
            return sum(max(0, _ceil_div(r.computed + iters, bs) - r.blocks) for r in run)

        if blocks_needed(k) > self.free:  # a preemption would come: stop just before it
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if blocks_needed(mid) <= self.free else (lo, mid - 1)
            k = lo
            if k < 2:
                return False

        floor, base, per_tok, per_ctx = cfg.profile.coefficients_ps()
        per_iter = max(floor, base + per_tok * n)
        ctx0 = sum(r.computed for r in run)

        def duration_ps(iters: int) -> int:
            return iters * per_iter + per_ctx * (iters * ctx0 + n * iters * (iters + 1) // 2)

        if self._next < len(self._pending):  # no arrival may be seen inside the span
            gap = self._pending[self._next].arrival_ps - self.now_ps
            if duration_ps(k - 1) >= gap:
                lo, hi = 1, k - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if duration_ps(mid - 1) < gap else (lo, mid - 1)
                k = lo
                if k < 2:
                    return False

        k = self._admission_free_iters(k, blocks_needed(1))
        if k < 2:
            return False

        for r in run:
            self.core.charge(r.info, Charge(0, k, k * r.computed + k * (k + 1) // 2))
            r.computed += k
            r.generated += k
            grown = _ceil_div(r.computed, bs) - r.blocks
            if grown > 0:
                r.blocks += grown
                self.free -= grown
        self.now_ps += duration_ps(k)
        self.iterations += k
        for r in [r for r in run if r.generated == r.output_tokens]:
            self._finish(r)
        return True

    def _admission_free_iters(self, k: int, first_blocks: int) -> int:
        """How many of the next ``k`` iterations surely admit no waiting request (0 if the first may)."""
        cfg = self.config
        waiting = self.core.waiting
        budget_left = cfg.max_num_batched_tokens - len(self.running)
        if not len(waiting) or len(self.running) >= cfg.max_num_seqs or budget_left <= 0:
            return k
        free_after = self.free - first_blocks  # free blocks only shrink during a decode span

        def fits(info: RequestInfo) -> bool:
            return _ceil_div(self.reqs[info.request_id].num_tokens, cfg.block_size) <= free_after

        if not self.policy.dynamic:
            return 0 if fits(waiting.peek()) else k
        # Dynamic keys move only for agents with running requests; find when the head could change.
        backlogged = set(waiting.agents())
        per_agent: dict[str, list[int]] = {}  # backlogged agents with running requests
        for r in self.running:
            if r.info.agent_id in backlogged:
                acc = per_agent.setdefault(r.info.agent_id, [0, 0])
                acc[0] += 1
                acc[1] += r.computed

        def extra(iters: int) -> dict[str, Charge]:
            return {
                a: Charge(0, iters * cnt, iters * csum + cnt * iters * (iters + 1) // 2)
                for a, (cnt, csum) in per_agent.items()
            }

        head = waiting.peek(extra(1))
        if fits(head):
            return 0
        moving = list(per_agent)
        if not moving:
            return k
        still = [a for a in backlogged if a not in per_agent]
        fixed = [waiting.next_agent(among=still)] if still else []
        for j in range(1, k):
            ahead = waiting.next_agent(extra(j + 1), among=moving + fixed)
            if ahead != head.agent_id and fits(waiting.agent_head(ahead)):
                return j
        return k
