"""``JustitiaScheduler``: vLLM's scheduler with its waiting queue ordered by a justitia policy, on
the step-log base (``base.StepLogScheduler``: vLLM's scheduler unchanged, with the step log).

Use it as ``LLM(..., scheduler_cls=JustitiaScheduler, scheduling_policy="priority")`` or
``--scheduler-cls justitia.vllm.plugin.JustitiaScheduler --scheduling-policy priority``.
Configuration comes from the environment (vLLM starts the scheduler in its own process;
``justitia.defaults`` lists the variables and their defaults; ``policy_settings`` reads them):
``JUSTITIA_POLICY`` (default justitia), ``JUSTITIA_COST`` (kv|kv-prefix|compute), ``JUSTITIA_CAPACITY`` (the
clock's M in cost units per second; default: the M of ``JUSTITIA_CALIBRATION``, a ``justitia
calibrate`` file for this KV cache, else what the KV cache, or the token budget for compute,
delivers per ``JUSTITIA_ITERATION_S``), ``JUSTITIA_MEASURE_CAPACITY`` (0: keep that M rather than
measure it), ``JUSTITIA_AGENT_IDLE_S`` (an agent with no open request is released after this),
``JUSTITIA_SESSION_KEEP_S`` (a session with nothing open is released after this),
``JUSTITIA_RETAG`` (0: an agent keeps its first tag), ``JUSTITIA_LOG_AGENTS`` (1: log agents'
arrivals, sessions' returns after a pause, and releases), ``JUSTITIA_CLIENT_PRICES`` (whether
requests' prices, weights and tenants are read) and ``JUSTITIA_DOOR_TOKEN`` (the secret of the door
that checked them).

Per-request metadata comes from ``SamplingParams.extra_args`` (``vllm_xargs`` on the OpenAI
server), read by ``core.protocol.RequestMeta``; missing costs are estimated from the prompt and
``max_tokens``.

Control calls (``core.protocol.ControlCall``) come from the process that started the engine,
through vLLM's utility channel (``AsyncLLM.engine_core.call_utility_async``, which an HTTP client
cannot reach): ``register`` an agent and read its virtual finish tag, ``release`` one, read the policy's
``state`` (its clock included), or ``reset`` an idle engine's policy state (the bench reuses one engine for every
policy). ``reset`` may open a step log, as on the base (``justitia.vllm.base``, which takes ``reset`` alone).
``retire`` with ``turn_end`` releases nothing: the door saw a session's turn end, and the burst the
plug-in priced is learned now (``pricer.BurstPricer.turn_ended``).

NOTE: the policy lives in the core (``justitia.core.AgentScheduler``), as in the simulator. This
class only translates: vLLM's queue calls become core verbs, each step's scheduled tokens become
charges, and every waiting and running request carries its policy key as ``priority``, so vLLM's
own preemption rule (largest ``(priority, arrival_time)``) picks the lowest-priority victim.
Read against vLLM 0.32 and 0.33, as its base is (``SUPPORTED_VLLM``; docs/vllm-versions.md): the
scheduler internals it relies on are not a public interface, so importing either module refuses any
other version. Importing this one also installs the base's control utility on vLLM's ``EngineCore``,
and the names users give vLLM stay here: ``--scheduler-cls justitia.vllm.plugin.StepLogScheduler``
runs the base.

The file is longer than the house's 400 lines: vLLM's scheduler is one class, and every override
here (the queues, the step's charges, the control calls) reads the same policy state of that
class; the step accounting itself lives in ``accounting``, the prices of bursts in ``pricer``.
"""

from __future__ import annotations

import hmac
import json
from typing import Iterable, Iterator

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import PriorityRequestQueue, RequestQueue
from vllm.v1.request import Request

from justitia.core import (
    KV_PREFIX,
    REGISTER,
    RESET,
    RETIRE,
    STATE,
    WINDOW_STEPS,
    AgentBook,
    AgentInfo,
    AgentScheduler,
    Charge,
    ControlCall,
    Registration,
    RequestMeta,
    calibrated_capacity,
    capacity_per_s,
    cost_model,
)
from justitia.defaults import DOOR_KEY, policy_settings
from justitia.vllm.accounting import StepDelivered, prefix_step_charges, step_charges, step_delivered
from justitia.vllm.base import (  # noqa: F401  (named here too)
    ASYNC_VARIANTS,
    SUPPORTED_VLLM,
    AsyncStepLogScheduler,
    StepLogScheduler,
    check_version,
    logger,
)
from justitia.vllm.pricer import BurstPricer


