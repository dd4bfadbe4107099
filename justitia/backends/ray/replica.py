"""``EngineReplica``: one vLLM engine with the Justitia plug-in, as a replica of a Ray Serve deployment.

Each replica is an ``AsyncLLM`` whose scheduler is ``JustitiaScheduler``. Under a cluster clock the
plug-in runs the ``tagged`` policy: every request carries the tag the ingress's one clock stamped
(``RequestMeta.agent_tag``), and the replica's queue is in tag order; its meter measures the M the
replica delivers, which the ingress reads (``state``) and adds up. The ingress is the only caller
(Ray handles; no HTTP reaches a replica), so the metadata it sends is trusted.

Every endpoint of vLLM's own server is served too: ``http`` hands one request (path, body,
headers) to vLLM's own app, built on this replica's engine (``build_app`` and ``init_app_state``,
the first time it is asked, with ``vllm_argv``: vLLM's serving options, such as a tool parser), and
streams its answer back: first ``{"status", "headers"}``, then the body's bytes, then
``{"replica": ...}`` (its id and measured M). The ingress's door has checked the body already.

The class is plain Python; ``justitia.backends.ray.deployment`` wraps it with ``serve.deployment``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from justitia.backends.base import Completion, Output, Sampling
from justitia.backends.wire import replay
from justitia.core import RETIRE, STATE, ControlCall


@dataclass
class ReplicaOutput(Output):
    """An answer so far, as a replica sends it to the ingress: on its last output, which replica
    answered, the M it measured (``RayBackend.heard``) and the prompt tokens its prefix cache held
    (``cached_tokens``, vLLM's ``RequestOutput.num_cached_tokens``)."""

    replica: dict | None = None


REFRESH_S = 1.0


class EngineDead(RuntimeError):
    """The replica's vLLM engine core has died: the replica's health check fails (Ray restarts it),
    and the ingress sends the request to a live replica, as when the replica itself dies."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid

    def __reduce__(self):  # Ray carries it to the ingress pickled
        return EngineDead, (str(self), self.pid)


def _actor_id() -> str | None:
    """This replica's Ray actor id (hex), which Ray's ``ActorDiedError`` names; None outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_actor_id()
    except Exception:  # noqa: BLE001  (not in a Ray worker)
        return None


class EngineReplica:
    """One engine: ``generate`` streams answers, ``state`` reads its plug-in, ``describe`` its sizes."""

    def __init__(self, spec: dict, plugin_env: dict, vllm_argv: list[str] | None = None):
        from justitia.engine.launch import EngineSpec, start_engine

        self.llm, model_dir = start_engine(EngineSpec(**spec), [], plugin_env)
        cache = self.llm.vllm_config.cache_config
        self.info = {
            "model": spec["model"],
            "tokenizer_dir": str(model_dir),
            "pid": os.getpid(),
            "actor": _actor_id(),
            "kv_tokens": (cache.num_gpu_blocks or 1) * cache.block_size,
            "max_model_len": self.llm.model_config.max_model_len,
            "block_size": cache.block_size,
        }
        self.capacity_per_s: float | None = None  # the plug-in's measured M, read every REFRESH_S
        self._refresher: asyncio.Task | None = None
        self.vllm_argv = list(vllm_argv or [])
        self._app = None  # vLLM's own app on this engine, built when first asked (``http``)
        self._app_lock = asyncio.Lock()

    async def describe(self) -> dict:
        """The replica's model, tokenizer directory, KV cache (tokens), context and process id."""
        return self.info

    async def generate(self, prompt_token_ids: list[int], params: Sampling, request_id: str, route: dict):
        """Serve one request (``route``: what the router reads: its predicted cost and prefix);
        yields ``ReplicaOutput``s. Cancelling the call aborts the request in vLLM."""
        from vllm.inputs import TokensPrompt

        from justitia.backends.local import vllm_params

        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())
        self._check_engine()
        try:
            prompt = TokensPrompt(prompt_token_ids=prompt_token_ids)
            async for out in self.llm.generate(prompt, vllm_params(params), request_id):
                c = out.outputs[0]
                about = self._about() | {"cached_tokens": out.num_cached_tokens} if out.finished else None
                yield ReplicaOutput(
                    request_id, [Completion(c.text, list(c.token_ids), c.finish_reason)], out.finished, about
                )
        except Exception:
            self._check_engine()  # the engine died under the request: say so, for the ingress to send it again
            raise

    def _about(self) -> dict:
        """What the ingress learns with each answer: which replica, and the M it measured."""
        return {"pid": self.info["pid"], "actor": self.info["actor"], "capacity_per_s": self.capacity_per_s}

    def _check_engine(self) -> None:
        """Raise ``EngineDead`` if this replica's engine core has died."""
        if self.llm.errored:
            raise EngineDead(f"replica {self.info['pid']}: its vLLM engine core has died.", self.info["pid"])

    async def _vllm_app(self):
        """vLLM's own OpenAI app over this replica's engine (no endpoint plugin: the ingress has the door)."""
        async with self._app_lock:
            if self._app is None:
                try:  # vLLM 0.32; 0.33 moved the parser to common/
                    from vllm.entrypoints.launchers.cli_args import make_arg_parser
                except ImportError:  # pragma: no cover
                    from vllm.entrypoints.common.cli_args import make_arg_parser
                from vllm.entrypoints.launchers.api_server.app_state import init_app_state
                from vllm.entrypoints.launchers.app import build_app
                from vllm.utils.argparse_utils import FlexibleArgumentParser

                args = make_arg_parser(FlexibleArgumentParser()).parse_args(
                    ["--model", self.info["tokenizer_dir"], "--served-model-name", self.info["model"], *self.vllm_argv]
                )
                tasks = await self.llm.get_supported_tasks()
                app = build_app(args, tasks, self.llm.model_config)
                await init_app_state(self.llm, app.state, args, tasks)
                self._app = app
        return self._app

    async def http(self, path: str, body: bytes, headers: list[tuple[str, str]], route: dict):
        """One request to vLLM's own app here (``route``: for the router); yields the answer's start
        (``{"status", "headers"}``), its body in pieces, then ``{"replica": ...}``. Cancelling the
        call is the client leaving: vLLM aborts the request."""
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())
        self._check_engine()
        app = await self._vllm_app()
        messages: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()

        async def disconnect():
            await gone.wait()
            return {"type": "http.disconnect"}

        receive = replay(body, disconnect)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        task = asyncio.get_running_loop().create_task(app(scope, receive, messages.put))
        try:
            while True:
                get = asyncio.ensure_future(messages.get())
                await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    task.result()  # the app ended without a whole answer: its error, if any
                    return
                message = get.result()
                if message["type"] == "http.response.start":
                    if message["status"] >= 500:
                        self._check_engine()  # an error because the engine died: the ingress sends it again
                    yield {
                        "status": message["status"],
                        "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]],
                    }
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body"):
                        break
            yield {"replica": self._about()}
        finally:
            gone.set()  # a cancelled call: vLLM sees the client gone and aborts the request
            if not task.done():
                await asyncio.wait({task}, timeout=5.0)
                task.cancel()

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
        from justitia.engine.launch import control

        return await control(self.llm, ControlCall(STATE))

    async def retire(self, agent_id: str, pause: bool = False) -> bool:
        """Retire an agent in the plug-in (a cancelled or failed agent; ``AgentBook.retire``; ``pause``:
        a session between bursts, ``AgentBook.pause``)."""
        from justitia.engine.launch import control

        return bool(await control(self.llm, ControlCall(RETIRE, {"agent_id": agent_id, "pause": pause})))

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine core died is restarted."""
        if self.llm.errored:
            raise RuntimeError("the replica's vLLM engine core has died.")

    def __del__(self):
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
