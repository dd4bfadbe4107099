"""``justitia serve``: its settings (``ServeSettings``, checked when made), and ``run``, which starts
vLLM's own server with Justitia's scheduler and endpoint plugin (``vllm_command``, ``serve_vllm``), or
a front end over several engines (``--upstream``, ``--ray``: ``serve``), in one process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import math
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

from justitia.core import POLICY_NAMES, positive_finite
from justitia.predictors import make_predictor


@dataclass
class ServeSettings:
    """What ``justitia serve`` runs: one field per option, named as the option (``--max-num-seqs``:
    ``max_num_seqs``; the repeatable ``--api-key``: ``api_key``; ``--api-keys FILE``: ``api_keys``;
    ``--header-timeout`` and ``--upstream-timeout`` in seconds), and ``vllm_args``, vLLM's own options
    passed through; ``ray``, the replicas' ``RaySpec`` (``justitia.backends.ray``: its options check themselves) or
    None. Checked when made: a bad value raises ValueError naming its option."""

    model: str | None = None  # tiny, tiny-long, smollm2 or a model directory (None: tiny; upstream: the replicas' model)
    policy: str = "justitia"
    predictor: str = "online"
    predictor_state: Path | None = None  # None: next to the journal (nothing kept under no_journal)
    host: str = "127.0.0.1"
    port: int = 8000
    kv_blocks: int | None = None  # None: what memory allows
    calibration: Path | None = None  # a `justitia calibrate` file: the clock's M starts at what it measured
    max_num_seqs: int = 256
    max_model_len: int = 2048
    max_tasks_per_agent: int = 256
    max_agents_in_flight: int = 2048
    max_body_bytes: int = 1_000_000
    api_key: list[str] | None = None  # client keys (tenant 'default', weight 1)
    api_keys: Path | None = None  # a file of client keys (server.keys)
    key_agents_in_flight: int | None = None  # None: max_agents_in_flight
    key_requests_in_flight: int = 256
    key_rate: float = 0.0  # per second per key; 0: no limit
    key_burst: int = 0  # 0: one second's worth
    max_requests_in_flight: int = 1024
    max_streams_per_agent: int = 8
    finished_mib: int = 64
    finished_hours: float = 24.0
    journal: Path | None = None  # None: the default file (journal.default_path), unless no_journal
    no_journal: bool = False
    upstream_timeout: float = 600.0
    header_timeout: float = 10.0
    drain_s: float = 30.0
    upstream: list[str] | None = None  # stock vLLM servers to front
    upstream_kv_tokens: int | None = None  # None: read from each replica's /metrics
    ray: object = None  # a RaySpec: engine replicas on Ray Serve behind one clock here
    vllm_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "max_tasks_per_agent", "max_agents_in_flight", "max_body_bytes",
                     "key_requests_in_flight", "max_requests_in_flight", "max_streams_per_agent", "finished_mib"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}.")
        if self.key_agents_in_flight is not None and self.key_agents_in_flight < 1:
            raise ValueError(f"--key-agents-in-flight must be >= 1, got {self.key_agents_in_flight}.")
        for name in ("key_rate", "key_burst", "finished_hours"):
            value = getattr(self, name)
            if not (value >= 0 and value < math.inf):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}.")
        if self.upstream_kv_tokens is not None and self.upstream_kv_tokens < 1:
            raise ValueError(f"--upstream-kv-tokens must be >= 1, got {self.upstream_kv_tokens}.")
        if self.no_journal and self.journal:
            raise ValueError("--journal and --no-journal contradict each other.")
        if not (self.drain_s >= 0 and self.drain_s < math.inf):
            raise ValueError(f"--drain-s must be a finite number >= 0, got {self.drain_s}.")
        for name in ("header_timeout", "upstream_timeout"):
            positive_finite(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.ray is not None and self.upstream:
            raise ValueError("--ray and --upstream contradict each other: replicas run on Ray, or upstream.")
        if self.calibration is not None and (self.upstream or self.ray is not None):
            raise ValueError("--calibration: for the engine justitia serve runs itself; replicas measure their own M.")
        if self.vllm_args and self.upstream:
            raise ValueError(f"{' '.join(self.vllm_args)}: with --upstream, give vLLM's options to the replicas.")

    def limits(self) -> dict:
        """The per-key limits and what finished agents are kept: fields of the server's ``Settings``."""
        return {"key_agents_in_flight": self.key_agents_in_flight,
                "key_requests_in_flight": self.key_requests_in_flight, "key_rate": self.key_rate,
                "key_burst": self.key_burst,
                "max_requests_in_flight": self.max_requests_in_flight,
                "max_streams_per_agent": self.max_streams_per_agent, "finished_bytes": self.finished_mib << 20,
                "finished_s": self.finished_hours * 3600}

    def journal_path(self) -> Path | None:
        """The journal's file: None with ``no_journal``, else ``journal`` or the default one of this host and port."""
        if self.no_journal:
            return None
        from justitia.server.journal import default_path

        return self.journal or default_path(self.host, self.port)

    def predictor_state_path(self) -> Path | None:
        """Where ``online`` keeps what it learned: ``predictor_state``, else beside the journal
        (``*.online.json``); None without a journal."""
        if self.predictor_state is not None:
            return self.predictor_state
        journal = self.journal_path()
        return None if journal is None else journal.with_suffix(".online.json")


