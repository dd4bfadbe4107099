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
Event skipping (the default; ``event_skipping=False`` is the plain per-iteration reference): a
decoding request advances by one token per step, so it is kept lazily, exact as of some past
iteration, and heaps say when it next needs a KV block and when it finishes. A step then costs
only what changes in it. While every running request decodes and no admission, preemption,
arrival or finish can happen, steps differ only in context length, and a whole span of them is
taken in closed form. Steps where a preemption may happen, or where the token budget binds, are
run by the plain step on fully materialised state.
"""

from __future__ import annotations

import heapq
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
    admit_no: int = 0  # position in the running list: admission order
    sync_it: int = 0  # fast mode: computed/generated are exact as of this iteration
    epoch: int = 0  # fast mode: bumped when the request stops decoding, voiding heap entries

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
        self._charged = self.core.uses_service  # the other policies skip that work
        self._lifts = self._charged and type(self.policy).backlogged is not Policy.backlogged
        self.now_ps = 0
        self.free = self.config.blocks
        self.running: list[_Req] = []
        self.reqs: dict[str, _Req] = {}
        self.iterations = self.steps = self.preemptions = 0
        self.results: list[AgentResult] = []
        self._admitted = 0
        self._waiting_blocks: list[tuple[int, int, _Req]] = []  # fast mode: smallest need first
        self._queued_count = 0
        self._lazy_reset()
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
            if not self.event_skipping:
                self._step()
            elif not (self._lazy_span() or self._lazy_step()):
                self._materialize()
                self._step()
                self._absorb()
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
        if self._lifts and not self.core.waiting.is_backlogged(a.agent_id):
            self._flush_charges(self.iterations, also=a.agent_id)  # VTC's lift rule reads counters
        stage = a.stages[run.stage]
        run.open = len(stage)
        for i, task in enumerate(stage):
            rid = f"{a.agent_id}/{run.stage}/{i}"
            predicted = self.predictor.request_cost(a, run.stage, i, self.cost)
            info = self.core.request_arrived(rid, a.agent_id, task.prompt_tokens, predicted)
            self.reqs[rid] = r = _Req(info, run, task.prompt_tokens, task.output_tokens)
            self._queued(r)

    def _admit(self, r: _Req, n: int) -> None:
        """Move a waiting request into the running list and give it blocks for ``n`` tokens."""
        self.core.waiting.remove(r.info)
        self.running.append(r)
        r.running = True
        self._admitted += 1
        r.admit_no = self._admitted
        need = _ceil_div(n, self.config.block_size)
        self.free -= need
        r.blocks = need
        if self._charged:
            self.core.charge(r.info, self._charge_for(r, n))

    def _finish(self, r: _Req) -> None:
        if r in self._decoders:
            self._undecode(r)
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
        self.predictor.observe(a.type, run.predicted_cost, a.cost(self.cost))
        if self.on_agent_finish:
            self.on_agent_finish(result)

    # ----------------------------------------------------------- one iteration, plain reference
    def _charge_for(self, r: _Req, n: int) -> Charge:
        return Charge.for_step(r.computed, n, r.num_tokens, r.generated)

    def _preempt(self, victim: _Req, scheduled: dict[_Req, int]) -> int:
        """Free the victim's blocks and requeue it; return the token budget it gives back."""
        self.running.remove(victim)
        victim.running = False
        self.free += victim.blocks
        victim.blocks = 0
        victim.computed = 0
        self.core.requeue(victim.info)
        self._queued(victim)
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
        if self._charged:
            for r, c in charges.items():
                self.core.charge(r.info, c)
        if not preempted:
            for r, n in self._admit_waiting(budget):
                scheduled[r] = n
                charges[r] = Charge(n, 0, 0)
        if not scheduled:
            raise RuntimeError("the engine made no progress in a step; the configuration cannot serve this workload.")
        batched = sum(scheduled.values())
        context = sum(c.kv_token_iters for c in charges.values() if c.prefill_tokens == 0)
        self.now_ps += cfg.profile.iteration_ps(batched, context)
        self.iterations += 1
        for r, n in scheduled.items():
            r.computed += n
            if r.computed == r.num_tokens:
                r.generated += 1
                if r.generated == r.output_tokens:
                    self._finish(r)

    def _admit_waiting(self, budget: int) -> list[tuple[_Req, int]]:
        """Admit waiting requests in policy order until one does not fit; return them with their chunks."""
        cfg = self.config
        waiting = self.core.waiting
        admitted = []
        while budget > 0 and len(self.running) < cfg.max_num_seqs and len(waiting):
            r = self.reqs[waiting.peek().request_id]
            if _ceil_div(r.num_tokens, cfg.block_size) > self.free:
                break  # head-of-line: vLLM does not look past a request that does not fit
            n = min(r.num_tokens, budget)
            self._admit(r, n)
            admitted.append((r, n))
            budget -= n
        return admitted

    # ------------------------------------------------------------------- event-driven (lazy) mode
    # Decoding requests live in ``_decoders``, exact as of their ``sync_it``: at iteration ``it``
    # one has computed ``computed + it - sync_it`` tokens. ``_dec_ctx`` is the sum of their computed
    # tokens now. ``_need_block`` holds (iteration whose step needs a new block, ...), ``_done``
    # holds (iteration count after the step that samples the last token, ...). For policies that
    # read service, ``_agent_dec`` keeps per agent [decoders, their computed tokens as of
    # ``charged_it``, charged_it], and service is charged lazily, before any key is read.

    def _queued(self, r: _Req) -> None:
        """Note the blocks a request that just joined the waiting queue needs to be admitted."""
        if self.event_skipping:
            need = _ceil_div(r.num_tokens, self.config.block_size)
            self._queued_count += 1
            heapq.heappush(self._waiting_blocks, (need, self._queued_count, r))

    def _smallest_waiting_need(self) -> int:
        """The fewest free blocks that would let some waiting request in (any policy order)."""
        heap, waiting, bs = self._waiting_blocks, self.core.waiting, self.config.block_size
        while heap:
            need, _, r = heap[0]
            if r.info in waiting and need == _ceil_div(r.num_tokens, bs):
                return need
            heapq.heappop(heap)  # admitted, finished, or queued again with another length
        return 1 << 62

    def _lazy_reset(self) -> None:
        self._decoders: dict[_Req, None] = {}
        self._prefilling: list[_Req] = []
        self._dec_ctx = 0
        self._need_block: list[tuple[int, int, int, _Req]] = []
        self._done: list[tuple[int, int, int, _Req]] = []
        self._agent_dec: dict[str, list] = {}

    def _decode(self, r: _Req) -> None:
        """Start keeping a request that has just begun decoding lazily."""
        it = self.iterations
        r.sync_it = it
        self._decoders[r] = None
        self._dec_ctx += r.computed
        bs = self.config.block_size
        heapq.heappush(self._need_block, (it + r.blocks * bs - r.computed, r.admit_no, r.epoch, r))
        heapq.heappush(self._done, (it + r.output_tokens - r.generated, r.admit_no, r.epoch, r))
        if self._charged:
            agent = r.info.agent_id
            acc = self._agent_dec.get(agent)
            if acc is None:
                acc = self._agent_dec[agent] = [0, 0, it, r.info]
            self._flush_agent(acc, it)
            acc[0] += 1
            acc[1] += r.computed

    def _sync(self, r: _Req) -> None:
        """Bring a lazily kept decoder's counts up to the current iteration."""
        gone = self.iterations - r.sync_it
        r.computed += gone
        r.generated += gone
        r.sync_it = self.iterations

    def _undecode(self, r: _Req) -> None:
        """Stop keeping a decoder lazily (it finishes or is preempted); its counts become exact."""
        self._sync(r)
        del self._decoders[r]
        self._dec_ctx -= r.computed
        r.epoch += 1
        if self._charged:
            acc = self._agent_dec[r.info.agent_id]
            self._flush_agent(acc, self.iterations)
            acc[0] -= 1
            acc[1] -= r.computed
            if acc[0] == 0:
                del self._agent_dec[r.info.agent_id]

    def _flush_agent(self, acc: list, upto_it: int) -> None:
        """Charge an agent's decoders for the steps from ``acc[2]`` up to ``upto_it``."""
        k = upto_it - acc[2]
        if k > 0:
            n, csum = acc[0], acc[1]
            if n:
                self.core.charge(acc[3], Charge(0, n * k, k * csum + n * k * (k + 1) // 2))
            acc[1] = csum + n * k
            acc[2] = upto_it

    def _flush_charges(self, upto_it: int, everyone: bool = False, also: str | None = None) -> None:
        """Charge pending decode service to the agents whose keys may be read: the backlogged ones
        (and ``also``), or ``everyone``."""
        if self._agent_dec:
            waiting = self.core.waiting
            for agent_id, acc in self._agent_dec.items():
                if everyone or agent_id == also or waiting.is_backlogged(agent_id):
                    self._flush_agent(acc, upto_it)

    def _materialize(self) -> None:
        """Make every running request's state exact, for the plain step."""
        self._flush_charges(self.iterations, everyone=True)
        for r in self._decoders:
            self._sync(r)
            r.epoch += 1
        self._lazy_reset()

    def _absorb(self) -> None:
        """After a plain step, keep decoding requests lazily again."""
        for r in self.running:
            if r.decoding:
                self._decode(r)
            else:
                self._prefilling.append(r)

    def _pop_due(self, heap: list, it: int) -> list[_Req]:
        """Pop the live entries of ``heap`` that fall due at iteration ``it``."""
        due = []
        while heap and heap[0][0] <= it:
            _, _, epoch, r = heapq.heappop(heap)
            if epoch == r.epoch:
                due.append(r)
        return due

    def _next_due(self, heap: list) -> int | None:
        while heap and heap[0][2] != heap[0][3].epoch:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _lazy_step(self) -> bool:
        """One step without touching steady decoders; False if it needs the plain step."""
        cfg = self.config
        bs = cfg.block_size
        it = self.iterations
        n_dec = len(self._decoders)
        chunks = [(r, r.num_tokens - r.computed) for r in self._prefilling]
        demand = n_dec + sum(n for _, n in chunks)
        if demand > cfg.max_num_batched_tokens:
            return False  # the budget binds: running order decides who waits
        grow = self._pop_due(self._need_block, it)
        need = {r: _ceil_div(r.computed + n, bs) - r.blocks for r, n in chunks}
        need.update((r, 1) for r in grow)
        preempted = sum(need.values()) > self.free and self._preempt_for(need)
        for r in grow:
            if r.running:
                heapq.heappush(self._need_block, (it + bs, r.admit_no, r.epoch, r))
        for r, b in need.items():
            if r.running:
                r.blocks += b
                self.free -= b
        chunks = [(r, n) for r, n in chunks if r.running]
        n_dec = len(self._decoders)
        if self._charged:
            for r, n in chunks:
                self.core.charge(r.info, self._charge_for(r, n))
        budget = cfg.max_num_batched_tokens - n_dec - sum(n for _, n in chunks)
        if (not preempted and len(self.core.waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs
                and self._smallest_waiting_need() <= self.free):
            self._flush_charges(it + 1)  # this step's decodes are charged before admission
            admitted = self._admit_waiting(budget)
            chunks += admitted
            self._prefilling += [r for r, _ in admitted]
        if not chunks and not n_dec:
            raise RuntimeError("the engine made no progress in a step; the configuration cannot serve this workload.")
        batched = n_dec + sum(n for _, n in chunks)
        self.now_ps += cfg.profile.iteration_ps(batched, self._dec_ctx + n_dec)
        self.iterations = it = it + 1
        self._dec_ctx += n_dec
        ended = self._pop_due(self._done, it)
        for r, n in chunks:
            r.computed += n
            if r.computed == r.num_tokens:
                r.generated += 1
                if r.generated == r.output_tokens:
                    self._prefilling.remove(r)
                    ended.append(r)
                    continue
            if r.decoding:  # a recompute can also stop one token short, which the next step decodes
                self._prefilling.remove(r)
                self._decode(r)
        for r in sorted(ended, key=lambda q: q.admit_no):  # the plain step's finishing order
            self._finish(r)
        return True

    def _preempt_for(self, need: dict[_Req, int]) -> bool:
        """Preempt, as the plain step would, until the requests in ``need`` fit; True if any was."""
        self._flush_charges(self.iterations, everyone=True)  # victims: before this step's charges
        preempted = False
        for r in sorted(need, key=lambda q: q.admit_no):  # the plain step allocates in running order
            while r.running and need[r] > self.free:
                victim = self.reqs[self.core.victim(q.info for q in self.running).request_id]
                if victim in self._decoders:
                    self._undecode(victim)
                else:
                    self._prefilling.remove(victim)
                self._preempt(victim, {})
                preempted = True
                if victim is r:
                    break
            if r.running:  # allocate now, so that later requests see what is left
                self.free -= need[r]
                r.blocks += need[r]
                need[r] = 0
        return preempted

    def _lazy_span(self) -> bool:
        """Take ``k >= 2`` decode-only steps at once when nothing can change in them."""
        cfg = self.config
        n = len(self._decoders)
        if self._prefilling or n == 0 or n > cfg.max_num_batched_tokens:
            return False
        it = self.iterations
        k = self._next_due(self._done) - it  # requests finish only in the span's last step
        if k < 2:
            return False
        floor, base, per_tok, per_ctx = cfg.profile.coefficients_ps()
        per_iter = max(floor, base + per_tok * n)
        ctx0 = self._dec_ctx

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
        grow_now = self._pop_due(self._need_block, it)
        for r in grow_now:
            heapq.heappush(self._need_block, (it, r.admit_no, r.epoch, r))
        if len(grow_now) > self.free:
            return False
        k = self._admission_free_iters(k, self.free - len(grow_now))
        if k < 2:
            return False
        # Hand out blocks step by step until the span's end or a step that would run out.
        bs = cfg.block_size
        heap = self._need_block
        while True:
            due = self._next_due(heap)
            if due is None or due >= it + k:
                break
            group = self._pop_due(heap, due)
            if len(group) > self.free:
                for r in group:
                    heapq.heappush(heap, (due, r.admit_no, r.epoch, r))
                k = due - it  # stop just before the step that preempts
                break
            self.free -= len(group)
            for r in group:
                r.blocks += 1
                heapq.heappush(heap, (due + bs, r.admit_no, r.epoch, r))
        if k < 1:
            return False
        self.now_ps += duration_ps(k)
        self.iterations = it = it + k
        self._dec_ctx += n * k
        for r in sorted(self._pop_due(self._done, it), key=lambda q: q.admit_no):
            self._finish(r)
        return True

    def _admission_free_iters(self, k: int, free_after: int) -> int:
        """How many of the next ``k`` steps surely admit no waiting request (0 if the first may)."""
        cfg = self.config
        waiting = self.core.waiting
        n = len(self._decoders)
        if not len(waiting) or len(self.running) >= cfg.max_num_seqs or cfg.max_num_batched_tokens - n <= 0:
            return k
        if self._smallest_waiting_need() > free_after:
            return k  # nothing waiting fits, whatever the order

        def fits(info: RequestInfo) -> bool:
            return _ceil_div(self.reqs[info.request_id].num_tokens, cfg.block_size) <= free_after

        if not self.policy.dynamic:
            return 0 if fits(waiting.peek()) else k
        # Dynamic keys move only for backlogged agents that are also decoding, and each moves one
        # way, so over steps 1..e a key lies between its values at steps 1 and e. The span is safe
        # up to e while some agent whose head request does not fit surely stays ahead of every
        # agent whose head request fits.
        it = self.iterations
        rates = {}
        for a, acc in self._agent_dec.items():
            if waiting.is_backlogged(a):
                self._flush_agent(acc, it)
                rates[a] = (acc[0], acc[1])

        def extra(a: str, iters: int) -> Charge:
            cnt, csum = rates[a]
            return Charge(0, iters * cnt, iters * csum + cnt * iters * (iters + 1) // 2)

        key = self.policy.agent_key
        best_still = waiting.best_agent(set(rates))
        candidates = list(rates) + ([best_still] if best_still is not None else [])
        head = min(candidates, key=lambda a: key(a, extra(a, 1)) if a in rates else key(a))
        if fits(waiting.agent_head(head)):
            return 0
        if not rates:
            return k
        fitting = [a for a in candidates if fits(waiting.agent_head(a))]
        if not fitting:
            return k
        blocked = [a for a in candidates if a not in fitting]

        def span(a: str, e: int) -> tuple[tuple, tuple]:
            if a not in rates:
                return key(a), key(a)
            first, last = key(a, extra(a, 2)), key(a, extra(a, e + 1))
            return min(first, last), max(first, last)

        def safe(e: int) -> bool:
            return min(span(a, e)[1] for a in blocked) < min(span(b, e)[0] for b in fitting)

        lo, hi = 0, k - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if safe(mid) else (lo, mid - 1)
        return lo + 1
