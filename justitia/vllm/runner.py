"""Replay a workload on a real vLLM engine (``AsyncLLM``) in real time, one policy at a time.

Agents arrive on the wall clock at their ``arrival_s``; an agent's stages run one after another
(a stage is submitted when the previous one is done) and the tasks of a stage in parallel. Each
task is one request whose prompt is exactly ``prompt_tokens`` token ids (the task's prompt text,
tokenized and cut or repeated to length) and whose decode length is forced to ``output_tokens``
(``ignore_eos``), so the engine serves the same token counts as the simulator.

Two ways to schedule:

- ``plugin``: the engine runs ``JustitiaScheduler``; every request carries its agent's metadata in
  ``extra_args``. One engine serves every policy: a control request resets the plug-in's policy
  state between runs (``JUSTITIA_CONTROL=1`` is set for the engine this module starts).
- ``tagging``: stock vLLM with ``scheduling_policy="priority"`` and no plug-in. The runner keeps
  the policy in the front end (``AgentBook.tagging``, fed the same metadata as the plug-in) and
  passes each request's static key as the int ``priority`` (``AgentBook.tag``). Only static
  policies can be tagged this way (fcfs, sjf, parrot, justitia).

NOTE: engine start-up takes ~30 s on the 2-core CPU machine; reuse one ``VllmEngine`` per mode.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from justitia.cost import cost_model
from justitia.predictor import make_predictor
from justitia.scheduler import AgentBook
from justitia.sim.engine import AgentResult, SimResult
from justitia.workload import Agent

STEP_LOG_COLUMNS = ("t_s", "batched_tokens", "decode_context_tokens", "prefill_reqs", "decode_reqs", "busy_after",
                    "preemptions")


@dataclass(frozen=True)
class EngineSpec:
    """How to start the vLLM engine."""

    model: str = "tiny"  # tiny | smollm2 | a Hugging Face model directory
    kv_blocks: int = 24  # num_gpu_blocks_override: the KV cache is the bottleneck, as in the paper
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048  # must fit in the KV cache: kv_blocks * block size (128 on CPU)
    mode: str = "plugin"  # plugin | tagging
    dtype: str = "auto"  # auto: float32 on CPUs (bf16 matmuls fall back to slow kernels without AVX-512 BF16)

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: vLLM keeps one of ``kv_blocks`` back as its null block."""
        return self.kv_blocks - 1

    def to_json(self) -> dict:
        """The spec as a results-file document."""
        return dict(self.__dict__)


