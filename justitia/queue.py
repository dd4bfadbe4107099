"""Waiting requests, kept in a policy's order.

Static policies (keys fixed once a request is queued) use one heap. Dynamic policies order
agents by ``agent_key`` and requests inside an agent by arrival, so the queue keeps one heap per
agent and scans the backlogged agents for the smallest key. Either way the queue tells the policy
when an agent becomes backlogged, which VTC's lift rule needs.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from justitia.policies.base import Charge, Policy, RequestInfo


class WaitingQueue:
    """The requests waiting for admission, in ``policy`` order."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._heap: list[tuple[tuple, int, RequestInfo]] = []  # static policies only
        self._by_agent: dict[str, list[tuple[int, RequestInfo]]] = {}
        self._live: dict[str, RequestInfo] = {}
        self._token: dict[str, int] = {}  # heap entry that is current for each waiting request
        self._pushes = 0

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

    def add(self, req: RequestInfo) -> None:
        """Queue a new or preempted request."""
        if req.request_id in self._live:
            raise ValueError(f"request '{req.request_id}' is already waiting.")
        self._live[req.request_id] = req
        group = self._by_agent.get(req.agent_id)
        if group is None:
            self.policy.backlogged(req.agent_id, self._by_agent.keys())
            group = self._by_agent[req.agent_id] = []
        heapq.heappush(group, (req.seq, req))
        if not self.policy.dynamic:
            self._pushes += 1
            self._token[req.request_id] = self._pushes
            heapq.heappush(self._heap, (self.policy.key(req), self._pushes, req))

    def peek(self, extra: dict[str, Charge] | None = None) -> RequestInfo | None:
        """The next request to admit, or None; a dynamic policy's keys may include ``extra``."""
        if not self._live:
            return None
        if not self.policy.dynamic:
            while self._token.get(self._heap[0][2].request_id) != self._heap[0][1]:
                heapq.heappop(self._heap)
            return self._heap[0][2]
        return self.agent_head(self.next_agent(extra))

    def next_agent(self, extra: dict[str, Charge] | None = None, among=None) -> str:
        """The backlogged agent a dynamic policy serves next (``among`` limits the candidates)."""
        key = self.policy.agent_key
        candidates = self._by_agent if among is None else among
        if extra:
            return min(candidates, key=lambda a: key(a, extra[a]) if a in extra else key(a))
        return min(candidates, key=key)

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
        self._token.pop(req.request_id, None)
