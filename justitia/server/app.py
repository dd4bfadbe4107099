"""Justitia's HTTP surface: the door and the agent API (``add_justitia``), on vLLM's own app (the
endpoint plugin, ``server.plugin``) or on the front end's (``create_app``, for ``--upstream`` and
``--ray``).

The agents run in ``agents.AgentManager``. Every ``/v1/`` route needs a key when the server has
any (``keys.KeyRing``: 401 without one); ``/health``, ``/metrics`` and the API docs are open.
"""

from __future__ import annotations

import json

from pydantic import ValidationError
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from justitia.predictors import Predictor
from justitia.server.agents import TERMINAL, AgentManager, Settings
from justitia.backends.base import Backend, BackendError
from justitia.server.door import Door
from justitia.server.forward import add_forwarding_routes
from justitia.server.journal import Journal, JournalError
from justitia.server.keys import KeyRing, client_of
from justitia.server.limits import (Authenticate, BodyLimit, BodyTooLarge, JsonTooDeep, body_too_large, load_json,
                                   retry_after)
from justitia.server.metrics import prometheus_text
from justitia.server.schema import AgentSpec, SpecError, TurnSpec, first_error
from justitia.server.turns import TurnRefused, continue_session

__all__ = ["Settings", "create_app"]


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


def create_app(backend: Backend, tokenizer, settings: Settings, predictor: Predictor,
               keys: KeyRing | None = None, journal: Journal | None = None) -> FastAPI:
    """The front end's app (``--upstream``, ``--ray``): Justitia (``add_justitia``) and the inference
    endpoints, validated by vLLM's own request models and forwarded to the backend
    (``forward.add_forwarding_routes``). Open if ``keys`` is empty or None; journaled to ``journal``,
    if given: ``await app.state.manager.recover()`` before serving."""
    keys = keys or KeyRing()
    app = FastAPI(title="Justitia", version="0.1.0",
                  description="Agent-aware serving on vLLM: task-parallel agents scheduled by Justitia.")
    manager = AgentManager(backend, tokenizer, settings, predictor, journal)
    app.state.manager = manager
    add_forwarding_routes(app, manager)
    add_justitia(app, app.state, keys, settings)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        text = prometheus_text(manager, await backend.state())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health():
        if not backend.alive():
            return JSONResponse({"status": "engine_dead", "error": "the engine has stopped; the server is exiting"},
                                status_code=503)
        state = await backend.state()
        return {"status": "draining" if manager.draining else "ok", "model": settings.model, "policy": settings.policy,
                "agents_in_flight": manager.in_flight(), "virtual_clock": state.has_clock,
                "journal": None if journal is None else str(journal.path)}

    return app


