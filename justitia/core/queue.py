"""Waiting requests, kept in a policy's order.

Static policies (keys fixed once a request is queued) use one heap of requests. Dynamic policies
order agents by ``agent_key`` and requests inside an agent by arrival: the queue keeps one heap
per agent and a heap of backlogged agents, which it re-keys for the agents whose service changed
(``touch``). Either way the queue tells the policy when an agent becomes backlogged, which VTC's
lift rule needs; a dynamic policy is told the other backlogged agents smallest key first, so the
lift reads one counter, not every backlogged agent's.
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
        self._live[req.request_id] = req
        group = self._by_agent.get(req.agent_id)
        if group is None:
            self.policy.backlogged(req.agent_id, self.in_order() if self.policy.dynamic else self._by_agent.keys())
            group = self._by_agent[req.agent_id] = []
            if self.policy.dynamic:
                self._file(req.agent_id)
        heapq.heappush(group, (req.seq, req))
        if not self.policy.dynamic:
            self._pushes += 1
            self._token[req.request_id] = self._pushes
            heapq.heappush(self._heap, (self.policy.key(req), self._pushes, req))

    def touch(self, agent_id: str) -> None:
        """The agent's dynamic key may have changed (it was charged service)."""
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
            if agent_id in self._by_agent:
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
        group = self._by_agent[req.agent_id]
        if group[0][1] is req:
            heapq.heappop(group)
        else:
            group.remove((req.seq, req))
            heapq.heapify(group)
        if not group:
            del self._by_agent[req.agent_id]
            self._agent_key.pop(req.agent_id, None)
        self._token.pop(req.request_id, None)
