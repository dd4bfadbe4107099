"""Start ``AsyncLLM`` with the Justitia plug-in and serve the app with uvicorn, in one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal


def _uvicorn_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT once it has stopped, which would kill the process before
        the engine is shut down (leaving vLLM's worker processes behind); ``serve`` handles them."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server


async def serve(model: str = "tiny", policy: str = "justitia", predictor: str = "mlp", host: str = "127.0.0.1",
                port: int = 8000, kv_blocks: int | None = None, max_num_seqs: int = 256, max_model_len: int = 2048,
                max_tasks_per_agent: int = 256, max_agents_in_flight: int = 2048, max_body_bytes: int = 1_000_000,
                ready: asyncio.Event | None = None) -> None:
    """Run the server until it is stopped (Ctrl-C)."""
    from justitia.policies import POLICY_NAMES
    from justitia.predictor import make_predictor

    if policy not in POLICY_NAMES:
        raise ValueError(f"--policy: unknown policy '{policy}'; expected one of: {', '.join(POLICY_NAMES)}.")
    pred = make_predictor(predictor)  # before the engine: a bad predictor fails fast
    os.environ["JUSTITIA_POLICY"] = policy
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import uvicorn
    from transformers import AutoTokenizer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from justitia.server.app import Settings, create_app
    from justitia.vllm.models import resolve_model
    from justitia.vllm.runner import engine_dtype

    _Server = _uvicorn_server()
    model_dir = resolve_model(model)
    args = AsyncEngineArgs(model=str(model_dir), scheduling_policy="priority",
                           scheduler_cls="justitia.vllm.scheduler.JustitiaScheduler",
                           num_gpu_blocks_override=kv_blocks, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                           enforce_eager=True, disable_log_stats=True, dtype=engine_dtype("auto"))
    llm = AsyncLLM.from_engine_args(args)
    try:
        cache = llm.vllm_config.cache_config
        kv_tokens = (cache.num_gpu_blocks or 1) * cache.block_size
        iteration_s = float(os.environ.get("JUSTITIA_ITERATION_S", "0.02"))
        settings = Settings(model=model, policy=policy, max_model_len=max_model_len,
                            max_tasks_per_agent=max_tasks_per_agent, max_agents_in_flight=max_agents_in_flight,
                            max_body_bytes=max_body_bytes,
                            capacity_per_s=float(os.environ.get("JUSTITIA_CAPACITY", kv_tokens / iteration_s)))
        app = create_app(llm, AutoTokenizer.from_pretrained(str(model_dir)), settings, pred)
        log = logging.getLogger("justitia.server")  # one JSON object a line, on stderr
        if not log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
            log.propagate = False
        # keep-alive well above the 5 s default: under load a client may reuse a connection that
        # uvicorn has just closed (httpx then fails with ReadError)
        server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_keep_alive=75))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop serving, then shut the engine down (finally)
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(f"justitia serve: {model} with policy {policy} on http://{host}:{port} (API docs at /docs)", flush=True)
            if ready is not None:
                ready.set()
        await task
    finally:
        llm.shutdown()
