"""Justitia's HTTP surface: the door and the agent API (``add_justitia``), on vLLM's own app (the
endpoint plugin, ``server.plugin``) or on the front end's (``justitia.gateway.app.create_app``,
for ``--upstream`` and ``--ray``).

The agents run in ``agents.AgentManager``; the agent API's limits are its ``admission``
(``admission.Admission``). Every ``/v1/`` route needs a key when the server has any
(``keys.KeyRing``: 401 without one); ``/health``, ``/metrics`` and the API docs are open.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import ValidationError

from justitia.backends.base import BackendError
from justitia.server.agents import TERMINAL, Settings
from justitia.server.door import Door
from justitia.server.journal import JournalError
from justitia.server.keys import KeyRing, client_of
from justitia.server.limits import (
    Authenticate,
    BodyLimit,
    BodyTooLarge,
    JsonTooDeep,
    body_too_large,
    load_json,
    retry_after,
)
from justitia.server.schema import AgentSpec, SpecError, TurnSpec, first_error
from justitia.server.turns import TurnRefused, continue_session

LIVE_PAGE = Path(__file__).with_name("static") / "justitia.html"  # the live page: no build step

__all__ = ["Settings", "add_justitia"]


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _parse(model, request: Request):
    """The request's body as ``model``, or the 422 that names its first bad field (400 for a body
    nested past ``limits.MAX_JSON_DEPTH``)."""
    try:
        return model.model_validate(load_json(await request.body()))
    except JsonTooDeep as exc:
        return _error(400, str(exc))
    except ValueError as exc:  # not JSON, or not the model (pydantic's ValidationError is a ValueError)
        errors = exc.errors() if isinstance(exc, ValidationError) else [{"type": "json_invalid", "loc": ()}]
        return _error(422, first_error(list(errors)))


def add_justitia(app: FastAPI, holder, keys: KeyRing, settings: Settings) -> None:
    """Justitia on ``app`` (vLLM's own, or the front end's): the door (413, 401, then ``door.Door``'s
    checks and identity on the inference endpoints) and the agent API. ``holder.manager`` is the
    ``AgentManager``, looked up per request (a vLLM plugin builds it after the app)."""
    add_agent_routes(app, holder)
    app.add_middleware(Door, holder=holder)
    app.add_middleware(Authenticate, keys=keys)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # outermost: counted before anything reads it
    app.add_exception_handler(BodyTooLarge, body_too_large)


def add_agent_routes(app: FastAPI, holder) -> None:
    """The agent API (``/v1/agents``, a session's ``/v1/agents/{id}/turns``), the door's sessions
    (``/v1/sessions``) and the live page (``/justitia``) on ``app``: an ``APIRouter`` each."""
    app.include_router(AgentRoutes(holder).router())
    app.include_router(session_routes(holder))
    app.include_router(live_routes(holder))


class AgentRoutes:
    """The agent API: submit an agent, read or cancel it, a session's next turn, its events."""

    def __init__(self, holder):
        self.holder = holder  # holder.manager: the AgentManager, looked up per request

    def router(self) -> APIRouter:
        r = APIRouter(prefix="/v1/agents")
        r.add_api_route("", self.submit, methods=["POST"], status_code=202)
        r.add_api_route("/{agent_id}", self.status, methods=["GET"])
        r.add_api_route("/{agent_id}", self.cancel, methods=["DELETE"])
        r.add_api_route("/{agent_id}/turns", self.turn, methods=["POST"], status_code=202)
        r.add_api_route("/{agent_id}/events", self.events, methods=["GET"])
        return r

    async def submit(self, request: Request):
        manager = self.holder.manager
        spec = await _parse(AgentSpec, request)
        if isinstance(spec, JSONResponse):
            return spec
        client = client_of(request)
        if manager.draining:
            return _error(503, "the server is stopping; retry on its successor.", retry_after(5))
        idempotency = request.headers.get("idempotency-key")
        if idempotency is not None and not 1 <= len(idempotency) <= 256:
            return _error(400, "header 'Idempotency-Key': must be 1-256 characters.")
        if idempotency is not None and manager.is_retry(client.owner, idempotency):
            try:
                run = await manager.submit(spec, client, idempotency)  # the first agent, not a second one
            except SpecError as exc:
                return _error(400, str(exc))
            return JSONResponse({"agent_id": run.agent_id, "status": run.status}, status_code=202)
        if (refused := manager.admission.refuse_agent(client.owner)) is not None:
            return _error(*refused)
        # counted before the first await: concurrent submissions see each other; started (and
        # counted as such) or refused when it ends
        with manager.admission.admit(client.owner):
            try:
                run = await manager.submit(spec, client, idempotency)
            except SpecError as exc:
                return _error(400, str(exc))
            except JournalError as exc:  # not recorded, so not accepted
                return _error(503, f"the agent could not be journaled ({exc}); retry later.", retry_after(5))
            except BackendError as exc:  # the engine could not take it now (a journaled agent runs at the next start)
                return _error(503, f"the engine could not take the agent ({exc}); retry later.", retry_after(5))
        return JSONResponse({"agent_id": run.agent_id, "status": run.status}, status_code=202)

    def _missing(self, agent_id: str, request: Request) -> JSONResponse:
        """404 for an unknown agent or another key's; 410 for one of this key's that was dropped."""
        manager = self.holder.manager
        settings = manager.settings
        if manager.store.was_owned(agent_id, client_of(request)):
            return _error(
                410,
                f"agent '{agent_id}' finished and is no longer kept (this server keeps finished "
                f"agents {settings.finished_s / 3600:g} hours, {settings.finished_bytes >> 20} MiB in all).",
            )
        return _error(404, f"no agent '{agent_id}'.")

    async def status(self, agent_id: str, request: Request):
        run = self.holder.manager.store.owned(agent_id, client_of(request))
        if run is None:  # unknown, or another key's: the same answer
            return self._missing(agent_id, request)
        return run.doc()

    async def cancel(self, agent_id: str, request: Request):
        if self.holder.manager.store.owned(agent_id, client_of(request)) is None:
            return self._missing(agent_id, request)
        return (await self.holder.manager.cancel(agent_id)).doc()

    async def turn(self, agent_id: str, request: Request):
        """A waiting session's next turn (202), or its end (``"last": true`` with no stages: 200 and
        its document); ``server.turns``."""
        manager = self.holder.manager
        client = client_of(request)
        run = manager.store.owned(agent_id, client)
        if run is None:
            return self._missing(agent_id, request)
        spec = await _parse(TurnSpec, request)
        if isinstance(spec, JSONResponse):
            return spec
        if manager.draining:
            return _error(503, "the server is stopping; retry on its successor.", retry_after(5))
        if (refused := manager.admission.refuse_rate(client.owner)) is not None:
            return _error(*refused)
        try:
            run = await continue_session(manager, run, spec)
        except TurnRefused as exc:
            return _error(409, str(exc))
        except SpecError as exc:
            return _error(400, str(exc))
        except JournalError as exc:  # not recorded, so not taken: the session still waits
            return _error(503, f"the turn could not be journaled ({exc}); retry later.", retry_after(5))
        if run.status in TERMINAL:
            return JSONResponse(run.doc())
        return JSONResponse(
            {"agent_id": run.agent_id, "status": run.status, "turn": len(run.turns) - 1, "first_stage": run.base},
            status_code=202,
        )

    async def events(self, agent_id: str, request: Request):
        """The agent's events as they happen (server-sent events), from its first."""
        run = self.holder.manager.store.owned(agent_id, client_of(request))
        if run is None:
            return self._missing(agent_id, request)
        if run.streams >= self.holder.manager.settings.max_streams_per_agent:
            return _error(
                429, f"agent '{agent_id}' has {run.streams} event streams open, this server's limit.", retry_after(1)
            )
        run.streams += 1
        return StreamingResponse(_event_stream(run), media_type="text/event-stream")


async def _event_stream(run):
    """A run's events, each once, until it ends; its stream count is given back when it stops."""
    sent = 0
    try:
        while True:
            changed = run.changed
            while sent < len(run.events):
                e = run.events[sent]
                sent += 1
                yield f"event: {e['event']}\ndata: {json.dumps(e)}\n\n"
            if run.status in TERMINAL and sent == len(run.events):
                return
            await changed.wait()
    finally:
        run.streams -= 1


def session_routes(holder) -> APIRouter:
    """The door's sessions: ``/v1/sessions``."""
    r = APIRouter()

    @r.get("/v1/sessions")
    async def sessions(request: Request):
        """The key's identified agents on the OpenAI and Anthropic endpoints, most recent last."""
        sessions = holder.manager.admission.sessions
        return {"object": "list", "data": [s.doc() for s in sessions.of(client_of(request).owner)]}

    return r


def live_routes(holder) -> APIRouter:
    """The live page (``/justitia``) and its figures (``/justitia/state``)."""
    r = APIRouter()

    @r.get("/justitia/state")
    async def live_state(request: Request):
        """The live page's figures (``observe.Watch.doc``): each tenant's share against its fair
        share, the head of the queue, the clock and the bound's slack; a key sees its own tenant
        (an admin key, or any client of an open server, every tenant)."""
        manager = holder.manager
        try:
            await manager.watch.read()
        except Exception as exc:  # noqa: BLE001  (an engine going away: say so, as /health does)
            return _error(
                503, f"the engine's state cannot be read now ({type(exc).__name__}); retry later.", retry_after(1)
            )
        return manager.watch.doc(client_of(request))

    @r.get("/justitia", response_class=HTMLResponse, include_in_schema=False)
    async def live_page():
        """The live page: plain HTML and a small script that polls ``/justitia/state``."""
        return HTMLResponse(LIVE_PAGE.read_text())

    return r
