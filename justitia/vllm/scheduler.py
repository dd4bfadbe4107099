"""``JustitiaScheduler``: vLLM's scheduler with its waiting queue ordered by a justitia policy.

Use it as ``LLM(..., scheduler_cls=JustitiaScheduler, scheduling_policy="priority")`` or
``--scheduler-cls justitia.vllm.scheduler.JustitiaScheduler --scheduling-policy priority``.
Configuration comes from the environment (vLLM starts the scheduler in its own process):

    JUSTITIA_POLICY        fcfs|sjf|parrot|vtc|srjf|justitia|las   (default justitia)
    JUSTITIA_COST          kv|compute: the cost model of the clock and the charges (default kv)
    JUSTITIA_CAPACITY      the virtual clock's M, in cost units per second; if unset,
                           M = KV tokens / JUSTITIA_ITERATION_S
    JUSTITIA_ITERATION_S   nominal seconds of a memory-saturated step (default 0.02)
    JUSTITIA_AGENT_IDLE_S  an agent with no open request for this long is released even if
                           it never sent ``agent_done`` (default 60)
    JUSTITIA_LOG_AGENTS    1: log one INFO line per agent arrival and release
    JUSTITIA_CONTROL       1: accept ``justitia_control`` requests (below); off by default,
                           because on a shared server any client could send one

Per-request metadata comes from ``SamplingParams.extra_args`` (``vllm_xargs`` on the OpenAI
server): ``agent_id`` (absent: the request is an agent of its own), ``agent_type``,
``agent_cost`` (predicted total KV token-iterations of the agent), ``request_cost`` (this
request's), ``agent_done`` (true on the agent's last stage: its state is released when those
requests finish). Missing costs are estimated as ``p*d + d^2/2`` from the prompt and
``max_tokens``.

Control (only with ``JUSTITIA_CONTROL=1``; the bench runner uses it to reuse one engine across
policies): a request whose ``extra_args`` hold ``justitia_control: {"policy", "cost",
"capacity_per_s", "step_log"}`` sent to an idle engine replaces the policy state with a fresh one,
restarts the scheduler's clock and, with ``step_log``, appends one CSV line per engine step to
that file: ``t_s,batched_tokens,decode_context_tokens,prefill_reqs,decode_reqs,busy_after,preemptions``
(``busy_after`` = 1 when the next step follows at once; the calibration fits only those).
The control request itself is then served as a one-request agent.

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

from vllm.logger import init_logger
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from justitia.policies import Charge, RequestInfo, make_policy
from justitia.scheduler import AgentBook, AgentScheduler

logger = init_logger("vllm.justitia")  # under "vllm": vLLM configures handlers for that tree only


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


def _probe(agent_id: str) -> RequestInfo:
    """A stand-in request of ``agent_id``, to read the agent's current key."""
    return RequestInfo("", agent_id, -1, 0, 0.0)


