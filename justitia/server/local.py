"""``LocalBackend``: vLLM's ``AsyncLLM`` with the Justitia plug-in, in the server's process.

The plug-in runs in vLLM's engine process; agents are registered and released, and its clock is
read, through control calls (``justitia.vllm.engine.control``), so the tags the server reports
are the ones that order the engine.
"""

from __future__ import annotations

from justitia.core import REGISTER, RELEASE, STATE, ControlCall, PolicyState
from justitia.server.backend import Backend, metric_lines
from justitia.vllm.engine import EngineSpec, control, plugin_environment, start_engine


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


class LocalBackend(Backend):
    """One ``AsyncLLM`` running the plug-in under ``policy``."""

    def __init__(self, spec: EngineSpec, policy: str):
        self.policy = policy
        self.stats = EngineStats()
        self.llm, self.tokenizer_dir = start_engine(spec, [self.stats.logger], plugin_environment(policy))
        cache = self.llm.vllm_config.cache_config
        self.model = spec.model
        self.kv_tokens = (cache.num_gpu_blocks or 1) * cache.block_size
        self.max_model_len = spec.max_model_len

    def generate(self, prompt: dict, params, request_id: str):
        """``AsyncLLM.generate``: closing it early aborts the request in vLLM."""
        from vllm.inputs import TokensPrompt

        return self.llm.generate(TokensPrompt(prompt_token_ids=prompt["prompt_token_ids"]), params, request_id)

    async def register(self, agent_id: str, agent_type: str, predicted_cost: float, weight: float = 1.0,
                       tenant: str | None = None) -> float | None:
        """Register the agent in the plug-in; the tag its clock stamped."""
        args = {"agent_id": agent_id, "agent_type": agent_type, "predicted_cost": predicted_cost, "weight": weight,
                "tenant": tenant}
        return await control(self.llm, ControlCall(REGISTER, args))

    async def release(self, agent_id: str) -> None:
        """Release the agent in the plug-in."""
        await control(self.llm, ControlCall(RELEASE, {"agent_id": agent_id}))

    async def state(self) -> PolicyState:
        """The plug-in's policy, read in the engine process."""
        return PolicyState.from_json(await control(self.llm, ControlCall(STATE)))

    def alive(self) -> bool:
        """False once vLLM's engine core has died."""
        return not self.llm.errored

    def unfinished(self) -> int:
        """Requests in AsyncLLM's output processor."""
        return int(self.llm.output_processor.get_num_unfinished_requests())

    def metrics_lines(self) -> list[str]:
        """The engine's queues and KV cache use, from vLLM's scheduler statistics."""
        # vLLM reports its queues after each step; an abort into an idle engine brings no step, so
        # an engine holding nothing (the output processor's count) reports empty queues
        st = self.stats
        idle = self.unfinished() == 0
        n_wait, n_run = (0, 0) if idle else (st.waiting, st.running)
        return [*metric_lines("engine_requests_waiting", "gauge", "Requests in the engine's waiting queue (the plug-in's "
                              "order).", f"justitia_engine_requests_waiting {n_wait}"),
                *metric_lines("engine_requests_running", "gauge", "Requests the engine is running.",
                              f"justitia_engine_requests_running {n_run}"),
                *metric_lines("engine_kv_cache_usage", "gauge", "Share of the engine's KV cache in use (0-1).",
                              f"justitia_engine_kv_cache_usage {0.0 if idle else st.kv_cache_usage:.4f}")]

    async def aclose(self) -> None:
        """Shut vLLM down (its worker processes with it)."""
        self.llm.shutdown()
