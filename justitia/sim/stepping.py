"""The simulated engine's state and its plain stepping, one iteration per pass: the reference that
``sim.skipping`` (the default) must agree with.

NOTE on the rules followed in each step (as vLLM v1's ``Scheduler.schedule``):
  1. Running requests first, in admission order; each gets its next prefill chunk (chunked prefill,
     limited by the step's token budget) or one decode token. When the KV cache has no block for
     it, the running request with the lowest policy priority is preempted by recompute (its blocks
     are freed, it goes back to waiting and later recomputes prompt and output so far), until the
     request fits or is itself the victim; then no further running request is scheduled this step.
  2. Only if nothing was preempted, waiting requests are admitted in policy order until one does
     not fit (head-of-line break) or ``max_num_seqs`` is reached. A request is admitted only if its
     whole sequence so far fits in the free blocks (vLLM 0.32's ``scheduler_reserve_full_isl``,
     on by default, watermark 0); blocks are then allocated chunk by chunk.
     With ``prefix_caching`` (``sim.prefix``), a request admitted with a hit starts with the hit's
     tokens computed; its hit blocks are shared, and those in the free queue count against it.
  3. The step lasts ``profile.iteration_ps(...)`` (its tokens, its requests, and the new requests
     the engine took in since the last step); a request that completes its prefill or decodes
     samples one token; a request with all its output tokens finishes and frees its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from justitia.core import AgentScheduler, Charge, RequestInfo, kv_token_iters
from justitia.sim.config import PS_PER_S, EngineConfig
from justitia.sim.prefix import PrefixCache


@dataclass(eq=False)
class SimRequest:
    """One request inside the simulated engine."""

    request_id: str
    agent_id: str
    predicted_cost: float
    prompt_tokens: int
    output_tokens: int
    owner: Any = None  # what the simulator needs back when the request finishes (its agent, its call)
    info: RequestInfo | None = None  # the core's, once submitted
    generated: int = 0
    computed: int = 0
    blocks: int = 0
    running: bool = False
    admit_no: int = 0  # position in the running list: admission order
    sync_it: int = 0  # skipping: computed/generated are exact as of this iteration
    epoch: int = 0  # skipping: bumped when the request stops decoding, voiding heap entries
    tag: float | None = None  # a cluster's front-end tag (the ``tagged`` policy orders by it)
    rank: float | None = None  # ... and, in a tenant, its agent's inner tag
    # its content, prompt then output: ``(source, tokens)`` pairs, equal sources the same text
    # (``sim.prefix``); empty: text no other request shares
    runs: tuple = ()
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def decoding(self) -> bool:
        return self.generated >= 1 and self.computed == self.num_tokens - 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PlainRun:
    """The simulated engine stepped one iteration per pass: the reference for ``SkippingRun``."""

    def __init__(self, config: EngineConfig, core: AgentScheduler, finished: Callable[[SimRequest], None]):
        self.config = config
        self.core = core
        self.finished = finished  # told of every request that finishes, in the step's finishing order
        self.charged = core.traits.uses_service  # other policies skip that work
        # an agent priced as a distribution is repriced on its service (core.gittins): where the policy
        # is not charged step by step, each request is charged its whole service when it finishes
        self.charge_finished = core.traits.retags_on_service
        self.timed = core.traits.timed  # keys that move with time (justitia-eligible): advanced each step
        # keys timed and rising (justitia-guarded): charged every step with the time, so the core retags
        # and reprices on service as it is charged, as the plug-in does
        self.charge_now = self.timed and core.traits.keys_rise and self.charge_finished
        self.holds = core.traits.holds_place  # an agent keeps its place across a hand-off: ``advance``
        # begins each pass
        self.now_ps = 0
        self.next_arrival_ps: int | None = None  # the simulator keeps this up to date
        self.free = config.blocks
        self.running: list[SimRequest] = []
        self.reqs: dict[str, SimRequest] = {}
        self.iterations = self.steps = self.preemptions = 0
        self._admitted = 0
        self._arrivals = 0  # new requests since the last step, which it pays for (profile.per_arrival_ms)
        self.measuring = core.traits.measures_capacity  # report delivered service for the clock's M
        self.busy_ps = self.busy_prefill = self.busy_decode = self.busy_kv = 0  # since the last report
        # vLLM's automatic prefix cache, and its PrefixCacheStats (tokens, at each admission's lookup;
        # lookups of preempted requests apart)
        self.cache = (
            PrefixCache(config.block_size, config.kv_eviction, self._next_tag) if config.prefix_caching else None
        )
        self.prefix_queries = self.prefix_hits = 0
        self.prefix_preempted_queries = self.prefix_preempted_hits = 0

    # ------------------------------------------------------------------ what the simulator calls
    @property
    def busy(self) -> bool:
        """Whether any request is running or waiting."""
        return bool(self.running) or len(self.core) > 0

    def submit(self, reqs: list[SimRequest]) -> None:
        """Queue new requests (a stage of one agent)."""
        for r in reqs:
            r.info = self.core.request_arrived(
                r.request_id, r.agent_id, r.prompt_tokens, r.predicted_cost, self.now_ps / PS_PER_S, r.tag, r.rank
            )
            self.reqs[r.request_id] = r
            self._queued(r)
        self._arrivals += len(reqs)

    def _take_arrivals(self) -> int:
        """The new requests the step about to be timed follows (counted once)."""
        n, self._arrivals = self._arrivals, 0
        return n

    def advance(self) -> None:
        """One pass of the engine loop: here, one iteration."""
        self.steps += 1
        if self.holds and not self.timed:  # (a timed policy's step advances the core itself)
            self.core.advance(self.now_ps / PS_PER_S)  # the pass begins: an agent may keep its place
        self._step()

    def report_service(self) -> None:
        """Tell the core what the engine delivered while backlogged since the last report (exact
        integers, so both stepping modes report the same at every arrival)."""
        if self.busy_ps:
            self.core.observe_service(
                self.busy_ps / PS_PER_S, Charge(self.busy_prefill, self.busy_decode, self.busy_kv)
            )
            self.busy_ps = self.busy_prefill = self.busy_decode = self.busy_kv = 0

    def _delivered(self, duration_ps: int, steps: list[Charge], decodes: int = 0, decode_kv: int = 0) -> None:
        """A step (or a span of steps) in which requests waited delivered ``steps`` plus ``decodes``
        lazily kept decode tokens holding ``decode_kv``. The KV token-time counted is what the
        requests that sampled a token held (``delivered_service``)."""
        self.busy_ps += duration_ps
        self.busy_prefill += sum(c.prefill_tokens for c in steps)
        self.busy_decode += decodes + sum(c.decode_tokens for c in steps)
        self.busy_kv += decode_kv + sum(c.kv_token_iters for c in steps if c.decode_tokens)

    def _next_tag(self, agent_id: str) -> float | None:
        """The session's next tag as the core says now (``kv_eviction="tag"``): its GPS virtual
        finish (a paused session keeps its own); None if the core does not know it (finished) or
        its policy keeps no clock."""
        standing = self.core.agent(agent_id)
        return None if standing is None else standing.virtual_finish

    # ------------------------------------------------------------------------------- requests
    def _queued(self, r: SimRequest) -> None:
        """A request joined the waiting queue (new or preempted)."""

    def _admit(self, r: SimRequest, n: int, hits: list | None = None) -> None:
        """Move a waiting request into the running list and give it blocks for ``n`` tokens (after
        the cached blocks it ``hits``, with the prefix cache)."""
        self.core.dequeue(r.info)
        self.running.append(r)
        r.running = True
        self._admitted += 1
        r.admit_no = self._admitted
        if hits is None:
            need = ceil_div(n, self.config.block_size)
            self.free -= need
            r.blocks = need
        else:  # vLLM's allocate_slots: touch the hits, allocate the chunk's blocks, cache the full ones
            cache = self.cache
            h = len(hits)
            hit_tokens = h * self.config.block_size
            self.free -= cache.touch(hits)
            cache.hold(r, hits)
            need = ceil_div(hit_tokens + n, self.config.block_size) - h
            self._alloc(need)
            r.blocks = h + need
            r.computed = hit_tokens
            cache.cache_upto(r, hit_tokens + n)
            if r.preemptions:
                self.prefix_preempted_queries += r.num_tokens
                self.prefix_preempted_hits += hit_tokens
            else:
                self.prefix_queries += r.num_tokens
                self.prefix_hits += hit_tokens
        if self.charged:
            self._charge(r.info, self._charge_for(r, n))

    def _alloc(self, n: int) -> None:
        """Take ``n`` blocks from the free queue (with the prefix cache, evicting as vLLM does)."""
        if self.cache is not None and n > 0:
            self.cache.evict_for(n, self.free)
        self.free -= n

    def _release(self, r: SimRequest) -> None:
        """Give back the request's blocks (cached ones stay cached in the free queue, shared ones
        stay with their other holders)."""
        if self.cache is None:
            self.free += r.blocks
        else:
            held = self.cache.held(r)
            self.free += r.blocks - held + self.cache.release(r)
        r.blocks = 0

    def _finish(self, r: SimRequest) -> None:
        self.running.remove(r)
        r.running = False
        self._release(r)
        if self.cache is not None:
            self.cache.forget(r)
        if self.charge_finished and not self.charged:
            self._charge_finished(r)
        self.core.request_finished(r.info, r.generated)
        del self.reqs[r.info.request_id]
        self.finished(r)

    def _charge_finished(self, r: SimRequest) -> None:
        standing = self.core.agent(r.info.agent_id)
        if standing is not None and standing.info.dist is not None:
            p, d = r.prompt_tokens, r.output_tokens
            self.core.charge(r.info, Charge(p, d, kv_token_iters(p, d)), self.now_ps / PS_PER_S)

    def _charge(self, info: RequestInfo, service: Charge) -> None:
        """Charge the core for a step's service (with the time under ``charge_now``)."""
        self.core.charge(info, service, self.now_ps / PS_PER_S if self.charge_now else None)

    def _charge_for(self, r: SimRequest, n: int) -> Charge:
        return Charge.for_step(r.computed, n, r.num_tokens, r.generated)

    def _victim(self) -> SimRequest:
        return self.reqs[max((q.info for q in self.running), key=self.core.priority).request_id]

    def _preempt(self, victim: SimRequest, scheduled: dict[SimRequest, int]) -> int:
        """Free the victim's blocks and requeue it; return the token budget it gives back."""
        self.running.remove(victim)
        victim.running = False
        self._release(victim)
        victim.computed = 0
        victim.preemptions += 1
        self.core.requeue(victim.info)
        self._queued(victim)
        self.preemptions += 1
        return scheduled.pop(victim, 0)

    # ---------------------------------------------------------------------- one plain iteration
    def _step(self) -> None:
        cfg = self.config
        if self.timed:
            self.core.advance(self.now_ps / PS_PER_S)
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        scheduled: dict[SimRequest, int] = {}
        preempted = False
        backlogged = self.measuring and len(self.core) > 0
        for r in list(self.running):
            if budget <= 0:
                break
            if not r.running:
                continue  # preempted earlier in this step
            n = min(r.num_tokens - r.computed, budget)
            need = ceil_div(r.computed + n, bs) - r.blocks
            while need > self.free:
                victim = self._victim()
                budget += self._preempt(victim, scheduled)
                preempted = True
                if victim is r:
                    break
            if not r.running:
                break  # it preempted itself: vLLM schedules no further running request this step
            self._alloc(max(need, 0))
            r.blocks += max(need, 0)
            if self.cache is not None:
                self.cache.cache_upto(r, r.computed + n)
            scheduled[r] = n
            budget -= n
        charges = {r: self._charge_for(r, n) for r, n in scheduled.items()}
        if self.charged:
            for r, c in charges.items():
                self._charge(r.info, c)
        if not preempted:
            for r, n in self._admit_waiting(budget):
                scheduled[r] = n
                charges[r] = Charge(n, 0, 0)
        if not scheduled:
            if preempted:  # the first request that needed a block preempted itself: an empty step, no time
                return
            raise RuntimeError("the engine made no progress in a step; the configuration cannot serve this workload.")
        batched = sum(scheduled.values())
        context = sum(c.kv_token_iters for c in charges.values() if c.prefill_tokens == 0)
        step_ps = (
            cfg.profile.iteration_ps(batched, context, len(scheduled), self._take_arrivals())
            * cfg.slowdown_at(self.now_ps)[0]
        )
        if backlogged:
            self._delivered(step_ps, [self._charge_for(r, n) for r, n in scheduled.items()])
        self.now_ps += step_ps
        self.iterations += 1
        for r, n in scheduled.items():
            r.computed += n
            if r.computed == r.num_tokens:
                r.generated += 1
                if r.generated == r.output_tokens:
                    self._finish(r)

    def _front(self) -> RequestInfo | None:
        """The waiting request to admit next (None: the next would pass an agent keeping its place)."""
        return self.core.peek()

    def _admit_waiting(self, budget: int) -> list[tuple[SimRequest, int]]:
        """Admit waiting requests in policy order until one does not fit; return them with their chunks."""
        cfg = self.config
        core = self.core
        admitted = []
        while budget > 0 and len(self.running) < cfg.max_num_seqs and len(core):
            front = self._front()
            if front is None:
                break  # the next would pass an agent keeping its place (AgentScheduler.advance)
            r = self.reqs[front.request_id]
            if self.cache is None:
                if ceil_div(r.num_tokens, cfg.block_size) > self.free:
                    break  # head-of-line: vLLM does not look past a request that does not fit
                n = min(r.num_tokens, budget)
                self._admit(r, n)
            else:
                hits = self.cache.lookup(r)
                evictable = sum(b.ref == 0 for b in hits)  # hits in the free queue count against it
                if max(ceil_div(r.num_tokens, cfg.block_size) - len(hits), 0) + evictable > self.free:
                    break
                n = min(r.num_tokens - len(hits) * cfg.block_size, budget)
                self._admit(r, n, hits)
            admitted.append((r, n))
            budget -= n
        return admitted