def run(settings: ServeSettings) -> int:
    """Run ``justitia serve`` until it stops; returns its exit status. Without ``upstream`` or ``ray``:
    vLLM's own server with Justitia's scheduler and endpoint plugin (``serve_vllm``); with them, the
    front end over those replicas (``serve``)."""
    if not settings.upstream and settings.ray is None:
        from justitia.server.keys import KeyRing

        make_predictor(settings.predictor)  # fail before minutes of start-up (online: its prior, trained once)
        KeyRing.load(settings.api_key, settings.api_keys)
        if settings.policy not in POLICY_NAMES:
            raise ValueError(f"--policy: unknown policy '{settings.policy}'; expected one of: "
                             f"{', '.join(POLICY_NAMES)}.")
        path = settings.journal_path()
        state = settings.predictor_state_path()
        config = {"predictor": settings.predictor, "predictor_state": None if state is None else str(state),
                  "api_keys": settings.api_key or [],
                  "api_keys_file": None if settings.api_keys is None else str(settings.api_keys),
                  "journal": None if path is None else str(path),
                  "limits": settings.limits() | {"max_tasks_per_agent": settings.max_tasks_per_agent,
                                                 "max_agents_in_flight": settings.max_agents_in_flight,
                                                 "max_body_bytes": settings.max_body_bytes}}
        argv = vllm_command(settings.model or "tiny", settings.host, settings.port, settings.kv_blocks,
                            settings.max_num_seqs, settings.max_model_len, settings.vllm_args)
        try:
            pricing = None if state is None else state.with_suffix(".pricing.json")  # the plug-in's (vllm/pricer.py)
            return serve_vllm(argv, vllm_environment(settings.policy, config, settings.calibration, pricing),
                              settings.header_timeout)
        except KeyboardInterrupt:
            return 0
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 0


