"""``StepLogScheduler``: vLLM's scheduler unchanged, with the step log; the Justitia plug-in's base
(``plugin.JustitiaScheduler``), and what importing either installs in vLLM.

vLLM is given it under the plug-in's module name,
``--scheduler-cls justitia.vllm.plugin.StepLogScheduler`` (the bench's ``priority-logged`` engine;
this module's name works too). It decides nothing: every method it overrides counts or times, then
calls vLLM's (front-end tagging runs on it, so that their steps are logged as the plug-in's are;
tests check that it schedules step for step as vLLM's own scheduler does). A ``reset`` control call
opens a step log, or closes it: one CSV line per engine step, a ``justitia.vllm.steplog.StepRow``
(its fields and units: that module, and docs/formats.md); the other control verbs need the plug-in.

Importing this module checks vLLM's version (``SUPPORTED_VLLM``; docs/vllm-versions.md: the
scheduler internals both classes rely on are not a public interface, so any other version is
refused at import) and installs the control utility on vLLM's ``EngineCore``
(``ENGINE_UTILITY``, which ``AsyncLLM.engine_core.call_utility_async`` reaches) that hands a
``core.protocol.ControlCall`` to the scheduler's ``control``.
"""

from __future__ import annotations

import time
from collections import deque

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore
from vllm.v1.request import Request

from justitia.core import ENGINE_UTILITY, RESET, ControlCall
from justitia.defaults import ENV_STEP_LOG, env
from justitia.vllm.accounting import StepDelivered, prefill_attention, step_delivered
from justitia.vllm.steplog import StepLogWriter, StepRow

logger = init_logger("vllm.justitia")  # under "vllm": vLLM configures handlers for that tree only

# The vLLM versions whose scheduler internals this module was read against (docs/vllm-versions.md);
# on any other, importing it fails at once rather than misordering late.
SUPPORTED_VLLM = ("0.32", "0.33")


def check_version(version: str) -> None:
    """Raise a ``RuntimeError`` naming the supported versions unless ``version`` is one of them."""
    if ".".join(version.split("+")[0].split(".")[:2]) not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"justitia's scheduler plug-in supports vLLM {' and '.join(SUPPORTED_VLLM)} (its scheduler "
            f"internals are not a public interface); this is vLLM {version}. Install one of those."
        )


check_version(vllm.__version__)


def _async_scheduling(args: tuple, kwargs: dict) -> bool:
    """Whether the ``VllmConfig`` a scheduler is built with asks for async scheduling."""
    config = kwargs.get("vllm_config", args[0] if args else None)
    return bool(getattr(getattr(config, "scheduler_config", None), "async_scheduling", False))


ASYNC_VARIANTS: dict[type, type] = {}  # a scheduler class -> its twin on vLLM's async path (``__new__``)


