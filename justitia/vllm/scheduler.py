"""``JustitiaScheduler``: vLLM's scheduler with its waiting queue ordered by a justitia policy.

Use it as ``LLM(..., scheduler_cls=JustitiaScheduler, scheduling_policy="priority")`` or
``--scheduler-cls justitia.vllm.scheduler.JustitiaScheduler --scheduling-policy priority``.
Configuration comes from the environment (vLLM starts the scheduler in its own process):

    JUSTITIA_POLICY        fcfs|sjf|parrot|vtc|srjf|justitia|las   (default justitia)
    JUSTITIA_ITERATION_S   nominal seconds of a memory-saturated step, for the virtual clock's
                           capacity M = KV tokens / JUSTITIA_ITERATION_S   (default 0.02)

Per-request metadata comes from ``SamplingParams.extra_args`` (``vllm_xargs`` on the OpenAI
server): ``agent_id`` (absent: the request is an agent of its own), ``agent_type``,
``agent_cost`` (predicted total KV token-iterations of the agent), ``request_cost`` (this
request's), ``agent_done`` (true on the agent's last stage: its state is released when those
requests finish). Missing costs are estimated as ``p*d + d^2/2`` from the prompt and
``max_tokens``.

NOTE: the policy lives in the core (``justitia.scheduler.AgentScheduler``), as in the simulator.
This class only translates: vLLM's queue calls become core calls, each step's scheduled tokens
become charges, and every waiting and running request carries its policy key as ``priority``,
so vLLM's own preemption rule (largest ``(priority, arrival_time)``) picks the lowest-priority
victim. Pinned to vLLM 0.32: the scheduler internals it relies on are not a public interface.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from justitia.cost import kv_token_iters
from justitia.policies import Charge, RequestInfo, make_policy
from justitia.scheduler import AgentScheduler


def _meta(request: Request) -> dict:
    sp = request.sampling_params
    return (getattr(sp, "extra_args", None) or {}) if sp is not None else {}


class _CoreQueue(RequestQueue):
    """vLLM's waiting queue, kept in the order of a justitia ``AgentScheduler``."""

    def __init__(self, plugin: "JustitiaScheduler"):
        self.plugin = plugin
        self.requests: dict[str, Request] = {}

    def add_request(self, request: Request) -> None:
        """A new request, or one coming back."""
        self.plugin._queue(request)
        self.requests[request.request_id] = request

    def prepend_request(self, request: Request) -> None:
        """A preempted or skipped request goes back; its policy key decides where."""
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Several requests go back."""
        for request in requests:
            self.add_request(request)

    def peek_request(self) -> Request:
        """The request the policy admits next."""
        info = self.plugin.core.waiting.peek()
        if info is None:
            raise IndexError("peek from an empty waiting queue")
        return self.requests[info.request_id]

    def pop_request(self) -> Request:
        """Remove and return the request the policy admits next."""
        request = self.peek_request()
        self.remove_request(request)
        return request

    def remove_request(self, request: Request) -> None:
        """Take a request out (admitted or aborted)."""
        info = self.plugin.infos[request.request_id]
        self.plugin.core.waiting.remove(info)
        del self.requests[request.request_id]

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Take several requests out; ones not waiting here are ignored."""
        for request in requests:
            if request.request_id in self.requests:
                self.remove_request(request)

    def __bool__(self) -> bool:
        return bool(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self.requests.values()))


class JustitiaScheduler(Scheduler):
    """vLLM's v1 scheduler whose waiting order and preemption victims follow a justitia policy."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        name = os.environ.get("JUSTITIA_POLICY", "justitia")
        iteration_s = float(os.environ.get("JUSTITIA_ITERATION_S", "0.02"))
        blocks = self.kv_cache_manager.block_pool.num_gpu_blocks
        self.kv_tokens = blocks * self.cache_config.block_size
        self.core = AgentScheduler(make_policy(name, self.kv_tokens / iteration_s))
        self.infos: dict[str, RequestInfo] = {}
        self.agent_done: set[str] = set()  # agents whose last stage has been submitted
        self.t0 = time.monotonic()
        self.waiting = _CoreQueue(self)

    # ------------------------------------------------------------------------------ requests
    def _queue(self, request: Request) -> None:
        """Register a request with the core (first time) or requeue it, and stamp its key."""
        info = self.infos.get(request.request_id)
        if info is not None:
            self.core.requeue(info)
        else:
            meta = _meta(request)
            agent_id = str(meta.get("agent_id") or request.request_id)
            max_tokens = getattr(request.sampling_params, "max_tokens", None) or 256
            request_cost = float(meta.get("request_cost", kv_token_iters(request.num_prompt_tokens, max_tokens)))
            if not self.core.has_agent(agent_id):
                cost = float(meta.get("agent_cost", request_cost))
                self.core.agent_arrived(agent_id, str(meta.get("agent_type", "")), cost, self._now())
            if meta.get("agent_done") or "agent_id" not in meta:
                self.agent_done.add(agent_id)
            info = self.core.request_arrived(request.request_id, agent_id, request.num_prompt_tokens, request_cost)
            self.infos[request.request_id] = info
        request.priority = self.core.policy.key(info)

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _free_request(self, request: Request, *args, **kwargs):
        """A finished or aborted request releases its policy state (and its agent's, when done)."""
        info = self.infos.pop(request.request_id, None)
        if info is not None:
            self.waiting.remove_requests([request])
            self.core.request_finished(info)
            agent_id = info.agent_id
            if agent_id in self.agent_done and self.core.open_requests(agent_id) == 0:
                self.agent_done.discard(agent_id)
                self.core.agent_finished(agent_id, self._now())
        return super()._free_request(request, *args, **kwargs)

    # --------------------------------------------------------------------------------- steps
    def schedule(self, *args, **kwargs):
        """vLLM's step, with keys refreshed before it and the service it scheduled charged after."""
        if self.core.policy.dynamic:
            key = self.core.policy.key
            for request in self.running:
                info = self.infos.get(request.request_id)
                if info is not None:
                    request.priority = key(info)
        output = super().schedule(*args, **kwargs)
        if self.core.uses_service:
            for request_id, n in output.num_scheduled_tokens.items():
                info = self.infos.get(request_id)
                request = self.requests.get(request_id)
                if info is None or request is None:
                    continue
                before = request.num_computed_tokens - n  # vLLM has already added this step's
                self.core.charge(info, Charge.for_step(before, n, request.num_tokens, request.num_output_tokens))
        return output