def _uvicorn_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT once it has stopped, which would kill the process before
        the engine is shut down (leaving vLLM's worker processes behind); ``serve`` handles them."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server


def vllm_command(model: str, host: str, port: int, kv_blocks: int | None, max_num_seqs: int, max_model_len: int,
                 passthrough: list[str]) -> list[str]:
    """The ``vllm serve`` arguments (after ``vllm serve``) that run Justitia: the model, the scheduler
    class, vLLM's priority queue (the plug-in stamps each request's key as its priority), and the
    server options given, then ``passthrough`` (any of vLLM's own options, which win)."""
    from justitia.vllm.engine import engine_dtype, has_gpu
    from justitia.vllm.models import resolve_model

    given = {a.split("=", 1)[0] for a in passthrough if a.startswith("--")}
    if "--model" in given:
        raise ValueError("--model: give it to justitia serve itself (tiny, tiny-long, smollm2 or a model directory).")
    argv = ["--model", str(resolve_model(model)), "--scheduler-cls", "justitia.vllm.plugin.JustitiaScheduler",
            "--scheduling-policy", "priority"]
    defaults = {"--host": host, "--port": str(port), "--max-model-len": str(max_model_len),
                "--max-num-seqs": str(max_num_seqs), "--dtype": engine_dtype("auto")}
    if kv_blocks is not None:
        defaults["--num-gpu-blocks-override"] = str(kv_blocks)
    if "/" not in model:  # a built-in model answers to its own name, as before
        defaults["--served-model-name"] = model
    if not has_gpu():
        defaults["--enforce-eager"] = None  # no graphs to capture on a CPU; starts sooner
    for flag, value in defaults.items():
        if flag not in given:
            argv += [flag] if value is None else [flag, value]
    return argv + passthrough


def vllm_environment(policy: str, serve: dict, calibration: Path | None = None,
                     pricing_state: Path | None = None) -> dict[str, str]:
    """What configures Justitia inside vLLM's server: the plugin allowed, the scheduler's policy,
    the plugin's settings (``server.plugin.serve_config``), a calibration to start the clock's M
    from (``JUSTITIA_CALIBRATION``), and where the plug-in keeps what its own pricing learned
    (``JUSTITIA_PRICING_STATE``)."""
    from justitia.defaults import ENV_CALIBRATION, ENV_DOOR_TOKEN, ENV_POLICY, ENV_PRICING_STATE
    from justitia.server.plugin import ENV_SERVE
    from justitia.vllm.engine import has_gpu

    plugins = [p for p in os.environ.get("VLLM_PLUGINS", "").split(",") if p]
    env = {"VLLM_PLUGINS": ",".join(dict.fromkeys(plugins + ["justitia"])), ENV_POLICY: policy,
           ENV_SERVE: json.dumps(serve)}
    if calibration is not None:
        if not calibration.is_file():
            raise ValueError(f"--calibration: no file at {calibration}.")
        env[ENV_CALIBRATION] = str(calibration.resolve())
    if pricing_state is not None and ENV_PRICING_STATE not in os.environ:
        env[ENV_PRICING_STATE] = str(pricing_state)
    env.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))  # the model is a local directory
    env[ENV_DOOR_TOKEN] = os.environ.get(ENV_DOOR_TOKEN) or secrets.token_hex(16)  # justitia.vllm.general
    if "VLLM_CPU_KVCACHE_SPACE" not in os.environ and not has_gpu():
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB, as the benches' engines (vLLM's own default is 4)
    return env


