"""``RayBackend`` (``justitia serve --ray``): engine replicas on Ray Serve, one Justitia clock here.

The server (the ingress) keeps the cluster's one clock: a tagging ``AgentBook`` running the policy
(justitia, or another static policy), as ``--upstream`` does. Every request carries its key's lead,
the agent's virtual finish tag under justitia, as ``RequestMeta.agent_tag`` to whichever replica
serves it; each replica's plug-in runs the ``tagged`` policy and orders its queue by those tags
(``justitia.ray.replica``). The clock's M is the sum of the replicas' measured M: each replica's
last answer to a request reports its plug-in's meter, and M = their mean x the number of replicas
(a replica that has answered nothing yet counts at the mean), applied at the next agent's arrival.

Requests go through a deployment handle; ``JustitiaRouter`` (``justitia.ray.router``) picks the
replica with the least outstanding predicted KV token-time per KV token, or (``--router
affinity``) the replica that served the prompt's first block lately. Faults: a request whose
replica dies, or is unavailable, before any token came back is sent again (Ray routes it to a live
replica), up to ``RETRIES`` times; one that fails after tokens came back raises
``BackendInterrupted`` (the server's agents run such a task once more). Ray restarts a dead replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

from justitia.core import KV, STATIC_POLICY_NAMES, AgentBook, PolicyState, RequestMeta, capacity_per_s
from justitia.defaults import policy_settings
from justitia.server.backend import Backend, BackendError, BackendInterrupted, metric_lines

log = logging.getLogger("justitia.server")
RETRIES = 4  # sends of one request while no token came back
RETRY_S = 1.0  # the wait before sending again (Ray learns of a dead replica meanwhile)
SHUTDOWN_S = 60.0  # the most the server waits for Ray to delete the deployment when it stops


def check_policy(policy: str) -> None:
    """Only a policy whose keys are fixed on arrival can be kept by one clock in front of the replicas."""
    if policy not in STATIC_POLICY_NAMES:
        raise ValueError(f"--ray: policy '{policy}' changes its keys as service accrues, which one clock in front "
                         f"of several engines cannot see; --ray supports {', '.join(STATIC_POLICY_NAMES)}.")


class RayBackend(Backend):
    """The cluster's one clock over Ray Serve engine replicas."""

    def __init__(self, handle, info: dict, replicas: int, policy: str, capacity: float, idle_release_s: float,
                 retag: bool, local: bool):
        check_policy(policy)
        self.handle = handle
        self.policy = policy
        self.model = info["model"]
        self.tokenizer_dir = Path(info["tokenizer_dir"])
        self.replica_kv_tokens = int(info["kv_tokens"])
        self.block_size = int(info.get("block_size") or 16)
        self.max_model_len = int(info["max_model_len"])
        self.replicas = replicas
        self.local = local
        self.book = AgentBook.tagging(policy, capacity, KV, idle_release_s, log, retag)
        self.formula_capacity_per_s = capacity
        self.measured: dict[int, float] = {}  # replica pid -> its last reported M
        self.served: dict[int, int] = {}  # replica pid -> requests it answered
        self.in_flight = 0
        self.sent = self.retried = self.interrupted = 0
        self.t0 = time.monotonic()

    @classmethod
    async def start(cls, spec, policy: str, ray_spec, vllm_argv: list[str] | None = None) -> "RayBackend":
        """Start (or join) Ray, deploy ``ray_spec.replicas`` engines of ``spec`` (an ``EngineSpec``),
        each serving vLLM's own app with ``vllm_argv`` (vLLM's serving options)."""
        from justitia.ray.deployment import deploy, shutdown
        from justitia.vllm.engine import plugin_environment

        check_policy(policy)  # before minutes of start-up
        settings = policy_settings()
        env = plugin_environment("tagged", iteration_s=settings.iteration_s)
        loop = asyncio.get_running_loop()
        handle = await loop.run_in_executor(None, deploy, ray_spec, spec.to_json(), env, vllm_argv)
        try:
            info = await handle.describe.remote()
            total = info["kv_tokens"] * ray_spec.replicas
            capacity = settings.capacity_per_s or capacity_per_s(KV, total, 0, settings.iteration_s)
            return cls(handle, info, ray_spec.replicas, policy, capacity, settings.agent_idle_s, settings.retag,
                       ray_spec.address is None)
        except BaseException:
            await loop.run_in_executor(None, shutdown, ray_spec.address is None)
            raise

    @property
    def kv_tokens(self) -> int:
        """The replicas' KV caches together, in tokens."""
        return self.replica_kv_tokens * self.replicas

    def now(self) -> float:
        return time.monotonic() - self.t0

    def capacity(self) -> float:
        """The cluster's M: the replicas' measured M, their mean x the number of replicas."""
        known = [m for m in self.measured.values() if m]
        if not known:
            return self.book.core.capacity_per_s or self.formula_capacity_per_s
        return sum(known) / len(known) * self.replicas

    async def register(self, agent_id: str, agent_type: str, predicted_cost: float, weight: float = 1.0,
                       tenant: str | None = None) -> float | None:
        """Register the agent with the one clock (at the M the replicas measured); its tag."""
        now = self.now()
        self._follow_capacity(agent_id, now)
        self.book.register(agent_id, agent_type, predicted_cost, now, weight, tenant)
        return self.book.core.virtual_finish(agent_id)

    def _follow_capacity(self, agent_id: str, now: float) -> None:
        """An agent is about to arrive: the clock moves to the M the replicas measured."""
        core = self.book.core
        if self.measured and core.capacity_per_s is not None and not core.has_agent(agent_id):
            core.set_capacity(self.capacity(), now)

    async def release(self, agent_id: str) -> None:
        """Drop the agent from the clock now (its requests are aborted; each replica's plug-in forgets
        it once none of its requests is left there, after its idle timeout)."""
        self.book.release(agent_id, self.now())

    async def state(self) -> PolicyState:
        """The ingress's policy, which orders every replica."""
        return self.book.state(self.now())

    def unfinished(self) -> int:
        """Requests sent to the replicas and not finished."""
        return self.in_flight

    def prefix(self, ids: list[int]) -> str | None:
        """The key of the prompt's first KV block (None if the prompt has no full block)."""
        if len(ids) <= self.block_size:
            return None
        return hashlib.blake2b(json.dumps(ids[: self.block_size]).encode(), digest_size=8).hexdigest()

    def _stamp(self, request_id: str, xargs: dict, prompt_tokens: int, max_tokens: int):
        """Tag a request with the one clock (its metadata in ``xargs``, which gets the clock's tag and
        the agent's rank in its tenant); its info, to ``book.finish`` when it ends."""
        now = self.now()
        self.book.sweep(now)
        meta = RequestMeta.parse(xargs, request_id, log)
        self._follow_capacity(meta.agent_id or request_id, now)  # an agent known only by its requests
        info, _ = self.book.tag(request_id, meta, prompt_tokens, max_tokens, now)
        xargs["agent_tag"], rank = self.book.core.stamp(info)
        if rank is not None:
            xargs["agent_rank"] = rank
        return info

    async def generate(self, prompt, params, request_id: str):
        """Stamp the request with the clock's tag and send it through the router; retried while no
        token came back."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

        ids = list(prompt["prompt_token_ids"])
        xargs = dict(params.extra_args or {})
        info = self._stamp(request_id, xargs, len(ids), params.max_tokens or 16)
        sent = params.clone()
        sent.extra_args = xargs
        route = {"cost": info.predicted_cost, "prefix": self.prefix(ids)}
        produced = 0
        self.in_flight += 1
        try:
            for attempt in range(RETRIES):
                streamed = False
                self.sent += 1
                stream = self.handle.options(stream=True).generate.remote(ids, sent, f"{request_id}#{attempt}", route=route)
                try:
                    async for out in stream:
                        streamed = True
                        produced += len(out.outputs[0].token_ids)
                        if out.replica is not None:
                            pid = out.replica["pid"]
                            self.measured[pid] = out.replica["capacity_per_s"]
                            self.served[pid] = self.served.get(pid, 0) + 1
                        yield replace(out, request_id=request_id)
                    return
                except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    if streamed:
                        self.interrupted += 1
                        raise BackendInterrupted(f"request {request_id}: its replica failed midway ({reason}).") from exc
                    self.retried += 1
                    log.warning(json.dumps({"event": "replica_failed", "request_id": request_id, "error": reason[:200],
                                            "action": "send again"}))
                    await asyncio.sleep(RETRY_S)
                except RayTaskError as exc:  # the engine refused or failed the request itself
                    cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                    raise BackendError(f"request {request_id}: {str(cause).splitlines()[0][:300]}") from exc
                finally:
                    stream.cancel()  # a closed generator (a cancelled request) aborts it in the replica
            raise BackendError(f"request {request_id}: no replica could serve it after {RETRIES} tries.")
        finally:
            self.in_flight -= 1
            self.book.finish(request_id, self.now(), produced)

    async def forward(self, path: str, kind: str, doc: dict, prompt_tokens: int, max_tokens: int, request_id: str):
        """A client's OpenAI or Anthropic body, stamped with the clock's tag, to vLLM's own app on a
        replica the router picks (``EngineReplica.http``); its answer streams back as it is. Sent
        again while no byte came back and the replica died or was unavailable."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
        from starlette.responses import JSONResponse, StreamingResponse

        from justitia.server.forward import prompt_text
        from justitia.server.limits import error_doc, once

        outer, name = ("sampling_params", "extra_args") if kind == "generate" else (None, "vllm_xargs")
        holder = doc[outer] if outer else doc
        xargs = dict(holder.get(name) or {})
        info = self._stamp(request_id, xargs, prompt_tokens, max_tokens)
        holder[name] = xargs
        body = json.dumps(doc, ensure_ascii=False).encode()
        text = prompt_text(doc)
        route = {"cost": info.predicted_cost,
                 "prefix": hashlib.blake2b(text[:512].encode(), digest_size=8).hexdigest() if len(text) >= 512 else None}
        self.in_flight += 1

        @once
        def end() -> None:
            self.in_flight -= 1
            self.book.finish(request_id, self.now())

        try:
            for attempt in range(RETRIES):
                self.sent += 1
                stream = self.handle.options(stream=True).http.remote(path, body, [("content-type", "application/json")],
                                                                      route=route)
                try:
                    start = await stream.__anext__()
                    break
                except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                    stream.cancel()
                    self.retried += 1
                    log.warning(json.dumps({"event": "replica_failed", "request_id": request_id, "action": "send again",
                                            "error": (str(exc).splitlines() or [type(exc).__name__])[0][:200]}))
                    await asyncio.sleep(RETRY_S)
                except RayTaskError as exc:
                    stream.cancel()
                    end()
                    return JSONResponse(error_doc(kind, 502, f"the replica failed the request: "
                                                             f"{str(exc).splitlines()[0][:300]}"), status_code=502)
            else:
                end()
                return JSONResponse(error_doc(kind, 503, f"no replica could serve it after {RETRIES} tries; retry later."),
                                    status_code=503, headers={"Retry-After": "5"})
        except BaseException:
            end()
            raise

        async def chunks():
            try:
                async for item in stream:
                    if isinstance(item, dict):  # the replica's last word: its id and measured M
                        about = item.get("replica") or {}
                        if about.get("pid") is not None:
                            self.measured[about["pid"]] = about.get("capacity_per_s")
                            self.served[about["pid"]] = self.served.get(about["pid"], 0) + 1
                        continue
                    yield item
            except (ActorDiedError, ActorUnavailableError, RayActorError):
                self.interrupted += 1  # the answer was under way: the client sees it cut short
                log.warning(json.dumps({"event": "replica_failed_midway", "request_id": request_id}))
            finally:
                stream.cancel()
                end()

        headers = dict(start["headers"])
        return StreamingResponse(chunks(), status_code=start["status"],
                                 media_type=headers.get("content-type", "application/json"))

    def alive(self) -> bool:
        """False once this process has lost Ray (Ray itself restarts replicas that die)."""
        import ray

        return ray.is_initialized()

    def metrics_lines(self) -> list[str]:
        """Prometheus lines about the replicas."""
        return [*metric_lines("ray_replicas", "gauge", "Engine replicas in the Ray Serve deployment.",
                              f"justitia_ray_replicas {self.replicas}"),
                *metric_lines("ray_kv_tokens", "gauge", "The replicas' KV caches together, in tokens.",
                              f"justitia_ray_kv_tokens {self.kv_tokens}"),
                *metric_lines("ray_requests_total", "counter", "Requests sent to a replica (retries included).",
                              f"justitia_ray_requests_total {self.sent}"),
                *metric_lines("ray_retries_total", "counter", "Requests sent again after their replica failed "
                              "before any token.", f"justitia_ray_retries_total {self.retried}"),
                *metric_lines("ray_interrupted_total", "counter", "Requests whose replica failed midway.",
                              f"justitia_ray_interrupted_total {self.interrupted}"),
                *metric_lines("ray_replica_answers_total", "counter", "Requests a replica answered, by its process id.",
                              *(f'justitia_ray_replica_answers_total{{replica_pid="{pid}"}} {n}'
                                for pid, n in sorted(self.served.items()))),
                *metric_lines("ray_replica_capacity", "gauge", "A replica's measured M (cost units per second), as "
                              "it last reported it.", *(f'justitia_ray_replica_capacity{{replica_pid="{pid}"}} {m:.6g}'
                                                        for pid, m in sorted(self.measured.items()) if m))]

    async def aclose(self) -> None:
        """Delete the deployment (and stop a local Ray), waiting at most ``SHUTDOWN_S``."""
        from justitia.ray.deployment import shutdown

        done = asyncio.get_running_loop().create_future()

        def run():  # a daemon thread: a Ray that hangs (its raylet gone) must not keep the process alive
            try:
                shutdown(self.local)
            finally:
                done.get_loop().call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        threading.Thread(target=run, name="ray-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done, SHUTDOWN_S)
        except asyncio.TimeoutError:
            log.error(json.dumps({"event": "ray_shutdown_timeout", "after_s": SHUTDOWN_S}))
