"""``justitia profile``: run generated agents through a real model and record what they cost.

Each agent comes from the workflow generators stage by stage (``workflows.staged_agent``): its
first stage's prompts are generated, the model answers them (chat template, temperature 0,
natural stopping, a ``max_tokens`` cap per workflow), and the next stage's prompts quote those
real answers, as a map-reduce agent's would. The profile file is an ordinary workload file
(``justitia.workload.agents``, docs/formats.md; ``.jsonl`` or ``.jsonl.gz``): per task the prompt text as the agent
wrote it,
its measured ``prompt_tokens`` (inside the model's chat template, as the engine saw it) and the
measured ``output_tokens``; per agent a ``meta`` object (model, size class, scale, cap, how many answers hit
the cap, the agent's KV token-time cost). Every agent arrives at 0: arrivals are the bench's job.

Agents are written one line each as they finish, so an interrupted run resumes where it stopped
(agents already in the file are skipped). Agent ``i`` of a type is drawn from a generator seeded
with (seed, type index, i): the same command always asks the same first questions.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from justitia.core import KV
from justitia.engine.launch import EngineSpec, RunningEngine
from justitia.engine.models import BUILT_IN_MODELS, chat_ids
from justitia.lab.progress import progress_bar
from justitia.workload import Agent, Task, append_agent, load_workload
from justitia.workload.workflows import WORKFLOW_TYPES, output_cap, staged_agent


@dataclass
class ProfileSpec:
    """What to profile and on which engine."""

    model: str = "smollm2"
    types: tuple[str, ...] = WORKFLOW_TYPES
    agents_per_type: int = 30
    size: str = "small"
    scale: float = 8.0  # every drawn length / scale: 2 CPU cores prefill ~300 tokens/s of SmolLM2
    max_tokens: int = 128  # the cap on any answer; each workflow's own cap is at most this
    seed: int = 0
    concurrency: int = 32  # agents in flight
    max_model_len: int = 4096
    max_num_seqs: int = 128
    dtype: str = "auto"


def planned_agents(spec: ProfileSpec) -> list[tuple[str, str, int]]:
    """(agent id, type, index) of every agent the spec asks for, types interleaved so that a
    partial profile still covers every type."""
    for t in spec.types:
        if t not in WORKFLOW_TYPES:
            raise ValueError(f"unknown workflow '{t}'; expected some of: {', '.join(WORKFLOW_TYPES)}.")
    if spec.agents_per_type < 1:
        raise ValueError(f"--agents-per-type must be >= 1, got {spec.agents_per_type}.")
    return [(f"{t}-{i:03d}", t, i) for i in range(spec.agents_per_type) for t in spec.types]


class Profiler(RunningEngine):
    """One AsyncLLM (stock scheduler, prefix caching on) answering generated agents."""

    def __init__(self, spec: ProfileSpec):
        super().__init__(
            EngineSpec(
                spec.model,
                kv_blocks=None,
                max_num_seqs=spec.max_num_seqs,
                max_num_batched_tokens=None,
                max_model_len=spec.max_model_len,
                scheduler="fcfs",
                prefix_caching=True,
                dtype=spec.dtype,
                cpu_kv_space_gib=4,
                cpu_threads="0-1",
            )
        )
        self.profile = spec

    @property
    def model_name(self) -> str:
        """What profiles record as the model: a built-in name, or the model directory's name."""
        return self.profile.model if self.profile.model in BUILT_IN_MODELS else self.model_dir.name

    def _encode(self, prompt: str, cap: int) -> tuple[str, list[int]]:
        """The prompt (cut to leave room for ``cap`` tokens, if need be) and the token ids the model
        sees: the prompt inside the model's chat template."""
        tok = self.tokenizer
        room = self.profile.max_model_len - cap
        while True:
            ids = chat_ids(tok, [{"role": "user", "content": prompt}]) if tok.chat_template else tok.encode(prompt)
            if len(ids) <= room:
                return prompt, ids
            # keep the instruction (it comes first) and the start of the body
            prompt = prompt[: max(1, len(prompt) * room // len(ids) - 16)]

    async def _answer(self, prompt: str, cap: int, request_id: str) -> tuple[str, int, int, str]:
        """(prompt as the agent wrote it, cut if need be; prompt tokens; output tokens; output text)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        text, ids = self._encode(prompt, cap)
        params = SamplingParams(max_tokens=cap, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=ids), params, request_id):
            final = out
        answer = final.outputs[0]
        return text, len(ids), len(answer.token_ids), answer.text

    async def agent(self, agent_id: str, workflow: str, index: int) -> Agent:
        """Run one generated agent to the end; return it with measured lengths."""
        spec = self.profile
        rng = np.random.default_rng([spec.seed, WORKFLOW_TYPES.index(workflow), index])
        cap = output_cap(workflow, spec.size, spec.scale, spec.max_tokens)
        gen = staged_agent(workflow, spec.size, rng, spec.scale)
        stages: list[tuple[Task, ...]] = []
        at_cap = 0
        t0 = time.perf_counter()
        stage = next(gen)
        while True:
            answers = await asyncio.gather(
                *(self._answer(task.prompt, cap, f"{agent_id}/{len(stages)}/{i}") for i, task in enumerate(stage))
            )
            stages.append(tuple(Task(text, n_in, max(1, n_out)) for text, n_in, n_out, _ in answers))
            at_cap += sum(n_out >= cap for _, _, n_out, _ in answers)
            try:
                stage = gen.send([(out_text, max(1, n_out)) for _, _, n_out, out_text in answers])
            except StopIteration:
                break
        agent = Agent(agent_id, workflow, 0.0, tuple(stages))
        meta = {
            "model": self.model_name,
            "size": spec.size,
            "scale": spec.scale,
            "max_tokens": cap,
            "answers_at_cap": at_cap,
            "cost_kv": agent.cost(KV),
            "wall_s": round(time.perf_counter() - t0, 3),
        }
        return Agent(agent_id, workflow, 0.0, tuple(stages), meta)


async def _run(spec: ProfileSpec, out: Path, progress: bool) -> dict:
    done = {a.agent_id for a in load_workload(out)} if out.is_file() and out.stat().st_size else set()
    todo = [p for p in planned_agents(spec) if p[0] not in done]
    log = sys.stderr
    print(
        f"profile: {len(done)} agents already in {out}, {len(todo)} to run on '{spec.model}' "
        f"({spec.size} agents, lengths / {spec.scale:g}, answers <= {spec.max_tokens} tokens)",
        file=log,
    )
    if not todo:
        return {"agents": len(done), "new": 0, "wall_s": 0.0}
    started = time.perf_counter()
    finished = 0
    async with Profiler(spec) as prof:
        sem = asyncio.Semaphore(spec.concurrency)
        with progress_bar(len(todo), progress and log.isatty(), "profiling") as advance:

            async def one(agent_id: str, workflow: str, index: int) -> None:
                nonlocal finished
                async with sem:
                    agent = await prof.agent(agent_id, workflow, index)
                append_agent(agent, out)
                finished += 1
                advance(workflow)
                if not log.isatty() and (finished % 10 == 0 or finished == len(todo)):
                    took = time.perf_counter() - started
                    eta = took / finished * (len(todo) - finished)
                    print(
                        f"profile: {finished}/{len(todo)} agents, {took / 60:.1f} min, ETA {math.ceil(eta / 60)} min",
                        file=log,
                        flush=True,
                    )

            await asyncio.gather(*(one(*p) for p in todo))
    return {"agents": len(done) + finished, "new": finished, "wall_s": time.perf_counter() - started}


def run_profile(spec: ProfileSpec, out: str | Path, progress: bool = True) -> dict:
    """Profile the agents ``spec`` asks for into ``out`` (resuming it); return a summary."""
    return asyncio.run(_run(spec, Path(out), progress))
