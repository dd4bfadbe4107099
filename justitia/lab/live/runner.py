"""Replay a workload on a real vLLM engine (``AsyncLLM``) in real time, one policy at a time.

Agents arrive on the wall clock at their ``arrival_s`` and live as ``AgentProcess``es driven by
``agent.drive`` (stages in order, the tasks of a stage in parallel). Each task is one request whose
prompt is exactly ``prompt_tokens`` token ids (the task's prompt text, tokenized and cut or
repeated to length) and whose decode length is forced to ``output_tokens`` (``ignore_eos``), so
the engine serves the same token counts as the simulator.

A session's call (docs/sessions.md) is built from token ids as the simulator's prefix cache sees
it (``SessionPrompts``): its context's segments (a shared text's ids, the same for the same name
in every session; an earlier call's prompt ids as sent; its output ids as the engine generated
them), then its own text, which begins with the session and task ids so that no two calls' own
text shares a block. With vLLM's prefix cache on, the run reports vLLM's own hit rate
(``RequestOutput.num_cached_tokens``: prompt tokens found cached at a request's first schedule,
the simulator's count) beside the requests' prompt tokens; the cache is emptied before each run
(``reset_prefix_cache``), so that runs of one workload do not hit each other's blocks.

Two ways to schedule (``EngineSpec.scheduler``):

- ``plugin``: the engine runs ``JustitiaScheduler``; every request carries its agent's metadata.
  An agent or a session's turn priced as a distribution (``online``) is registered with the
  plug-in ahead of its first request, with the distribution (``register_args``), which the plug-in
  reprices by its Gittins index as it serves it, as the simulator does; a request's metadata
  carries point prices only. One engine serves every policy: a ``reset`` control call gives the
  plug-in a fresh policy state between runs.
- ``priority`` (front-end tagging): stock vLLM with ``scheduling_policy="priority"`` and no
  plug-in. The runner keeps the policy in a front end's book fed the same metadata and passes each
  request's static key as the int ``priority`` (``backends.tagging.Tagger``). Only static policies can be
  tagged this way (fcfs, sjf, parrot, justitia).
- ``priority-logged``: the same, on stock vLLM's scheduler under the plug-in's step-log base
  (``StepLogScheduler``), so that a tagging run's steps are logged as a plug-in run's are.

NOTE: engine start-up takes 35-60 s on the 2-core CPU machine; reuse one ``VllmEngine`` per mode.
The model's threads and the front end get cores of their own (``core_layout``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from justitia.agent import AgentProcess, AgentResult, Answer, Call, RunResult, drive
from justitia.backends.tagging import Tagger
from justitia.core import (
    REGISTER,
    RESET,
    RETIRE,
    STATE,
    WINDOW_STEPS,
    ControlCall,
    PolicyState,
    Registration,
    cost_model,
)
from justitia.core import capacity_per_s as default_capacity  # run() takes a capacity_per_s of its own
from justitia.defaults import ITERATION_S, env, process_cpus
from justitia.engine.launch import EngineSpec, RunningEngine, control
from justitia.predictors import make_predictor
from justitia.vllm.steplog import StepRow, read_step_log
from justitia.workload import Agent
from justitia.workload.text import shared_text


class VllmEngine(RunningEngine):
    """One running ``AsyncLLM`` that replays workloads; use as ``async with VllmEngine(spec)``."""

    def __init__(self, spec: EngineSpec):
        if spec.scheduler not in ("plugin", "priority", "priority-logged"):
            raise ValueError(f"the runner schedules by the plug-in or by tagging, not '{spec.scheduler}'.")
        threads, self._frontend_cpus = core_layout(spec)
        super().__init__(replace(spec, cpu_threads=threads))
        self.block_size = 0
        self.kv_tokens = 0
        self._saved_cpus: set[int] | None = None

    @property
    def tagging(self) -> bool:
        """Whether the policy lives here, in the front end (stock vLLM by int priority)."""
        return self.spec.scheduler in ("priority", "priority-logged")

    @property
    def prefix_caching(self) -> bool:
        """Whether vLLM's prefix cache is on (its default, ``EngineSpec.prefix_caching`` None)."""
        return self.llm.vllm_config.cache_config.enable_prefix_caching

    @property
    def logged(self) -> bool:
        """Whether the engine writes a step log (the plug-in, or its step-log base)."""
        return self.spec.scheduler != "priority"

    async def __aenter__(self) -> "VllmEngine":
        await super().__aenter__()
        self.block_size = self.llm.vllm_config.cache_config.block_size
        self.kv_tokens = self.spec.usable_blocks * self.block_size
        if self._frontend_cpus is not None:  # after the start: the engine's processes keep every core
            self._saved_cpus = os.sched_getaffinity(0)
            pin_process(self._frontend_cpus)
        return self

    async def __aexit__(self, *exc) -> None:
        await super().__aexit__(*exc)
        if self._saved_cpus is not None:
            pin_process(self._saved_cpus)
            self._saved_cpus = None

    # ------------------------------------------------------------------------------ prompts
    def prompt_ids(self, agents: list[Agent]) -> dict[tuple[str, int, int], list[int]]:
        """Token ids of every (agent, stage, task): its prompt text tokenized, then cut or repeated
        to length."""
        limit = self.spec.max_model_len
        vocab = self.tokenizer.vocab_size
        unique = self.prefix_caching  # with the cache on, no two tasks' texts share a block (as simulated)
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
                    text = f"{agent.agent_id}/{s}/{i}: {task.prompt}" if unique else task.prompt
                    ids = self.tokenizer.encode(text, add_special_tokens=False) or [min(3, vocab - 1)]
                    reps = -(-task.prompt_tokens // len(ids))
                    out[(agent.agent_id, s, i)] = (ids * reps)[: task.prompt_tokens]
        return out

    # ---------------------------------------------------------------------------------- runs
    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, request_id: str, extra_args: dict | None = None, priority: int = 0
    ) -> tuple[list[int], int]:
        """The output token ids and the prompt tokens vLLM's prefix cache held at the first schedule."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=True,
            temperature=0.0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args=extra_args,
        )
        final = None
        async for out in self.llm.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), params, request_id, priority=priority
        ):
            final = out
        return list(final.outputs[0].token_ids), int(final.num_cached_tokens or 0)

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
        measure_capacity: bool = True,
        retag: bool = True,
        pricing: str = "first-stage",
    ) -> "EngineRun":
        """Replay ``agents`` under ``policy``; return per-agent results and the engine's step log.
        ``measure_capacity``: the clock follows what the engine delivers (the plug-in's from its steps;
        the front end's, in tagging mode, from its requests' round trips: ``Tagger``). ``retag``: see
        ``AgentScheduler``; ``pricing``:
        see ``AgentProcess``."""
        if self.llm is None:
            raise RuntimeError("the engine is not started; use 'async with VllmEngine(spec) as engine'.")
        model = cost_model(cost)
        budget = self.llm.vllm_config.scheduler_config.max_num_batched_tokens
        capacity = (
            float(capacity_per_s) if capacity_per_s else default_capacity(model, self.kv_tokens, budget, ITERATION_S)
        )
        pred = make_predictor(predictor, seed)
        ids = self.prompt_ids([a for a in agents if not a.is_session])
        sessions = SessionPrompts(self.tokenizer, self.spec.max_model_len)
        cache = [0, 0]  # prompt tokens at first schedule, and those vLLM's prefix cache held
        if self.prefix_caching and not await self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM would not empty its prefix cache: the engine is not idle.")
        run_id = uuid.uuid4().hex[:8]
        # tagging: the policy lives here, in the same kind of book as the plug-in's, fed the same metadata
        window = WINDOW_STEPS * ITERATION_S if measure_capacity else None  # the front end measures M from round trips
        tagger = (
            Tagger(policy, capacity, cost, retag=retag, measure_every_s=window, kv_tokens=self.kv_tokens)
            if self.tagging
            else None
        )
        frontend = None if tagger is None else tagger.book
        own_log = step_log is None
        if own_log:
            fd, step_log = tempfile.mkstemp(prefix="justitia-steps-", suffix=".csv")
            os.close(fd)
        Path(step_log).write_text("")
        if self.logged:  # the plug-in's fresh policy state (its step-log base takes the step log alone)
            await self._reset(policy, cost, capacity, str(step_log), measure_capacity, retag)

        requests: list[tuple[str, float, float]] = []  # (request id, sent, answered), seconds into the run
        processes: dict[str, AgentProcess] = {}
        ahead: dict[tuple, asyncio.Future] = {}  # (agent, turn) -> its registration with the plug-in
        t0 = time.monotonic()

        def process_for(agent: Agent) -> AgentProcess:
            p = AgentProcess(agent, pred, model, request_prefix=f"{run_id}/", pricing=pricing)
            processes[agent.agent_id] = p
            return p

        async def serve(call: Call) -> Answer:
            task = call.task
            key = (call.meta.agent_id, call.stage, call.index)
            prompt = ids[key] if key in ids else sessions.prompt(call)
            sent = time.monotonic() - t0
            if frontend is None:
                meta = call.meta
                args = register_args(processes[meta.agent_id], call)
                if args is not None:  # registered once, before any of its requests: they open nothing
                    opens = (meta.agent_id, call.turn if meta.session else None)
                    if opens not in ahead:
                        ahead[opens] = asyncio.ensure_future(control(self.llm, ControlCall(REGISTER, args)))
                    await ahead[opens]
                    meta = replace(meta, turn_start=False)
                out, hit = await self._generate(prompt, task.output_tokens, call.request_id, meta.to_extra_args())
            else:
                _, priority = tagger.tag(
                    call.request_id, call.meta, task.prompt_tokens, task.output_tokens, time.monotonic() - t0
                )
                out, hit = [], 0
                try:
                    out, hit = await self._generate(prompt, task.output_tokens, call.request_id, None, priority)
                finally:
                    tagger.finish(call.request_id, time.monotonic() - t0, len(out))  # the last one releases the agent
            n = len(out)
            cache[0] += len(prompt)
            cache[1] += hit
            sessions.answered(call, out)
            if n != task.output_tokens:
                raise RuntimeError(
                    f"request '{call.request_id}': the engine produced {n} tokens, {task.output_tokens} were forced."
                )
            requests.append((call.request_id.removeprefix(f"{run_id}/"), sent, time.monotonic() - t0))
            return Answer("", task.prompt_tokens, n)

        def paused(agent: Agent):
            async def pause() -> None:  # a session between bursts leaves the engine's book (AgentBook.pause)
                if frontend is not None:
                    frontend.pause(agent.agent_id, time.monotonic() - t0)
                else:
                    await control(self.llm, ControlCall(RETIRE, {"agent_id": agent.agent_id, "pause": True}))

            return pause

        results, lags, wall = await replay(agents, process_for, serve, t0, paused, on_agent_finish)
        schedule = None
        if frontend is None:  # the plug-in's clock
            state = PolicyState.from_json(await control(self.llm, ControlCall(STATE)))
            schedule = [tuple(x) for x in state.capacity_schedule] if state.capacity_schedule else None
        else:  # the front end's clock
            schedule = frontend.clock().schedule
        if self.logged:  # a reset that closes (and flushes) the step log
            await self._reset("fcfs", "kv", capacity, None, False)
        steps = read_step_log(step_log)
        if own_log:
            os.unlink(step_log)
        preemptions = sum(row.preemptions for row in steps)
        run = RunResult(
            policy,
            results,
            max(r.finish_s for r in results),
            len(steps),
            len(steps),
            preemptions,
            wall,
            schedule,
            prefix_cache={
                "queried_tokens": cache[0],
                "hit_tokens": cache[1],
                "hit_rate": cache[1] / cache[0] if cache[0] else 0.0,
            }
            if self.prefix_caching
            else None,
        )
        return EngineRun(run, steps, max(lags) if lags else 0.0, requests)

    async def _reset(
        self, policy: str, cost: str, capacity: float, step_log: str | None, measure: bool, retag: bool = True
    ) -> None:
        args = {
            "policy": policy,
            "cost": cost,
            "capacity_per_s": capacity,
            "step_log": step_log,
            "measure_capacity": measure,
            "retag": retag,
        }
        if not await control(self.llm, ControlCall(RESET, args)):
            raise RuntimeError("the plug-in refused to reset (its policy state, its step log): the engine is not idle.")


def register_args(process: AgentProcess, call: Call) -> dict | None:
    """The plug-in's ``register`` arguments for what ``call`` opens, where its price is a
    distribution: the agent (a call of its first stage) or the session's turn (the call that opens
    it, ``turn_start``). The plug-in takes a distribution only there (``Registration.from_json``: ``dist``
    as ``[values, probs]``), never from a request's metadata, which carries the point price. None for
    a call that opens nothing, or a point price."""
    meta = call.meta
    if process.agent.is_session:
        dist = process.burst_dist([call]) if meta.turn_start else None
    else:
        dist = process.predicted_dist if call.stage == 0 else None
    if dist is None:
        return None
    return Registration(
        meta.agent_id,
        meta.agent_type,
        meta.agent_cost,
        meta.agent_weight or 1.0,
        meta.tenant,
        session=meta.session,
        dist=dist,
    ).to_json()


async def replay(
    agents: list[Agent],
    process_for: Callable[[Agent], AgentProcess],
    serve: Callable,
    t0: float,
    paused: Callable[[Agent], Callable] | None = None,
    on_agent_finish: Callable[[AgentResult], None] | None = None,
) -> tuple[list[AgentResult], list[float], float]:
    """Every agent on the wall clock from ``t0`` (``time.monotonic()``): it arrives at its
    ``arrival_s``, its process (``process_for``) is driven by ``agent.drive`` with ``serve``
    (``paused(agent)``: what a session's pause does). Returns the results in the agents' order, how
    late each agent started, and the wall time."""
    results: list[AgentResult] = []
    lags: list[float] = []

    async def run_agent(agent: Agent) -> None:
        delay = agent.arrival_s - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append(time.monotonic() - t0 - agent.arrival_s)
        process = process_for(agent)
        await drive(process, serve, on_pause=paused(agent) if paused else None, clock=lambda: time.monotonic() - t0)
        result = process.result(agent.arrival_s, time.monotonic() - t0)
        results.append(result)
        if on_agent_finish is not None:
            on_agent_finish(result)

    wall0 = time.perf_counter()
    await asyncio.gather(*(run_agent(a) for a in agents))
    wall = time.perf_counter() - wall0
    order = {a.agent_id: k for k, a in enumerate(agents)}
    results.sort(key=lambda r: order[r.agent_id])
    return results, lags, wall


process_cpus()  # read now, before any engine pins this process (then kept)


def core_layout(spec: EngineSpec) -> tuple[str, set[int] | None]:
    """Where the engine's model threads run (``VLLM_CPU_OMP_THREADS_BIND``) and where this process,
    the front end, is pinned once the engine has started (None: not pinned).

    By default the model gets every core but the first, and the front end (the agents, vLLM's
    input and output processing) the first: on two cores, sharing both made repeats of one run
    differ by 12-36 %, and splitting them made runs faster and within 1-11 % of each other
    (justitia/lab/live/noise_study.py, docs/results.md). vLLM's scheduler process keeps every core. A binding
    in the spec or the environment wins, and nothing is pinned."""
    cpus = sorted(process_cpus())
    if len(cpus) < 2:
        return ",".join(map(str, cpus)), None
    threads = ",".join(map(str, cpus[1:]))
    given = spec.cpu_threads or env("VLLM_CPU_OMP_THREADS_BIND")  # (an earlier engine's is ours)
    if given and given != threads:
        return given, None
    return threads, {cpus[0]}


def pin_process(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (threads it starts later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass


class SessionPrompts:
    """The token ids of sessions' calls, built as the simulator's prefix cache sees their text
    (``Agent.runs``): context segments, then the call's own text; see the module's docstring."""

    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.limit = max_model_len
        self._shared: dict[tuple[str, int], list[int]] = {}  # (name, tokens) -> ids
        self._sent: dict[tuple[str, str, str], list[int]] = {}  # (agent, task id, "in"|"out") -> ids
        self.context_tokens = 0

    def _fit(self, text: str, n: int) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False) or [min(3, self.tokenizer.vocab_size - 1)]
        return (ids * -(-n // len(ids)))[:n]

    def prompt(self, call: Call) -> list[int]:
        """The call's prompt ids: exactly its task's ``prompt_tokens``."""
        task, agent_id = call.task, call.meta.agent_id
        if task.prompt_tokens + task.output_tokens > self.limit:
            raise ValueError(
                f"request '{call.request_id}': prompt_tokens + output_tokens = "
                f"{task.prompt_tokens + task.output_tokens} exceeds max_model_len {self.limit}."
            )
        ids: list[int] = []
        for seg in task.context:
            if seg.kind == "shared":
                key = (seg.ref, seg.tokens)
                if key not in self._shared:
                    self._shared[key] = self._fit(shared_text(seg.ref, seg.tokens), seg.tokens)
                ids += self._shared[key]
            else:
                ids += self._sent[(agent_id, seg.ref, "in" if seg.kind == "prompt_of" else "out")]
        own = task.prompt_tokens - len(ids)
        self.context_tokens = len(ids)  # of the prompt just built: its context, before its own text
        if own < 1:
            raise ValueError(
                f"request '{call.request_id}': its context holds {len(ids)} tokens, its prompt "
                f"{task.prompt_tokens}: the context must be shorter."
            )
        ids += self._fit(f"{agent_id} {task.id or call.request_id}: {task.prompt}", own)
        if task.id is not None:
            self._sent[(agent_id, task.id, "in")] = ids
        return ids

    def answered(self, call: Call, output_ids: list[int]) -> None:
        """The engine's output for the call, which later prompts may quote."""
        if getattr(call.task, "id", None) is not None:
            self._sent[(call.meta.agent_id, call.task.id, "out")] = output_ids


@dataclass
class EngineRun:
    """One policy's run on the engine: the results, the engine's steps, the worst arrival lag, and
    each request's (id, sent, answered) in seconds into the run, as its agent saw them."""

    result: RunResult
    steps: list[StepRow]  # the step log's rows (empty: an engine that logs none)
    max_arrival_lag_s: float
    requests: list[tuple[str, float, float]] = field(default_factory=list)