class StepLogScheduler(Scheduler):
    """vLLM's v1 scheduler, its decisions untouched, that writes the step log (the module's docstring).

    The hooks ``_before_step`` and ``_after_step`` are where a subclass works inside a step's timing
    (``sched_us``); they do nothing here.

    Built with async scheduling on (vLLM's default on a GPU), the class makes itself a subclass of
    vLLM's ``AsyncScheduler`` as well (``__new__``: ``AsyncStepLogScheduler``,
    ``JustitiaAsyncScheduler``), so the step in flight is vLLM's to handle; a step is read when it is
    scheduled, its tokens in flight counted (``accounting.step_delivered``'s ``ahead``), and written out
    when its own output comes back, a later step already scheduled or not."""

    def __new__(cls, *args, **kwargs):
        if _async_scheduling(args, kwargs) and not issubclass(cls, AsyncScheduler):
            variant = ASYNC_VARIANTS.get(cls)
            if variant is None:  # a subclass of ours: its async twin, made once
                variant = ASYNC_VARIANTS[cls] = type(
                    cls.__name__ + "Async",
                    (cls, AsyncScheduler),
                    {"__module__": cls.__module__, "__doc__": cls.__doc__},
                )
            cls = variant
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # async scheduling: a sampling request's placeholders per step (accounting.step_delivered's ahead)
        self._ahead = getattr(self, "num_sampled_tokens_per_step", 1) if isinstance(self, AsyncScheduler) else 0
        self._step_log = None
        self._standing_log = env(ENV_STEP_LOG) or None  # a bench's, for an engine it did not start itself
        self._open_step_log(None)

    def _open_step_log(self, path: str | None) -> None:
        """Close the step log (flushing it) and open ``path``'s (None: the one ``JUSTITIA_STEP_LOG``
        names, written line by line with its times on the system's monotonic clock; or none); restart
        the step clock."""
        if self._step_log is not None:
            self._step_log.close()
        path = path or self._standing_log
        self.t0 = time.monotonic()
        standing = path == self._standing_log  # its times on the system's clock: a bench's, in another process
        self._step_log = StepLogWriter(path, by_line=standing, origin=self.t0 if standing else 0.0) if path else None
        self._steps: deque[tuple] = deque()  # (output, its line's fields) of steps scheduled, not yet back
        self._preemptions = self._arrived = self._finished = 0

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def control(self, call: ControlCall):
        """``reset`` (an idle engine): open the step log given, or close it; other verbs need a policy."""
        if call.verb != RESET:
            raise ValueError(
                f"'{call.verb}' needs the Justitia plug-in: this engine runs vLLM's own scheduler "
                f"(with a step log), which keeps no policy state."
            )
        if self.requests:
            logger.warning("justitia: reset refused: the engine is not idle")
            return False
        self._open_step_log(call.args.get("step_log"))
        return True

    # ------------------------------------------------------------------------------- counts
    def add_request(self, request: Request) -> None:
        """vLLM's; a new request counts towards the next step's ``arrived_before``."""
        if request.request_id not in self.requests:
            self._arrived += 1
        return super().add_request(request)

    def _free_request(self, request: Request, *args, **kwargs):
        """vLLM's; a finished or aborted request counts towards its step's ``finished``."""
        self._finished += 1
        return super()._free_request(request, *args, **kwargs)

    def _preempt_request(self, *args, **kwargs):
        """vLLM's recompute preemption (the victim comes back through the waiting queue)."""
        self._preemptions += 1
        return super()._preempt_request(*args, **kwargs)

    # --------------------------------------------------------------------------------- steps
    def _before_step(self, now_s: float) -> None:
        """A subclass's work before vLLM schedules a step."""

    def _after_step(self, now_s: float, waiting: int, output) -> StepDelivered | None:
        """A subclass's work after vLLM scheduled a step; it may return the step's ``step_delivered``."""
        return None

    def schedule(self, *args, **kwargs):
        """vLLM's step between the hooks; with a step log, the step is kept for ``update_from_output``."""
        t_sched = time.perf_counter()
        now_s = self._now()
        self._before_step(now_s)
        waiting = len(self.waiting)
        output = super().schedule(*args, **kwargs)
        delivered = self._after_step(now_s, waiting, output)
        if self._step_log is not None:
            ahead, scheduled = self._ahead, output.num_scheduled_tokens
            step = delivered or step_delivered(self.requests, scheduled, ahead)
            kv, prefills, ctx = step.kv_tokens, step.prefills, step.context_tokens
            attention = prefill_attention(self.requests, scheduled, ahead) if prefills else 0
            self._steps.append(
                (
                    output,
                    (
                        now_s,
                        output.total_num_scheduled_tokens,
                        ctx,
                        prefills,
                        len(scheduled) - prefills,
                        waiting,
                        kv,
                        time.perf_counter() - t_sched,
                        self._arrived,
                        attention,
                    ),
                )
            )
            self._arrived = 0
        return output

    def update_from_output(self, scheduler_output, *args, **kwargs):
        """vLLM's bookkeeping after a step; with a step log, the step is written out (under async
        scheduling, the step whose output this is: a later one may be scheduled already)."""
        started = time.perf_counter()
        outputs = super().update_from_output(scheduler_output, *args, **kwargs)
        if self._step_log is not None:
            while self._steps:
                output, step = self._steps.popleft()
                if output is scheduler_output:
                    break
            else:
                return outputs
            t, batched, ctx, prefills, decodes, waiting, delivered, sched_s, arrived, attention = step
            busy = int(self.has_unfinished_requests())
            sched_us = round(1e6 * (sched_s + time.perf_counter() - started))
            self._step_log.write(
                StepRow(
                    t,
                    batched,
                    ctx,
                    prefills,
                    decodes,
                    busy,
                    self._preemptions,
                    waiting,
                    delivered,
                    sched_us,
                    arrived,
                    self._finished,
                    attention,
                )
            )
            self._preemptions = self._finished = 0
        return outputs

    def shutdown(self) -> None:
        """Flush the step log with the engine."""
        if self._step_log is not None:
            self._step_log.close()
            self._step_log = None
        super().shutdown()


class AsyncStepLogScheduler(StepLogScheduler, AsyncScheduler):
    """``StepLogScheduler`` on vLLM's async path (chosen by ``StepLogScheduler`` itself)."""


ASYNC_VARIANTS[StepLogScheduler] = AsyncStepLogScheduler


def _engine_control(engine_core: EngineCore, call: dict):
    """The utility vLLM's engine process runs for ``AsyncLLM.engine_core.call_utility_async``."""
    scheduler = engine_core.scheduler
    if not isinstance(scheduler, StepLogScheduler):
        raise RuntimeError("this engine runs neither the Justitia scheduler plug-in nor its step-log base.")
    return scheduler.control(ControlCall.from_json(call))


# vLLM's engine process resolves utility calls by method name on its EngineCore; importing this
# module (vLLM does, to build the scheduler) adds ours. It adds a method and overrides nothing.
setattr(EngineCore, ENGINE_UTILITY, _engine_control)
