"""``EngineReplica``: one vLLM engine with the Justitia plug-in, as a replica of a Ray Serve deployment.

Each replica is an ``AsyncLLM`` whose scheduler is ``JustitiaScheduler``. Under a cluster clock the
plug-in runs the ``tagged`` policy: every request carries the tag the ingress's one clock stamped
(``RequestMeta.agent_tag``), and the replica's queue is in tag order; its meter measures the M the
replica delivers, which the ingress reads (``state``) and adds up. The ingress is the only caller
(Ray handles; no HTTP reaches a replica), so the metadata it sends is trusted.

The class is plain Python; ``justitia.ray.deployment`` wraps it with ``serve.deployment``.
"""

from __future__ import annotations

import asyncio
import os

from justitia.core import RELEASE, STATE, ControlCall
from justitia.server.backend import Completion, Output

REFRESH_S = 1.0


class EngineReplica:
    """One engine: ``generate`` streams answers, ``state`` reads its plug-in, ``describe`` its sizes."""

    def __init__(self, spec: dict, plugin_env: dict):
        from justitia.vllm.engine import EngineSpec, start_engine

        self.llm, model_dir = start_engine(EngineSpec(**spec), [], plugin_env)
        cache = self.llm.vllm_config.cache_config
        self.info = {"model": spec["model"], "tokenizer_dir": str(model_dir), "pid": os.getpid(),
                     "kv_tokens": (cache.num_gpu_blocks or 1) * cache.block_size,
                     "max_model_len": self.llm.model_config.max_model_len, "block_size": cache.block_size}
        self.capacity_per_s: float | None = None  # the plug-in's measured M, read every REFRESH_S
        self._refresher: asyncio.Task | None = None

    async def describe(self) -> dict:
        """The replica's model, tokenizer directory, KV cache (tokens), context and process id."""
        return self.info

    async def generate(self, prompt_token_ids: list[int], params, request_id: str, route: dict):
        """Serve one request (``route``: what the router reads: its predicted cost and prefix);
        yields ``Output``s. Cancelling the call aborts the request in vLLM."""
        from vllm.inputs import TokensPrompt

        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), params, request_id):
            c = out.outputs[0]
            about = {"pid": self.info["pid"], "capacity_per_s": self.capacity_per_s} if out.finished else None
            yield Output(request_id, [Completion(c.text, list(c.token_ids), c.finish_reason)], out.finished, about)

    async def _refresh(self) -> None:
        """Keep ``capacity_per_s`` current (one control call a second while requests come)."""
        while True:
            try:
                self.capacity_per_s = (await self.state()).get("capacity_per_s")
            except Exception:  # an engine that is going away: the health check reports it
                return
            await asyncio.sleep(REFRESH_S)

    def record_routing_stats(self) -> dict:
        """What the router reads of this replica (Ray polls it): its KV cache and measured M."""
        return {"kv_tokens": self.info["kv_tokens"], "capacity_per_s": self.capacity_per_s}

    async def state(self) -> dict:
        """The plug-in's policy state (``PolicyState.to_json()``): its measured M among it."""
        from justitia.vllm.engine import control

        return await control(self.llm, ControlCall(STATE))

    async def release(self, agent_id: str) -> bool:
        """Drop an agent's state in the plug-in (a cancelled or failed agent)."""
        from justitia.vllm.engine import control

        return bool(await control(self.llm, ControlCall(RELEASE, {"agent_id": agent_id})))

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine core died is restarted."""
        if self.llm.errored:
            raise RuntimeError("the replica's vLLM engine core has died.")

    def __del__(self):
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
