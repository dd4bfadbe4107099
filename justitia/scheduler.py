"""The scheduling core that an engine drives: one policy, its waiting queue, agent bookkeeping.

The simulator and the vLLM plug-in both talk to this class and nothing else of the core. It knows
nothing about KV blocks or iterations: the engine decides what fits and reports what it served.
"""

from __future__ import annotations

from typing import Iterable

from justitia.policies.base import AgentInfo, Charge, Policy, RequestInfo
from justitia.queue import WaitingQueue


class AgentScheduler:
    """Agent-aware request ordering for one engine."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.waiting = WaitingQueue(policy)
        self._agents: dict[str, AgentInfo] = {}
        self._open: dict[str, int] = {}  # agent id -> requests not yet finished
        self._agent_seq = 0
        self._request_seq = 0

    def agent_arrived(self, agent_id: str, agent_type: str, predicted_cost: float, now_s: float) -> AgentInfo:
        """Register an agent with its predicted total cost."""
        if agent_id in self._agents:
            raise ValueError(f"agent '{agent_id}' has already arrived.")
        info = AgentInfo(agent_id, agent_type, self._agent_seq, now_s, predicted_cost)
        self._agent_seq += 1
        self._agents[agent_id] = info
        self._open[agent_id] = 0
        self.policy.agent_arrived(info, now_s)
        return info

    def request_arrived(self, request_id: str, agent_id: str, prompt_tokens: int, predicted_cost: float) -> RequestInfo:
        """Queue a new request of a registered agent."""
        if agent_id not in self._agents:
            raise KeyError(f"request '{request_id}': agent '{agent_id}' has not arrived.")
        req = RequestInfo(request_id, agent_id, self._request_seq, prompt_tokens, predicted_cost)
        self._request_seq += 1
        self._open[agent_id] += 1
        self.waiting.add(req)
        return req

    def has_agent(self, agent_id: str) -> bool:
        """Whether the agent has arrived and not finished."""
        return agent_id in self._agents

    def open_requests(self, agent_id: str) -> int:
        """The agent's requests that have arrived and not finished."""
        return self._open.get(agent_id, 0)

    @property
    def uses_service(self) -> bool:
        """Whether the policy reads the service charged to it (engines may skip charging if not)."""
        return type(self.policy).charge is not Policy.charge

    def requeue(self, req: RequestInfo) -> None:
        """Put a preempted request back among the waiting."""
        self.waiting.add(req)

    def charge(self, req: RequestInfo, service: Charge) -> None:
        """Report service the engine scheduled for ``req``."""
        self.policy.charge(req, service)
        if self.policy.dynamic:
            self.waiting.touch(req.agent_id)

    def request_finished(self, req: RequestInfo) -> None:
        """A running or waiting request finished or was aborted."""
        if req in self.waiting:
            self.waiting.remove(req)
        self._open[req.agent_id] -= 1

    def agent_finished(self, agent_id: str, now_s: float) -> None:
        """The agent is done (or cancelled): release every bit of its policy state."""
        for req in self.waiting.requests_of(agent_id):
            self.request_finished(req)
        self._agents.pop(agent_id, None)
        self._open.pop(agent_id, None)
        self.policy.agent_finished(agent_id, now_s)

    def victim(self, running: Iterable[RequestInfo]) -> RequestInfo:
        """The running request to preempt first: the one with the lowest priority."""
        return max(running, key=self.policy.key)
