"""The front end's app (``justitia serve --upstream`` / ``--ray``): Justitia's door and agent API
(``server.app.add_justitia``), the inference endpoints forwarded to the backend (``forward``), and
the front end's own ``/health`` and ``/metrics``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from justitia.backends.base import Backend
from justitia.gateway.forward import add_forwarding_routes
from justitia.predictors import Predictor
from justitia.server.agents import AgentManager, Settings
from justitia.server.app import add_justitia
from justitia.server.journal import Journal
from justitia.server.keys import KeyRing
from justitia.server.metrics import prometheus_text

__all__ = ["Settings", "create_app"]


def create_app(
    backend: Backend,
    tokenizer,
    settings: Settings,
    predictor: Predictor,
    keys: KeyRing | None = None,
    journal: Journal | None = None,
) -> FastAPI:
    """The front end's app (``--upstream``, ``--ray``): Justitia (``add_justitia``) and the inference
    endpoints, validated by vLLM's own request models and forwarded to the backend
    (``forward.add_forwarding_routes``). Open if ``keys`` is empty or None; journaled to ``journal``,
    if given: ``await app.state.manager.recover()`` before serving."""
    keys = keys or KeyRing()
    app = FastAPI(
        title="Justitia",
        version="0.1.0",
        description="Agent-aware serving on vLLM: task-parallel agents scheduled by Justitia.",
    )
    manager = AgentManager(backend, tokenizer, settings, predictor, journal)
    app.state.manager = manager
    add_forwarding_routes(app, manager)
    add_justitia(app, app.state, keys, settings)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        await manager.watch.read()  # the per-tenant state, read at most once a second
        text = prometheus_text(manager, await backend.state())  # the clock, read now
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health():
        if not backend.alive():
            return JSONResponse(
                {"status": "engine_dead", "error": "the engine has stopped; the server is exiting"}, status_code=503
            )
        state = await backend.state()
        return {
            "status": "draining" if manager.draining else "ok",
            "model": settings.model,
            "policy": settings.policy,
            "agents_in_flight": manager.in_flight(),
            "virtual_clock": state.has_clock,
            "journal": None if journal is None else str(journal.path),
        }

    return app
