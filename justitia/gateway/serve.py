"""``justitia serve --upstream`` / ``--ray``: the front end over several engines, in one process.
``run`` serves until it is stopped; ``serve`` takes the port, starts the backend (``_backend``: the
upstream replicas, or replicas on Ray), reloads the journal and serves the front end's app
(``app.create_app``) with uvicorn, watching the engine (it exits, status 1, if the engine dies)
and draining on SIGTERM or Ctrl-C (``--drain-s``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

from justitia.server import logs
from justitia.server.settings import ServeSettings


def run(settings: ServeSettings) -> int:
    """Run the front end until it stops; returns its exit status (``serve``)."""
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 0


async def serve(settings: ServeSettings, ready: asyncio.Event | None = None) -> int:
    """Run the server until it is stopped (Ctrl-C or SIGTERM).

    With ``settings.upstream``: the front end of stock vLLM servers (``model``, if given, names the
    tokenizer; by default the replicas' model directory). With ``settings.ray``: engine replicas on
    Ray Serve behind one clock here (``RayBackend``). ``api_key`` / ``api_keys``: the clients
    allowed (``server.keys``); none: the server is open, and says so. SIGTERM or Ctrl-C stops
    taking agents and waits up to ``drain_s`` for those in flight (the journal resumes the rest at
    the next start). ``ready`` is set once it listens. Returns the exit status: 1 if the engine died
    (a supervisor restarts it).
    """
    host, port, drain_s = settings.host, settings.port, settings.drain_s
    from justitia.server.learning import server_predictor

    pred = server_predictor(settings.predictor, settings.predictor_state_path())  # before the engine: fails fast
    from justitia.server.keys import KeyRing

    keys = KeyRing.load(settings.api_key, settings.api_keys)
    from justitia.server.journal import Journal

    path = settings.journal_path()
    book = Journal(path) if path else None  # before the engine: a bad path fails fast
    # the port is taken before the backend starts: a port in use fails now, not after minutes of
    # start-up, and no process the backend starts (Ray's take ports of their own) can take it first
    sock = _listen(host, port)
    try:
        backend = await _backend(settings)
    except BaseException:
        sock.close()
        raise
    try:
        app = _app(settings, backend, pred, keys, book)
        manager = app.state.manager
        logs.setup()  # one JSON object a line, on stderr
        server = _server(app, settings)
        life = _Lifecycle(manager, server, backend, drain_s)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop serving, then shut the backend down (finally)
            loop.add_signal_handler(sig, life.stop)
        if book is not None:
            finished, resumed = await manager.recover()
            logs.event("journal_reloaded", path=book.path, finished=finished, unfinished=resumed)
        watcher = asyncio.create_task(life.watch())
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            _announce(settings, backend, keys)
            if ready is not None:
                ready.set()
        await task
        watcher.cancel()
        await _cancel_unfinished(manager)
        return life.status
    finally:
        sock.close()
        await backend.aclose()
        if book is not None:
            book.close()


def _app(settings: ServeSettings, backend, pred, keys, book):
    """The front end's app (``app.create_app``) over ``backend``, with the model's tokenizer."""
    from transformers import AutoTokenizer

    from justitia.gateway.app import Settings, create_app

    app_settings = Settings(
        model=backend.model,
        policy=settings.policy,
        max_model_len=backend.max_model_len,
        max_tasks_per_agent=settings.max_tasks_per_agent,
        max_agents_in_flight=settings.max_agents_in_flight,
        max_body_bytes=settings.max_body_bytes,
        **settings.limits(),
    )
    return create_app(
        backend, AutoTokenizer.from_pretrained(str(backend.tokenizer_dir)), app_settings, pred, keys, book
    )


def _server(app, settings: ServeSettings):
    """uvicorn's server for ``app``; keep-alive well above the 5 s default: under load a client may
    reuse a connection that uvicorn has just closed (httpx then fails with ReadError)."""
    import uvicorn

    from justitia.server.limits import http_with_header_timeout

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_keep_alive=75,
        http=http_with_header_timeout(settings.header_timeout),
    )
    return _uvicorn_server()(config)


class _Lifecycle:
    """Stopping: the first signal drains (no new agents; those working get up to ``drain_s``), a
    second stops at once; an engine that dies stops the server with status 1 (a supervisor
    restarts it)."""

    def __init__(self, manager, server, backend, drain_s: float):
        self.manager, self.server, self.backend, self.drain_s = manager, server, backend, drain_s
        self.status = 0

    async def drain(self) -> None:
        """Stop taking agents; wait for those working (not a waiting session), up to ``drain_s``."""
        loop = asyncio.get_running_loop()
        self.manager.draining = True
        deadline = loop.time() + self.drain_s
        while self.manager.working() and loop.time() < deadline:
            await asyncio.sleep(0.1)
        self.server.should_exit = True

    def stop(self) -> None:
        manager = self.manager
        if manager.draining:  # a second signal: stop now
            self.server.should_exit = True
            return
        logs.event(
            "stopping",
            working=manager.working(),
            wait_s=self.drain_s,
            sessions_not_waited_for=manager.in_flight() - manager.working(),
            sessions_kept="journal" if manager.journal is not None else "lost: no --journal",
        )
        asyncio.get_running_loop().create_task(self.drain())

    async def watch(self) -> None:
        """The engine died: exit, so that a supervisor restarts the server."""
        while not self.server.should_exit:
            if not self.backend.alive():
                logs.event("engine_dead", logging.ERROR, action="exiting")
                self.status = 1
                self.server.should_exit = True
            await asyncio.sleep(1.0)


def _announce(settings: ServeSettings, backend, keys) -> None:
    """The ``serving`` event: what it serves, where, under which policy, and whether it needs keys."""
    ray = settings.ray
    where = (
        f"{len(settings.upstream)} upstream vLLM server(s)"
        if settings.upstream
        else f"{ray.replicas} Ray Serve replica(s) of {backend.model}"
        if ray is not None
        else backend.model
    )
    logs.event(
        "serving",
        engine=where,
        kv_tokens=backend.kv_tokens,
        policy=settings.policy,
        url=f"http://{settings.host}:{settings.port}",
        api_docs="/docs",
        api_keys=len(keys)
        if not keys.open
        else "none: open to every client that can reach it (--api-key / --api-keys to require keys)",
    )


async def _cancel_unfinished(manager) -> None:
    """Unfinished agents' tasks cancelled (the journal resumes them at the next start)."""
    for run in list(manager.agents.values()):
        if run.task is not None and not run.task.done():
            run.task.cancel()
    await asyncio.gather(*(r.task for r in manager.agents.values() if r.task is not None), return_exceptions=True)


def _uvicorn_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT once it has stopped, which would kill the process before
        the engine is shut down (leaving vLLM's worker processes behind); ``serve`` handles them."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn to listen on (ValueError naming the port if it cannot)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"--port {port}: cannot listen on {host}: {exc.strerror or exc}.") from None
    return sock


async def _backend(settings: ServeSettings):
    """The engines the front end talks to: the upstream replicas, or replicas on Ray."""
    if settings.ray is not None:
        from justitia.backends.ray.backend import RayBackend

        spec = local_spec(settings.model or "tiny", settings.kv_blocks, settings.max_num_seqs, settings.max_model_len)
        return await RayBackend.start(spec, settings.policy, settings.ray, settings.vllm_args)
    if settings.upstream:
        from justitia.backends.upstream import UpstreamBackend
        from justitia.engine.models import resolve_model

        model = resolve_model(settings.model) if settings.model is not None else None
        return await UpstreamBackend.connect(
            settings.upstream, settings.policy, settings.upstream_kv_tokens, model, settings.upstream_timeout
        )
    raise ValueError("justitia serve runs vLLM's own server when it has neither --upstream nor --ray (serve_vllm).")


def local_spec(model: str, kv_blocks: int | None, max_num_seqs: int, max_model_len: int):
    """The engine of a ``--ray`` replica (and of the server bench): the plug-in, vLLM's own token
    budget and prefix caching, the KV cache the device leaves unless ``kv_blocks`` caps it."""
    from justitia.engine.launch import EngineSpec

    return EngineSpec(
        model,
        kv_blocks=kv_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=None,
        max_model_len=max_model_len,
        scheduler="plugin",
        prefix_caching=None,
    )
