"""Event skipping, the simulator's default way of stepping: the plain stepper's rules
(``sim.stepping``), with many steps taken at once where nothing but context length changes.

``SkippingRun`` keeps decoding requests lazily (a decoding request advances by one token per
step), exact as of some past iteration, with heaps that say when each next needs a KV block and
when each finishes. A step then costs only what changes in it. While every running request decodes
and no admission, preemption, arrival or finish can happen, steps differ only in context length,
and a whole span of them is taken in closed form. A step that would preempt, or where the token
budget binds, is run by the plain step on fully materialised state.

With the prefix cache on, a decoder's blocks are cached as they fill, from a heap of when each
fills its next block (in the plain step's order: by step, then running order), before any lookup
reads the cache. A span is taken only while no waiting request that could be admitted in it: its
lower bound on the blocks it needs counts only the hits now in use, and holds while no decoder can
cache a block of its prefix (none of its runs' sources is a decoder's output source); else the
bound is one block, and the steps are taken one at a time.

The file is longer than the house's 400 lines: its parts (lazy decoders, closed-form spans, lazy
charging, the admission look-ahead) all read and write the one lazy state of ``SkippingRun``, and
apart they would hand it back and forth on every step.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

from justitia.core import AgentScheduler, Charge, RequestInfo
from justitia.sim.config import PS_PER_S, EngineConfig
from justitia.sim.stepping import PlainRun, SimRequest, ceil_div

NEVER = 1 << 62


@dataclass(eq=False)
class DecodeGroup:
    """Skipping, for policies that read service: one agent's lazily kept decoders, charged up to
    ``charged_it``; ``context_tokens`` is what they held then."""

    count: int
    context_tokens: int
    charged_it: int
    info: RequestInfo  # one of the agent's requests, to charge through


class SkippingRun(PlainRun):
    """The simulated engine with event skipping: decoders kept lazily, spans taken in closed form.

    Decoding requests live in ``_decoders``, exact as of their ``sync_it``: at iteration ``it``
    one has computed ``computed + it - sync_it`` tokens. ``_dec_ctx`` is the sum of their computed
    tokens now. ``_need_block`` holds (iteration whose step needs a new block, ...), ``_done``
    holds (iteration count after the step that samples the last token, ...). For policies that
    read service, ``_groups`` keeps a ``DecodeGroup`` per agent and service is charged lazily,
    before any key is read: under keys that rise with service (``lookahead.keys_rise``) only the agents
    at the front of the queue, whose keys as charged so far are the smallest, are charged.
    """

    def __init__(self, config: EngineConfig, core: AgentScheduler, finished: Callable[[SimRequest], None]):
        super().__init__(config, core, finished)
        self._waiting_blocks: list[tuple[int, int, SimRequest]] = []  # smallest need first
        self._queued_count = 0
        self._lazy_reset()

    # ------------------------------------------------------------------ what the simulator calls
    def submit(self, reqs: list[SimRequest]) -> None:
        """Queue a stage; VTC's lift rule reads counters, so pending service is charged first."""
        agent_id = reqs[0].agent_id
        ahead = self.core.lookahead
        if ahead.reads_service_on_backlog and not ahead.is_backlogged(agent_id):
            if ahead.keys_rise:  # the lift reads the agent's own counter and the front one's
                if agent_id in self._groups:
                    self._flush_group(self._groups[agent_id], self.iterations)
                self._charge_front(self.iterations)
            else:
                self._flush_charges(self.iterations, also=agent_id)
        super().submit(reqs)

    def advance(self) -> None:
        """One pass: a span of decode-only steps, one lazy step, or the plain step."""
        self.steps += 1
        if self.timed or self.holds:  # keys that move with time (and rise with service), and the places
            self.core.advance(self.now_ps / PS_PER_S)  # agents keep: read at the pass's start
        if not (self._lazy_span() or self._lazy_step()):
            self._materialize()
            self._step()
            self._absorb()

    # ------------------------------------------------------------------------------- requests
    def _queued(self, r: SimRequest) -> None:
        """Note the blocks a request that just joined the waiting queue needs to be admitted."""
        need = self._static_need(r)
        self._queued_count += 1
        heapq.heappush(self._waiting_blocks, (need, self._queued_count, r))

    def _finish(self, r: SimRequest) -> None:
        if r in self._decoders:
            self._undecode(r)
        super()._finish(r)

    def _smallest_waiting_need(self) -> int:
        """The fewest free blocks that would let some waiting request in (any policy order)."""
        heap, core, bs = self._waiting_blocks, self.core, self.config.block_size
        while heap:
            need, _, r = heap[0]
            if core.lookahead.is_waiting(r.info) and need == (
                ceil_div(r.num_tokens, bs) if self.cache is None else self._static_need(r)
            ):
                return need
            heapq.heappop(heap)  # admitted, finished, or queued again with another length
        return NEVER

    def _static_need(self, r: SimRequest) -> int:
        """The fewest blocks a waiting request can need to be admitted, whatever is cached."""
        need = ceil_div(r.num_tokens, self.config.block_size)
        if self.cache is not None and r.runs:
            need -= (r.num_tokens - 1) // self.config.block_size  # every block but the last may hit
        return need

    def _need_lb(self, r: SimRequest) -> int:
        """The fewest blocks a waiting request can need to be admitted in any step of a span (no
        admission, free, or prefill in it): only the hits now in use can lower its need, unless a
        decoder may cache a block of its prefix."""
        cache = self.cache
        if cache is None or not r.runs:
            return ceil_div(r.num_tokens, self.config.block_size)
        dec = self._dec_sources
        if dec and any(src in dec for src in cache.content(r).sources):
            return self._static_need(r)
        return ceil_div(r.num_tokens, self.config.block_size) - cache.in_use_hits(r)

    # -------------------------------------------------------------------------- lazy decoders
    def _lazy_reset(self) -> None:
        self._decoders: dict[SimRequest, None] = {}
        self._prefilling: list[SimRequest] = []
        self._dec_ctx = 0
        self._need_block: list[tuple[int, int, int, SimRequest]] = []
        self._done: list[tuple[int, int, int, SimRequest]] = []
        self._groups: dict[str, DecodeGroup] = {}
        self._fill: list[tuple[int, int, int, SimRequest]] = []  # prefix cache: (step that fills a block, ...)
        self._dec_sources: dict = {}  # prefix cache: decoders' output sources, counted

    def _decode(self, r: SimRequest) -> None:
        """Start keeping a request that has just begun decoding lazily."""
        it = self.iterations
        r.sync_it = it
        self._decoders[r] = None
        self._dec_ctx += r.computed
        bs = self.config.block_size
        heapq.heappush(self._need_block, (it + r.blocks * bs - r.computed, r.admit_no, r.epoch, r))
        heapq.heappush(self._done, (it + r.output_tokens - r.generated, r.admit_no, r.epoch, r))
        if self.cache is not None and r.runs:
            # the step that computes the last token of the block after those now full fills it
            heapq.heappush(self._fill, (it + bs - 1 - r.computed % bs, r.admit_no, r.epoch, r))
            dec = self._dec_sources
            for src in self.cache.content(r).out_sources:
                dec[src] = dec.get(src, 0) + 1
        if self.charged:
            agent = r.info.agent_id
            group = self._groups.get(agent)
            if group is None:
                group = self._groups[agent] = DecodeGroup(0, 0, it, r.info)
            self._flush_group(group, it)
            group.count += 1
            group.context_tokens += r.computed

    def _sync(self, r: SimRequest) -> None:
        """Bring a lazily kept decoder's counts up to the current iteration."""
        gone = self.iterations - r.sync_it
        r.computed += gone
        r.generated += gone
        r.sync_it = self.iterations

    def _undecode(self, r: SimRequest) -> None:
        """Stop keeping a decoder lazily (it finishes or is preempted); its counts become exact."""
        self._sync(r)
        del self._decoders[r]
        self._dec_ctx -= r.computed
        r.epoch += 1
        if self.cache is not None and r.runs:
            dec = self._dec_sources
            for src in self.cache.content(r).out_sources:
                dec[src] -= 1
                if not dec[src]:
                    del dec[src]
        if self.charged:
            group = self._groups[r.info.agent_id]
            self._flush_group(group, self.iterations)
            group.count -= 1
            group.context_tokens -= r.computed
            if group.count == 0:
                del self._groups[r.info.agent_id]

    @staticmethod
    def _pending(group: DecodeGroup, upto_it: int) -> Charge:
        """What an agent's decoders are owed for the steps from ``group.charged_it`` up to ``upto_it``."""
        k, n = upto_it - group.charged_it, group.count
        return Charge(0, n * k, k * group.context_tokens + n * k * (k + 1) // 2)

    def _flush_group(self, group: DecodeGroup, upto_it: int) -> None:
        """Charge an agent's decoders for the steps from ``group.charged_it`` up to ``upto_it``."""
        k = upto_it - group.charged_it
        if k > 0:
            if group.count:
                self._charge(group.info, self._pending(group, upto_it))
            group.context_tokens += group.count * k
            group.charged_it = upto_it

    def _charge_front(self, upto_it: int) -> str | None:
        """Keys that rise: charge pending decode service up to ``upto_it`` to the agents at the front
        of the queue until the front one owes nothing; return it (its key is then exact and smallest)."""
        core = self.core
        while True:
            agent_id = core.lookahead.best_agent()
            group = self._groups.get(agent_id)
            if group is None or group.charged_it >= upto_it:
                return agent_id
            self._flush_group(group, upto_it)

    def _front(self) -> RequestInfo | None:
        """The waiting request to admit next, its agent's key (and those ahead of it) charged; None
        if it would pass an agent keeping its place (``AgentScheduler.advance``)."""
        if self.charged and self.core.lookahead.keys_rise:
            head = self.core.lookahead.agent_head(self._charge_front(self.iterations + 1))  # this step's decodes too
            return None if self.core.lookahead.passes_place(head) else head
        return self.core.peek()

    def _flush_charges(self, upto_it: int, everyone: bool = False, also: str | None = None) -> None:
        """Charge pending decode service to the agents whose keys may be read: the backlogged ones
        (and ``also``), or ``everyone``."""
        core = self.core
        for agent_id, group in self._groups.items():
            if everyone or agent_id == also or core.lookahead.is_backlogged(agent_id):
                self._flush_group(group, upto_it)

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

    def _pop_due(self, heap: list, it: int) -> list[SimRequest]:
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

    # ----------------------------------------------------------------------------- one step
    def _lazy_step(self) -> bool:
        """One step without touching steady decoders; False if it needs the plain step (the token
        budget binds, or a request needs a block that is not free: a preemption)."""
        cfg = self.config
        bs = cfg.block_size
        it = self.iterations
        n_dec = len(self._decoders)
        chunks = [(r, r.num_tokens - r.computed) for r in self._prefilling]
        demand = n_dec + sum(n for _, n in chunks)
        backlogged = self.measuring and len(self.core) > 0
        if demand > cfg.max_num_batched_tokens:
            return False  # the budget binds: running order decides who waits
        grow = self._pop_due(self._need_block, it)
        need = {r: ceil_div(r.computed + n, bs) - r.blocks for r, n in chunks}
        need.update((r, 1) for r in grow)
        if sum(need.values()) > self.free:
            return False  # a preemption: the plain step decides whom (on materialised state)
        for r in grow:
            heapq.heappush(self._need_block, (it + bs, r.admit_no, r.epoch, r))
        for r, b in need.items():
            r.blocks += b
        if self.cache is None:
            self.free -= sum(need.values())
        else:
            for b in need.values():
                self._alloc(b)
        if self.cache is not None:  # the step's full blocks are cached in running order, before admission
            fills = [(r.admit_no, r, r.computed + n) for r, n in chunks]
            for r in self._pop_due(self._fill, it):
                fills.append((r.admit_no, r, r.computed + it - r.sync_it + 1))
                heapq.heappush(self._fill, (it + bs, r.admit_no, r.epoch, r))
            for _, r, upto in sorted(fills, key=lambda f: f[0]):
                self.cache.cache_upto(r, upto)
        if self.charged:
            for r, n in chunks:
                self._charge(r.info, self._charge_for(r, n))
        budget = cfg.max_num_batched_tokens - demand
        if (
            len(self.core)
            and budget > 0
            and len(self.running) < cfg.max_num_seqs
            and self._smallest_waiting_need() <= self.free
        ):
            if not self.core.lookahead.keys_rise:
                self._flush_charges(it + 1)  # this step's decodes are charged before admission (else: _front)
            admitted = self._admit_waiting(budget)
            chunks += admitted
            self._prefilling += [r for r, _ in admitted]
        if not chunks and not n_dec:
            raise RuntimeError("the engine made no progress in a step; the configuration cannot serve this workload.")
        batched = n_dec + sum(n for _, n in chunks)
        step_ps = (
            cfg.profile.iteration_ps(batched, self._dec_ctx + n_dec, n_dec + len(chunks), self._take_arrivals())
            * cfg.slowdown_at(self.now_ps)[0]
        )
        if backlogged:
            self._delivered(step_ps, [self._charge_for(r, n) for r, n in chunks], n_dec, self._dec_ctx + n_dec)
        self.now_ps += step_ps
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

    # ---------------------------------------------------------------------------- a whole span
    def _lazy_span(self) -> bool:
        """Take ``k >= 2`` decode-only steps at once when nothing can change in them."""
        cfg = self.config
        n = len(self._decoders)
        if self._prefilling or n == 0 or n > cfg.max_num_batched_tokens or self.core.lookahead.holding:
            return False  # (an agent keeping its place: the pass after may admit what this one may not)
        it = self.iterations
        k = self._next_due(self._done) - it  # requests finish only in the span's last step
        if k < 2:
            return False
        floor, base, per_tok, per_ctx = cfg.profile.coefficients_ps()
        per_req, per_arr = cfg.profile.request_coefficients_ps()
        per_iter = max(floor, base + per_tok * n) + per_req * n
        arrivals_ps = per_arr * self._arrivals  # the span's first step follows them
        ctx0 = self._dec_ctx
        factor, change_ps = cfg.slowdown_at(self.now_ps)

        def duration_ps(iters: int) -> int:
            return factor * (arrivals_ps + iters * per_iter + per_ctx * (iters * ctx0 + n * iters * (iters + 1) // 2))

        # no arrival may be seen, and no step may start past a change of the engine's speed, in the span
        stops = [t for t in (self.next_arrival_ps, change_ps) if t is not None]
        if stops:
            gap = min(stops) - self.now_ps
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
            if self.cache is None:
                self.free -= len(group)
            else:
                self._alloc(len(group))
            for r in group:
                r.blocks += 1
                heapq.heappush(heap, (due + bs, r.admit_no, r.epoch, r))
        if k < 1:
            return False
        if self.cache is not None:  # the blocks decoders fill in the span, by step, then running order
            fill = self._fill
            while fill and fill[0][0] < it + k:
                due, _, epoch, r = heapq.heappop(fill)
                if epoch == r.epoch:
                    self.cache.cache_upto(r, r.computed + due - r.sync_it + 1)
                    heapq.heappush(fill, (due + bs, r.admit_no, r.epoch, r))
        if self.measuring and len(self.core):
            self._delivered(duration_ps(k), [], n * k, k * ctx0 + n * k * (k + 1) // 2)
        self.now_ps += duration_ps(k)
        self._arrivals = 0
        self.iterations = it = it + k
        self._dec_ctx += n * k
        for r in sorted(self._pop_due(self._done, it), key=lambda q: q.admit_no):
            self._finish(r)
        return True

    def _admission_free_iters(self, k: int, free_after: int) -> int:
        """How many of the next ``k`` steps surely admit no waiting request (0 if the first may)."""
        cfg = self.config
        core = self.core
        ahead = core.lookahead
        n = len(self._decoders)
        if not len(core) or len(self.running) >= cfg.max_num_seqs or cfg.max_num_batched_tokens - n <= 0:
            return k
        if self._smallest_waiting_need() > free_after:
            return k  # nothing waiting fits, whatever the order

        def fits(info: RequestInfo) -> bool:
            return self._need_lb(self.reqs[info.request_id]) <= free_after

        if not core.traits.keys_move:
            return 0 if fits(core.peek()) else k
        # Dynamic keys move only for backlogged agents that are also decoding, and each moves one
        # way, so over steps 1..e a key lies between its values at steps 1 and e. The span is safe
        # up to e while some agent whose head request does not fit surely stays ahead of every
        # agent whose head request fits. The candidates: the decoding agents and the best of the
        # others; under keys that rise, only the decoding agents ahead of the first agent that is
        # not decoding (its key is exact, and every key behind it is at least as large).
        it = self.iterations
        if ahead.keys_rise:
            candidates = []
            for a in ahead.backlogged_agents():
                candidates.append(a)
                if a not in self._groups:
                    break
        else:
            candidates = [a for a in self._groups if ahead.is_backlogged(a)]
            best_still = ahead.best_agent(set(candidates))
            candidates += [best_still] if best_still is not None else []
        moving = [a for a in candidates if a in self._groups]
        for a in moving:
            self._flush_group(self._groups[a], it)

        key = ahead.agent_key

        def key_at(a: str, iters: int) -> tuple:  # as if charged the decodes of the next ``iters`` steps
            group = self._groups.get(a)
            return key(a) if group is None else key(a, self._pending(group, it + iters))

        head = min(candidates, key=lambda a: key_at(a, 1))
        if fits(ahead.agent_head(head)):
            return 0
        if not moving:
            return k
        fitting = [a for a in candidates if fits(ahead.agent_head(a))]
        if not fitting:
            return k
        blocked = [a for a in candidates if a not in fitting]

        def span(a: str, e: int) -> tuple[tuple, tuple]:
            if a not in self._groups:
                return key(a), key(a)
            first, last = key_at(a, 2), key_at(a, e + 1)
            return min(first, last), max(first, last)

        def safe(e: int) -> bool:
            return min(span(a, e)[1] for a in blocked) < min(span(b, e)[0] for b in fitting)

        lo, hi = 0, k - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if safe(mid) else (lo, mid - 1)
        return lo + 1
