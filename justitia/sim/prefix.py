"""vLLM's automatic prefix cache for the simulated engine (vLLM 0.32's rules; the lines followed are
listed in docs/design.md, "The prefix cache").

A request's content is its ``runs``: ``(source, tokens)`` pairs, prompt then output, two equal
sources being the same text. Block ``k``'s key names tokens ``[0, (k+1)*block_size)``: its parent's
key and the ``(source, start, end)`` slices of runs it covers, interned to an int (exact, no
collisions, numbered in the order first seen: nothing depends on ``hash()`` values).

Only full blocks are cached. A cached block is a ``Block``; a request holds its cached blocks as a
prefix of its block list (``held``), the rest of its blocks (not yet full, or content that is never
shared) are counted only. Free blocks form vLLM's free queue: blocks without a key are always at
its head (vLLM prepends them when freed), cached ones behind them in least-recently-freed order
(``lru``), so allocation takes unkeyed blocks first, then evicts the ``lru`` head. The engine keeps
the free count (``PlainRun.free``); this object keeps the keyed part of the queue and the key map.

An eviction rule other than vLLM's (``EngineConfig.kv_eviction``, tried in the simulator only):
``"tag"`` evicts first the cached blocks of the sessions whose next tag comes last
(``PrefixCache.evict_for``; docs/sessions.md, "KV kept across tool pauses").
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any, Callable

EVICTIONS = ("lru", "tag")  # vLLM's free queue; the sessions' next tags (``PrefixCache.evict_for``)


class Block:
    """A full, cached KV block: its key, how many running requests hold it, and (free, under the
    ``tag`` rule) the agent of the request that freed it last and when (a count of frees)."""

    __slots__ = ("key", "ref", "owner", "freed")

    def __init__(self, key: int):
        self.key = key
        self.ref = 1
        self.owner = None
        self.freed = 0


class Content:
    """A request's block keys, computed as far as asked, and the cached blocks it holds."""

    __slots__ = ("runs", "keys", "held", "_run", "_off", "sources", "out_sources")

    def __init__(self, runs: tuple, prompt_tokens: int, total: int):
        if sum(t for _, t in runs) != total or any(t < 1 for _, t in runs):
            raise ValueError(f"request runs must be >= 1 token each and sum to prompt + output tokens ({total}).")
        self.runs = runs
        self.keys: list[int] = []
        self.held: list[Block] = []
        self._run = 0  # where the next key's block starts: run index, offset in it
        self._off = 0
        self.sources = frozenset(s for s, _ in runs)
        out, pos = set(), 0
        for s, t in runs:
            if pos + t > prompt_tokens:
                out.add(s)
            pos += t
        self.out_sources = frozenset(out)  # what a block it fills while decoding contains


