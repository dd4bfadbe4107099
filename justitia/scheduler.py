"""The scheduling core that an engine drives: one policy, its waiting queue, agent bookkeeping.

The simulator and the vLLM plug-in both talk to this class and nothing else of the core. It knows
nothing about KV blocks or iterations: the engine decides what fits and reports what it served.
"""

from __future__ import annotations

import logging
import math
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

    @property
    def agent_count(self) -> int:
        """Agents that have arrived and not finished (holding policy state)."""
        return len(self._agents)

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


class AgentBook:
    """Agents known only through their requests' metadata, kept in an ``AgentScheduler``.

    An engine that receives loose requests (the vLLM plug-in; the server's upstream front end)
    learns about agents from each request's metadata: ``agent_id`` (absent: the request is an
    agent of its own), ``agent_type``, ``agent_cost`` (the agent's predicted total),
    ``request_cost`` (this request's) and ``agent_done`` (the agent's last stage). An agent is
    registered by its first request and released when its ``agent_done`` requests have all
    finished, when ``release`` is called, or after ``idle_release_s`` with no open request.
    Missing costs are estimated as ``cost.request_cost(prompt, max_tokens)``.
    """

    def __init__(self, core: AgentScheduler, cost: str = "kv", idle_release_s: float = 60.0,
                 log: logging.Logger | None = None):
        from justitia.cost import cost_model

        self.core = core
        self.cost = cost_model(cost)
        self.idle_release_s = idle_release_s
        self.log = log or logging.getLogger("justitia")
        self.infos: dict[str, RequestInfo] = {}  # open requests
        self.agent_done: set[str] = set()  # agents whose last stage has arrived
        self.idle_since: dict[str, float] = {}  # agents with no open request, since when
        self._next_sweep_s = 0.0

    @classmethod
    def tagging(cls, policy: str, capacity_per_s: float, cost: str = "kv", idle_release_s: float = 60.0,
                log: logging.Logger | None = None) -> "AgentBook":
        """A book for front-end tagging (``tag``): only policies whose keys are fixed on arrival qualify."""
        from justitia.policies import make_policy

        core = AgentScheduler(make_policy(policy, capacity_per_s, cost))
        if core.policy.dynamic:
            raise ValueError(f"policy '{policy}' changes its keys as service accrues, which a front end cannot see; "
                             "front-end tagging supports only fcfs, sjf, parrot and justitia.")
        return cls(core, cost, idle_release_s, log)

    def register(self, agent_id: str, agent_type: str, predicted_cost: float, now_s: float) -> AgentInfo | None:
        """Register an agent ahead of its requests; its info if it is new, None if it is known."""
        if self.core.has_agent(agent_id):
            return None
        return self.core.agent_arrived(agent_id, agent_type, predicted_cost, now_s)

    def arrive(self, request_id: str, meta: dict, prompt_tokens: int, max_tokens: int,
               now_s: float) -> tuple[RequestInfo, AgentInfo | None]:
        """Queue a new request; returns its info and its agent's if the request brought a new one."""
        agent_id = str(meta.get("agent_id") or request_id)
        request_cost = self.meta_cost(meta, "request_cost", self.cost.request_cost(prompt_tokens, max_tokens),
                                      request_id)
        new = self.register(agent_id, str(meta.get("agent_type", "")),
                            self.meta_cost(meta, "agent_cost", request_cost, request_id), now_s)
        self.idle_since.pop(agent_id, None)
        if meta.get("agent_done") or "agent_id" not in meta:
            self.agent_done.add(agent_id)
        info = self.core.request_arrived(request_id, agent_id, prompt_tokens, request_cost)
        self.infos[request_id] = info
        return info, new

    def tag(self, request_id: str, meta: dict, prompt_tokens: int, max_tokens: int,
            now_s: float) -> tuple[RequestInfo, int]:
        """Front-end tagging: a request that another engine will queue (stock vLLM with
        ``scheduling_policy="priority"``); returns its info and its key as vLLM's int ``priority``.
        ``finish`` it when the engine is done with it."""
        info, _ = self.arrive(request_id, meta, prompt_tokens, max_tokens, now_s)
        self.core.waiting.remove(info)  # the engine queues it; this book only tags it
        return info, int_priority(self.core.policy.key(info))

    def finish(self, request_id: str, now_s: float) -> RequestInfo | None:
        """A request finished or was aborted; its agent is released if that was its last."""
        info = self.infos.pop(request_id, None)
        if info is None or not self.core.has_agent(info.agent_id):
            return info
        self.core.request_finished(info)
        if self.core.open_requests(info.agent_id) == 0:
            if info.agent_id in self.agent_done:
                self.release(info.agent_id, now_s)
            else:
                self.idle_since[info.agent_id] = now_s
        return info

    def release(self, agent_id: str, now_s: float) -> bool:
        """Release the agent's policy state now (a no-op if it is not known); True if it was."""
        self.agent_done.discard(agent_id)
        self.idle_since.pop(agent_id, None)
        if not self.core.has_agent(agent_id):
            return False
        self.core.agent_finished(agent_id, now_s)
        return True

    def sweep(self, now_s: float) -> list[str]:
        """Release the agents idle for ``idle_release_s`` (checked at most once a second)."""
        if not self.idle_since or now_s < self._next_sweep_s:
            return []
        self._next_sweep_s = now_s + 1.0
        stale = [a for a, since in self.idle_since.items() if now_s - since >= self.idle_release_s]
        for agent_id in stale:
            self.release(agent_id, now_s)
        return stale

    def meta_cost(self, meta: dict, key: str, default: float, request_id: str) -> float:
        """A cost from request metadata; a bad value is logged and replaced (it must not stop an engine)."""
        value = meta.get(key)
        if value is None:
            return default
        try:
            cost = float(value)
        except (TypeError, ValueError):
            cost = math.nan
        if not (math.isfinite(cost) and cost >= 0):
            self.log.warning("justitia: request %s: %s=%r is not a finite number >= 0; using %.6g",
                             request_id, key, value, default)
            return default
        return cost


def int_priority(key: tuple) -> int:
    """vLLM wants an int priority; the key's leading number decides (vLLM breaks ties by arrival)."""
    head = key[0]
    if not isinstance(head, (int, float)):
        raise ValueError(f"cannot turn policy key {key!r} into an int priority.")
    return int(round(head))