def trusted(extra_args, client_prices: bool | None, door_token: str | None) -> bool:
    """Whether a request's prices, weight and tenant may be read (``JUSTITIA_CLIENT_PRICES``): always
    (1) or never (0); by default, in an engine with no door token (a program's own, in-process) always,
    and in vLLM's OpenAI server only from a request that carries the door's token (the door checked
    its key), compared in constant time."""
    if client_prices is not None:
        return client_prices
    if not door_token:
        return True
    given = (extra_args or {}).get(DOOR_KEY)
    return isinstance(given, str) and hmac.compare_digest(given.encode(), door_token.encode())


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
        info = self.plugin.core.peek()
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
        self.plugin.core.dequeue(self.plugin.book.request(request.request_id))
        del self.requests[request.request_id]

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Take several requests out; ones not waiting here are ignored."""
        for request in requests:
            if request.request_id in self.requests:
                self.remove_request(request)

    def __bool__(self) -> bool:
        """Whether a request may be admitted now: vLLM's admission loop stops when this is false, so
        a request that would pass an agent keeping its place waits (``AgentScheduler.advance``)."""
        return bool(self.requests) and self.plugin.core.peek() is not None

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self.requests.values()))


class _HoldingQueue(PriorityRequestQueue):
    """vLLM's second waiting queue, ``kv_holding_waiting``: requests that already hold KV blocks (a
    streaming session's next chunk, a request skipped mid-prefill), which vLLM drains before
    ``waiting`` so that they never wait behind a request that cannot be allocated. They keep that
    rule; among themselves they are in policy order, and they are on the plug-in's books (charged,
    released) like every other request."""

    def __init__(self, plugin: "JustitiaScheduler"):
        super().__init__()
        self.plugin = plugin

    def add_request(self, request: Request) -> None:
        """A request holding KV blocks: stamped with its policy key (registered if new)."""
        self.plugin._hold(request)
        super().add_request(request)

    def prepend_request(self, request: Request) -> None:
        """Back after a skip; its key decides where."""
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Several back."""
        for request in requests:
            self.add_request(request)


