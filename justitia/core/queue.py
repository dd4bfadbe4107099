"""Waiting requests, kept in a policy's order.

Static policies (keys fixed once a request is queued) use one heap of requests. Dynamic policies
order agents by ``agent_key`` and requests inside an agent by arrival: the queue keeps one heap
per agent and a heap of backlogged agents, which it re-keys for the agents whose service changed
(``touch``). Either way the queue tells the policy when an agent becomes backlogged, which VTC's
lift rule needs; a dynamic policy is told the other backlogged agents smallest key first, so the
lift reads one counter, not every backlogged agent's.

A grouping policy (``Policy.groups``: justitia and vtc with tenants) puts some requests in groups:
a group's requests wait in a heap by ``inner_key`` (fixed while they wait), and the group is filed
under ``group_key`` of its head request, re-read when the head changes or the policy says the
group's key moved (``take_dirty``). The next request is the smaller of the best group's head and the
best request outside any group, so a group costs O(log n) per request, however many agents it has.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from justitia.core.cost import Charge
from justitia.core.policies.base import Policy, RequestInfo


class WaitingQueue:
    """The requests waiting for admission, in ``policy`` order."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._heap: list[tuple[tuple, int, RequestInfo]] = []  # static policies: requests
        self._token: dict[str, int] = {}  # the heap entry that is current for each waiting request
        self._pushes = 0
        self._by_agent: dict[str, list[tuple[int, RequestInfo]]] = {}
        self._live: dict[str, RequestInfo] = {}
        self._agents: list[tuple[tuple, str]] = []  # dynamic policies: backlogged agents by key
        self._agent_key: dict[str, tuple] = {}  # the key each backlogged agent is filed under
        self._dirty: set[str] = set()
        self._grouped = policy.groups
        self._lifts = policy.lifts_on_backlog
        self._gheap: dict[str, list[tuple[tuple, int, RequestInfo]]] = {}  # group -> its waiting requests
        self._agent_group: dict[str, str] = {}  # backlogged agents in a group -> the group
        self._groots: list[tuple[tuple, str]] = []  # groups by key (stale entries skipped)
        self._gkey: dict[str, tuple] = {}  # the key each group is filed under
        self._gdirty: set[str] = set()
        self._ungrouped = 0  # waiting requests outside any group
        self._gcount: dict[str, int] = {}  # group -> its waiting requests

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, req: RequestInfo) -> bool:
        return self._live.get(req.request_id) is req

    def __iter__(self) -> Iterator[RequestInfo]:
        """Waiting requests, in no particular order."""
        return iter(list(self._live.values()))

    def agents(self) -> list[str]:
        """The backlogged agents: those with at least one waiting request."""
        return list(self._by_agent)

    def is_backlogged(self, agent_id: str) -> bool:
        """Whether the agent has a waiting request."""
        return agent_id in self._by_agent

    def add(self, req: RequestInfo) -> None:
        """Queue a new or preempted request."""
        if req.request_id in self._live:
            raise ValueError(f"request '{req.request_id}' is already waiting.")
        if self._grouped and (g := self.policy.group_of(req)) is not None:
            self._add_grouped(req, g)
            return
        self._ungrouped += 1
        self._live[req.request_id] = req
        group = self._by_agent.get(req.agent_id)
        if group is None:
            if self._lifts:
                self.policy.backlogged(req.agent_id, self._others())
            group = self._by_agent[req.agent_id] = []
            if self.policy.dynamic:
                self._file(req.agent_id)
        heapq.heappush(group, (req.seq, req))
        if not self.policy.dynamic:
            self._pushes += 1
            self._token[req.request_id] = self._pushes
            heapq.heappush(self._heap, (self.policy.key(req), self._pushes, req))

    def _add_grouped(self, req: RequestInfo, g: str) -> None:
        self._live[req.request_id] = req
        agent = self._by_agent.get(req.agent_id)
        if agent is None:
            if self._lifts and not self._gcount.get(g):  # the group becomes backlogged
                self.policy.backlogged(req.agent_id, self._others())
            agent = self._by_agent[req.agent_id] = []
            self._agent_group[req.agent_id] = g
        heapq.heappush(agent, (req.seq, req))
        self._pushes += 1
        self._token[req.request_id] = self._pushes
        self._gcount[g] = self._gcount.get(g, 0) + 1
        heap = self._gheap.setdefault(g, [])
        heapq.heappush(heap, (self.policy.inner_key(req), self._pushes, req))
        if heap[0][2] is req:
            self._gdirty.add(g)

    def _others(self) -> Iterator[str]:
        """Backlogged agents for the policy's ``backlogged`` hook, smallest key first where keys move:
        the best group's head agent or the best agent outside groups first, whichever is smaller."""
        outside = self.in_order() if self.policy.dynamic else iter(list(self._by_agent))
        best = self._best_group()
        if best is None:
            yield from outside
            return
        head_agent = self._gheap[best[1]][0][2].agent_id
        first = next(outside, None)
        if first is None or not self.policy.dynamic or self._agent_group.get(first) is not None:
            yield head_agent
        elif best[0] < self.policy.agent_key(first) + (self.agent_head(first).seq,):
            yield head_agent
        if first is not None:
            yield first
        yield from outside

    def _refresh_groups(self) -> None:
        dirty = self._gdirty | self.policy.take_dirty()
        self._gdirty = set()
        for g in dirty:
            heap = self._gheap.get(g)
            while heap and self._token.get(heap[0][2].request_id) != heap[0][1]:
                heapq.heappop(heap)
            if not heap:
                self._gheap.pop(g, None)
                self._gkey.pop(g, None)
                self.policy.group_filed(g, None)
                continue
            key = self.policy.group_key(g, heap[0][2])
            if self._gkey.get(g) != key:
                self._gkey[g] = key
                self.policy.group_filed(g, key)
                heapq.heappush(self._groots, (key, g))
                if len(self._groots) > 2 * len(self._gkey) + 16:
                    self._groots = [(k, x) for x, k in self._gkey.items()]
                    heapq.heapify(self._groots)

    def _best_group(self) -> tuple[tuple, str] | None:
        """(key, group) of the group whose head comes first, or None."""
        if not self._gheap and not self._gdirty:
            self.policy.take_dirty()
            return None
        self._refresh_groups()
        roots = self._groots
        while roots and self._gkey.get(roots[0][1]) != roots[0][0]:
            heapq.heappop(roots)
        return roots[0] if roots else None

    def touch(self, agent_id: str) -> None:
        """The agent's dynamic key may have changed (it was charged service)."""
        g = self._agent_group.get(agent_id)
        if g is not None:
            self._gdirty.add(g)
        elif agent_id in self._by_agent:  # one not backlogged is filed at its key when it next is
            self._dirty.add(agent_id)

    def _file(self, agent_id: str) -> None:
        key = self.policy.agent_key(agent_id)
        if self._agent_key.get(agent_id) != key:
            self._agent_key[agent_id] = key
            heapq.heappush(self._agents, (key, agent_id))
            if len(self._agents) > 2 * len(self._agent_key) + 16:  # mostly stale entries: rebuild
                self._agents = [(k, a) for a, k in self._agent_key.items()]
                heapq.heapify(self._agents)

    def _refresh(self) -> None:
        for agent_id in self._dirty:
            if agent_id in self._by_agent and agent_id not in self._agent_group:
                self._file(agent_id)
        self._dirty.clear()

    def best_agent(self, exclude: set[str] | frozenset = frozenset()) -> str | None:
        """The backlogged agent with the smallest current key, leaving out ``exclude``."""
        self._refresh()
        heap, held = self._agents, []
        best = None
        while heap:
            key, agent_id = heap[0]
            if self._agent_key.get(agent_id) != key:
                heapq.heappop(heap)  # stale: re-keyed, or no longer backlogged
            elif agent_id in exclude:
                held.append(heapq.heappop(heap))
            else:
                best = agent_id
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return best

    def in_order(self) -> Iterator[str]:
        """The backlogged agents, smallest current key first, lazily (read before the queue changes)."""
        self._refresh()
        heap, filed, seen = self._agents, self._agent_key, set()
        frontier = [(heap[0], 0)] if heap else []
        while frontier:  # a walk down the heap, smallest entry first, that leaves it as it is
            (key, agent_id), i = heapq.heappop(frontier)
            if filed.get(agent_id) == key and agent_id not in seen:
                seen.add(agent_id)
                yield agent_id
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))

    def peek(self, extra: dict[str, Charge] | None = None) -> RequestInfo | None:
        """The next request to admit, or None; a dynamic policy's keys may include ``extra``."""
        if not self._live:
            return None
        if self._grouped and (self._gheap or self._gdirty):
            best = self._best_group()
            if best is not None:
                head = self._gheap[best[1]][0][2]
                if not self._ungrouped:
                    return head
                other = self._peek_ungrouped(extra)
                return head if best[0] < self.policy.key(other) else other
        return self._peek_ungrouped(extra)

    def _peek_ungrouped(self, extra: dict[str, Charge] | None = None) -> RequestInfo | None:
        if not self._ungrouped:
            return None
        if not self.policy.dynamic:
            while self._token.get(self._heap[0][2].request_id) != self._heap[0][1]:
                heapq.heappop(self._heap)
            return self._heap[0][2]
        if not extra:
            return self.agent_head(self.best_agent())
        key = self.policy.agent_key
        moved = [a for a in extra if a in self._by_agent]
        best = self.best_agent(set(moved))
        candidates = [(key(a, extra[a]), a) for a in moved]
        if best is not None:
            candidates.append((key(best), best))
        return self.agent_head(min(candidates)[1])

    def requests_of(self, agent_id: str) -> list[RequestInfo]:
        """The agent's waiting requests, earliest first."""
        return [req for _, req in sorted(self._by_agent.get(agent_id, []))]

    def agent_head(self, agent_id: str) -> RequestInfo:
        """The agent's earliest waiting request."""
        return self._by_agent[agent_id][0][1]

    def pop(self) -> RequestInfo:
        """Remove and return the next request to admit."""
        req = self.peek()
        if req is None:
            raise IndexError("pop from an empty waiting queue")
        self.remove(req)
        return req

    def remove(self, req: RequestInfo) -> None:
        """Take a request out of the queue (admitted or aborted)."""
        if self._live.get(req.request_id) is not req:
            raise KeyError(f"request '{req.request_id}' is not waiting.")
        del self._live[req.request_id]
        g = self._agent_group.get(req.agent_id)
        if g is not None:
            heap = self._gheap[g]
            if heap[0][2] is req:
                self._gdirty.add(g)
            self._gcount[g] -= 1
            if not self._gcount[g]:  # the group is empty: drop it (and its stale entries) now
                del self._gcount[g], self._gheap[g]
                self._gkey.pop(g, None)
                self.policy.group_filed(g, None)
            elif len(heap) > 2 * self._gcount[g] + 16:  # mostly stale entries: rebuild
                live = [e for e in heap if self._token.get(e[2].request_id) == e[1] and e[2] is not req]
                heapq.heapify(live)
                self._gheap[g] = live
                self._gdirty.add(g)
        else:
            self._ungrouped -= 1
            if not self.policy.dynamic and len(self._heap) > 2 * self._ungrouped + 16:
                # mostly stale entries (a tagging front end never peeks): rebuild
                self._heap = [e for e in self._heap if self._token.get(e[2].request_id) == e[1] and e[2] is not req]
                heapq.heapify(self._heap)
        group = self._by_agent[req.agent_id]
        if group[0][1] is req:
            heapq.heappop(group)
        else:
            group.remove((req.seq, req))
            heapq.heapify(group)
        if not group:
            del self._by_agent[req.agent_id]
            self._agent_key.pop(req.agent_id, None)
            self._agent_group.pop(req.agent_id, None)
        self._token.pop(req.request_id, None)
        if not self._live:  # nothing waits: every entry left in the heaps is stale, dropped now (an idle
            # engine then holds nothing of the agents it served)
            self._heap, self._agents, self._dirty, self._groots = [], [], set(), []
