"""The agents a server runs: each one an ``AgentProcess`` driven on the server's ``Backend``.

Submitting an agent checks it, prices it with the predictor, registers it with the policy that
orders the engine (which stamps its virtual finish tag) and starts it. Every request carries the
agent's ``RequestMeta``; the last stage's say ``agent_done``, so the policy releases the agent
when they finish. A cancelled or failed agent is released at once. A session runs turn by turn
(``server.turns``).

``AgentManager`` submits and drives agents. What it shares is in parts of their own, each used
through its methods: ``admission.Admission`` (the limits and counts of what is in flight, the
door's and the agent API's), ``store.AgentStore`` (the agents by id, finished ones kept by bytes
and age), ``metrics.Counts`` (what ``/metrics`` reports) and ``pricing.Pricer``; a restart's reload
is ``recovery``'s, through ``register``, ``launch``, ``remember`` and ``ended_before``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from dataclasses import replace

from justitia.agent import Answer, Call, drive
from justitia.backends.base import Backend, BackendInterrupted, Sampling
from justitia.core import Registration
from justitia.predictors import Predictor
from justitia.server.admission import Admission
from justitia.server.journal import Journal, Record
from justitia.server.keys import ANONYMOUS, Client
from justitia.server.metrics import Counts
from justitia.server.observe import Watch
from justitia.server.pricing import Pricer
from justitia.server.runs import TERMINAL, AgentRun, Settings, Turn  # noqa: F401  (Settings: the server's, imported from here)
from justitia.server.schema import AgentSpec, SpecError, check_agent
from justitia.server.store import AgentStore
from justitia.server.turns import await_turn, price_turn

log = logging.getLogger("justitia.server")
V_READ_EVERY_S = 1.0  # the clock's V, journaled with each agent, is read at most this often


class AgentManager:
    """Runs agents stage by stage on the backend and keeps their state for the API."""

    def __init__(
        self, backend: Backend, tokenizer, settings: Settings, predictor: Predictor, journal: Journal | None = None
    ):
        self.backend, self.tokenizer, self.settings, self.predictor = backend, tokenizer, settings, predictor
        self.journal = journal
        self.t0 = time.monotonic()
        self.t_start, self.t_start_s = time.time(), 0.0  # the wall clock at server time 0
        self.store = AgentStore(settings, journal, self.now)  # the agents by id, finished ones kept
        self.admission = Admission(settings)  # what is in flight, and its limits: the door's and the agent API's
        self.idempotent: dict[tuple[str, str], asyncio.Future] = {}  # (owner, Idempotency-Key) -> its agent
        self.draining = False
        self.counts = Counts()  # what /metrics reports, the door's requests included
        self.pricer = Pricer(tokenizer, settings, predictor)  # tokenizing and prices
        # the engine's per-tenant state over a window: /metrics, the live page, justitia top
        self.watch = Watch(
            backend, settings.model, settings.max_model_len, settings.metrics_window_s, settings.metrics_tenants
        )
        self._clocked = True  # the policy stamps tags (until a registration says otherwise)
        self._v_read: tuple[float, float | None] = (-math.inf, None)  # (server time, the clock's V) last read

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def agents(self) -> dict[str, AgentRun]:
        """Every agent known, by id (``store``)."""
        return self.store.agents

    def in_flight(self) -> int:
        """Agents submitted and not ended, and those being accepted now (``Admission.admit``)."""
        return self.admission.agents_in_flight()

    def working(self) -> int:
        """Agents in flight less the sessions waiting for their client (``server.turns``): what a
        stopping server waits for. A waiting session is journaled as waiting; the next start
        keeps it waiting for its next turn (``recovery``), so a drain need not wait for it."""
        return self.in_flight() - sum(run.status == "waiting" for run in self.agents.values())

    # ----------------------------------------------------------------------------- agents
    def is_retry(self, owner: str, idempotency_key: str) -> bool:
        """Whether ``owner`` submitted an agent under ``idempotency_key`` already (``submit`` returns it)."""
        return (owner, idempotency_key) in self.idempotent

    async def submit(self, spec: AgentSpec, client: Client = ANONYMOUS, idempotency_key: str | None = None) -> AgentRun:
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
        process, first, predict_s = await asyncio.to_thread(
            price_turn, self.pricer, agent_id, spec.type, list(spec.stages), client, []
        )
        predicted = process.predicted_cost
        self.counts.submission(predict_s)
        predict_ms = 1000 * predict_s
        arrival = self.now()
        run = AgentRun(
            agent_id, spec, process, arrival, None, client.owner, outputs=[[None] * len(stage) for stage in spec.stages]
        )
        run.client, run.first_ids = client, first
        if spec.session:  # registered as a session: kept across its pauses, each turn registered (server.turns)
            run.turns = [Turn(list(spec.stages), 0, predicted)]
        v = await self.register(run)  # refused: nothing journaled, its Idempotency-Key free (submit)
        run.turn_opened = spec.session  # its first request need not open the turn
        if self.journal is not None:  # committed before the 202: accepted work survives a crash
            try:
                await self.journal.accept(
                    Record(
                        agent_id,
                        client.owner,
                        client.tenant,
                        client.weight,
                        spec.model_dump(),
                        idempotency_key,
                        predicted,
                        "queued",
                        None,
                        self.wall(arrival),
                        None,
                        None,
                        run.virtual_finish,
                        v,
                    )
                )
            except BaseException:  # not accepted after all: the policy forgets it, the next start too
                await asyncio.shield(self._unaccept(agent_id))
                raise
        self.launch(run, predict_ms=round(predict_ms, 3))
        log.info(
            json.dumps(
                {
                    "event": "agent_submitted",
                    "agent_id": agent_id,
                    "owner": client.owner,
                    "type": spec.type,
                    "tasks": sum(len(s) for s in spec.stages),
                    "predicted_cost": predicted,
                }
            )
        )
        return run

    async def register(self, run: AgentRun, resume_cost: float | None = None) -> float | None:
        """Register the agent with the policy; its tag goes to ``run.virtual_finish``. With a journal,
        returns the clock's ``V`` as last read, for a restart to place it (``journal.resume_order``:
        a lower bound on ``V`` when the server stops is all it needs), read again alongside the
        registration (a control call more, at once) when the last reading is older than
        ``V_READ_EVERY_S``; None under a policy without a clock. ``resume_cost``: what GPS still
        owed a resumed agent (``Backend.register``). A session's is its current turn's (``server.turns``)."""
        client = run.client
        register = self.backend.register(
            Registration(
                run.agent_id,
                run.spec.type,
                run.process.predicted_cost,
                client.weight,
                client.tenant,
                resume_cost,
                run.session,
                run.process.predicted_dist,
            )
        )
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

    def launch(self, run: AgentRun, resume: list[list[Answer]] | None = None, **event) -> None:
        """Run the registered agent (after the stages ``resume`` answered)."""
        self.store.add(run)
        self.admission.agent_started(run.owner)
        run.emit("queued", predicted_cost=run.predicted_cost, virtual_finish=run.virtual_finish, **event)
        run.task = asyncio.get_running_loop().create_task(self._run(run, resume))

    def wall(self, now_s: float) -> float:
        """Wall-clock time of a server time (``now``)."""
        return self.t_start + (now_s - self.t_start_s)

    async def recover(self) -> tuple[int, int]:
        """Reload the journal at start-up (``recovery.recover``): (finished, resumed)."""
        from justitia.server.recovery import recover

        return await recover(self)

    def remember(self, owner: str, idempotency_key: str, run: AgentRun) -> None:
        """A journaled agent's ``Idempotency-Key``: a retry of it returns ``run`` (``recovery``)."""
        done = asyncio.get_running_loop().create_future()
        done.set_result(run)
        self.idempotent[(owner, idempotency_key)] = done

    def ended_before(self, run: AgentRun) -> None:
        """A journaled agent that had ended (``recovery``): counted and kept, as it ended."""
        self.store.add(run)
        self.counts.ended(run.status)
        run.emit(run.status, **({"error": run.error} if run.error else {}))
        self.store.keep(run)

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
            raise SpecError(
                f"stage {stage} task {call.index}: {len(ids)} prompt tokens (after placeholders) + "
                f"max_tokens {task.max_tokens} exceed the model's context of "
                f"{self.settings.max_model_len} tokens."
            )
        meta = call.meta
        if run.session:  # a turn not registered ahead: its first request opens it at its price; the last turn ends it
            meta = replace(
                meta, session=True, turn_start=not run.turn_opened, agent_done=meta.agent_done and run.turns[-1].last
            )
            run.turn_opened = True
        params = Sampling(
            task.max_tokens, task.temperature, task.top_p, task.seed, task.stop, task.ignore_eos, meta.to_extra_args()
        )
        request_id = f"{run.agent_id}/{stage}/{call.index}"
        final = None
        with self.counts.task():
            for attempt in (1, 2):  # a replica that fails midway: the task runs once more (on another)
                try:
                    async for out in self.backend.generate(
                        {"prompt_token_ids": ids}, params, request_id + ("" if attempt == 1 else "/retry")
                    ):
                        final = out
                    break
                except BackendInterrupted as exc:
                    if attempt == 2 or not self.backend.alive():
                        raise
                    log.warning(
                        json.dumps(
                            {
                                "event": "task_retried",
                                "agent_id": run.agent_id,
                                "stage": stage,
                                "task": call.index,
                                "error": str(exc),
                            }
                        )
                    )
        o = final.outputs[0]
        doc = {
            "output": o.text,
            "prompt_tokens": len(ids),
            "output_tokens": len(o.token_ids),
            "finish_reason": o.finish_reason,
        }
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
                self.admission.agent_ended(run.owner)
                raise
            run.status = "cancelled"
        except Exception as exc:  # noqa: BLE001  (any failure of a task fails the agent, with its reason)
            if not self.backend.alive():  # the engine died under it: the restarted server resumes it
                self.admission.agent_ended(run.owner)
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
        timed = run.status == "done" and not run.session  # (a session's time is its client's too)
        self.counts.ended(run.status, run.spec.type, run.finish_s - run.arrival_s if timed else None)
        run.emit(run.status, **({"error": run.error} if run.error else {}))
        self.admission.agent_ended(run.owner)
        self.store.keep(run)
        log.info(
            json.dumps(
                {
                    "event": "agent_" + run.status,
                    "agent_id": run.agent_id,
                    "jct_s": round(run.finish_s - run.arrival_s, 4),
                    "error": run.error,
                }
            )
        )

    async def cancel(self, agent_id: str) -> AgentRun:
        run = self.agents[agent_id]
        run.cancelled_by_client = True
        if run.status not in TERMINAL and run.task is not None:
            run.task.cancel()
            await asyncio.gather(run.task, return_exceptions=True)
        return run