def add_agent_routes(app: FastAPI, holder) -> None:
    """The agent API (``/v1/agents``, a session's ``/v1/agents/{id}/turns``) and the door's sessions
    (``/v1/sessions``) on ``app``."""

    @app.post("/v1/agents", status_code=202)
    async def submit(request: Request):
        manager = holder.manager
        settings = manager.settings
        spec = await _parse(AgentSpec, request)
        if isinstance(spec, JSONResponse):
            return spec
        client = client_of(request)
        if manager.draining:
            return _error(503, "the server is stopping; retry on its successor.", retry_after(5))
        idempotency = request.headers.get("idempotency-key")
        if idempotency is not None and not 1 <= len(idempotency) <= 256:
            return _error(400, "header 'Idempotency-Key': must be 1-256 characters.")
        if idempotency is not None and (client.owner, idempotency) in manager.idempotent:
            try:
                run = await manager.submit(spec, client, idempotency)  # the first agent, not a second one
            except SpecError as exc:
                return _error(400, str(exc))
            return JSONResponse({"agent_id": run.agent_id, "status": run.status}, status_code=202)
        if manager.in_flight() >= settings.max_agents_in_flight:
            return _error(429, f"{manager.in_flight()} agents are in flight, this server's limit; retry later.",
                          retry_after(1))
        mine, cap = manager.owner_in_flight(client.owner), settings.key_agents_in_flight or settings.max_agents_in_flight
        if mine >= cap:
            return _error(429, f"your key has {mine} agents in flight, its limit; retry later.", retry_after(1))
        if (wait := manager.rate.take(client.owner)) is not None:
            return _error(429, f"your key's rate limit ({settings.key_rate:g} requests a second); retry later.",
                          retry_after(wait))
        owner = client.owner  # counted before the first await: concurrent submissions see each other
        manager.admitting[owner] = manager.admitting.get(owner, 0) + 1
        try:
            run = await manager.submit(spec, client, idempotency)
        except SpecError as exc:
            return _error(400, str(exc))
        except JournalError as exc:  # not recorded, so not accepted
            return _error(503, f"the agent could not be journaled ({exc}); retry later.", retry_after(5))
        except BackendError as exc:  # the engine could not take it now (a journaled agent runs at the next start)
            return _error(503, f"the engine could not take the agent ({exc}); retry later.", retry_after(5))
        finally:  # started (and counted in owner_agents), or refused
            manager.admitting[owner] -= 1
        return JSONResponse({"agent_id": run.agent_id, "status": run.status}, status_code=202)

    @app.get("/v1/sessions")
    async def sessions(request: Request):
        """The key's identified agents on the OpenAI and Anthropic endpoints, most recent last."""
        return {"object": "list", "data": [s.doc() for s in holder.manager.sessions.of(client_of(request).owner)]}

    def missing(agent_id: str, request: Request) -> JSONResponse:
        """404 for an unknown agent or another key's; 410 for one of this key's that was dropped."""
        manager = holder.manager
        settings = manager.settings
        if manager.was_owned(agent_id, client_of(request)):
            return _error(410, f"agent '{agent_id}' finished and is no longer kept (this server keeps finished "
                               f"agents {settings.finished_s / 3600:g} hours, {settings.finished_bytes >> 20} MiB in all).")
        return _error(404, f"no agent '{agent_id}'.")

    @app.get("/v1/agents/{agent_id}")
    async def status(agent_id: str, request: Request):
        run = holder.manager.owned(agent_id, client_of(request))
        if run is None:  # unknown, or another key's: the same answer
            return missing(agent_id, request)
        return run.doc()

    @app.delete("/v1/agents/{agent_id}")
    async def cancel(agent_id: str, request: Request):
        if holder.manager.owned(agent_id, client_of(request)) is None:
            return missing(agent_id, request)
        return (await holder.manager.cancel(agent_id)).doc()

    @app.post("/v1/agents/{agent_id}/turns", status_code=202)
    async def turn(agent_id: str, request: Request):
        """A waiting session's next turn (202), or its end (``"last": true`` with no stages: 200 and
        its document); ``server.turns``."""
        manager = holder.manager
        client = client_of(request)
        run = manager.owned(agent_id, client)
        if run is None:
            return missing(agent_id, request)
        spec = await _parse(TurnSpec, request)
        if isinstance(spec, JSONResponse):
            return spec
        if manager.draining:
            return _error(503, "the server is stopping; retry on its successor.", retry_after(5))
        if (wait := manager.rate.take(client.owner)) is not None:
            return _error(429, f"your key's rate limit ({manager.settings.key_rate:g} requests a second); retry "
                               f"later.", retry_after(wait))
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
        return JSONResponse({"agent_id": run.agent_id, "status": run.status, "turn": len(run.turns) - 1,
                             "first_stage": run.base}, status_code=202)

    @app.get("/v1/agents/{agent_id}/events")
    async def events(agent_id: str, request: Request):
        run = holder.manager.owned(agent_id, client_of(request))
        if run is None:
            return missing(agent_id, request)
        if run.streams >= holder.manager.settings.max_streams_per_agent:
            return _error(429, f"agent '{agent_id}' has {run.streams} event streams open, this server's limit.",
                          retry_after(1))
        run.streams += 1

        async def stream():
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

        return StreamingResponse(stream(), media_type="text/event-stream")