class JustitiaScheduler(StepLogScheduler):
    """vLLM's v1 scheduler whose waiting order and preemption victims follow a justitia policy."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = policy_settings()
        # vLLM keeps one block back (its null block): the rest is what requests can hold.
        blocks = self.kv_cache_manager.block_pool.get_num_free_blocks()
        self.kv_tokens = blocks * self.cache_config.block_size
        self.log_agents = settings.log_agents
        self.client_prices, self.door_token = settings.client_prices, settings.door_token
        self.idle_release_s, self.session_keep_s = settings.agent_idle_s, settings.session_keep_s
        self.iteration_s = settings.iteration_s
        cost = cost_model(settings.cost)
        capacity = (
            settings.capacity_per_s
            or self._calibrated(settings.calibration)
            or capacity_per_s(cost, self.kv_tokens, self.scheduler_config.max_num_batched_tokens, settings.iteration_s)
        )
        # a burst without a price (a harness's turn through the door): priced from the engine's own bursts
        self.pricer = (
            BurstPricer(cost, state=settings.pricing_state, log=logger) if settings.pricing == "online" else None
        )
        self.guard_scale = settings.guard_scale
        self._reset(settings.policy, cost.name, capacity, settings.measure_capacity, None, settings.retag)
        self.waiting = _CoreQueue(self)
        self._cache_hits: dict[
            str, int
        ] = {}  # request id -> prompt tokens vLLM's prefix cache held at its first schedule
        self.kv_holding_waiting = _HoldingQueue(self)

    def _calibrated(self, path: str | None) -> float | None:
        """The M a ``justitia calibrate`` file measured on an engine with this KV cache (``JUSTITIA_CALIBRATION``),
        or None (no file; or another cache: the formula's guess starts the clock, the meter measures it)."""
        if not path:
            return None
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"JUSTITIA_CALIBRATION={path!r}: cannot read a calibration there ({exc}).") from None
        measured = calibrated_capacity(doc, self.kv_tokens)
        if measured is None:
            logger.warning(
                "justitia: %s measured no M for a KV cache of %d tokens; the clock starts from the formula's guess",
                path,
                self.kv_tokens,
            )
        return measured

    def _reset(
        self, policy: str, cost: str, capacity: float, measure: bool, step_log: str | None, retag: bool = True
    ) -> None:
        """Fresh policy state and clock (at start-up, or on a ``reset`` of an idle engine)."""
        window = WINDOW_STEPS * self.iteration_s if measure else None
        # an agent keeps its place for the step scheduled as its last request ends; under async
        # scheduling the step after is scheduled before the freed memory shows too: both
        passes = 2 if isinstance(self, AsyncScheduler) else 1
        self.core = AgentScheduler.for_policy(
            policy, capacity, cost, window, retag, self.guard_scale, passes, step_s=self.iteration_s
        )
        self.book = AgentBook(self.core, cost, self.idle_release_s, self.session_keep_s)
        # what the policy needs from each step, read once (they are fixed for a policy)
        traits = self.core.traits
        # charged every step if the policy reads service, or to retag agents charged beyond their price
        self._charge = traits.uses_service or traits.retags_on_service
        self._rekey, self._measure = traits.keys_move, traits.measures_capacity
        self._rekey = self._rekey or traits.keys_shift  # tenants' keys move at their tenant's events
        self._busy_step: tuple[float, Charge] | None = None  # the last step, if requests waited in it
        self._kv_blocks = self._block_lists() if cost == KV_PREFIX.name else None  # kv-prefix: shared blocks split
        if self.pricer is not None:
            self.pricer.reset()
        self._open_step_log(step_log)  # the policy's clock starts with the step log's

    def _block_lists(self) -> tuple | None:
        """Under ``kv-prefix``, what splits a shared block (``accounting.prefix_step_charges``): vLLM's
        per-request block lists of its first KV cache group (``kv_cache_manager.coordinator
        .single_type_managers[0].req_to_blocks``, request id -> ``KVCacheBlock`` list in token order)
        and that group's tokens per block. None where nothing is shared: prefix caching off (then the
        charge is ``kv``'s), or a vLLM without those internals (the same, with a warning)."""
        manager = self.kv_cache_manager
        if not getattr(manager, "enable_caching", False):
            return None
        try:
            group = manager.coordinator.single_type_managers[0]
            return group.req_to_blocks, group.block_size
        except (AttributeError, IndexError):
            logger.warning(
                "justitia: kv-prefix: this vLLM's KV cache manager has no per-request block lists where "
                "0.32 keeps them; each request is charged the KV token-time it holds, as under kv"
            )
            return None

    # ----------------------------------------------------------------------------- control
    def control(self, call: ControlCall):
        """One control call from the process that started the engine (see the module's docstring)."""
        args, now = call.args, self._now()
        if call.verb == REGISTER:
            reg = Registration.from_json(args, logger)
            agent_id = reg.agent_id
            before = self.core.agent(agent_id)  # a paused session's standing: its return is logged as one
            agent = self.book.register(reg, now)
            if agent is not None:
                self._log_arrival(agent, before)
            return self.book.virtual_finish(agent_id)
        if call.verb == RETIRE:
            agent_id = str(args["agent_id"])
            if args.get("turn_end"):  # the door saw its turn end: only the burst's price learns
                return self.pricer is not None and self.pricer.turn_ended(agent_id, self.core.agent(agent_id))
            if args.get("pause"):  # a session between bursts: settled once none of its requests is open
                return self.book.pause(agent_id, now)
            released = self.book.retire(agent_id, now)  # requests still in vLLM's queues are served first
            if released:
                self._released(agent_id)
            return released
        if call.verb == STATE:
            detail = args.get("detail") is True
            waiting = [request.request_id for request in list(self.waiting)] if detail else ()
            return self.book.state(now, detail, args.get("bound_s"), waiting).to_json()
        if call.verb == RESET:
            if self.requests or self.book.open_count:
                logger.warning("justitia: reset refused: the engine is not idle")
                return False
            self._reset(
                str(args.get("policy", "justitia")),
                str(args.get("cost", "kv")),
                float(args["capacity_per_s"]),
                bool(args.get("measure_capacity", True)),
                args.get("step_log"),
                bool(args.get("retag", True)),
            )
            return True
        raise ValueError(f"unknown control verb '{call.verb}'")

    # ------------------------------------------------------------------------------ requests
    def _queue(self, request: Request) -> None:
        """Register a request with the core (first time) or requeue it, and stamp its key."""
        info = self.book.request(request.request_id)
        if info is not None:
            self.core.requeue(info)
        else:
            sp = request.sampling_params
            extra = getattr(sp, "extra_args", None) if sp is not None else None
            meta = RequestMeta.parse(extra, request.request_id, logger)
            if not trusted(extra, self.client_prices, self.door_token):  # a client's own prices: ignored
                meta = meta.without_prices()
            max_tokens = getattr(sp, "max_tokens", None) or 256
            before = self.core.agent(meta.agent_id) if meta.agent_id is not None else None
            dist = None
            if self.pricer is not None and self.pricer.opens(meta, before):
                dist = self.pricer.price(meta.agent_id, meta, request.num_prompt_tokens, before)
            info, agent = self.book.arrive(
                request.request_id, meta, request.num_prompt_tokens, max_tokens, self._now(), dist=dist
            )
            if agent is not None:
                self._log_arrival(agent, before)
        request.priority = self.core.priority(info)

    def _hold(self, request: Request) -> None:
        """A request entering vLLM's ``kv_holding_waiting``: on the books (new: registered, but not in
        the policy's waiting queue, since vLLM drains that queue first), its key stamped."""
        info = self.book.request(request.request_id)
        if info is None:
            self._queue(request)
            self.core.dequeue(self.book.request(request.request_id))
        else:
            request.priority = self.core.priority(info)

    def _log_arrival(self, agent: AgentInfo, before=None) -> None:
        """One line for an agent's arrival; ``before``: its standing until now (a session that paused, returning)."""
        if self.log_agents and before is not None:
            logger.info(
                "justitia: agent %s returned after a pause: predicted_cost=%.6g virtual_finish=%s (was %s) tenant=%s",
                agent.agent_id,
                agent.predicted_cost,
                self.book.virtual_finish(agent.agent_id),
                before.virtual_finish,
                agent.tenant,
            )
        elif self.log_agents:
            logger.info(
                "justitia: agent %s arrived: type=%r predicted_cost=%.6g virtual_finish=%s tenant=%s",
                agent.agent_id,
                agent.agent_type,
                agent.predicted_cost,
                self.book.virtual_finish(agent.agent_id),
                agent.tenant,
            )

    def _free_request(self, request: Request, *args, **kwargs):
        """A finished or aborted request releases its policy state (and its agent's, when done)."""
        cached = self._cache_hits.pop(request.request_id, None)
        if self.book.request(request.request_id) is not None:
            if request.request_id in self.waiting.requests:
                self.waiting.remove_request(request)
            if self.pricer is not None:  # what its burst was charged, before the book may settle it
                agent_id = self.book.request(request.request_id).agent_id
                self.pricer.charged(agent_id, self.core.agent(agent_id))
            info = self.book.finish(request.request_id, self._now(), request.num_output_tokens, cached)
            if self.core.agent(info.agent_id) is None:
                self._released(info.agent_id)
        return super()._free_request(request, *args, **kwargs)

    def _released(self, agent_id: str, why: str = "") -> None:
        """An agent's policy state was dropped: logged, and its open burst learned from."""
        if self.pricer is not None:
            self.pricer.gone(agent_id)
        if self.log_agents:
            logger.info("justitia: agent %s released%s", agent_id, why)

    def shutdown(self) -> None:
        """What online pricing learned kept (``JUSTITIA_PRICING_STATE``), then the base's shutdown."""
        if self.pricer is not None:
            self.pricer.close()
        super().shutdown()

    # --------------------------------------------------------------------------------- steps
    def _before_step(self, now_s: float) -> None:
        """Keys refreshed before vLLM's step: idle agents swept, the clock advanced, moved keys restamped."""
        for agent_id in self.book.sweep(now_s):
            self._released(agent_id, " (idle)")
        core, info_of = self.core, self.book.request
        # keys that move with time refreshed (justitia-eligible), and the step's admission pass begun
        # (an agent whose last request just finished keeps its place in it)
        moved = core.advance(now_s)
        if self._rekey and moved:  # keys moved with service, or with their tenant
            for request in self.running:
                info = info_of(request.request_id)
                if info is not None and info.agent_id in moved:
                    request.priority = core.priority(info)
        if self._measure and self._busy_step is not None:  # the last step, in which requests waited, ended now
            started, delivered = self._busy_step
            core.observe_service(now_s - started, delivered, 1)
            self._busy_step = None

    def update_from_output(self, *args, **kwargs):
        """vLLM's; an engine left with nothing to run is idle until its next step, which is no
        step's time: the last busy step is not measured (the meter's own guard, and
        ``lab.live.calibrate``, drop such gaps too)."""
        outputs = super().update_from_output(*args, **kwargs)
        if self._busy_step is not None and not self.has_unfinished_requests():
            self._busy_step = None
        return outputs

    def _after_step(self, now_s: float, waiting: int, output) -> StepDelivered | None:
        """The service vLLM scheduled, charged; a step in which requests waited, kept to measure M;
        the prefix-cache hit of each request scheduled for the first time, kept till it is freed."""
        for new in output.scheduled_new_reqs:
            request = self.requests.get(new.req_id)
            if (
                request is not None and not request.num_preemptions
            ):  # not one resumed (vLLM's v2 runner lists those here)
                stats = getattr(
                    request, "prefill_stats", False
                )  # 0.32: set at the first schedule, taken at its first output
                if stats is False:  # a vLLM without them: what it had computed before this step
                    self._cache_hits[new.req_id] = new.num_computed_tokens
                elif stats is not None:
                    self._cache_hits[new.req_id] = stats.num_cached_tokens
        if self._kv_blocks is not None:
            return self._after_prefix_step(now_s, waiting, output)
        if self._charge:
            for info, p, d, kv in step_charges(
                self.requests, output.num_scheduled_tokens, self.book.request, self._ahead
            ).values():
                self.core.charge(info, Charge(p, d, kv), now_s)
        if self._measure and waiting > 0:
            delivered = step_delivered(self.requests, output.num_scheduled_tokens, self._ahead)
            self._busy_step = (now_s, Charge(delivered.prefill_tokens, delivered.samples, delivered.kv_tokens))
            return delivered
        return None

    def _after_prefix_step(self, now_s: float, waiting: int, output) -> StepDelivered | None:
        """``_after_step`` under ``kv-prefix``: each request's KV token-time, a full block that ``n``
        requests of this step hold at once counted ``1/n`` to each (``accounting.prefix_step_charges``;
        nothing shared: ``_after_step``'s charges exactly); the meter reads the KV its sampling
        requests were charged, shared blocks split as charged. The step log's KV column stays the
        tokens each holds."""
        measure = self._measure and waiting > 0
        if not (self._charge or measure):
            return None
        lists, block_size = self._kv_blocks
        blocks = lists.get

        def blocks_of(request_id: str) -> list[int] | None:
            """The ids of the request's leading blocks that another request also holds (``ref_cnt``
            above 1): where vLLM's prefix cache shares blocks, a hit being a run of blocks from the
            first. The rest are its own; so this is O(shared blocks), one read when none is."""
            held = blocks(request_id)
            if not held or held[0].ref_cnt < 2:
                return None
            ids = []
            for block in held:
                if block.is_null or block.ref_cnt < 2:
                    break
                ids.append(block.block_id)
            return ids

        scheduled = output.num_scheduled_tokens
        per_agent, saved = prefix_step_charges(
            self.requests, scheduled, self.book.request, blocks_of, block_size, self._ahead
        )
        if self._charge:
            for info, p, d, kv in per_agent.values():
                self.core.charge(info, Charge(p, d, kv), now_s)
        if measure:
            delivered = step_delivered(self.requests, scheduled, self._ahead)
            kv = delivered.kv_tokens
            self._busy_step = (now_s, Charge(delivered.prefill_tokens, delivered.samples, kv - saved if saved else kv))
            return delivered
        return None


class JustitiaAsyncScheduler(JustitiaScheduler, AsyncScheduler):
    """``JustitiaScheduler`` on vLLM's async path (chosen by ``JustitiaScheduler`` itself): vLLM
    schedules the next step before the last one's tokens come back; the plug-in charges each step as
    it is scheduled, its tokens in flight counted, so the charges are the sync path's."""


ASYNC_VARIANTS[JustitiaScheduler] = JustitiaAsyncScheduler