class PrefixCache:
    """The key map, the keyed blocks of the free queue, and vLLM's hit counters."""

    def __init__(self, block_size: int, eviction: str = "lru", next_tag: Callable[[str], float | None] | None = None):
        """``eviction``: ``"lru"`` (vLLM's) or ``"tag"``, which reads each session's next tag with
        ``next_tag(agent_id)`` (None: the agent is not known, or its policy keeps no clock)."""
        if eviction not in EVICTIONS:
            raise ValueError(f"kv eviction must be one of {', '.join(EVICTIONS)}, got '{eviction}'.")
        if eviction == "tag" and next_tag is None:
            raise ValueError("the 'tag' eviction rule needs the sessions' next tags (next_tag).")
        self.bs = block_size
        self._names: dict[tuple, int] = {}  # (parent key, slices) -> key
        self.map: dict[int, list[Block]] = {}  # key -> cached blocks, first inserted first
        self.lru: OrderedDict[Block, None] = OrderedDict()  # free cached blocks, next evicted first
        self._content: dict[Any, Content] = {}
        self.evictions = 0
        self.eviction = eviction
        self.next_tag = next_tag
        # ``tag``: the free cached blocks of each agent (that freed them last), in the free queue's order
        self.free_by_agent: dict[Any, OrderedDict[Block, None]] = {}
        self._frees = 0

    # ------------------------------------------------------------------------------ keys
    def content(self, r) -> Content | None:
        """The request's content (None if it has no runs: unique text, never hits nor cached)."""
        if not r.runs:
            return None
        c = self._content.get(r)
        if c is None:
            c = self._content[r] = Content(tuple(r.runs), r.prompt_tokens, r.prompt_tokens + r.output_tokens)
        return c

    def forget(self, r) -> None:
        self._content.pop(r, None)

    def key(self, c: Content, k: int) -> int:
        """Block ``k``'s key (keys before it computed first: each names its parent)."""
        keys = c.keys
        bs = self.bs
        while len(keys) <= k:
            need, runs, i, off = bs, c.runs, c._run, c._off
            slices = []
            while need:
                src, tokens = runs[i]
                take = min(tokens - off, need)
                slices.append((src, off, off + take))
                need -= take
                off += take
                if off == tokens:
                    i, off = i + 1, 0
            c._run, c._off = i, off
            name = (keys[-1] if keys else -1, tuple(slices))
            key = self._names.get(name)
            if key is None:
                key = self._names[name] = len(self._names)
            keys.append(key)
        return keys[k]

    # ---------------------------------------------------------------------------- lookups
    def lookup(self, r) -> list[Block]:
        """vLLM's ``get_computed_blocks``: the longest run of cached full blocks from the start,
        at most ``(num_tokens - 1) // block_size`` of them (the last token is always computed)."""
        c = self.content(r)
        if c is None:
            return []
        hits = []
        m = self.map
        for k in range((r.num_tokens - 1) // self.bs):
            blocks = m.get(self.key(c, k))
            if not blocks:
                break
            hits.append(blocks[0])
        return hits

    def in_use_hits(self, r) -> int:
        """How many of the blocks a lookup would hit now have some block of their key in use: an
        upper bound on the in-use hits of any later lookup while no new key of this request's
        prefix is cached and nothing is freed or touched (``SkippingRun``'s spans)."""
        c = self.content(r)
        if c is None:
            return 0
        n = 0
        m = self.map
        for k in range((r.num_tokens - 1) // self.bs):
            blocks = m.get(self.key(c, k))
            if not blocks:
                break
            n += any(b.ref for b in blocks)
        return n

    # -------------------------------------------------------------------- the block pool
    def touch(self, hits: list[Block]) -> int:
        """vLLM's ``BlockPool.touch``: hold each hit; return how many left the free queue."""
        taken = 0
        lru = self.lru
        for b in hits:
            if b.ref == 0:
                del lru[b]
                if self.eviction == "tag":
                    self._unfile(b)
                taken += 1
            b.ref += 1
        return taken

    def _unfile(self, b: Block) -> None:
        """``tag``: the block leaves its agent's free blocks."""
        group = self.free_by_agent[b.owner]
        del group[b]
        if not group:
            del self.free_by_agent[b.owner]

    def evict_for(self, n: int, free: int) -> None:
        """``n`` blocks are taken from the head of a free queue of ``free`` blocks: the unkeyed
        ones first, then cached ones, which lose their key: under ``lru`` the least recently freed
        first; under ``tag``, see ``_evict_by_tag``."""
        lru = self.lru
        over = n - (free - len(lru))
        if over <= 0:
            return
        self.evictions += over
        if self.eviction == "tag":
            self._evict_by_tag(over)
            return
        m = self.map
        for _ in range(over):
            b, _ = lru.popitem(last=False)
            blocks = m[b.key]
            blocks.remove(b)
            if not blocks:
                del m[b.key]

    def _evict_by_tag(self, over: int) -> None:
        """Evict ``over`` free cached blocks, those of the sessions whose next tag comes last first:
        first the blocks of agents with no tag (not known to the core: finished, or never arrived;
        or under a policy without a clock) in vLLM's order, then agent by agent by descending tag,
        each agent's blocks in vLLM's order (the least recently freed first, a request's tail
        first); equal tags merge in vLLM's order. Tags are read now, once per eviction: the core
        moves them at arrivals, retags, pauses and finishes. When no agent has a tag this is
        exactly vLLM's order (a policy without a clock falls back to LRU)."""
        groups = self.free_by_agent
        heap = []
        for agent, group in groups.items():
            tag = self.next_tag(agent)
            head = next(iter(group)).freed
            heap.append((0, 0.0, head, agent) if tag is None else (1, -tag, head, agent))
        heapq.heapify(heap)
        lru, m = self.lru, self.map
        while over:
            rank, tag, _, agent = heap[0]
            group = groups[agent]
            # the agent's blocks go in a row while no other agent shares its place (its rank and tag)
            alone = all(e[:2] > (rank, tag) for e in heap[1:3])
            take = min(over, len(group)) if alone else 1
            over -= take
            for _ in range(take):
                b, _ = group.popitem(last=False)
                del lru[b]
                blocks = m[b.key]
                blocks.remove(b)
                if not blocks:
                    del m[b.key]
            if group:
                heapq.heapreplace(heap, (rank, tag, next(iter(group)).freed, agent))
            else:
                heapq.heappop(heap)
                del groups[agent]

    def cache_upto(self, r, num_tokens: int) -> None:
        """vLLM's ``cache_blocks``: the request's blocks that ``num_tokens`` fill are cached (a key
        may then have several blocks; a lookup finds the first inserted)."""
        c = self.content(r)
        if c is None:
            return
        held = c.held
        full = num_tokens // self.bs
        m = self.map
        for k in range(len(held), full):
            b = Block(self.key(c, k))
            held.append(b)
            blocks = m.get(b.key)
            if blocks is None:
                m[b.key] = [b]
            else:
                blocks.append(b)

    def hold(self, r, hits: list[Block]) -> None:
        """The request now holds ``hits`` (touched) as its first blocks."""
        c = self.content(r)
        if c is not None:
            c.held = list(hits)

    def release(self, r) -> int:
        """vLLM's ``free``: the request's blocks are freed in reverse order, so its cached blocks
        go to the back of the free queue last block first (and are evicted in that order); return
        how many cached blocks became free (its uncached blocks all do)."""
        c = self._content.get(r)
        if c is None or not c.held:
            return 0
        freed = 0
        lru = self.lru
        by_tag = self.eviction == "tag"
        for b in reversed(c.held):
            b.ref -= 1
            if b.ref == 0:
                lru[b] = None
                freed += 1
                if by_tag:  # the block is now the freeing request's session's
                    self._frees += 1
                    b.owner, b.freed = r.agent_id, self._frees
                    group = self.free_by_agent.get(r.agent_id)
                    if group is None:
                        group = self.free_by_agent[r.agent_id] = OrderedDict()
                    group[b] = None
        c.held = []
        return freed

    def held(self, r) -> int:
        c = self._content.get(r)
        return 0 if c is None else len(c.held)