class JustitiaScheduler(Scheduler):
    """vLLM's v1 scheduler whose waiting order and preemption victims follow a justitia policy."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # vLLM keeps one block back (its null block): the rest is what requests can hold.
        blocks = self.kv_cache_manager.block_pool.get_num_free_blocks()
        self.kv_tokens = blocks * self.cache_config.block_size
        self.allow_control = os.environ.get("JUSTITIA_CONTROL") == "1"
        self.log_agents = os.environ.get("JUSTITIA_LOG_AGENTS") == "1"
        self.idle_release_s = float(os.environ.get("JUSTITIA_AGENT_IDLE_S", "60"))
        capacity = os.environ.get("JUSTITIA_CAPACITY")
        if capacity is None:
            capacity = self.kv_tokens / float(os.environ.get("JUSTITIA_ITERATION_S", "0.02"))
        self._step_log = None
        self._reset(os.environ.get("JUSTITIA_POLICY", "justitia"), os.environ.get("JUSTITIA_COST", "kv"),
                    float(capacity), None)
        self.waiting = _CoreQueue(self)

    def _reset(self, policy: str, cost: str, capacity_per_s: float, step_log: str | None) -> None:
        """Fresh policy state and clock (at start-up, or on a control request to an idle engine)."""
        self.book = AgentBook(AgentScheduler(make_policy(policy, capacity_per_s, cost)), cost, self.idle_release_s,
                              logger)
        self.core = self.book.core
        self.uses_service = self.core.uses_service
        self.infos: dict[str, RequestInfo] = self.book.infos  # the open requests, by request id
        self.t0 = time.monotonic()
        if self._step_log is not None:
            self._step_log.close()
        self._step_log = open(step_log, "a", buffering=1 << 16) if step_log else None
        self._last_step: list | None = None
        self._preemptions = 0

    # ------------------------------------------------------------------------------ requests
    def _control(self, request: Request, meta: dict) -> None:
        control = meta.get("justitia_control")
        if control is None or not self.allow_control:
            return
        if any(rid != request.request_id for rid in self.requests) or self.infos:
            logger.warning("justitia: control request %s ignored: the engine is not idle", request.request_id)
            return
        try:
            self._reset(str(control.get("policy", "justitia")), str(control.get("cost", "kv")),
                        float(control["capacity_per_s"]), control.get("step_log"))
        except (AttributeError, KeyError, TypeError, ValueError, OSError) as exc:
            logger.warning("justitia: control request %s ignored: %s", request.request_id, exc)

    def _queue(self, request: Request) -> None:
        """Register a request with the core (first time) or requeue it, and stamp its key."""
        info = self.infos.get(request.request_id)
        if info is not None:
            self.core.requeue(info)
        else:
            meta = _meta(request)
            if "justitia_control" in meta:
                self._control(request, meta)
            max_tokens = getattr(request.sampling_params, "max_tokens", None) or 256
            info, agent = self.book.arrive(request.request_id, meta, request.num_prompt_tokens, max_tokens,
                                           self._now())
            if agent is not None and self.log_agents:
                logger.info("justitia: agent %s arrived: type=%r predicted_cost=%.6g key=%s", agent.agent_id,
                            agent.agent_type, agent.predicted_cost, self.core.policy.key(_probe(agent.agent_id)))
        request.priority = self.core.policy.key(info)

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _free_request(self, request: Request, *args, **kwargs):
        """A finished or aborted request releases its policy state (and its agent's, when done)."""
        if request.request_id in self.infos:
            self.waiting.remove_requests([request])
            agent_id = self.infos[request.request_id].agent_id
            self.book.finish(request.request_id, self._now())
            if self.log_agents and not self.core.has_agent(agent_id):
                logger.info("justitia: agent %s released", agent_id)
        return super()._free_request(request, *args, **kwargs)

    # --------------------------------------------------------------------------------- steps
    def schedule(self, *args, **kwargs):
        """vLLM's step, with keys refreshed before it and the service it scheduled charged after."""
        now_s = self._now()
        for agent_id in self.book.sweep(now_s):
            if self.log_agents:
                logger.info("justitia: agent %s released (idle)", agent_id)
        policy = self.core.policy
        if policy.dynamic:  # a dynamic policy's key is its agent's key, then the request's seq
            agent_keys: dict[str, tuple] = {}
            for request in self.running:
                info = self.infos.get(request.request_id)
                if info is not None:
                    head = agent_keys.get(info.agent_id)
                    if head is None:
                        head = agent_keys[info.agent_id] = policy.agent_key(info.agent_id)
                    request.priority = head + (info.seq,)
        output = super().schedule(*args, **kwargs)
        charge = self.uses_service
        if charge or self._step_log is not None:
            batched = ctx = prefills = decodes = 0
            per_agent: dict[str, list] = {}  # agent -> [a request, prefill, decode, kv]: charges add up
            for request_id, n in output.num_scheduled_tokens.items():
                request = self.requests.get(request_id)
                if request is None:
                    continue
                before = request.num_computed_tokens - n  # vLLM has already added this step's
                step = Charge.for_step(before, n, request.num_tokens, request.num_output_tokens)
                if charge and (info := self.infos.get(request_id)) is not None:
                    acc = per_agent.get(info.agent_id)
                    if acc is None:
                        per_agent[info.agent_id] = [info, step.prefill_tokens, step.decode_tokens, step.kv_token_iters]
                    else:
                        acc[1] += step.prefill_tokens
                        acc[2] += step.decode_tokens
                        acc[3] += step.kv_token_iters
                batched += n
                if step.prefill_tokens:
                    prefills += 1
                else:
                    decodes += 1
                    ctx += step.kv_token_iters
            for info, prefill, decode, kv in per_agent.values():
                self.core.charge(info, Charge(prefill, decode, kv))
            if self._step_log is not None:
                self._last_step = [now_s, batched, ctx, prefills, decodes]
        return output

    def _preempt_request(self, *args, **kwargs):
        """vLLM's recompute preemption (the victim comes back through the waiting queue)."""
        self._preemptions += 1
        return super()._preempt_request(*args, **kwargs)

    def update_from_output(self, *args, **kwargs):
        """vLLM's bookkeeping after a step; with a step log, the step is written out."""
        outputs = super().update_from_output(*args, **kwargs)
        if self._step_log is not None and self._last_step is not None:
            t, batched, ctx, prefills, decodes = self._last_step
            busy = int(self.has_unfinished_requests())
            self._step_log.write(f"{t:.6f},{batched},{ctx},{prefills},{decodes},{busy},{self._preemptions}\n")
            self._last_step = None
            self._preemptions = 0
        return outputs

    def shutdown(self) -> None:
        """Flush the step log with the engine."""
        if self._step_log is not None:
            self._step_log.close()
            self._step_log = None
        super().shutdown()