class VllmEngine:
    """One running ``AsyncLLM`` that replays workloads; use as ``async with VllmEngine(spec)``."""

    def __init__(self, spec: EngineSpec):
        if spec.mode not in ("plugin", "tagging"):
            raise ValueError(f"engine mode must be 'plugin' or 'tagging', got '{spec.mode}'.")
        self.spec = spec
        self.llm = None
        self.block_size = 0
        self.kv_tokens = 0
        self.tokenizer = None

    async def __aenter__(self) -> "VllmEngine":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
        os.environ["JUSTITIA_CONTROL"] = "1"
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from justitia.vllm.models import resolve_model

        model_dir = resolve_model(self.spec.model)
        args = AsyncEngineArgs(
            model=str(model_dir),
            scheduling_policy="priority",
            num_gpu_blocks_override=self.spec.kv_blocks,
            max_num_seqs=self.spec.max_num_seqs,
            max_num_batched_tokens=self.spec.max_num_batched_tokens,
            max_model_len=self.spec.max_model_len,
            enforce_eager=True,
            enable_prefix_caching=False,  # runs of different policies replay the same prompts
            async_scheduling=False,
            disable_log_stats=True,
            dtype=engine_dtype(self.spec.dtype),
        )
        if self.spec.mode == "plugin":
            args.scheduler_cls = "justitia.vllm.scheduler.JustitiaScheduler"
        self.llm = AsyncLLM.from_engine_args(args)
        self.block_size = self.llm.vllm_config.cache_config.block_size
        self.kv_tokens = self.spec.usable_blocks * self.block_size
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return self

    async def __aexit__(self, *exc) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    # ------------------------------------------------------------------------------ prompts
    def prompt_ids(self, agents: list[Agent]) -> dict[tuple[str, int, int], list[int]]:
        """Token ids of every task: its prompt text tokenized, then cut or repeated to length."""
        limit = self.spec.max_model_len
        vocab = self.tokenizer.vocab_size
        out: dict[tuple[str, int, int], list[int]] = {}
        for agent in agents:
            for s, stage in enumerate(agent.stages):
                for i, task in enumerate(stage):
                    if task.prompt_tokens + task.output_tokens > limit:
                        raise ValueError(
                            f"agent '{agent.agent_id}' stage {s} task {i}: prompt_tokens + output_tokens = "
                            f"{task.prompt_tokens + task.output_tokens} exceeds max_model_len {limit}; "
                            f"scale the workload down (--scale) or raise --max-model-len."
                        )
                    ids = self.tokenizer.encode(task.prompt, add_special_tokens=False) or [min(3, vocab - 1)]
                    reps = -(-task.prompt_tokens // len(ids))
                    out[(agent.agent_id, s, i)] = (ids * reps)[: task.prompt_tokens]
        return out

    # ---------------------------------------------------------------------------------- runs
    async def _generate(self, prompt_ids: list[int], max_tokens: int, request_id: str,
                        extra_args: dict | None = None, priority: int = 0) -> int:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY, extra_args=extra_args,
        )
        final = None
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id,
                                           priority=priority):
            final = out
        return len(final.outputs[0].token_ids)

    async def run(
        self,
        agents: list[Agent],
        policy: str,
        predictor: str = "oracle",
        cost: str = "kv",
        capacity_per_s: float | None = None,
        seed: int = 0,
        step_log: str | Path | None = None,
        on_agent_finish: Callable[[AgentResult], None] | None = None,
    ) -> "EngineRun":
        """Replay ``agents`` under ``policy``; return per-agent results and the engine's step log."""
        if self.llm is None:
            raise RuntimeError("the engine is not started; use 'async with VllmEngine(spec) as engine'.")
        capacity = float(capacity_per_s) if capacity_per_s else self.kv_tokens / 0.02
        model = cost_model(cost)
        pred = make_predictor(predictor, seed)
        ids = self.prompt_ids(agents)
        run_id = uuid.uuid4().hex[:8]
        # tagging: the policy lives here, in the same kind of book as the plug-in's, fed the same metadata
        frontend = AgentBook.tagging(policy, capacity, cost) if self.spec.mode == "tagging" else None
        own_log = step_log is None
        if own_log:
            fd, step_log = tempfile.mkstemp(prefix="justitia-steps-", suffix=".csv")
            os.close(fd)
        Path(step_log).write_text("")
        if self.spec.mode == "plugin":
            control = {"policy": policy, "cost": cost, "capacity_per_s": capacity, "step_log": str(step_log)}
            await self._generate([1, 2, 3], 1, f"control-{run_id}", {"justitia_control": control})

        results: list[AgentResult] = []
        lags: list[float] = []
        t0 = time.monotonic()

        async def run_agent(agent: Agent) -> None:
            delay = agent.arrival_s - (time.monotonic() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.monotonic() - t0 - agent.arrival_s)
            predicted = pred.agent_cost(agent, model)
            for s, stage in enumerate(agent.stages):
                calls = []
                for i, task in enumerate(stage):
                    rid = f"{run_id}/{agent.agent_id}/{s}/{i}"
                    meta = {"agent_id": agent.agent_id, "agent_type": agent.type, "agent_cost": predicted,
                            "request_cost": pred.request_cost(agent, s, i, model)}
                    if s == len(agent.stages) - 1:
                        meta["agent_done"] = True
                    prompt = ids[(agent.agent_id, s, i)]
                    if frontend is None:
                        calls.append(self._generate(prompt, task.output_tokens, rid, meta))
                    else:
                        _, priority = frontend.tag(rid, meta, task.prompt_tokens, task.output_tokens,
                                                   time.monotonic() - t0)
                        calls.append(self._tagged(frontend, prompt, task.output_tokens, rid, priority, t0))
                served = await asyncio.gather(*calls)
                for i, (task, n) in enumerate(zip(stage, served)):
                    if n != task.output_tokens:
                        raise RuntimeError(f"agent '{agent.agent_id}' stage {s} task {i}: the engine produced "
                                           f"{n} tokens, {task.output_tokens} were forced.")
            finish_s = time.monotonic() - t0
            result = AgentResult(agent.agent_id, agent.type, agent.arrival_s, finish_s, finish_s - agent.arrival_s,
                                 agent.cost(model), predicted)
            results.append(result)
            pred.observe(agent.type, predicted, agent.cost(model))
            if on_agent_finish is not None:
                on_agent_finish(result)

        wall0 = time.perf_counter()
        await asyncio.gather(*(run_agent(a) for a in agents))
        wall = time.perf_counter() - wall0
        if self.spec.mode == "plugin":  # the next control request closes and flushes the step log
            await self._generate([1, 2, 3], 1, f"flush-{run_id}",
                                 {"justitia_control": {"policy": "fcfs", "capacity_per_s": capacity}})
        steps = read_step_log(step_log)
        if own_log:
            os.unlink(step_log)
        order = {a.agent_id: k for k, a in enumerate(agents)}
        results.sort(key=lambda r: order[r.agent_id])
        preemptions = sum(row[6] for row in steps)
        sim = SimResult(policy, results, max(r.finish_s for r in results), len(steps), len(steps), preemptions, wall)
        return EngineRun(sim, steps, max(lags) if lags else 0.0)

    async def _tagged(self, frontend: AgentBook, prompt_ids, max_tokens, rid, priority, t0: float) -> int:
        try:
            return await self._generate(prompt_ids, max_tokens, rid, None, priority)
        finally:
            frontend.finish(rid, time.monotonic() - t0)  # the last agent_done request releases the agent


@dataclass
class EngineRun:
    """One policy's run on the engine: the results, the engine's steps, the worst arrival lag."""

    result: SimResult
    steps: list[tuple[float, ...]]
    max_arrival_lag_s: float


def engine_dtype(dtype: str) -> str:
    """``auto`` means float32 on a CPU (bf16 matmuls are slow without AVX-512 BF16), else as given."""
    return dtype if dtype != "auto" or _has_gpu() else "float32"


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def read_step_log(path: str | Path) -> list[tuple[float, ...]]:
    """The plug-in's step log as tuples of ``STEP_LOG_COLUMNS``."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line:
            t, *rest = line.split(",")
            rows.append((float(t), *(int(x) for x in rest)))
    return rows
