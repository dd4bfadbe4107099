"""A server's restart: the journal reloaded (``AgentManager.recover``), through the manager's
``register``, ``launch``, ``remember`` and ``ended_before``. Finished agents answer as
before; unfinished ones run again from their first stage not fully answered, same id and owner,
registered again in their old tags' order with what GPS still owed them (``journal.resume_order``);
a session waits again (its next turn is registered when it comes), or runs its current turn again,
registered so, its price the turn's (``server.turns``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

from justitia.agent import AgentProcess, Answer
from justitia.core import KV
from justitia.server.journal import Record, resume_order
from justitia.server.keys import Client
from justitia.server.runs import TERMINAL, AgentRun
from justitia.server.schema import AgentSpec, SpecError
from justitia.server.turns import price_turn, session_turns
from justitia.workload import Agent, Task

log = logging.getLogger("justitia.server")


async def recover(manager) -> tuple[int, int]:
    """Reload the journal at start-up: finished agents answer as before, unfinished ones run
    again from their first stage not fully answered, same id and owner, registered again in
    their old tags' order with what GPS still owed them (``journal.resume_order``): before
    every agent that arrives from now on with their cost and weight. A waiting session waits
    again (its keep time counted from when it began); a running one runs its turn again from its
    first stage not fully answered, registered as the agents are with what GPS still owed its
    turn (``server.turns``). (finished, resumed)."""
    if manager.journal is None:
        return 0, 0
    finished = 0
    records = manager.journal.load()
    waiting = {}  # unfinished: agent id -> its run and the answers kept (of its current turn, for a session)
    for rec in records:
        run = await _restore(manager, rec)
        if rec.idempotency_key is not None:
            manager.remember(rec.owner, rec.idempotency_key, run)
        if rec.status in TERMINAL:
            run.status, run.error = rec.status, rec.error
            run.finish_s = (rec.finish_wall or rec.arrival_wall) - manager.wall(0.0)
            manager.ended_before(run)
            finished += 1
            continue
        waiting[rec.agent_id] = run, None if run.status == "waiting" else _answered(run.outputs, run.base)
    # a session's cost, to what GPS owed it, is its current turn's (its tag is that turn's)
    priced = [
        replace(rec, predicted_cost=waiting[rec.agent_id][0].turns[-1].predicted_cost)
        if rec.agent_id in waiting and waiting[rec.agent_id][0].turns
        else rec
        for rec in records
    ]
    for rec, owed in resume_order(priced):  # in their old order, each registered before the next
        run, answered = waiting[rec.agent_id]
        if run.status != "waiting":  # (a waiting session's next turn registers it)
            v = await manager.register(run, owed)
            run.turn_opened = run.session
            try:  # its stamps in this run's clock, for a later restart
                await manager.journal.stamped(run.agent_id, run.virtual_finish, v)
            except Exception as exc:  # noqa: BLE001  (its old stamps stay: a later restart places it by them)
                log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))
        event = {"resume_cost": owed, "tasks_kept": sum(d is not None for stage in run.outputs for d in stage)}
        if answered is not None:
            part = bool(answered) and None in answered[-1]
            event["resumed_after_stage"] = run.base + len(answered) - 1 - part
        manager.launch(run, answered, **event)
    log.info(
        json.dumps(
            {
                "event": "journal_recovered",
                "journal": str(manager.journal.path),
                "finished": finished,
                "resumed": len(waiting),
            }
        )
    )
    return finished, len(waiting)


async def _restore(manager, rec: Record) -> AgentRun:
    """A journaled agent as a run: its outputs, and (unless it has ended, or is a session waiting)
    the process of its stages, or of its session's current turn, priced as journaled. One the
    server cannot run now (a model with a shorter context) is failed, with why."""
    spec = AgentSpec.model_validate(rec.spec)
    client = Client(rec.owner, rec.tenant, rec.weight)
    turns = session_turns(spec.stages, rec.predicted_cost, rec.turns) if spec.session else []
    stages = [stage for turn in turns for stage in turn.stages] if turns else spec.stages
    run = AgentRun(
        rec.agent_id,
        spec,
        None,
        rec.arrival_wall - manager.wall(0.0),
        None,
        rec.owner,
        outputs=[[rec.outputs.get((s, i)) for i in range(len(stage))] for s, stage in enumerate(stages)],
    )
    run.client, run.turns = client, turns
    if spec.session and rec.status == "waiting":
        run.status, run.waiting_wall = "waiting", rec.waiting_wall or manager.wall(manager.now())
        return run
    current = turns[-1] if turns else None
    own = current.stages if current else list(spec.stages)
    earlier = [[doc["output"] for doc in stage] for stage in run.outputs[: run.base]]
    if rec.status not in TERMINAL or not spec.session:
        try:
            run.process, _, _ = await asyncio.to_thread(
                price_turn, manager.pricer, rec.agent_id, spec.type, own, client, earlier
            )
        except SpecError:  # the server now runs a model with a shorter context: fail it, with why
            run.process = AgentProcess(Agent(rec.agent_id, spec.type, 0.0, ((Task("", 1, 1),),)), manager.predictor, KV)
            rec.status, rec.error = "failed", rec.error or "the restarted server cannot fit its first stage."
        run.process.keep_price(current.predicted_cost if current else rec.predicted_cost)
    return run


def _answered(outputs: list[list[dict | None]], base: int) -> list[list[Answer | None]]:
    """The answers kept from stage ``base`` on: the stages answered in full, then one answered in
    part (if any); later stages' outputs are dropped (none can have run)."""
    answered = []
    for stage in outputs[base:]:
        answered.append(
            [
                None if d is None else Answer(d["output"], d["prompt_tokens"], d["output_tokens"], d["finish_reason"])
                for d in stage
            ]
        )
        if any(doc is None for doc in stage):
            break
    for s in range(base + len(answered), len(outputs)):
        outputs[s] = [None] * len(outputs[s])
    return answered
