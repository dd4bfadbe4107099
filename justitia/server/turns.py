"""A session over the agent API: turns its client submits one by one under one agent id
(docs/reference.md, "Sessions over the agent API").

A session (``"session": true``) runs its first turn's stages as an agent does. When they are all
answered it does not finish: it **waits** for its client (status ``waiting``), paused in the engine
(``Backend.retire(agent_id, pause=True)``: settled for the turn it ran, its place kept), until
``POST /v1/agents/{id}/turns`` brings its next turn (``continue_session``), ends it (``"last":
true`` with no stages), or ``Settings.session_keep_s`` passes (it ends as ``done``). Each turn is
priced on its own (``price_turn``) and registered ahead of its requests, as a session
(``Backend.register``, a ``Registration`` with ``session``): the first turn arrives, each later one returns the
paused session at its own price (``AgentBook.register``), and ``virtual_finish`` is the current
turn's tag. Every request says ``session``, and the last turn's last stage says ``agent_done``.
Where a turn could not be registered (pausing the session failed, so the engine may still hold it
open; or the registration failed), its first request says ``turn_start`` with the turn's price,
and the engine's book opens the turn from it (``AgentBook``'s session rules).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from types import SimpleNamespace

from justitia.agent import AgentProcess
from justitia.server.keys import Client
from justitia.server.pricing import Pricer
from justitia.server.runs import TERMINAL, AgentRun, Turn
from justitia.server.schema import SpecError, TurnSpec, check_stages, render, stage_doc, task_field
from justitia.workload import Stage

log = logging.getLogger("justitia.server")


class TurnRefused(Exception):
    """A turn the agent cannot take now (409); the message says why."""


def price_turn(
    pricer: Pricer, agent_id: str, agent_type: str, stages: list[Stage], client: Client, earlier: list[list[str]]
) -> tuple[AgentProcess, dict[int, tuple[str, list[int]]], float]:
    """The process of an agent, or of a session's turn after the stages whose outputs ``earlier``
    holds (``Pricer.priced``: priced, its first stage tokenized, in one trip to a worker thread),
    its first stage's prompts with their token ids, and how long the predictor took. A later
    turn's first stage quotes only outputs known now: its prompts are filled here, so that their
    price and context check see them whole; its later stages' placeholders count stages across the
    session."""
    base = len(earlier)
    if base:
        first = []
        for i, task in enumerate(stages[0]):
            try:
                prompt = render(task.prompt, base, earlier, pricer.settings.max_prompt_chars)
            except SpecError as exc:
                raise SpecError(f"field '{task_field(0, stages[0], i)}.prompt': {exc}") from None
            first.append(task.model_copy(update={"prompt": prompt}))
        stages = [Stage(first, stages[0].pause_s), *stages[1:]]
    process, ids, predict_s = pricer.priced(agent_id, SimpleNamespace(type=agent_type, stages=stages), client)
    if base:  # the process counts its stages from 0; placeholders count the session's
        process.render = functools.partial(_render_after, base, earlier, pricer.settings.max_prompt_chars)
    return process, {i: (task.prompt, ids[i]) for i, task in enumerate(stages[0])}, predict_s


def _render_after(
    base: int, earlier: list[list[str]], limit: int, prompt: str, stage: int, texts: list[list[str]]
) -> str:
    """A turn's prompt filled (its first stage's already are), its stage ``stage`` of the turn being
    the session's ``base + stage``."""
    return prompt if stage == 0 else render(prompt, base + stage, earlier + texts, limit)


def turn_doc(turn: Turn) -> dict:
    """A turn as the journal keeps it."""
    return {"stages": [stage_doc(s) for s in turn.stages], "last": turn.last, "predicted_cost": turn.predicted_cost}


def session_turns(first: list[Stage], first_cost: float, later: list[dict]) -> list[Turn]:
    """A journaled session's turns: its first (its spec's stages), then ``later`` (``turn_doc``'s)."""
    turns = [Turn(list(first), 0, first_cost)]
    for doc in later:
        spec = TurnSpec.model_validate({"stages": doc["stages"], "last": doc["last"]})
        turns.append(
            Turn(list(spec.stages), turns[-1].first_stage + len(turns[-1].stages), doc["predicted_cost"], spec.last)
        )
    return turns


def _refuse(run: AgentRun) -> None:
    """TurnRefused unless ``run`` is a session waiting for its client."""
    if not run.session:
        raise TurnRefused(
            f"agent '{run.agent_id}' is not a session: only an agent submitted with field 'session': true takes turns."
        )
    if run.status in TERMINAL or run.closed:
        raise TurnRefused(
            f"session '{run.agent_id}' has ended ({'done' if run.closed else run.status}); it takes no more turns."
        )
    if run.status != "waiting":
        doing = (
            "taking a turn"
            if run.status == "queued" and len(run.turns) > 1
            else f"running its turn {len(run.turns) - 1}"
        )
        raise TurnRefused(f"session '{run.agent_id}' is {doing}; continue it once its status is 'waiting'.")


