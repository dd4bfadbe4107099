"""The agents a server runs: each one an ``AgentProcess`` driven on the server's ``Backend``.

Submitting an agent checks it, prices it with the predictor, registers it with the policy that
orders the engine (which stamps its virtual finish tag) and starts it. Every request carries the
agent's ``RequestMeta``; the last stage's say ``agent_done``, so the policy releases the agent
when they finish. A cancelled or failed agent is released at once.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field

from justitia.agent import AgentProcess, Answer, Call, drive
from justitia.core import KV
from justitia.predictors import Predictor
from justitia.server.backend import Backend, BackendInterrupted
from justitia.server.door import Sessions
from justitia.server.journal import Journal, Record, resume_order
from justitia.server.keys import ANONYMOUS, Client
from justitia.server.limits import RateLimit
from justitia.server.schema import PLACEHOLDER, AgentSpec, SpecError, check_agent, render
from justitia.vllm.models import chat_ids
from justitia.workload import Agent, Task

log = logging.getLogger("justitia.server")
TERMINAL = ("done", "failed", "cancelled")
JCT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, float("inf"))
V_READ_EVERY_S = 1.0  # the clock's V, journaled with each agent, is read at most this often
MAX_METRIC_TYPES = 64  # agent types with series of their own in /metrics; the rest are counted as "other"


@dataclass
class Settings:
    """Limits and identity of one server."""

    model: str = "tiny"
    policy: str = "justitia"
    max_model_len: int = 2048
    max_tasks_per_agent: int = 256
    max_agents_in_flight: int = 2048
    max_body_bytes: int = 1_000_000
    finished_bytes: int = 64 << 20  # finished agents' documents kept for GET, oldest dropped first (then 410)
    finished_s: float = 24 * 3600.0  # and for at most this long
    chars_per_context_token: int = 16  # a rendered prompt longer than this x max_model_len is refused untokenized
    chat: bool = True  # wrap agent prompts in the model's chat template when it has one
    key_agents_in_flight: int | None = None  # per key (None: max_agents_in_flight)
    key_requests_in_flight: int = 256  # OpenAI requests per key
    key_rate: float = 0.0  # requests (agents and completions) per second per key; 0: no rate limit
    key_burst: int = 0  # the rate limit's burst (0: one second's worth, at least 1)
    max_requests_in_flight: int = 1024  # OpenAI requests in all (beyond: 503)
    max_streams_per_agent: int = 8  # open event streams of one agent

    @property
    def max_prompt_chars(self) -> int:
        return self.chars_per_context_token * self.max_model_len


@dataclass
class AgentRun:
    """One submitted agent: what it asked, where it is, what it produced."""

    agent_id: str
    spec: AgentSpec
    process: AgentProcess
    arrival_s: float
    virtual_finish: float | None
    owner: str = ANONYMOUS.owner  # the key that submitted it (its owner id, not the key)
    status: str = "queued"
    error: str | None = None
    finish_s: float | None = None
    outputs: list[list[dict | None]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    streams: int = 0  # open event streams
    client: Client = ANONYMOUS  # who submitted it (owner, tenant, weight)
    cancelled_by_client: bool = False  # (a task cancelled otherwise is the server stopping)
    first_ids: dict[int, list[int]] = field(default_factory=dict)  # the first stage's prompts, tokenized at submission

    def emit(self, kind: str, **data) -> None:
        self.events.append({"event": kind, "agent_id": self.agent_id, "t_s": round(time.monotonic(), 6)} | data)
        self.changed.set()
        self.changed = asyncio.Event()

    def doc(self) -> dict:
        jct = None if self.finish_s is None else self.finish_s - self.arrival_s
        return {
            "agent_id": self.agent_id, "type": self.spec.type, "status": self.status, "error": self.error,
            "arrival_s": self.arrival_s, "finish_s": self.finish_s, "jct_s": jct,
            "predicted_cost": self.process.predicted_cost, "virtual_finish": self.virtual_finish,
            "stages": self.outputs,
        }


class AgentManager:
    """Runs agents stage by stage on the backend and keeps their state for the API."""

    def __init__(self, backend: Backend, tokenizer, settings: Settings, predictor: Predictor,
                 journal: Journal | None = None):
        self.backend, self.tokenizer, self.settings, self.predictor = backend, tokenizer, settings, predictor
        self.journal = journal
        self.agents: dict[str, AgentRun] = {}
        self.t0 = time.monotonic()
        self.t_start, self.t_start_s = time.time(), 0.0  # the wall clock at server time 0
        self.idempotent: dict[tuple[str, str], asyncio.Future] = {}  # (owner, Idempotency-Key) -> its agent
        self.draining = False
        self._background: set[asyncio.Task] = set()
        self.finished: dict[str, int] = {s: 0 for s in TERMINAL}
        self.jct: dict[str, list[int]] = {}  # type -> counts per JCT_BUCKETS (cumulative at export)
        self.jct_sum: dict[str, float] = {}
        self.predict_s, self.predictions = 0.0, 0
        self.requests: dict[str, int] = {"agents": 0, "chat": 0, "completions": 0, "responses": 0, "messages": 0}
        self.tasks_in_flight = 0
        self.ended: collections.deque[tuple[str, float, int]] = collections.deque()  # (id, when, bytes), oldest first
        self.ended_bytes = 0
        self.expired: collections.OrderedDict[str, str] = collections.OrderedDict()  # dropped agents -> owner (410)
        self.owner_agents: dict[str, int] = {}  # agents in flight per owner
        # agents past the limits' checks and not yet started (their prediction, journal and
        # registration awaited): counted at once, so that concurrent submissions cannot all pass
        self.admitting: dict[str, int] = {}
        self.owner_requests: dict[str, int] = {}  # OpenAI and Anthropic requests in flight per owner (the door's)
        self.requests_in_flight = 0
        self.rate = RateLimit(settings.key_rate, settings.key_burst)  # per key, agents and requests alike
        self.sessions = Sessions()  # the identified agents of the OpenAI and Anthropic endpoints
        self._clocked = True  # the policy stamps tags (until a registration says otherwise)
        self._v_read: tuple[float, float | None] = (-math.inf, None)  # (server time, the clock's V) last read

    def now(self) -> float:
        return time.monotonic() - self.t0

    def in_flight(self) -> int:
        """Agents submitted and not ended, and those being accepted now (``admitting``)."""
        return sum(self.owner_agents.values()) + sum(self.admitting.values())

    def owner_in_flight(self, owner: str) -> int:
        return self.owner_agents.get(owner, 0) + self.admitting.get(owner, 0)

    def ids_of(self, prompt: str) -> list[int]:
        """A prompt's token ids, in the model's chat template when it has one (and ``settings.chat``)."""
        tok = self.tokenizer
        if self.settings.chat and tok.chat_template:
            return chat_ids(tok, [{"role": "user", "content": prompt}])
        return tok.encode(prompt)

    async def predicted(self, predict) -> float:
        """Run ``predict()`` (a predictor's agent cost) off the event loop (a predictor can take
        milliseconds), its latency kept for /metrics."""
        t0 = time.perf_counter()
        value = float(await asyncio.to_thread(predict))
        self.predict_s += time.perf_counter() - t0
        self.predictions += 1
        return value

    def _ids_checked(self, prompt: str) -> list[int]:
        """``ids_of``, refused untokenized if the prompt is longer than any prompt that could fit the context."""
        if len(prompt) > self.settings.max_prompt_chars:
            raise SpecError(f"the prompt has {len(prompt)} characters, more than this server's limit of "
                            f"{self.settings.max_prompt_chars}.")
        return self.ids_of(prompt)

    async def encode(self, prompt: str) -> list[int]:
        """``_ids_checked`` off the event loop (tokenizing a long prompt takes time)."""
        if len(prompt) > self.settings.max_prompt_chars:  # no trip to a thread for that
            return self._ids_checked(prompt)
        return await asyncio.to_thread(self._ids_checked, prompt)

    def count_request(self, endpoint: str) -> None:
        self.requests[endpoint] += 1

    # ----------------------------------------------------------------------------- agents
    def owned(self, agent_id: str, client: Client) -> AgentRun | None:
        """The agent if ``client`` owns it; None if it is unknown or another key's (both 404)."""
        self.forget_old()
        run = self.agents.get(agent_id)
        return run if run is not None and run.owner == client.owner else None

    def was_owned(self, agent_id: str, client: Client) -> bool:
        """Whether ``client``'s agent of that id finished and was dropped since (410, not 404)."""
        return self.expired.get(agent_id) == client.owner

    def forget_old(self) -> None:
        """Drop finished agents past the bytes and age kept (a server runs for days); their ids are
        remembered, bounded, to answer 410."""
        limit_s = self.now() - self.settings.finished_s
        dropped = []
        while self.ended and (self.ended_bytes > self.settings.finished_bytes or self.ended[0][1] < limit_s):
            agent_id, _, size = self.ended.popleft()
            self.ended_bytes -= size
            run = self.agents.pop(agent_id, None)
            if run is not None:
                dropped.append(agent_id)
                self.expired[agent_id] = run.owner
                while len(self.expired) > 100_000:
                    self.expired.popitem(last=False)
        if dropped and self.journal is not None:  # kept referenced until done (asyncio holds tasks weakly)
            task = asyncio.get_running_loop().create_task(self.journal.forget(dropped))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _process(self, agent_id: str, spec: AgentSpec, client: Client) -> tuple[AgentProcess, list[list[int]]]:
        """The agent's process, with what the predictor sees at arrival: the first stage's prompts
        and lengths (later stages' prompts still hold their placeholders; their lengths are not known
        yet); and the first stage's token ids, which its tasks then send as they are. Tokenizes: run
        it off the event loop."""
        first = []
        for i, t in enumerate(spec.stages[0]):
            try:
                first.append(self._ids_checked(t.prompt))
            except SpecError as exc:
                raise SpecError(f"field 'stages[0][{i}].prompt': {exc}") from None
            if len(first[i]) + t.max_tokens > self.settings.max_model_len:
                raise SpecError(f"field 'stages[0][{i}].prompt': {len(first[i])} prompt tokens + max_tokens "
                                f"{t.max_tokens} exceed the model's context of {self.settings.max_model_len} tokens.")
        later = {}  # a later stage's own text (placeholders left out), tokenized: a floor on its prompt
        for s, stage in enumerate(spec.stages[1:], 1):
            for i, t in enumerate(stage):
                own = PLACEHOLDER.sub("", t.prompt)
                try:
                    later[s, i] = len(self._ids_checked(own))
                except SpecError as exc:
                    raise SpecError(f"field 'stages[{s}][{i}].prompt': {exc}") from None
                if later[s, i] + t.max_tokens > self.settings.max_model_len:
                    raise SpecError(f"field 'stages[{s}][{i}].prompt': its own text is {later[s, i]} tokens, with "
                                    f"max_tokens {t.max_tokens} more than the model's context of "
                                    f"{self.settings.max_model_len} tokens before any placeholder is filled.")
        view = Agent(agent_id, spec.type, 0.0, tuple(
            tuple(Task(t.prompt, len(first[i]) if s == 0 else max(later[s, i], len(t.prompt) // 4), t.max_tokens)
                  for i, t in enumerate(stage)) for s, stage in enumerate(spec.stages)),
            weight=client.weight, tenant=client.tenant)
        # submitted whole: priced on every stage, so that a cheap first stage cannot hide heavy later ones
        process = AgentProcess(view, self.predictor, KV, tasks=spec.stages, pricing="all-stages",
                               render=functools.partial(render, limit=self.settings.max_prompt_chars))
        return process, first

    def _priced(self, agent_id: str, spec: AgentSpec, client: Client) -> tuple[AgentProcess, list[list[int]], float]:
        """``_process`` and its price (and how long the predictor took), in one trip to a worker
        thread. The rule (docs/server.md, "prices"): a task's KV token-time is at most ``p*m + m^2/2``
        for its prompt's ``p`` tokens and ``m = max_tokens`` (its bound), and exactly that with
        ``ignore_eos``. The price is the predictor's, raised to what the ``ignore_eos`` tasks will
        cost (whatever a predictor reads of their text) and never above the sum of every task's
        bound (a prompt with placeholders, whose filled length is not known yet, at the longest the
        context allows: ``max_model_len - m``). What the predictor misses below that, retagging on
        attained service catches in the engine."""
        process, first = self._process(agent_id, spec, client)
        t0 = time.perf_counter()
        process.predict()
        known = ceiling = 0.0
        for s, stage in enumerate(process.agent.stages):
            for i, task in enumerate(stage):
                given = spec.stages[s][i]
                p = task.prompt_tokens
                if PLACEHOLDER.search(given.prompt):
                    p = max(p, self.settings.max_model_len - task.output_tokens)
                ceiling += KV.request_cost(p, task.output_tokens)
                if given.ignore_eos:
                    known += KV.request_cost(task.prompt_tokens, task.output_tokens)
        process.predicted_cost = min(max(process.predicted_cost, known), ceiling)
        return process, first, time.perf_counter() - t0

    async def submit(self, spec: AgentSpec, client: Client = ANONYMOUS,
                     idempotency_key: str | None = None) -> AgentRun:
        """Check, predict, journal, register and start one agent for ``client`` (its owner, in its
        tenant, with its weight); raises SpecError on a bad one. A retried ``idempotency_key``
        of the same key returns the first agent."""
        if idempotency_key is not None:
            known = self.idempotent.get((client.owner, idempotency_key))
            if known is not None:
                return await asyncio.shield(known)  # the first one (still being accepted, or accepted)
            self.idempotent[(client.owner, idempotency_key)] = asyncio.get_running_loop().create_future()
        try:
            run = await self._accept(spec, client, idempotency_key)
        except BaseException as exc:
            if idempotency_key is not None:  # a retry may try again
                first = self.idempotent.pop((client.owner, idempotency_key))
                if isinstance(exc, Exception):
                    first.set_exception(exc)
                    first.exception()  # retrieved: no warning when no retry was waiting
                else:
                    first.cancel()
            raise
        if idempotency_key is not None:
            self.idempotent[(client.owner, idempotency_key)].set_result(run)
        return run

    async def _accept(self, spec: AgentSpec, client: Client, idempotency_key: str | None) -> AgentRun:
        check_agent(spec, self.settings.max_tasks_per_agent, self.settings.max_model_len - 1)
        agent_id = f"agent-{uuid.uuid4().hex[:12]}"
        process, first, predict_s = await asyncio.to_thread(self._priced, agent_id, spec, client)
        predicted = process.predicted_cost
        self.predict_s += predict_s
        self.predictions += 1
        predict_ms = 1000 * predict_s
        self.count_request("agents")
        arrival = self.now()
        run = AgentRun(agent_id, spec, process, arrival, None, client.owner,
                       outputs=[[None] * len(stage) for stage in spec.stages])
        run.client, run.first_ids = client, dict(enumerate(first))
        v = await self._register(run)  # refused: nothing journaled, its Idempotency-Key free (submit)
        if self.journal is not None:  # committed before the 202: accepted work survives a crash
            try:
                await self.journal.accept(Record(agent_id, client.owner, client.tenant, client.weight,
                                                 spec.model_dump(), idempotency_key, predicted, "queued", None,
                                                 self.wall(arrival), None, None, run.virtual_finish, v))
            except BaseException:  # not accepted after all: the policy forgets it, the next start too
                await asyncio.shield(self._unaccept(agent_id))
                raise
        self._launch(run, predict_ms=round(predict_ms, 3))
        log.info(json.dumps({"event": "agent_submitted", "agent_id": agent_id, "owner": client.owner, "type": spec.type,
                             "tasks": sum(len(s) for s in spec.stages), "predicted_cost": predicted}))
        return run

    async def _register(self, run: AgentRun, resume_cost: float | None = None) -> float | None:
        """Register the agent with the policy; its tag goes to ``run.virtual_finish``. With a journal,
        returns the clock's ``V`` as last read, for a restart to place it (``journal.resume_order``:
        a lower bound on ``V`` when the server stops is all it needs), read again alongside the
        registration (a control call more, at once) when the last reading is older than
        ``V_READ_EVERY_S``; None under a policy without a clock. ``resume_cost``: what GPS still
        owed a resumed agent (``Backend.register``)."""
        client = run.client
        extra = {"resume_cost": resume_cost} if resume_cost is not None else {}
        register = self.backend.register(run.agent_id, run.spec.type, run.process.predicted_cost, client.weight,
                                         client.tenant, **extra)
        now = self.now()
        if self.journal is None or not self._clocked or now - self._v_read[0] < V_READ_EVERY_S:
            run.virtual_finish = await register
        else:
            run.virtual_finish, v = await asyncio.gather(register, self._virtual_time())
            if v is not None:  # (V never goes back: a reading that comes back late does not lower it)
                self._v_read = now, v if self._v_read[1] is None else max(v, self._v_read[1])
        if run.virtual_finish is None:  # a policy without a clock: nothing to read from now on
            self._clocked = False
            return None
        return self._v_read[1]

    async def _virtual_time(self) -> float | None:
        """The clock's ``V`` now, or None (no answer: the journal keeps the last reading)."""
        try:
            return (await self.backend.state()).virtual_time
        except Exception:  # noqa: BLE001  (a reading missed costs a resumed agent only part of its place)
            return None

    async def _unaccept(self, agent_id: str) -> None:
        """Undo a registration whose journal entry failed (or was cancelled, perhaps once written)."""
        try:
            await self.backend.retire(agent_id)
        except Exception as exc:  # noqa: BLE001  (the policy's idle timeout still releases it)
            log.warning(json.dumps({"event": "release_failed", "agent_id": agent_id, "error": str(exc)}))
        try:
            await self.journal.forget([agent_id])
        except Exception:  # noqa: BLE001  (a journal that cannot write did not write it either)
            pass

    def _launch(self, run: AgentRun, resume: list[list[Answer]] | None = None, **event) -> None:
        """Run the registered agent (after the stages ``resume`` answered)."""
        self.agents[run.agent_id] = run
        self.owner_agents[run.owner] = self.owner_agents.get(run.owner, 0) + 1
        run.emit("queued", predicted_cost=run.process.predicted_cost, virtual_finish=run.virtual_finish, **event)
        run.task = asyncio.get_running_loop().create_task(self._run(run, resume))

    def wall(self, now_s: float) -> float:
        """Wall-clock time of a server time (``now``)."""
        return self.t_start + (now_s - self.t_start_s)

    async def recover(self) -> tuple[int, int]:
        """Reload the journal at start-up: finished agents answer as before, unfinished ones run
        again from their first stage not fully answered, same id and owner, registered again in
        their old tags' order with what GPS still owed them (``journal.resume_order``): before
        every agent that arrives from now on with their cost and weight. (finished, resumed)."""
        if self.journal is None:
            return 0, 0
        finished = 0
        records = self.journal.load()
        waiting = {}  # unfinished: agent id -> its run and the answers kept
        for rec in records:
            spec = AgentSpec.model_validate(rec.spec)
            client = Client(rec.owner, rec.tenant, rec.weight)
            try:
                process, _ = await asyncio.to_thread(self._process, rec.agent_id, spec, client)
            except SpecError:  # the server now runs a model with a shorter context: fail it, with why
                process = AgentProcess(Agent(rec.agent_id, spec.type, 0.0, ((Task("", 1, 1),),)), self.predictor, KV)
                rec.status, rec.error = "failed", rec.error or "the restarted server cannot fit its first stage."
            process.predicted_cost = rec.predicted_cost
            arrival = rec.arrival_wall - self.wall(0.0)
            run = AgentRun(rec.agent_id, spec, process, arrival, None, rec.owner,
                           outputs=[[rec.outputs.get((s, i)) for i in range(len(stage))]
                                    for s, stage in enumerate(spec.stages)])
            run.client = client
            if rec.idempotency_key is not None:
                done = asyncio.get_running_loop().create_future()
                done.set_result(run)
                self.idempotent[(rec.owner, rec.idempotency_key)] = done
            if rec.status in TERMINAL:
                run.status, run.error = rec.status, rec.error
                run.finish_s = (rec.finish_wall or rec.arrival_wall) - self.wall(0.0)
                self.agents[run.agent_id] = run
                self.finished[run.status] += 1
                run.emit(run.status, **({"error": run.error} if run.error else {}))
                self._keep(run)
                finished += 1
                continue
            answered = []
            for stage in run.outputs:  # the stages answered in full, then one answered in part (if any)
                answered.append([None if d is None else Answer(d["output"], d["prompt_tokens"], d["output_tokens"],
                                                               d["finish_reason"]) for d in stage])
                if any(doc is None for doc in stage):
                    break
            for s in range(len(answered), len(run.outputs)):  # later stages: nothing kept (none can have run)
                run.outputs[s] = [None] * len(run.outputs[s])
            waiting[rec.agent_id] = run, answered
        for rec, owed in resume_order(records):  # in their old order, each registered before the next
            run, answered = waiting[rec.agent_id]
            v = await self._register(run, owed)
            try:  # its stamps in this run's clock, for a later restart
                await self.journal.stamped(run.agent_id, run.virtual_finish, v)
            except Exception as exc:  # noqa: BLE001  (its old stamps stay: a later restart places it by them)
                log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))
            part = bool(answered) and None in answered[-1]
            self._launch(run, answered, resumed_after_stage=len(answered) - 1 - part, resume_cost=owed,
                         tasks_kept=sum(d is not None for stage in run.outputs for d in stage))
        log.info(json.dumps({"event": "journal_recovered", "journal": str(self.journal.path),
                             "finished": finished, "resumed": len(waiting)}))
        return finished, len(waiting)

    async def _serve(self, run: AgentRun, call: Call) -> Answer:
        """One task of an agent on the backend."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        task = call.task
        ids = run.first_ids.pop(call.index, None) if call.stage == 0 else None  # tokenized at submission
        try:
            if ids is None or call.prompt != run.spec.stages[0][call.index].prompt:
                ids = await self.encode(call.prompt)
        except SpecError as exc:
            raise SpecError(f"stage {call.stage} task {call.index}: {exc}") from None
        if len(ids) + task.max_tokens > self.settings.max_model_len:
            raise SpecError(f"stage {call.stage} task {call.index}: {len(ids)} prompt tokens (after placeholders) + "
                            f"max_tokens {task.max_tokens} exceed the model's context of "
                            f"{self.settings.max_model_len} tokens.")
        params = SamplingParams(max_tokens=task.max_tokens, temperature=task.temperature, top_p=task.top_p,
                                seed=task.seed, stop=task.stop, ignore_eos=task.ignore_eos,
                                extra_args=call.meta.to_extra_args(), output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        self.tasks_in_flight += 1
        try:
            for attempt in (1, 2):  # a replica that fails midway: the task runs once more (on another)
                try:
                    async for out in self.backend.generate({"prompt_token_ids": ids}, params,
                                                           call.request_id + ("" if attempt == 1 else "/retry")):
                        final = out
                    break
                except BackendInterrupted as exc:
                    if attempt == 2 or not self.backend.alive():
                        raise
                    log.warning(json.dumps({"event": "task_retried", "agent_id": run.agent_id, "stage": call.stage,
                                            "task": call.index, "error": str(exc)}))
        finally:
            self.tasks_in_flight -= 1
        o = final.outputs[0]
        doc = {"output": o.text, "prompt_tokens": len(ids), "output_tokens": len(o.token_ids),
               "finish_reason": o.finish_reason}
        if self.journal is not None:  # before the agent moves on: a restart resumes after it
            await self.journal.task_done(run.agent_id, call.stage, call.index, doc)
        run.outputs[call.stage][call.index] = doc
        run.emit("task_done", stage=call.stage, task=call.index, output_tokens=len(o.token_ids))
        return Answer(o.text, len(ids), len(o.token_ids), o.finish_reason)

    async def _run(self, run: AgentRun, resume: list[list[Answer]] | None = None) -> None:
        try:
            run.status = "running"
            run.emit("running")
            await drive(run.process, lambda call: self._serve(run, call), resume)
            run.status = "done"
        except asyncio.CancelledError:
            if not run.cancelled_by_client:  # the server is stopping: the journal resumes it at restart
                self.owner_agents[run.owner] -= 1
                raise
            run.status = "cancelled"
        except Exception as exc:  # noqa: BLE001  (any failure of a task fails the agent, with its reason)
            if not self.backend.alive():  # the engine died under it: the restarted server resumes it
                self.owner_agents[run.owner] -= 1
                log.warning(json.dumps({"event": "agent_interrupted", "agent_id": run.agent_id, "error": str(exc)}))
                return
            run.status, run.error = "failed", str(exc) or type(exc).__name__
        run.finish_s = self.now()
        if self.journal is not None:
            try:
                await self.journal.ended(run.agent_id, run.status, run.error, self.wall(run.finish_s))
            except Exception as exc:  # noqa: BLE001  (kept in memory; a restart would run it again)
                log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))
        if run.status != "done":  # its agent_done requests may never have run: release it now
            try:
                await self.backend.retire(run.agent_id)
            except Exception as exc:  # noqa: BLE001  (the policy's idle timeout still releases it)
                log.warning(json.dumps({"event": "release_failed", "agent_id": run.agent_id, "error": str(exc)}))
        self.finished[run.status] += 1
        if run.status == "done":
            jct = run.finish_s - run.arrival_s
            label = run.spec.type if run.spec.type in self.jct or len(self.jct) < MAX_METRIC_TYPES else "other"
            counts = self.jct.setdefault(label, [0] * len(JCT_BUCKETS))
            counts[next(k for k, b in enumerate(JCT_BUCKETS) if jct <= b)] += 1
            self.jct_sum[label] = self.jct_sum.get(label, 0.0) + jct
        run.emit(run.status, **({"error": run.error} if run.error else {}))
        self.owner_agents[run.owner] -= 1
        self._keep(run)
        log.info(json.dumps({"event": "agent_" + run.status, "agent_id": run.agent_id,
                             "jct_s": round(run.finish_s - run.arrival_s, 4), "error": run.error}))

    def _keep(self, run: AgentRun) -> None:
        """A finished agent joins those kept (by bytes and age)."""
        size = len(json.dumps(run.doc())) + sum(len(json.dumps(e)) for e in run.events)
        self.ended.append((run.agent_id, run.finish_s, size))
        self.ended_bytes += size
        self.forget_old()

    async def cancel(self, agent_id: str) -> AgentRun:
        run = self.agents[agent_id]
        run.cancelled_by_client = True
        if run.status not in TERMINAL and run.task is not None:
            run.task.cancel()
            await asyncio.gather(run.task, return_exceptions=True)
        return run
