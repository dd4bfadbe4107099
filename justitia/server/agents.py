"""The agents a server runs: each one an ``AgentProcess`` driven on the server's ``Backend``.

Submitting an agent checks it, prices it with the predictor, registers it with the policy that
orders the engine (which stamps its virtual finish tag) and starts it. Every request carries the
agent's ``RequestMeta``; the last stage's say ``agent_done``, so the policy releases the agent
when they finish. A cancelled or failed agent is released at once. A session runs turn by turn
(``server.turns``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import time
import uuid
from dataclasses import replace

from justitia.agent import Answer, Call, drive
from justitia.predictors import Predictor
from justitia.backends.base import Backend, BackendInterrupted, Sampling
from justitia.server.door import Sessions
from justitia.server.journal import Journal, Record
from justitia.server.keys import ANONYMOUS, Client
from justitia.server.limits import RateLimit
from justitia.server.pricing import Pricer
from justitia.server.runs import TERMINAL, AgentRun, Settings, Turn  # noqa: F401  (Settings: the server's, imported from here)
from justitia.server.schema import AgentSpec, SpecError, check_agent
from justitia.server.turns import await_turn, price_turn

log = logging.getLogger("justitia.server")
JCT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, float("inf"))
V_READ_EVERY_S = 1.0  # the clock's V, journaled with each agent, is read at most this often
MAX_METRIC_TYPES = 64  # agent types with series of their own in /metrics; the rest are counted as "other"




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
        self.pricer = Pricer(tokenizer, settings, predictor)  # tokenizing and prices
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

    def working(self) -> int:
        """Agents in flight less the sessions waiting for their client (``server.turns``): what a
        stopping server waits for. A waiting session is journaled as waiting; the next start
        keeps it waiting for its next turn (``recovery``), so a drain need not wait for it."""
        return self.in_flight() - sum(run.status == "waiting" for run in self.agents.values())

    def owner_in_flight(self, owner: str) -> int:
        return self.owner_agents.get(owner, 0) + self.admitting.get(owner, 0)

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
        check_agent(spec, self.settings.max_tasks_per_agent, self.settings.max_model_len - 1, self.settings.max_pause_s)
        agent_id = f"agent-{uuid.uuid4().hex[:12]}"
        process, first, predict_s = await asyncio.to_thread(price_turn, self.pricer, agent_id, spec.type,
                                                            list(spec.stages), client, [])
        predicted = process.predicted_cost
        self.predict_s += predict_s
        self.predictions += 1
        predict_ms = 1000 * predict_s
        self.count_request("agents")
        arrival = self.now()
        run = AgentRun(agent_id, spec, process, arrival, None, client.owner,
                       outputs=[[None] * len(stage) for stage in spec.stages])
        run.client, run.first_ids = client, first
        if spec.session:  # registered as a session: kept across its pauses, each turn registered (server.turns)
            run.turns = [Turn(list(spec.stages), 0, predicted)]
        v = await self._register(run)  # refused: nothing journaled, its Idempotency-Key free (submit)
        run.turn_opened = spec.session  # its first request need not open the turn
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
        owed a resumed agent (``Backend.register``). A session's is its current turn's (``server.turns``)."""
        client = run.client
        extra = {"resume_cost": resume_cost} if resume_cost is not None else {}
        if run.session:
            extra["session"] = True
        if run.process.predicted_dist is not None:
            extra["dist"] = run.process.predicted_dist
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
        run.emit("queued", predicted_cost=run.predicted_cost, virtual_finish=run.virtual_finish, **event)
        run.task = asyncio.get_running_loop().create_task(self._run(run, resume))

    def wall(self, now_s: float) -> float:
        """Wall-clock time of a server time (``now``)."""
        return self.t_start + (now_s - self.t_start_s)

    async def recover(self) -> tuple[int, int]:
        """Reload the journal at start-up (``recovery.recover``): (finished, resumed)."""
        from justitia.server.recovery import recover

        return await recover(self)

    async def _serve(self, run: AgentRun, call: Call) -> Answer:
        """One task of an agent on the backend (``call.stage`` counts in its turn's process; ``stage``,
        in the session)."""
        task, stage = call.task, run.base + call.stage
        first = run.first_ids.pop(call.index, None) if call.stage == 0 else None  # tokenized at submission
        try:
            ids = first[1] if first is not None and call.prompt == first[0] else await self.pricer.encode(call.prompt)
        except SpecError as exc:
            raise SpecError(f"stage {stage} task {call.index}: {exc}") from None
        if len(ids) + task.max_tokens > self.settings.max_model_len:
            raise SpecError(f"stage {stage} task {call.index}: {len(ids)} prompt tokens (after placeholders) + "
                            f"max_tokens {task.max_tokens} exceed the model's context of "
                            f"{self.settings.max_model_len} tokens.")
        meta = call.meta
        if run.session:  # a turn not registered ahead: its first request opens it at its price; the last turn ends it
            meta = replace(meta, session=True, turn_start=not run.turn_opened,
                           agent_done=meta.agent_done and run.turns[-1].last)
            run.turn_opened = True
        params = Sampling(task.max_tokens, task.temperature, task.top_p, task.seed, task.stop, task.ignore_eos,
                          meta.to_extra_args())
        request_id = f"{run.agent_id}/{stage}/{call.index}"
        final = None
        self.tasks_in_flight += 1
        try:
            for attempt in (1, 2):  # a replica that fails midway: the task runs once more (on another)
                try:
                    async for out in self.backend.generate({"prompt_token_ids": ids}, params,
                                                           request_id + ("" if attempt == 1 else "/retry")):
                        final = out
                    break
                except BackendInterrupted as exc:
                    if attempt == 2 or not self.backend.alive():
                        raise
                    log.warning(json.dumps({"event": "task_retried", "agent_id": run.agent_id, "stage": stage,
                                            "task": call.index, "error": str(exc)}))
        finally:
            self.tasks_in_flight -= 1
        o = final.outputs[0]
        doc = {"output": o.text, "prompt_tokens": len(ids), "output_tokens": len(o.token_ids),
               "finish_reason": o.finish_reason}
        if self.journal is not None:  # before the agent moves on: a restart resumes after it
            await self.journal.task_done(run.agent_id, stage, call.index, doc)
        run.outputs[stage][call.index] = doc
        run.emit("task_done", stage=stage, task=call.index, output_tokens=len(o.token_ids))
        return Answer(o.text, len(ids), len(o.token_ids), o.finish_reason)

    async def _run(self, run: AgentRun, resume: list[list[Answer]] | None = None) -> None:
        """The agent's life: its stages (a session's turns, each after its client's, ``await_turn``),
        then its end (``_end``)."""
        try:
            if run.status != "waiting":  # (a session restored while waiting waits first)
                await self._turn(run, resume)
            while run.session and not run.turns[-1].last and await await_turn(self, run):
                await self._turn(run)
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
        await self._end(run)

    async def _turn(self, run: AgentRun, resume: list[list[Answer]] | None = None) -> None:
        """Run the agent's stages, or a session's current turn (after the stages ``resume`` answered)."""
        run.status = "running"
        run.emit("running", **({"turn": len(run.turns) - 1} if run.session else {}))
        await drive(run.process, lambda call: self._serve(run, call), resume)

    async def _end(self, run: AgentRun) -> None:
        """A finished agent (or session): journaled, released from the policy unless its last
        requests said ``agent_done``, counted and kept for GET."""
        run.finish_s = self.now()
        if self.journal is not None:
            try:
                await self.journal.ended(run.agent_id, run.status, run.error, self.wall(run.finish_s))
            except Exception as exc:  # noqa: BLE001  (kept in memory; a restart would run it again)
                log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))
        # its agent_done requests may never have run (or a session ended waiting): release it now
        if run.status != "done" or (run.session and not run.turns[-1].last):
            try:
                await self.backend.retire(run.agent_id)
            except Exception as exc:  # noqa: BLE001  (the policy's idle timeout still releases it)
                log.warning(json.dumps({"event": "release_failed", "agent_id": run.agent_id, "error": str(exc)}))
        self.finished[run.status] += 1
        if run.status == "done" and not run.session:  # (a session's time is its client's too)
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