async def continue_session(manager, run: AgentRun, turn: TurnSpec) -> AgentRun:
    """Give a waiting session its next turn, journaled before this returns; or, for ``last`` with
    no stages, end it (returns once it has ended). Raises TurnRefused (409) or SpecError (400)."""
    _refuse(run)
    settings = manager.settings
    if not turn.stages:
        if not turn.last:
            raise SpecError(
                "field 'stages': a turn holds at least one stage (or says \"last\": true to end the session)."
            )
        run.closed = True
        run.turn_ready.set()
        await asyncio.wait({run.task})
        return run
    earlier = [len(stage) for stage in run.outputs]
    check_stages(turn.stages, settings.max_tasks_per_agent, settings.max_model_len - 1, settings.max_pause_s, earlier)
    texts = [[doc["output"] for doc in stage] for stage in run.outputs]
    process, first, predict_s = await asyncio.to_thread(
        price_turn, manager.pricer, run.agent_id, run.spec.type, list(turn.stages), run.client, texts
    )
    _refuse(run)  # again: another turn, an end or the keep time may have come meanwhile
    run.status = "queued"  # being accepted: no other turn, and the keep time waits for it
    new = Turn(list(turn.stages), len(run.outputs), process.predicted_cost, turn.last)
    if manager.journal is not None:  # committed before the 202: a restart runs it
        try:
            await manager.journal.turned(run.agent_id, [turn_doc(t) for t in run.turns[1:]] + [turn_doc(new)])
        except BaseException:
            run.status = "waiting"
            run.turn_ready.set()
            raise
    manager.counts.submission(predict_s)
    run.turns.append(new)
    run.outputs += [[None] * len(stage) for stage in turn.stages]
    run.process, run.first_ids, run.turn_opened = process, first, False
    if run.engine_idle:
        await register_turn(manager, run)
    run.turn_ready.set()
    log.info(
        json.dumps(
            {
                "event": "session_turn",
                "agent_id": run.agent_id,
                "turn": len(run.turns) - 1,
                "tasks": sum(len(s) for s in turn.stages),
                "predicted_cost": new.predicted_cost,
                "last": turn.last,
            }
        )
    )
    return run


async def register_turn(manager, run: AgentRun) -> None:
    """Register a session's current turn ahead of its requests (the engine returns it, paused, at
    the turn's price; after a restart it arrives), its stamps journaled; if that fails, its first
    request opens the turn (``turn_start``)."""
    try:
        v = await manager.register(run)
    except Exception as exc:  # noqa: BLE001  (the turn's first request opens it instead)
        log.warning(json.dumps({"event": "register_failed", "agent_id": run.agent_id, "error": str(exc)}))
        return
    run.turn_opened = True
    if manager.journal is not None:
        try:  # a restart places its running turn by these
            await manager.journal.stamped(run.agent_id, run.virtual_finish, v)
        except Exception as exc:  # noqa: BLE001  (a restart then places it by its earlier turn's)
            log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))


async def await_turn(manager, run: AgentRun) -> bool:
    """A session whose turn is answered waits for its client: journaled as waiting, paused in the
    engine. True when a turn comes; False when its client ends it or ``session_keep_s`` passes from
    when it began to wait (across a restart: ``waiting_wall``)."""
    if run.waiting_wall is None:
        run.waiting_wall = manager.wall(manager.now())
        if manager.journal is not None:
            try:
                await manager.journal.waiting(run.agent_id, run.waiting_wall)
            except Exception as exc:  # noqa: BLE001  (a restart would run its answered turn's end again)
                log.warning(json.dumps({"event": "journal_failed", "agent_id": run.agent_id, "error": str(exc)}))
    run.status = "waiting"
    run.emit("waiting", turn=len(run.turns) - 1)
    try:
        await manager.backend.retire(run.agent_id, pause=True)
        run.engine_idle = True
    except Exception as exc:  # noqa: BLE001  (its next turn's turn_start settles it in the engine)
        run.engine_idle = False
        log.warning(json.dumps({"event": "pause_failed", "agent_id": run.agent_id, "error": str(exc)}))
    seen = len(run.turns)
    while True:
        left = manager.settings.session_keep_s - (manager.wall(manager.now()) - run.waiting_wall)
        try:  # a turn being accepted (status queued) is waited for, keep time or not
            await asyncio.wait_for(run.turn_ready.wait(), max(left, 0.0) if run.status == "waiting" else None)
        except asyncio.TimeoutError:
            if run.status == "waiting":
                log.info(
                    json.dumps(
                        {
                            "event": "session_expired",
                            "agent_id": run.agent_id,
                            "keep_s": manager.settings.session_keep_s,
                        }
                    )
                )
                return False
            continue
        run.turn_ready.clear()
        if len(run.turns) > seen:
            run.waiting_wall = None
            return True
        if run.closed:
            return False
