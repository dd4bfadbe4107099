"""``RayBackend`` (``justitia serve --ray``): engine replicas on Ray Serve, one Justitia clock here.

The server (the ingress) keeps the cluster's one clock: a tagging ``AgentBook`` running the policy
(justitia, or another static policy), as ``--upstream`` does. Every request carries its key's lead,
the agent's virtual finish tag under justitia, as ``RequestMeta.agent_tag`` to whichever replica
serves it; each replica's plug-in runs the ``tagged`` policy and orders its queue by those tags
(``justitia.backends.ray.replica``). The clock's M is the sum of the replicas' measured M: each replica's
last answer to a request reports its plug-in's meter, and M = their mean x the number of replicas
(a replica that has answered nothing yet counts at the mean), applied at the next agent's arrival.

Requests go through a deployment handle; ``JustitiaRouter`` (``justitia.backends.ray.router``) picks the
replica with the least outstanding predicted KV token-time per KV token, or (``--router
affinity``) the replica that served the prompt's first block lately. Faults: a request whose
replica dies or is unavailable, or whose replica's engine core died (``EngineDead``; the replica's
health check then fails and Ray restarts it), before any token came back is sent again (Ray routes
it to a live replica) until its deadline (``backend.DEADLINE``: an agent's task, the agent's own;
else ``RETRY_FOR_S``), waiting ``RETRY_S`` and up to ``RETRY_MAX_S`` between sends; one that fails
after tokens came back raises ``BackendInterrupted`` (the server's agents run such a task again,
till the agent's deadline). A replica that died leaves the clock's M at once (``replica_died``); the
replica Ray starts in its place joins it when it first answers.
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

from justitia.backends.base import (
    DEADLINE,
    BackendError,
    BackendInterrupted,
    ForwardRefused,
    Output,
    Sampling,
    metric_lines,
)
from justitia.backends.ray.replica import EngineDead
from justitia.backends.tagging import TaggingBackend
from justitia.core import KV, STATIC_POLICY_NAMES, capacity_per_s
from justitia.defaults import policy_settings

log = logging.getLogger("justitia.server")
RETRY_S = 1.0  # the first wait before sending again (Ray learns of a dead replica meanwhile)
RETRY_MAX_S = 5.0  # the wait doubles up to this
RETRY_FOR_S = 120.0  # how long a request outside an agent (a client's own) is sent again
SHUTDOWN_S = 60.0  # the most the server waits for Ray to delete the deployment when it stops


def check_policy(policy: str) -> None:
    """Only a policy whose keys are fixed on arrival can be kept by one clock in front of the replicas."""
    if policy not in STATIC_POLICY_NAMES:
        raise ValueError(
            f"--ray: policy '{policy}' changes its keys as service accrues, which one clock in front "
            f"of several engines cannot see; --ray supports {', '.join(STATIC_POLICY_NAMES)}."
        )


class RayBackend(TaggingBackend):
    """The cluster's one clock over Ray Serve engine replicas."""

    def __init__(
        self,
        handle,
        info: dict,
        replicas: int,
        policy: str,
        capacity: float,
        idle_release_s: float,
        retag: bool,
        local: bool,
    ):
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
        self._start_clock(policy, capacity, idle_release_s, retag)
        self.formula_capacity_per_s = capacity
        self.measured: dict[int, float | None] = {}  # live replica pid -> its last reported M
        self.served: dict[int, int] = {}  # replica pid -> requests it answered
        self.actors: dict[str, int] = {}  # replica's Ray actor id -> its pid
        self.dead = 0  # replicas that died and whose replacement has not answered yet
        self.in_flight = 0
        self.sent = self.retried = self.interrupted = 0

    @classmethod
    async def start(cls, spec, policy: str, ray_spec, vllm_argv: list[str] | None = None) -> "RayBackend":
        """Start (or join) Ray, deploy ``ray_spec.replicas`` engines of ``spec`` (an ``EngineSpec``),
        each serving vLLM's own app with ``vllm_argv`` (vLLM's serving options)."""
        from justitia.backends.ray.deployment import deploy, shutdown
        from justitia.engine.launch import plugin_environment

        check_policy(policy)  # before minutes of start-up
        settings = policy_settings()
        env = plugin_environment("tagged", iteration_s=settings.iteration_s)
        loop = asyncio.get_running_loop()
        handle = await loop.run_in_executor(None, deploy, ray_spec, spec.to_json(), env, vllm_argv)
        try:
            info = await handle.describe.remote()
            total = info["kv_tokens"] * ray_spec.replicas
            capacity = settings.capacity_per_s or capacity_per_s(KV, total, 0, settings.iteration_s)
            return cls(
                handle,
                info,
                ray_spec.replicas,
                policy,
                capacity,
                settings.agent_idle_s,
                settings.retag,
                ray_spec.address is None,
            )
        except BaseException:
            await loop.run_in_executor(None, shutdown, ray_spec.address is None)
            raise

    @property
    def kv_tokens(self) -> int:
        """The replicas' KV caches together, in tokens."""
        return self.replica_kv_tokens * self.replicas

    def capacity(self) -> float:
        """The cluster's M: the live replicas' measured M, their mean x the number of live replicas
        (those deployed, less those that died and are not replaced yet)."""
        known = [m for m in self.measured.values() if m]
        if not known:
            return self.book.clock().capacity_per_s or self.formula_capacity_per_s
        return sum(known) / len(known) * max(1, self.replicas - self.dead)

    def heard(self, about: dict) -> None:
        """A replica's last word on a request (``EngineReplica._about``): it is alive, with this M;
        a process id not seen before is a replica Ray started, in a dead one's place if one died."""
        pid = about.get("pid")
        if pid is None:
            return
        if pid not in self.served and self.dead:
            self.dead -= 1
        self.measured[pid] = about.get("capacity_per_s")
        self.served[pid] = self.served.get(pid, 0) + 1
        if about.get("actor"):
            self.actors[about["actor"]] = pid

    def replica_died(self, pid: int | None = None, actor_id: str | None = None) -> None:
        """A replica died (its process id, or the Ray actor id an ``ActorDiedError`` names): its M
        leaves the cluster's at the next arrival, until the replica replacing it answers."""
        if pid is None and actor_id is not None:
            pid = self.actors.pop(actor_id, None)
        if pid is not None and pid in self.measured:
            del self.measured[pid]
            self.dead += 1
            log.warning(json.dumps({"event": "replica_left_clock", "pid": pid, "live": self.replicas - self.dead}))

    def _failed_replica(self, exc: BaseException) -> str | None:
        """Why a send failed, if sending again may work (the replica, or its engine, died or is
        unavailable; the dead one leaves M); None if the engine refused the request itself."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        if isinstance(exc, (ActorDiedError, ActorUnavailableError, RayActorError)):
            if not isinstance(exc, ActorUnavailableError):
                self.replica_died(actor_id=getattr(exc, "actor_id", None))
            return reason
        cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else exc
        if isinstance(cause, EngineDead):
            self.replica_died(pid=cause.pid)
            return str(cause)
        return None

    @staticmethod
    def _deadline() -> float:
        """Till when a request is sent again: its agent's deadline, else ``RETRY_FOR_S`` from now."""
        deadline = DEADLINE.get()
        return deadline if deadline is not None else time.monotonic() + RETRY_FOR_S

    def _arriving(self, agent_id: str, now: float) -> None:
        """An agent is about to arrive: the clock moves to the M the replicas measured."""
        book = self.book
        if self.measured and book.clock().capacity_per_s is not None and book.agent(agent_id) is None:
            book.set_capacity(self.capacity(), now)

    def unfinished(self) -> int:
        """Requests sent to the replicas and not finished."""
        return self.in_flight

    def prefix(self, ids: list[int]) -> str | None:
        """The key of the prompt's first KV block (None if the prompt has no full block)."""
        if len(ids) <= self.block_size:
            return None
        return hashlib.blake2b(json.dumps(ids[: self.block_size]).encode(), digest_size=8).hexdigest()

    async def generate(self, prompt, params: Sampling, request_id: str):
        """Stamp the request with the clock's tag and send it through the router; sent again while
        no token came back, till its deadline."""
        from ray.exceptions import RayTaskError

        ids = list(prompt["prompt_token_ids"])
        xargs = dict(params.extra_args or {})
        info = self.tag(request_id, xargs, len(ids), params.max_tokens or 16, stamp=True)[0]
        sent = replace(params, extra_args=xargs)
        route = {"cost": info.predicted_cost, "prefix": self.prefix(ids)}
        produced, cached = 0, None  # tokens produced; the prompt tokens the replica's prefix cache held
        deadline, wait, attempt = self._deadline(), RETRY_S, 0
        self.in_flight += 1
        try:
            while True:
                streamed = False
                self.sent += 1
                stream = self.handle.options(stream=True).generate.remote(
                    ids, sent, f"{request_id}#{attempt}", route=route
                )
                try:
                    async for out in stream:
                        streamed = True
                        produced += len(out.outputs[0].token_ids)
                        if out.replica is not None:  # a ReplicaOutput's last: which replica, its M
                            self.heard(out.replica)
                            cached = out.replica.get("cached_tokens")
                        yield Output(request_id, out.outputs, out.finished)
                    return
                except Exception as exc:  # noqa: BLE001  (sorted below: a replica's death, or the engine's word)
                    reason = self._failed_replica(exc)
                    if reason is None:  # the engine refused or failed the request itself
                        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                        if isinstance(exc, RayTaskError):
                            raise BackendError(f"request {request_id}: {str(cause).splitlines()[0][:300]}") from exc
                        raise
                    if streamed:
                        self.interrupted += 1
                        raise BackendInterrupted(
                            f"request {request_id}: its replica failed midway ({reason})."
                        ) from exc
                    late = BackendError(
                        f"request {request_id}: no live replica could serve it before its "
                        f"deadline ({attempt + 1} tries; last: {reason})."
                    )
                    if time.monotonic() + wait > deadline:
                        raise late from exc
                    log.warning(
                        json.dumps(
                            {
                                "event": "replica_failed",
                                "request_id": request_id,
                                "error": reason,
                                "action": "send again",
                                "in_s": wait,
                            }
                        )
                    )
                    await asyncio.sleep(wait)
                    if time.monotonic() > deadline:  # the wait overran it: no send after the deadline
                        raise late from exc
                    self.retried += 1
                    wait, attempt = min(2 * wait, RETRY_MAX_S), attempt + 1
                finally:
                    stream.cancel()  # a closed generator (a cancelled request) aborts it in the replica
        finally:
            self.in_flight -= 1
            self.finish(request_id, produced, cached if isinstance(cached, int) else None)

    async def forward(self, path: str, kind: str, doc: dict, prompt_tokens: int, max_tokens: int, request_id: str):
        """A client's OpenAI or Anthropic body, stamped with the clock's tag, to vLLM's own app on a
        replica the router picks (``EngineReplica.http``); its answer streams back as it is. Sent
        again while no byte came back and the replica (or its engine) died or was unavailable, till
        ``RETRY_FOR_S``."""
        from starlette.responses import StreamingResponse

        from justitia.backends.wire import once, prompt_text

        outer, name = ("sampling_params", "extra_args") if kind == "generate" else (None, "vllm_xargs")
        holder = doc[outer] if outer else doc
        xargs = dict(holder.get(name) or {})
        info = self.tag(request_id, xargs, prompt_tokens, max_tokens, stamp=True)[0]
        holder[name] = xargs
        body = json.dumps(doc, ensure_ascii=False).encode()
        text = prompt_text(doc)
        route = {
            "cost": info.predicted_cost,
            "prefix": hashlib.blake2b(text[:512].encode(), digest_size=8).hexdigest() if len(text) >= 512 else None,
        }
        self.in_flight += 1

        @once
        def end() -> None:
            self.in_flight -= 1
            self.finish(request_id)

        try:
            stream, start = await self._first_bytes(path, body, route, request_id)
        except BaseException:
            end()
            raise

        async def chunks():
            try:
                async for item in stream:
                    if isinstance(item, dict):  # the replica's last word: its id and measured M
                        self.heard(item.get("replica") or {})
                        continue
                    yield item
            except Exception as exc:  # noqa: BLE001
                if self._failed_replica(exc) is None:
                    raise
                self.interrupted += 1  # the answer was under way: the client sees it cut short
                log.warning(json.dumps({"event": "replica_failed_midway", "request_id": request_id}))
            finally:
                stream.cancel()
                end()

        headers = dict(start["headers"])
        return StreamingResponse(
            chunks(), status_code=start["status"], media_type=headers.get("content-type", "application/json")
        )

    async def _first_bytes(self, path: str, body: bytes, route: dict, request_id: str):
        """The stream from a replica and its first item (status and headers), sent again while no
        byte came back and the replica (or its engine) died or was unavailable, till ``RETRY_FOR_S``;
        ``ForwardRefused`` when the replica failed the request or none could serve it."""
        from ray.exceptions import RayTaskError

        deadline, wait, tries = self._deadline(), RETRY_S, 0
        while True:
            self.sent += 1
            tries += 1
            stream = self.handle.options(stream=True).http.remote(
                path, body, [("content-type", "application/json")], route=route
            )
            try:
                return stream, await stream.__anext__()
            except Exception as exc:  # noqa: BLE001  (a replica's death, or the engine's word)
                stream.cancel()
                reason = self._failed_replica(exc)
                if reason is None:
                    if not isinstance(exc, RayTaskError):
                        raise
                    raise ForwardRefused(502, f"the replica failed the request: {str(exc).splitlines()[0][:300]}")
                if time.monotonic() + wait > deadline:
                    raise ForwardRefused(
                        503,
                        f"no live replica could serve it in {RETRY_FOR_S:g} s ({tries} tries); retry later.",
                        {"Retry-After": "5"},
                    )
                self.retried += 1
                log.warning(
                    json.dumps(
                        {"event": "replica_failed", "request_id": request_id, "action": "send again", "error": reason}
                        | {"in_s": wait}
                    )
                )
                await asyncio.sleep(wait)
                wait = min(2 * wait, RETRY_MAX_S)

    def alive(self) -> bool:
        """False once this process has lost Ray (Ray itself restarts replicas that die)."""
        import ray

        return ray.is_initialized()

    def metrics_lines(self) -> list[str]:
        """Prometheus lines about the replicas."""
        return [
            *metric_lines(
                "ray_replicas",
                "gauge",
                "Engine replicas in the Ray Serve deployment.",
                f"justitia_ray_replicas {self.replicas}",
            ),
            *metric_lines(
                "ray_kv_tokens",
                "gauge",
                "The replicas' KV caches together, in tokens.",
                f"justitia_ray_kv_tokens {self.kv_tokens}",
            ),
            *metric_lines(
                "ray_requests_total",
                "counter",
                "Requests sent to a replica (retries included).",
                f"justitia_ray_requests_total {self.sent}",
            ),
            *metric_lines(
                "ray_retries_total",
                "counter",
                "Requests sent again after their replica failed before any token.",
                f"justitia_ray_retries_total {self.retried}",
            ),
            *metric_lines(
                "ray_interrupted_total",
                "counter",
                "Requests whose replica failed midway.",
                f"justitia_ray_interrupted_total {self.interrupted}",
            ),
            *metric_lines(
                "ray_replica_answers_total",
                "counter",
                "Requests a replica answered, by its process id.",
                *(
                    f'justitia_ray_replica_answers_total{{replica_pid="{pid}"}} {n}'
                    for pid, n in sorted(self.served.items())
                ),
            ),
            *metric_lines(
                "ray_replica_capacity",
                "gauge",
                "A replica's measured M (cost units per second), as it last reported it.",
                *(
                    f'justitia_ray_replica_capacity{{replica_pid="{pid}"}} {m:.6g}'
                    for pid, m in sorted(self.measured.items())
                    if m
                ),
            ),
        ]

    async def aclose(self) -> None:
        """Delete the deployment (and stop a local Ray), waiting at most ``SHUTDOWN_S``."""
        from justitia.backends.ray.deployment import shutdown

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
