"""``justitia serve``: vLLM's own server with Justitia's scheduler and endpoint plugin (``vllm_command``,
``serve_vllm``), or a front end over several engines (``--upstream``, ``--ray``: ``serve``), in one
process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
from pathlib import Path

from justitia.core import POLICY_NAMES
from justitia.predictors import make_predictor


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
        raise ValueError("--model: give it to justitia serve itself (tiny, smollm2 or a model directory).")
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


def vllm_environment(policy: str, serve: dict, calibration: Path | None = None) -> dict[str, str]:
    """What configures Justitia inside vLLM's server: the plugin allowed, the scheduler's policy,
    the plugin's settings (``server.plugin.serve_config``), and a calibration to start the clock's M
    from (``JUSTITIA_CALIBRATION``)."""
    from justitia.defaults import ENV_CALIBRATION, ENV_DOOR_TOKEN, ENV_POLICY
    from justitia.server.plugin import ENV_SERVE
    from justitia.vllm.engine import has_gpu

    plugins = [p for p in os.environ.get("VLLM_PLUGINS", "").split(",") if p]
    env = {"VLLM_PLUGINS": ",".join(dict.fromkeys(plugins + ["justitia"])), ENV_POLICY: policy,
           ENV_SERVE: json.dumps(serve)}
    if calibration is not None:
        if not calibration.is_file():
            raise ValueError(f"--calibration: no file at {calibration}.")
        env[ENV_CALIBRATION] = str(calibration.resolve())
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


async def serve(model: str | None = None, policy: str = "justitia", predictor: str = "mlp", host: str = "127.0.0.1",
                port: int = 8000, kv_blocks: int | None = None, max_num_seqs: int = 256, max_model_len: int = 2048,
                max_tasks_per_agent: int = 256, max_agents_in_flight: int = 2048, max_body_bytes: int = 1_000_000,
                upstream: list[str] | None = None, upstream_kv_tokens: int | None = None,
                ready: asyncio.Event | None = None, api_keys: list[str] | None = None,
                api_keys_file: Path | None = None, limits: dict | None = None,
                journal: Path | None | bool = True, drain_s: float = 30.0, upstream_timeout_s: float = 600.0,
                header_timeout_s: float = 10.0, ray=None, vllm_args: list[str] | None = None) -> int:
    """Run the server until it is stopped (Ctrl-C or SIGTERM).

    With ``upstream``: the front end of stock vLLM servers (``model``, if given, names the tokenizer;
    by default the replicas' model directory). With ``ray`` (a ``RaySpec``): engine replicas on
    Ray Serve behind one clock here (``RayBackend``). ``api_keys`` / ``api_keys_file``: the clients
    allowed (``server.keys``); none: the server is open, and says so. ``limits``: other
    ``Settings`` fields (per-key limits, what finished agents are kept). ``journal``: a file,
    True (the default file, ``journal.default_path``) or False (none). SIGTERM or Ctrl-C stops
    taking agents and waits up to ``drain_s`` for those in flight (the journal resumes the rest at
    the next start). Returns the exit status: 1 if the engine died (a supervisor restarts it).
    """
    if policy not in POLICY_NAMES:
        raise ValueError(f"--policy: unknown policy '{policy}'; expected one of: {', '.join(POLICY_NAMES)}.")
    pred = make_predictor(predictor)  # before the engine: a bad predictor (or key file) fails fast
    from justitia.server.keys import KeyRing

    keys = KeyRing.load(api_keys, api_keys_file)
    from justitia.server.journal import Journal, default_path

    if journal is True:
        journal = default_path(host, port)
    book = Journal(journal) if journal else None  # before the engine: a bad path fails fast
    import uvicorn
    from transformers import AutoTokenizer

    from justitia.server.app import Settings, create_app

    backend = await _backend(model, policy, kv_blocks, max_num_seqs, max_model_len, upstream, upstream_kv_tokens,
                             upstream_timeout_s, ray, vllm_args)
    try:
        settings = Settings(model=backend.model, policy=policy, max_model_len=backend.max_model_len,
                            max_tasks_per_agent=max_tasks_per_agent, max_agents_in_flight=max_agents_in_flight,
                            max_body_bytes=max_body_bytes, **(limits or {}))
        app = create_app(backend, AutoTokenizer.from_pretrained(str(backend.tokenizer_dir)), settings, pred, keys,
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
                                                  timeout_keep_alive=75, http=http_with_header_timeout(header_timeout_s)))
        loop = asyncio.get_running_loop()
        status = 0

        async def drain():  # stop taking agents; wait for those in flight, up to drain_s; then stop
            manager.draining = True
            deadline = loop.time() + drain_s
            while manager.in_flight() and loop.time() < deadline:
                await asyncio.sleep(0.1)
            server.should_exit = True

        def stop():
            if not manager.draining:
                print(f"justitia serve: stopping: {manager.in_flight()} agent(s) in flight, waiting up to "
                      f"{drain_s:g} s", flush=True)
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
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            where = (f"{len(upstream)} upstream vLLM server(s)" if upstream else
                     f"{ray.replicas} Ray Serve replica(s) of {backend.model}" if ray else backend.model)
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
        await backend.aclose()
        if book is not None:
            book.close()


async def _backend(model, policy, kv_blocks, max_num_seqs, max_model_len, upstream, upstream_kv_tokens,
                   upstream_timeout_s=600.0, ray=None, vllm_args=None):
    """The engines the front end talks to: the upstream replicas, or replicas on Ray."""
    if ray is not None:
        from justitia.server.ray_backend import RayBackend

        return await RayBackend.start(local_spec(model or "tiny", kv_blocks, max_num_seqs, max_model_len), policy, ray,
                                      vllm_args)
    if upstream:
        from justitia.server.upstream import UpstreamBackend
        from justitia.vllm.models import resolve_model

        return await UpstreamBackend.connect(upstream, policy, upstream_kv_tokens,
                                             resolve_model(model) if model is not None else None, upstream_timeout_s)
    raise ValueError("justitia serve runs vLLM's own server when it has neither --upstream nor --ray (serve_vllm).")


def local_spec(model: str, kv_blocks: int | None, max_num_seqs: int, max_model_len: int):
    """The engine of a ``--ray`` replica (and of the server bench): the plug-in, vLLM's own token
    budget and prefix caching, the KV cache the device leaves unless ``kv_blocks`` caps it."""
    from justitia.vllm.engine import EngineSpec

    return EngineSpec(model, kv_blocks=kv_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=None,
                      max_model_len=max_model_len, scheduler="plugin", prefix_caching=None)