def serve_vllm(argv: list[str], env: dict[str, str], header_timeout_s: float = 10.0) -> int:
    """Run vLLM's own OpenAI server (``vllm serve``'s entry point) with ``argv`` in this process,
    ``env`` set first; its uvicorn closes a connection whose request headers take longer than
    ``header_timeout_s`` (``limits.http_with_header_timeout``). Returns when it stops."""
    os.environ.update(env)
    import uvloop

    try:  # vLLM 0.32; 0.33 moved the parser to common/
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # pragma: no cover
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="justitia serve", description="vLLM's server options"))
    args = parser.parse_args(argv)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    from justitia.server.limits import http_with_header_timeout

    uvloop.run(run_server(args, http=http_with_header_timeout(header_timeout_s)))
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
    policy, host, port, drain_s = settings.policy, settings.host, settings.port, settings.drain_s
    if policy not in POLICY_NAMES:
        raise ValueError(f"--policy: unknown policy '{policy}'; expected one of: {', '.join(POLICY_NAMES)}.")
    from justitia.server.learning import server_predictor

    pred = server_predictor(settings.predictor, settings.predictor_state_path())  # before the engine: fails fast
    from justitia.server.keys import KeyRing

    keys = KeyRing.load(settings.api_key, settings.api_keys)
    from justitia.server.journal import Journal

    path = settings.journal_path()
    book = Journal(path) if path else None  # before the engine: a bad path fails fast
    import uvicorn
    from transformers import AutoTokenizer

    from justitia.server.app import Settings, create_app

    # the port is taken before the backend starts: a port in use fails now, not after minutes of
    # start-up, and no process the backend starts (Ray's take ports of their own) can take it first
    sock = _listen(host, port)
    try:
        backend = await _backend(settings)
    except BaseException:
        sock.close()
        raise
    try:
        app_settings = Settings(model=backend.model, policy=policy, max_model_len=backend.max_model_len,
                                max_tasks_per_agent=settings.max_tasks_per_agent,
                                max_agents_in_flight=settings.max_agents_in_flight,
                                max_body_bytes=settings.max_body_bytes, **settings.limits())
        app = create_app(backend, AutoTokenizer.from_pretrained(str(backend.tokenizer_dir)), app_settings, pred, keys,
                         book)
        manager = app.state.manager
        log = logging.getLogger("justitia.server")  # one JSON object a line, on stderr
        if not log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
            log.propagate = False
        # keep-alive well above the 5 s default: under load a client may reuse a connection that
        # uvicorn has just closed (httpx then fails with ReadError)
        from justitia.server.limits import http_with_header_timeout

        server = _uvicorn_server()(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                  timeout_keep_alive=75,
                                                  http=http_with_header_timeout(settings.header_timeout)))
        loop = asyncio.get_running_loop()
        status = 0

        async def drain():  # stop taking agents; wait for those working (not a waiting session), up to drain_s
            manager.draining = True
            deadline = loop.time() + drain_s
            while manager.working() and loop.time() < deadline:
                await asyncio.sleep(0.1)
            server.should_exit = True

        def stop():
            if not manager.draining:
                waiting = manager.in_flight() - manager.working()
                print(f"justitia serve: stopping: {manager.working()} agent(s) in flight, waiting up to {drain_s:g} s"
                      + (f"; {waiting} session(s) waiting for their client, not waited for"
                         + (" (the journal keeps them)" if manager.journal is not None else " (no --journal: lost)")
                         if waiting else ""),
                      flush=True)
                loop.create_task(drain())
            else:  # a second signal: stop now
                server.should_exit = True

        async def watch():  # the engine died: exit, so that a supervisor restarts the server
            nonlocal status
            while not server.should_exit:
                if not backend.alive():
                    log.error(json.dumps({"event": "engine_dead", "action": "exiting"}))
                    status = 1
                    server.should_exit = True
                await asyncio.sleep(1.0)

        for sig in (signal.SIGINT, signal.SIGTERM):  # stop serving, then shut the backend down (finally)
            loop.add_signal_handler(sig, stop)
        if book is not None:
            finished, resumed = await manager.recover()
            print(f"justitia serve: journal {book.path}: {finished} finished and {resumed} unfinished agent(s) "
                  f"reloaded", flush=True)
        watcher = asyncio.create_task(watch())
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            ray = settings.ray
            where = (f"{len(settings.upstream)} upstream vLLM server(s)" if settings.upstream else
                     f"{ray.replicas} Ray Serve replica(s) of {backend.model}" if ray is not None else backend.model)
            print(f"justitia serve: {where} ({backend.kv_tokens:,} KV tokens) with policy {policy} on "
                  f"http://{host}:{port} (API docs at /docs)", flush=True)
            print(f"justitia serve: {len(keys)} API key(s)" if not keys.open else
                  "justitia serve: no API key configured: open to every client that can reach it "
                  "(--api-key / --api-keys to require keys)", flush=True)
            if ready is not None:
                ready.set()
        await task
        watcher.cancel()
        for run in list(manager.agents.values()):  # unfinished: the journal resumes them at the next start
            if run.task is not None and not run.task.done():
                run.task.cancel()
        await asyncio.gather(*(r.task for r in manager.agents.values() if r.task is not None), return_exceptions=True)
        return status
    finally:
        sock.close()
        await backend.aclose()
        if book is not None:
            book.close()


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
        from justitia.vllm.models import resolve_model

        model = resolve_model(settings.model) if settings.model is not None else None
        return await UpstreamBackend.connect(settings.upstream, settings.policy, settings.upstream_kv_tokens, model,
                                             settings.upstream_timeout)
    raise ValueError("justitia serve runs vLLM's own server when it has neither --upstream nor --ray (serve_vllm).")


def local_spec(model: str, kv_blocks: int | None, max_num_seqs: int, max_model_len: int):
    """The engine of a ``--ray`` replica (and of the server bench): the plug-in, vLLM's own token
    budget and prefix caching, the KV cache the device leaves unless ``kv_blocks`` caps it."""
    from justitia.vllm.engine import EngineSpec

    return EngineSpec(model, kv_blocks=kv_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=None,
                      max_model_len=max_model_len, scheduler="plugin", prefix_caching=None)
