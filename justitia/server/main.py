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


async def serve(model: str | None = None, policy: str = "justitia", predictor: str = "mlp", host: str = "127.0.0.1",
                port: int = 8000, kv_blocks: int | None = None, max_num_seqs: int = 256, max_model_len: int = 2048,
                max_tasks_per_agent: int = 256, max_agents_in_flight: int = 2048, max_body_bytes: int = 1_000_000,
                upstream: list[str] | None = None, upstream_kv_tokens: int | None = None,
                ready: asyncio.Event | None = None) -> None:
    """Run the server until it is stopped (Ctrl-C or SIGTERM).

    Without ``upstream``: AsyncLLM with the Justitia plug-in in this process (``model``, default
    tiny). With it: the front end of stock vLLM servers (``model``, if given, names the tokenizer;
    by default the replicas' model directory).
    """
    from justitia.policies import POLICY_NAMES
    from justitia.predictor import make_predictor

    if policy not in POLICY_NAMES:
        raise ValueError(f"--policy: unknown policy '{policy}'; expected one of: {', '.join(POLICY_NAMES)}.")
    pred = make_predictor(predictor)  # before the engine: a bad predictor fails fast
    import uvicorn
    from transformers import AutoTokenizer

    from justitia.server.app import Settings, create_app

    iteration_s = float(os.environ.get("JUSTITIA_ITERATION_S", "0.02"))
    async with contextlib.AsyncExitStack() as stack:
        if upstream:
            engine, tokenizer_dir, name = await _upstream(stack, upstream, upstream_kv_tokens, policy, model)
            stats = None  # each replica's own /metrics has its queues
            kv_tokens, max_model_len = engine.kv_tokens, engine.max_model_len
            where = f"{len(engine.replicas)} upstream vLLM server(s) ({kv_tokens:,} KV tokens)"
        else:
            engine, tokenizer_dir, kv_tokens, stats = _local(stack, model or "tiny", policy, kv_blocks, max_num_seqs,
                                                             max_model_len)
            name, where = model or "tiny", model or "tiny"
        settings = Settings(model=name, policy=policy, max_model_len=max_model_len,
                            max_tasks_per_agent=max_tasks_per_agent, max_agents_in_flight=max_agents_in_flight,
                            max_body_bytes=max_body_bytes,
                            capacity_per_s=float(os.environ.get("JUSTITIA_CAPACITY", kv_tokens / iteration_s)))
        app = create_app(engine, AutoTokenizer.from_pretrained(str(tokenizer_dir)), settings, pred, stats)
        log = logging.getLogger("justitia.server")  # one JSON object a line, on stderr
        if not log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
            log.propagate = False
        # keep-alive well above the 5 s default: under load a client may reuse a connection that
        # uvicorn has just closed (httpx then fails with ReadError)
        server = _uvicorn_server()(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                  timeout_keep_alive=75))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop serving, then shut the engine down (exit stack)
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(f"justitia serve: {where} with policy {policy} on http://{host}:{port} (API docs at /docs)",
                  flush=True)
            if ready is not None:
                ready.set()
        await task


def _local(stack: contextlib.AsyncExitStack, model: str, policy: str, kv_blocks: int | None, max_num_seqs: int,
           max_model_len: int):
    """AsyncLLM with the plug-in; returns it, its tokenizer directory, its KV tokens and its EngineStats."""
    os.environ["JUSTITIA_POLICY"] = policy
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from justitia.vllm.models import resolve_model
    from justitia.vllm.runner import engine_dtype

    model_dir = resolve_model(model)
    args = AsyncEngineArgs(model=str(model_dir), scheduling_policy="priority",
                           scheduler_cls="justitia.vllm.scheduler.JustitiaScheduler",
                           num_gpu_blocks_override=kv_blocks, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                           enforce_eager=True, disable_log_stats=True, dtype=engine_dtype("auto"))
    stats = EngineStats()
    llm = AsyncLLM.from_engine_args(args, stat_loggers=[stats.logger])
    stack.callback(llm.shutdown)
    cache = llm.vllm_config.cache_config
    return llm, model_dir, (cache.num_gpu_blocks or 1) * cache.block_size, stats


class EngineStats:
    """The engine's latest scheduler statistics (waiting, running, KV cache use), for /metrics.

    ``logger`` is a vLLM stat-logger factory; with only custom loggers vLLM logs nothing itself."""

    def __init__(self):
        self.waiting = self.running = 0
        self.kv_cache_usage = 0.0

    def logger(self, vllm_config, engine_index: int = 0):
        from vllm.v1.metrics.loggers import StatLoggerBase

        owner = self

        class Logger(StatLoggerBase):
            def __init__(self, *args, **kwargs):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                if scheduler_stats is not None:
                    owner.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                    owner.running = scheduler_stats.num_running_reqs
                    owner.kv_cache_usage = scheduler_stats.kv_cache_usage

            def log_engine_initialized(self):
                pass

        return Logger()


async def _upstream(stack: contextlib.AsyncExitStack, urls: list[str], kv_tokens: int | None, policy: str,
                    model: str | None):
    """The front end of stock vLLM servers; returns it, its tokenizer directory and the served model's name."""
    from pathlib import Path

    from justitia.server.upstream import UpstreamEngine, probe_replica
    from justitia.vllm.models import resolve_model

    replicas = []
    try:
        for url in urls:
            replicas.append(await probe_replica(url, kv_tokens))
    finally:
        for r in replicas:
            stack.push_async_callback(r.client.aclose)
    idle_s = float(os.environ.get("JUSTITIA_AGENT_IDLE_S", "60"))
    iteration_s = float(os.environ.get("JUSTITIA_ITERATION_S", "0.02"))
    total = sum(r.kv_tokens for r in replicas)
    engine = UpstreamEngine(replicas, policy, float(os.environ.get("JUSTITIA_CAPACITY", total / iteration_s)), idle_s)
    if model is not None:
        tokenizer_dir = resolve_model(model)
    elif Path(replicas[0].root).is_dir():
        tokenizer_dir = Path(replicas[0].root)
    else:
        raise ValueError(f"--upstream: the replicas serve '{replicas[0].root}', which is not a directory here; pass "
                         "--model with the same model (its tokenizer prices the requests).")
    return engine, tokenizer_dir, replicas[0].model
