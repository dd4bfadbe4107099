"""A server's restart: the journal reloaded (``AgentManager.recover``). Finished agents answer as
before; unfinished ones run again from their first stage not fully answered, same id and owner,
registered again in their old tags' order with what GPS still owed them (``journal.resume_order``).
"""

from __future__ import annotations

import asyncio
import json
import logging

from justitia.agent import AgentProcess, Answer
from justitia.core import KV
from justitia.server.runs import TERMINAL, AgentRun
from justitia.server.journal import resume_order
from justitia.server.keys import Client
from justitia.server.schema import AgentSpec, SpecError
from justitia.workload import Agent, Task

log = logging.getLogger("justitia.server")


async def recover(manager) -> tuple[int, int]:
    """Reload the journal at start-up: finished agents answer as before, unfinished ones run
    again from their first stage not fully answered, same id and owner, registered again in
    their old tags' order with what GPS still owed them (``journal.resume_order``): before
    every agent that arrives from now on with their cost and weight. (finished, resumed)."""
    if manager.journal is None:
        return 0, 0
    finished = 0
    records = manager.journal.load()
    waiting = {}  # unfinished: agent id -> its run and the answers kept
    for rec in records:
        spec = AgentSpec.model_validate(rec.spec)
        client = Client(rec.owner, rec.tenant, rec.weight)
        try:
            process, _ = await asyncio.to_thread(manager.pricer.process, rec.agent_id, spec, client)
        except SpecError:  # the server now runs a model with a shorter context: fail it, with why
            process = AgentProcess(Agent(rec.agent_id, spec.type, 0.0, ((Task("", 1, 1),),)), manager.predictor, KV)
            rec.status, rec.error = "failed", rec.error or "the restarted server cannot fit its first stage."
        process.predicted_cost = rec.predicted_cost
        arrival = rec.arrival_wall - manager.wall(0.0)
        run = AgentRun(rec.agent_id, spec, process, arrival, None, rec.owner,
                       outputs=[[rec.outputs.get((s, i)) for i in range(len(stage))]
                                for s, stage in enumerate(spec.stages)])
        run.client = client
        if rec.idempotency_key is not None:
            done = asyncio.get_running_loop().create_future()
            done.set_result(run)
            manager.idempotent[(rec.owner, rec.idempotency_key)] = done
        if rec.status in TERMINAL:
            run.status, run.error = rec.status, rec.error
            run.finish_s = (rec.finish_wall or rec.arrival_wall) - manager.wall(0.0)
            manager.agents[run.agent_id] = run
            manager.finished[run.status] += 1
            run.emit(run.status, **({"error": run.error} if run.error else {}))
            manager._keep(run)
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
        v = await manager._register(run, owed)
        try:  # its stamps in this run's clock, for a later restart
            await manager.journal.stamped(run.agent_id, run.virtual_finish, v)
        except Exception as exc:  # noqa: BLE001  (its old stamps stay: a later restart places it by them)
            log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))
        part = bool(answered) and None in answered[-1]
        manager._launch(run, answered, resumed_after_stage=len(answered) - 1 - part, resume_cost=owed,
                     tasks_kept=sum(d is not None for stage in run.outputs for d in stage))
    log.info(json.dumps({"event": "journal_recovered", "journal": str(manager.journal.path),
                         "finished": finished, "resumed": len(waiting)}))
    return finished, len(waiting)
