"""The HTTP application: the agent API over one ``AsyncLLM`` running the Justitia plug-in.

``create_app(engine, tokenizer, settings)`` returns a FastAPI app; ``engine`` is anything with
AsyncLLM's ``generate(prompt, sampling_params, request_id)`` async iterator (cancelling it aborts
the request in vLLM). Every request of an agent carries the agent's id, type and predicted cost
in ``SamplingParams.extra_args``, the metadata the plug-in reads (``justitia.vllm.scheduler``);
the last stage's requests say ``agent_done``, so the plug-in releases the agent when they finish.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from justitia.cost import cost_model
from justitia.predictor import Predictor
from justitia.policies import Justitia
from justitia.scheduler import AgentBook, AgentScheduler
from justitia.server.schema import AgentSpec, SpecError, check_agent, first_error, render
from justitia.vllm.models import chat_ids
from justitia.workload import Agent, Task

log = logging.getLogger("justitia.server")
TERMINAL = ("done", "failed", "cancelled")
JCT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, float("inf"))


@dataclass
class Settings:
    """Limits and identity of one server."""

    model: str = "tiny"
    policy: str = "justitia"
    max_model_len: int = 2048
    max_tasks_per_agent: int = 256
    max_agents_in_flight: int = 2048
    max_body_bytes: int = 1_000_000
    keep_finished: int = 10_000  # finished agents kept for GET; older ones are forgotten (404)
    capacity_per_s: float = 1.0  # the virtual clock's M (KV tokens / nominal step), for virtual_finish
    chat: bool = True  # wrap agent prompts in the model's chat template when it has one


@dataclass
class AgentRun:
    """One submitted agent: what it asked, where it is, what it produced."""

    agent_id: str
    spec: AgentSpec
    arrival_s: float
    predicted_cost: float
    virtual_finish: float
    status: str = "queued"
    error: str | None = None
    finish_s: float | None = None
    outputs: list[list[dict | None]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    def emit(self, kind: str, **data) -> None:
        self.events.append({"event": kind, "agent_id": self.agent_id, "t_s": round(time.monotonic(), 6)} | data)
        self.changed.set()
        self.changed = asyncio.Event()

    def doc(self) -> dict:
        jct = None if self.finish_s is None else self.finish_s - self.arrival_s
        return {
            "agent_id": self.agent_id, "type": self.spec.type, "status": self.status, "error": self.error,
            "arrival_s": self.arrival_s, "finish_s": self.finish_s, "jct_s": jct,
            "predicted_cost": self.predicted_cost, "virtual_finish": self.virtual_finish,
            "stages": self.outputs,
        }


class AgentManager:
    """Runs agents stage by stage on the engine and keeps their state for the API."""

    def __init__(self, engine, tokenizer, settings: Settings, predictor: Predictor, engine_stats=None):
        self.engine, self.tokenizer, self.settings, self.predictor = engine, tokenizer, settings, predictor
        self.engine_stats = engine_stats  # main.EngineStats: the local engine's queues, or None
        self.agents: dict[str, AgentRun] = {}
        self.cost = cost_model("kv")
        # the agents' tags for status and /metrics: the engine's own book when it keeps Justitia's clock
        # in this process (--upstream), else a mirror fed the same arrivals and costs as the plug-in
        shared = getattr(engine, "book", None)
        if shared is not None and isinstance(shared.core.policy, Justitia):
            self.book, self.t0 = shared, engine.t0
        else:
            self.book, self.t0 = AgentBook(AgentScheduler(Justitia(settings.capacity_per_s))), time.monotonic()
        self.releases: set[asyncio.Task] = set()
        self.finished: dict[str, int] = {s: 0 for s in TERMINAL}
        self.jct: dict[str, list[int]] = {}  # type -> counts per JCT_BUCKETS (cumulative at export)
        self.jct_sum: dict[str, float] = {}
        self.predict_s, self.predictions = 0.0, 0
        self.requests: dict[str, int] = {"agents": 0, "completions": 0, "chat": 0}
        self.tasks_in_flight = 0
        self.ended: collections.deque[str] = collections.deque()  # finished agents, oldest first

    def now(self) -> float:
        return time.monotonic() - self.t0

    def in_flight(self) -> int:
        return sum(a.status not in TERMINAL for a in self.agents.values())

    def _ids_of(self, prompt: str) -> list[int]:
        tok = self.tokenizer
        if self.settings.chat and tok.chat_template:
            return chat_ids(tok, [{"role": "user", "content": prompt}])
        return tok.encode(prompt)

    def timed_prediction(self, view: Agent) -> float:
        """The predictor's agent cost for ``view``, its latency kept for /metrics."""
        t0 = time.perf_counter()
        predicted = float(self.predictor.agent_cost(view, self.cost))
        self.predict_s += time.perf_counter() - t0
        self.predictions += 1
        return predicted

    def engine_unfinished(self) -> int:
        """Requests inside the engine (AsyncLLM's output processor, or sent to the replicas)."""
        replicas = getattr(self.engine, "replicas", None)
        if replicas is not None:
            return sum(r.in_flight for r in replicas)
        return int(self.engine.output_processor.get_num_unfinished_requests())

    def count_request(self, endpoint: str) -> None:
        self.requests[endpoint] += 1

    def metrics(self) -> str:
        """The Prometheus text exposition of the server's state."""
        now = self.now()
        lines = [
            "# HELP justitia_agents_in_flight Agents submitted and not yet done, failed or cancelled.",
            "# TYPE justitia_agents_in_flight gauge", f"justitia_agents_in_flight {self.in_flight()}",
            "# HELP justitia_tasks_in_flight Agent-API requests sent to the engine and not finished.",
            "# TYPE justitia_tasks_in_flight gauge", f"justitia_tasks_in_flight {self.tasks_in_flight}",
            "# HELP justitia_agents_finished_total Agents that ended, by how.",
            "# TYPE justitia_agents_finished_total counter",
            *(f'justitia_agents_finished_total{{status="{k}"}} {v}' for k, v in self.finished.items()),
            "# HELP justitia_requests_total Requests received, by endpoint.",
            "# TYPE justitia_requests_total counter",
            *(f'justitia_requests_total{{endpoint="{k}"}} {v}' for k, v in self.requests.items()),
            "# HELP justitia_engine_requests_unfinished Requests the engine holds (waiting or running), all endpoints.",
            "# TYPE justitia_engine_requests_unfinished gauge",
            f"justitia_engine_requests_unfinished {self.engine_unfinished()}",
            "# HELP justitia_virtual_time The front end's GPS virtual time V(now), in cost units.",
            "# TYPE justitia_virtual_time gauge",
            f"justitia_virtual_time {self.book.core.policy.clock.virtual_time(now):.6g}",
            "# HELP justitia_gps_active_agents Agents the GPS clock counts as active (N_t).",
            "# TYPE justitia_gps_active_agents gauge", f"justitia_gps_active_agents {self.book.core.policy.clock.active}",
            "# HELP justitia_policy_agents Agents holding state in the front end's policy book (with --upstream, "
            "the one that orders the replicas).",
            "# TYPE justitia_policy_agents gauge", f"justitia_policy_agents {self.book.core.agent_count}",
            "# HELP justitia_predictor_latency_seconds Time to predict an agent's cost.",
            "# TYPE justitia_predictor_latency_seconds summary",
            f"justitia_predictor_latency_seconds_sum {self.predict_s:.6f}",
            f"justitia_predictor_latency_seconds_count {self.predictions}",
            "# HELP justitia_agent_jct_seconds Job completion time of finished agents, by type.",
            "# TYPE justitia_agent_jct_seconds histogram",
        ]
        for agent_type, counts in sorted(self.jct.items()):
            running = 0
            for bound, n in zip(JCT_BUCKETS, counts):
                running += n
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                lines.append(f'justitia_agent_jct_seconds_bucket{{type="{agent_type}",le="{le}"}} {running}')
            lines.append(f'justitia_agent_jct_seconds_sum{{type="{agent_type}"}} {self.jct_sum[agent_type]:.6f}')
            lines.append(f'justitia_agent_jct_seconds_count{{type="{agent_type}"}} {running}')
        if self.engine_stats is not None:
            # vLLM reports its queues after each step; an abort into an idle engine brings no step, so
            # an engine holding nothing (the output processor's count) reports empty queues
            st = self.engine_stats
            idle = self.engine_unfinished() == 0
            n_wait, n_run = (0, 0) if idle else (st.waiting, st.running)
            lines += ["# HELP justitia_engine_requests_waiting Requests in the engine's waiting queue (the plug-in's order).",
                      "# TYPE justitia_engine_requests_waiting gauge", f"justitia_engine_requests_waiting {n_wait}",
                      "# HELP justitia_engine_requests_running Requests the engine is running.",
                      "# TYPE justitia_engine_requests_running gauge", f"justitia_engine_requests_running {n_run}",
                      "# HELP justitia_engine_kv_cache_usage Share of the engine's KV cache in use (0-1).",
                      "# TYPE justitia_engine_kv_cache_usage gauge",
                      f"justitia_engine_kv_cache_usage {0.0 if idle else st.kv_cache_usage:.4f}"]
        if hasattr(self.engine, "metrics_lines"):
            lines += self.engine.metrics_lines()
        return "\n".join(lines) + "\n"

    def submit(self, spec: AgentSpec) -> AgentRun:
        """Check, predict, tag and start one agent; raises SpecError on a bad one."""
        check_agent(spec, self.settings.max_tasks_per_agent, self.settings.max_model_len - 1)
        first = []
        for i, t in enumerate(spec.stages[0]):
            n = len(self._ids_of(t.prompt))
            if n + t.max_tokens > self.settings.max_model_len:
                raise SpecError(f"field 'stages[0][{i}].prompt': {n} prompt tokens + max_tokens {t.max_tokens} exceed "
                                f"the model's context of {self.settings.max_model_len} tokens.")
            first.append(n)
        agent_id = f"agent-{uuid.uuid4().hex[:12]}"
        # what the predictor sees at arrival: the first stage's prompts and lengths (later stages'
        # prompts still hold their placeholders; their lengths are not known yet)
        view = Agent(agent_id, spec.type, 0.0, tuple(
            tuple(Task(t.prompt, first[i] if s == 0 else max(1, len(t.prompt) // 4), t.max_tokens)
                  for i, t in enumerate(stage)) for s, stage in enumerate(spec.stages)))
        before = self.predict_s
        predicted = self.timed_prediction(view)
        predict_ms = 1000 * (self.predict_s - before)
        self.count_request("agents")
        now = self.now()
        self.book.register(agent_id, spec.type, predicted, now)
        run = AgentRun(agent_id, spec, now, predicted, self.book.core.policy.tag(agent_id),
                       outputs=[[None] * len(stage) for stage in spec.stages])
        self.agents[agent_id] = run
        run.emit("queued", predicted_cost=predicted, virtual_finish=run.virtual_finish, predict_ms=round(predict_ms, 3))
        run.task = asyncio.get_running_loop().create_task(self._run(run, view))
        log.info(json.dumps({"event": "agent_submitted", "agent_id": agent_id, "type": spec.type,
                             "tasks": sum(len(s) for s in spec.stages), "predicted_cost": predicted}))
        return run

    async def _task(self, run: AgentRun, view: Agent, s: int, i: int, texts: list[list[str]]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        spec = run.spec.stages[s][i]
        prompt = render(spec.prompt, s, texts)
        ids = self._ids_of(prompt)
        if len(ids) + spec.max_tokens > self.settings.max_model_len:
            raise SpecError(f"stage {s} task {i}: {len(ids)} prompt tokens (after placeholders) + max_tokens "
                            f"{spec.max_tokens} exceed the model's context of {self.settings.max_model_len} tokens.")
        meta = {"agent_id": run.agent_id, "agent_type": run.spec.type, "agent_cost": run.predicted_cost,
                "request_cost": float(self.predictor.request_cost(view, s, i, self.cost))}
        if s == len(run.spec.stages) - 1:
            meta["agent_done"] = True
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature, top_p=spec.top_p,
                                seed=spec.seed, stop=spec.stop, ignore_eos=spec.ignore_eos, extra_args=meta,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        self.tasks_in_flight += 1
        try:
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=ids), params, f"{run.agent_id}/{s}/{i}"):
                final = out
        finally:
            self.tasks_in_flight -= 1
        o = final.outputs[0]
        run.outputs[s][i] = {"output": o.text, "prompt_tokens": len(ids), "output_tokens": len(o.token_ids),
                             "finish_reason": o.finish_reason}
        run.emit("task_done", stage=s, task=i, output_tokens=len(o.token_ids))

    async def _run(self, run: AgentRun, view: Agent) -> None:
        texts: list[list[str]] = []
        started = 0  # stages whose requests went to the engine
        try:
            for s, stage in enumerate(run.spec.stages):
                started = s + 1
                if s == 0:
                    run.status = "running"
                    run.emit("running")
                tasks = [asyncio.ensure_future(self._task(run, view, s, i, texts)) for i in range(len(stage))]
                try:
                    await asyncio.gather(*tasks)
                except BaseException:
                    for t in tasks:  # one task failed (or the agent was cancelled): abort the others
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    raise
                texts.append([o["output"] for o in run.outputs[s]])
            run.status = "done"
        except asyncio.CancelledError:
            run.status = "cancelled"
        except Exception as exc:  # noqa: BLE001  (any failure of a task fails the agent, with its reason)
            run.status, run.error = "failed", str(exc) or type(exc).__name__
        run.finish_s = self.now()
        self.book.release(run.agent_id, run.finish_s)
        if run.status != "done" and started < len(run.spec.stages):
            # its last stage (the requests that say agent_done) never ran: tell the engine's policy now
            self._release_engine_state(run)
        self.finished[run.status] += 1
        if run.status == "done":
            jct = run.finish_s - run.arrival_s
            counts = self.jct.setdefault(run.spec.type, [0] * len(JCT_BUCKETS))
            counts[next(k for k, b in enumerate(JCT_BUCKETS) if jct <= b)] += 1
            self.jct_sum[run.spec.type] = self.jct_sum.get(run.spec.type, 0.0) + jct
        if run.status == "done":
            actual = sum(self.cost.request_cost(o["prompt_tokens"], o["output_tokens"]) for st in run.outputs for o in st)
            self.predictor.observe(run.spec.type, run.predicted_cost, actual)
        run.emit(run.status, **({"error": run.error} if run.error else {}))
        self.ended.append(run.agent_id)
        while len(self.ended) > self.settings.keep_finished:  # a server runs for days
            self.agents.pop(self.ended.popleft(), None)
        log.info(json.dumps({"event": "agent_" + run.status, "agent_id": run.agent_id,
                             "jct_s": round(run.finish_s - run.arrival_s, 4), "error": run.error}))

    def _release_engine_state(self, run: AgentRun) -> None:
        """Release a cancelled or failed agent's policy state in the engine at once (not after its idle time)."""
        if hasattr(self.engine, "release_agent"):  # the policy lives in this process (--upstream)
            self.engine.release_agent(run.agent_id)
            return
        # the plug-in learns about agents from their requests: one 1-token request that says agent_done
        # ends the agent as soon as it finishes (sent in the background: DELETE does not wait for it)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY,
                                extra_args={"agent_id": run.agent_id, "agent_type": run.spec.type,
                                            "agent_cost": run.predicted_cost, "request_cost": 1.0, "agent_done": True})

        async def release() -> None:
            try:
                async for _ in self.engine.generate(TokensPrompt(prompt_token_ids=[0]), params,
                                                    f"{run.agent_id}/release"):
                    pass
            except Exception as exc:  # noqa: BLE001  (the idle timeout still releases it)
                log.warning(json.dumps({"event": "release_failed", "agent_id": run.agent_id, "error": str(exc)}))

        task = asyncio.get_running_loop().create_task(release())
        self.releases.add(task)
        task.add_done_callback(self.releases.discard)

    async def cancel(self, agent_id: str) -> AgentRun:
        run = self.agents[agent_id]
        if run.status not in TERMINAL and run.task is not None:
            run.task.cancel()
            await asyncio.gather(run.task, return_exceptions=True)
        return run


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(engine, tokenizer, settings: Settings, predictor: Predictor, engine_stats=None) -> FastAPI:
    """The FastAPI application of one server (``engine_stats``: the local engine's queues for /metrics)."""
    app = FastAPI(title="Justitia", version="0.1.0",
                  description="Agent-aware serving on vLLM: task-parallel agents scheduled by Justitia.")
    manager = AgentManager(engine, tokenizer, settings, predictor, engine_stats)
    app.state.manager = manager

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message = first_error(list(exc.errors()))
        if request.url.path in ("/v1/completions", "/v1/chat/completions"):  # OpenAI's error shape
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=422)
        return _error(422, message)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            return _error(413, f"the request body has {length} bytes, more than this server's limit of "
                               f"{settings.max_body_bytes}.")
        return await call_next(request)

    from fastapi.responses import PlainTextResponse

    from justitia.server.openai_api import add_openai_routes

    add_openai_routes(app, manager)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(manager.metrics(), media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": settings.model, "policy": settings.policy, "agents_in_flight": manager.in_flight()}

    @app.post("/v1/agents", status_code=202)
    async def submit(spec: AgentSpec):
        if manager.in_flight() >= settings.max_agents_in_flight:
            return _error(429, f"{manager.in_flight()} agents are in flight, this server's limit; retry later.")
        try:
            run = manager.submit(spec)
        except SpecError as exc:
            return _error(400, str(exc))
        return JSONResponse({"agent_id": run.agent_id, "status": run.status}, status_code=202)

    @app.get("/v1/agents/{agent_id}")
    async def status(agent_id: str):
        run = manager.agents.get(agent_id)
        if run is None:
            return _error(404, f"no agent '{agent_id}'.")
        return run.doc()

    @app.delete("/v1/agents/{agent_id}")
    async def cancel(agent_id: str):
        if agent_id not in manager.agents:
            return _error(404, f"no agent '{agent_id}'.")
        return (await manager.cancel(agent_id)).doc()

    @app.get("/v1/agents/{agent_id}/events")
    async def events(agent_id: str):
        run = manager.agents.get(agent_id)
        if run is None:
            return _error(404, f"no agent '{agent_id}'.")

        async def stream():
            sent = 0
            while True:
                changed = run.changed
                while sent < len(run.events):
                    e = run.events[sent]
                    sent += 1
                    yield f"event: {e['event']}\ndata: {json.dumps(e)}\n\n"
                if run.status in TERMINAL and sent == len(run.events):
                    return
                await changed.wait()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app
