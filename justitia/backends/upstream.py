"""``UpstreamBackend`` (``justitia serve --upstream URL ...``): Justitia in front of stock vLLM
OpenAI servers.

The replicas are unmodified vLLM servers started with ``--scheduling-policy priority``. The front
end keeps one policy for all of them and tags each request with its static key as vLLM's int
``priority`` (``AgentBook.tagging`` / ``AgentBook.tag`` in the core, as the bench runner's
tagging mode does). Justitia's clock is global: its M is the sum of the replicas' KV capacities
(read from each replica's ``/metrics``) per nominal step. Each request goes to the replica with
the least outstanding predicted KV token-time per KV token of capacity (so the tasks of one stage
spread over the replicas): ``core.routing``'s least-load rule, the one the Ray Serve router and
the simulator's cluster use.

A request that wants its final output only is one plain completion; a streamed one streams from
the replica. Cancelling a request closes its connection, and vLLM aborts a request whose client
has gone (streamed or not).

Faults: connections time out after 10 s and reads after ``read_timeout_s`` (600 s by default:
a request may wait long in a busy replica's queue). A request that fails before any token came
back (refused or timed-out connection, a 5xx, a dropped connection) is retried on the next
replica; a 4xx is the request's own fault and fails it; a failure after tokens streamed fails it
(the server's agents retry such a task once). A replica that fails ``BREAKER_FAILURES`` times in a
row is left out (its circuit breaker opens) and probed on ``/health`` every ``PROBE_S`` seconds
until it answers; if every replica is left out, the request tries them anyway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from justitia.backends.base import (
    BackendError,
    BackendInterrupted,
    Completion,
    ForwardRefused,
    Output,
    Sampling,
    metric_lines,
)
from justitia.backends.tagging import TaggingBackend
from justitia.core import KV, WINDOW_STEPS, ReplicaLoad, Replicas, RouteRequest, capacity_per_s
from justitia.defaults import policy_settings

log = logging.getLogger("justitia.server")
_INFO = re.compile(r"^vllm:cache_config_info\{(.*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


BREAKER_FAILURES = 3  # failures in a row that take a replica out of routing
PROBE_S = 2.0  # how often a replica left out is probed


class UpstreamError(BackendError):
    """A replica that cannot be used, or that failed a request."""


class ReplicaUnavailable(UpstreamError):
    """A replica answered 5xx: the next one may serve the request."""


class ReplicaLostMidway(UpstreamError, BackendInterrupted):
    """A replica failed a request after tokens had come back."""


@dataclass
class Replica:
    """One stock vLLM server, what it serves and what this front end has sent it."""

    url: str
    model: str  # the served model id (what requests must name)
    root: str  # the model path the replica loaded
    max_model_len: int
    kv_tokens: int
    client: httpx.AsyncClient = field(repr=False)
    failed: int = 0
    failures_in_row: int = 0
    route: ReplicaLoad = field(init=False, repr=False)  # what the router sees: load in flight, alive

    def __post_init__(self) -> None:
        self.route = ReplicaLoad(self.url, self.kv_tokens)

    @property
    def out(self) -> bool:
        """Its circuit breaker is open: left out of routing until a probe succeeds."""
        return not self.route.alive

    @out.setter
    def out(self, value: bool) -> None:
        self.route.alive = not value

    @property
    def load(self) -> float:
        """Predicted KV token-time of the requests in flight there."""
        return self.route.load

    @property
    def in_flight(self) -> int:
        return self.route.in_flight

    @property
    def sent(self) -> int:
        return self.route.sent_total

    def failure(self) -> None:
        self.failed += 1
        self.failures_in_row += 1
        if self.failures_in_row >= BREAKER_FAILURES and not self.out:
            self.out = True
            log.warning(
                json.dumps({"event": "replica_out", "replica": self.url, "failures_in_row": self.failures_in_row})
            )

    def success(self) -> None:
        self.failures_in_row = 0


def _client(url: str, timeout_s: float | None) -> httpx.AsyncClient:
    # no pool limit: every request in flight holds a connection while it waits. Idle connections
    # are dropped after 2 s, before vLLM's uvicorn closes them (its keep-alive is 5 s): reusing one
    # the server is closing fails the request with no response (seen once in 1,780 requests).
    return httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0),
    )


async def probe_replica(url: str, kv_tokens: int | None = None, timeout_s: float | None = None) -> Replica:
    """What the replica at ``url`` serves, its KV capacity, and that it takes priorities."""
    url = url.rstrip("/")
    client = _client(url, timeout_s)
    try:
        try:
            models = (await client.get("/v1/models", timeout=30)).json()["data"]
            model = models[0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            reason = str(exc) or type(exc).__name__
            raise UpstreamError(f"--upstream {url}: no vLLM OpenAI server answers there ({reason}).")
        if kv_tokens is None:
            text = (await client.get("/metrics", timeout=30)).text
            m = _INFO.search(text)
            labels = dict(_LABEL.findall(m.group(1))) if m else {}
            try:
                kv_tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                raise UpstreamError(
                    f"--upstream {url}: its /metrics has no vllm:cache_config_info with the KV cache "
                    "size (was it started with --disable-log-stats?); pass --upstream-kv-tokens."
                )
        r = await client.post(
            "/v1/completions", json={"model": model["id"], "prompt": [0], "max_tokens": 1, "priority": 1}, timeout=60
        )
        if r.status_code != 200:
            raise UpstreamError(
                f"--upstream {url}: a request with a priority was refused ({r.status_code}); start "
                "the replica with --scheduling-policy priority."
            )
        return Replica(
            url,
            model["id"],
            str(model.get("root") or model["id"]),
            int(model.get("max_model_len") or 0),
            int(kv_tokens),
            client,
        )
    except BaseException:
        await client.aclose()
        raise


class UpstreamBackend(TaggingBackend):
    """One front-end policy over stock vLLM replicas."""

    def __init__(
        self, replicas: list[Replica], policy: str, capacity: float, idle_release_s: float, tokenizer_dir: Path
    ):
        if not replicas:
            raise ValueError("--upstream needs at least one replica.")
        models = {r.model for r in replicas}
        if len(models) > 1:
            raise UpstreamError(f"--upstream: the replicas serve different models ({', '.join(sorted(models))}).")
        self.replicas = replicas
        self.routes = Replicas([r.route for r in replicas], "least-load")
        self._by_url = {r.url: r for r in replicas}
        self.policy = policy
        self.model = replicas[0].model
        self.tokenizer_dir = tokenizer_dir
        settings = policy_settings()
        window = WINDOW_STEPS * settings.iteration_s if settings.measure_capacity else None
        self._start_clock(policy, capacity, idle_release_s, settings.retag, window, self.kv_tokens)
        self._prober: asyncio.Task | None = None

    @classmethod
    async def connect(
        cls,
        urls: list[str],
        policy: str,
        kv_tokens: int | None = None,
        tokenizer_dir: Path | None = None,
        read_timeout_s: float = 600.0,
    ) -> "UpstreamBackend":
        """Probe every replica, then keep one clock over them all: M = their KV tokens together per
        nominal step (``JUSTITIA_CAPACITY`` / ``JUSTITIA_ITERATION_S``). ``tokenizer_dir``: by
        default the replicas' model directory, when it is one here."""
        replicas = []
        try:
            for url in urls:
                replicas.append(await probe_replica(url, kv_tokens, read_timeout_s))
            settings = policy_settings()
            total = sum(r.kv_tokens for r in replicas)
            capacity = settings.capacity_per_s or capacity_per_s(KV, total, 0, settings.iteration_s)
            if tokenizer_dir is None:
                if not Path(replicas[0].root).is_dir():
                    raise ValueError(
                        f"--upstream: the replicas serve '{replicas[0].root}', which is not a directory "
                        "here; pass --model with the same model (its tokenizer prices the requests)."
                    )
                tokenizer_dir = Path(replicas[0].root)
            return cls(replicas, policy, capacity, settings.agent_idle_s, tokenizer_dir)
        except BaseException:
            for r in replicas:
                await r.client.aclose()
            raise

    @property
    def kv_tokens(self) -> int:
        return sum(r.kv_tokens for r in self.replicas)

    @property
    def max_model_len(self) -> int:
        return min(r.max_model_len for r in self.replicas)

    def unfinished(self) -> int:
        """Requests sent to the replicas and not finished."""
        return sum(r.in_flight for r in self.replicas)

    async def generate(self, prompt, params: Sampling, request_id: str):
        """Send one request to the least-loaded replica with its policy key as ``priority``."""
        ids = list(prompt["prompt_token_ids"])
        xargs = dict(params.extra_args or {})
        info, priority = self.tag(request_id, xargs, len(ids), params.max_tokens or 16)
        try:
            delta = params.stream
            body = {
                "prompt": ids,
                "max_tokens": params.max_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": params.seed,
                "stop": params.stop or None,
                "ignore_eos": params.ignore_eos,
                "presence_penalty": 0.0,
                "frequency_penalty": 0.0,
                "priority": priority,
                "stream": delta,
                "return_token_ids": True,
                "vllm_xargs": {k: v for k, v in xargs.items() if isinstance(v, (str, int, float))},
            }
            tried: set[str] = set()
            produced = 0  # tokens the replica produced (the front end's meter credits them)
            route = RouteRequest(request_id, info.predicted_cost)
            self._start_prober()
            while True:
                choice = self.routes.choose(route, exclude=tried)  # live replicas first, by load per KV token
                if choice is None:
                    raise UpstreamError(f"request {request_id}: no replica could be reached ({', '.join(tried)}).")
                replica = self._by_url[choice.replica_id]
                tried.add(replica.url)
                self.routes.sent(route, replica.url)
                streamed = False
                try:
                    async for out in self._send(replica, body | {"model": replica.model}, request_id, delta):
                        streamed = True
                        produced += len(out.outputs[0].token_ids)
                        yield out
                    replica.success()
                    return
                except (httpx.HTTPError, ReplicaUnavailable) as exc:
                    replica.failure()
                    reason = str(exc) or type(exc).__name__
                    if streamed:  # tokens went out already: the caller decides
                        raise ReplicaLostMidway(
                            f"replica {replica.url} failed request {request_id} midway: {reason}"
                        ) from exc
                    log.warning(
                        json.dumps(
                            {
                                "event": "replica_failed",
                                "replica": replica.url,
                                "request_id": request_id,
                                "error": reason,
                                "action": "next replica",
                            }
                        )
                    )
                except UpstreamError:  # a 4xx: the request's own fault
                    replica.success()
                    raise
                finally:
                    self.routes.done(request_id)
        finally:
            self.finish(request_id, produced)

    async def forward(self, path: str, kind: str, doc: dict, prompt_tokens: int, max_tokens: int, request_id: str):
        """Send a client's OpenAI or Anthropic body, unchanged, to the least-loaded replica's same
        endpoint, its policy key in vLLM's ``X-Vllm-Priority`` header (every endpoint reads it);
        the replica's answer (its status, JSON or stream) comes back as it is. Retried on the next
        replica while nothing came back (a refused connection, a 5xx)."""
        from starlette.responses import StreamingResponse

        from justitia.backends.wire import once

        xargs = (doc.get("sampling_params") or {}).get("extra_args") if kind == "generate" else doc.get("vllm_xargs")
        info, priority = self.tag(request_id, xargs, prompt_tokens, max_tokens)
        route = RouteRequest(request_id, info.predicted_cost)
        headers = {"X-Vllm-Priority": str(priority), "Accept-Encoding": "identity"}
        tried: set[str] = set()
        self._start_prober()
        end = once(lambda: self.finish(request_id))

        try:
            while True:
                choice = self.routes.choose(route, exclude=tried)
                if choice is None:
                    end()
                    raise ForwardRefused(502, f"no replica could be reached ({', '.join(tried)}).")
                replica = self._by_url[choice.replica_id]
                tried.add(replica.url)
                self.routes.sent(route, replica.url)
                try:
                    resp = await replica.client.send(
                        replica.client.build_request("POST", path, json=doc, headers=headers), stream=True
                    )
                except httpx.HTTPError as exc:
                    resp, reason = None, str(exc) or type(exc).__name__
                if resp is not None and resp.status_code < 500:
                    break
                if resp is not None:
                    reason = f"answered {resp.status_code}"
                    await resp.aclose()
                replica.failure()
                self.routes.done(request_id)
                log.warning(
                    json.dumps(
                        {
                            "event": "replica_failed",
                            "replica": replica.url,
                            "request_id": request_id,
                            "error": reason,
                            "action": "next replica",
                        }
                    )
                )
        except BaseException:
            end()
            raise
        replica.success()

        async def body():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()
                self.routes.done(request_id)
                end()

        return StreamingResponse(
            body(), status_code=resp.status_code, media_type=resp.headers.get("content-type", "application/json")
        )

    @staticmethod
    async def _send(replica: Replica, body: dict, request_id: str, delta: bool):
        """One completion on ``replica``: the whole answer at once, or (``delta``) streamed piece by piece.
        Closing the connection early (a cancelled request) makes vLLM abort it."""
        if not delta:
            resp = await replica.client.post("/v1/completions", json=body)
            if resp.status_code != 200:
                kind = ReplicaUnavailable if resp.status_code >= 500 else UpstreamError
                raise kind(f"replica {replica.url} answered {resp.status_code}: {_message(resp.text)}")
            choice = resp.json()["choices"][0]
            yield Output(
                request_id,
                [
                    Completion(
                        choice.get("text") or "", list(choice.get("token_ids") or []), choice.get("finish_reason")
                    )
                ],
                True,
            )
            return
        async with replica.client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                kind = ReplicaUnavailable if resp.status_code >= 500 else UpstreamError
                raise kind(f"replica {replica.url} answered {resp.status_code}: {_message(resp.text)}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if "error" in doc:
                    raise UpstreamError(f"replica {replica.url}: {_message(json.dumps(doc))}")
                for choice in doc.get("choices", []):
                    reason = choice.get("finish_reason")
                    yield Output(
                        request_id,
                        [Completion(choice.get("text") or "", list(choice.get("token_ids") or []), reason)],
                        reason is not None,
                    )

    def metrics_lines(self) -> list[str]:
        """Prometheus lines about the replicas."""
        lines = metric_lines(
            "upstream_kv_tokens",
            "gauge",
            "The replicas' KV caches together, in tokens (the clock's M per step).",
            f"justitia_upstream_kv_tokens {self.kv_tokens}",
        )
        for name, kind, attr, text in (
            ("replica_requests_in_flight", "gauge", "in_flight", "Requests sent to a replica and not finished."),
            ("replica_requests_total", "counter", "sent", "Requests sent to a replica."),
            ("replica_failures_total", "counter", "failed", "Requests a replica could not take or failed."),
            ("replica_kv_tokens", "gauge", "kv_tokens", "A replica's KV cache, in tokens."),
            ("replica_out", "gauge", "out", "1 while a replica's circuit breaker keeps it out of routing."),
        ):
            lines += metric_lines(
                name,
                kind,
                text,
                *(f'justitia_{name}{{replica="{r.url}"}} {int(getattr(r, attr))}' for r in self.replicas),
            )
        return lines

    def _start_prober(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Active probes: a replica left out comes back once its ``/health`` answers 200."""
        while True:
            await asyncio.sleep(PROBE_S)
            for r in self.replicas:
                if not r.out:
                    continue
                try:
                    ok = (await r.client.get("/health", timeout=5.0)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    r.out, r.failures_in_row = False, 0
                    log.warning(json.dumps({"event": "replica_back", "replica": r.url}))

    async def aclose(self) -> None:
        """Stop probing; close the connections to the replicas."""
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        for r in self.replicas:
            await r.client.aclose()


def _message(text: str) -> str:
    """The error message in a vLLM error body, or the body itself (cut short)."""
    try:
        doc = json.loads(text)
        err = doc.get("error", doc)
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except (ValueError, AttributeError):
        return text[:300]
