"""Harness identity and the door (``server/identity.py``, ``server/door.py``): which agent a request
joins, in which key's namespace, what is refused and what reaches the engine (the front end's app in
process, over a backend that records what reaches it)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from inprocess import auth, door_app

from justitia.server.identity import SOURCES, IdentityError, identify

A, B = "sk-identity-a", "sk-identity-b"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def app(tmp_path):
    with door_app(tmp_path, f"{A} team-a 2\n{B}\n") as client:
        yield client


def test_the_first_source_in_the_table_names_the_agent_and_every_one_present_is_checked():
    headers = {"x-session-id": "s-header", "x-claude-code-session-id": "claude", "x-claude-code-agent-id": "sub"}
    body = {"prompt_cache_key": "cache", "user": "u", "session_id": "s-field"}
    who = identify(headers, body, "k1")
    assert (who.agent_id, who.source, who.subagent) == ("k1/s-field", "session_id", "sub")
    assert identify({"x-agent-id": "mine"} | headers, body, "k1").agent_id == "k1/mine"
    assert identify({}, {"vllm_xargs": {"agent_id": 7}}, "k1").agent_id == "k1/7"
    assert identify({}, {"user": ""}, "k1").agent_id is None  # an empty user names nobody
    assert identify({}, {}, "k1").agent_id is None
    with pytest.raises(IdentityError, match="header 'X-Claude-Code-Session-Id'"):  # a loser is checked too
        identify({"x-agent-id": "ok", "x-claude-code-session-id": "bad\x00id"}, {}, "k1")
    with pytest.raises(IdentityError, match="field 'prompt_cache_key': must be a string"):
        identify({}, {"prompt_cache_key": ["a"]}, "k1")
    with pytest.raises(IdentityError, match="1-256 characters"):
        identify({}, {"user": "u" * 257}, "k1")
    assert [name for _, name, _, _ in SOURCES][:2] == ["X-Agent-Id", "vllm_xargs.agent_id"]


@pytest.mark.parametrize(
    "headers, body",
    [
        ({"X-Claude-Code-Session-Id": "run-1"}, {}),
        ({"X-Session-ID": "run-1"}, {}),
        ({}, {"session_id": "run-1"}),
        ({}, {"prompt_cache_key": "run-1"}),
        ({}, {"user": "run-1"}),
        ({"X-Agent-Id": "run-1"}, {}),
    ],
)
def test_each_harness_id_groups_requests_into_one_agent_per_key(app, headers, body):
    for key in (A, A, B):
        r = app.post("/v1/chat/completions", json=CHAT | body, headers=auth(key) | headers)
        assert r.status_code == 200, r.text
    first, second, other = app.backend.metas
    assert first.agent_id == second.agent_id != other.agent_id  # the same id under two keys: two agents
    assert first.agent_id.endswith("/run-1") and other.agent_id.endswith("/run-1")
    assert not first.agent_done  # a session stays until it is idle
    assert (first.tenant, first.agent_weight) == ("team-a", 2.0)  # the key's tenant and weight, from the door
    assert first.agent_cost is None and first.request_cost is None  # priced where it is served


def test_the_engine_sees_the_namespaced_session_and_no_client_session_field(app):
    seen = []
    forward = app.backend.forward

    async def keep(path, kind, doc, *rest):
        seen.append(doc)
        return await forward(path, kind, doc, *rest)

    app.backend.forward = keep
    app.post(
        "/v1/chat/completions",
        json=CHAT | {"session_id": "s1", "vllm_xargs": {"agent_type": "coder"}},
        headers=auth(A) | {"X-Session-ID": "ignored"},
    )
    doc = seen[0]
    assert "session_id" not in doc
    xargs = doc["vllm_xargs"]
    assert xargs["session_id"] == xargs["agent_id"] and xargs["agent_id"].endswith("/s1")
    assert xargs["agent_type"] == "coder" and xargs["tenant"] == "team-a"
    app.post("/v1/chat/completions", json=CHAT, headers=auth(A))  # no id: an agent of its own, done with its request
    assert seen[1]["vllm_xargs"]["agent_done"] is True and "agent_id" not in seen[1]["vllm_xargs"]
    sessions = app.get("/v1/sessions", headers=auth(A)).json()["data"]
    assert [(s["session_id"], s["source"], s["requests"]) for s in sessions] == [("s1", "session_id", 1)]
    assert app.get("/v1/sessions", headers=auth(B)).json()["data"] == []  # another key sees none of them


@pytest.mark.parametrize(
    "body, headers, words",
    [
        ({"vllm_xargs": {"agent_cost": 1}}, {}, "vllm_xargs.agent_cost"),
        ({"vllm_xargs": {"tenant": "vip"}}, {}, "vllm_xargs.tenant"),
        ({"vllm_xargs": {"priority": -5}}, {}, "vllm_xargs.priority"),
        ({"vllm_xargs": "agent"}, {}, "vllm_xargs"),
        ({"session_id": "x" * 300}, {}, "session_id"),
        ({}, {"X-Claude-Code-Agent-Id": "\t"}, "X-Claude-Code-Agent-Id"),
    ],
)
def test_a_bad_id_or_price_is_a_400_naming_it_and_reaches_nothing(app, body, headers, words):
    r = app.post("/v1/chat/completions", json=CHAT | body, headers=auth(A) | headers)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = app.post("/v1/messages", json=CHAT | body, headers=auth(A) | headers)  # Anthropic's error shape there
    assert r.status_code == 400 and r.json()["type"] == "error" and words in r.json()["error"]["message"]
    assert app.backend.metas == []


def test_concurrent_requests_past_the_keys_limit_are_refused_at_once_not_after_the_engine(app):
    """100 requests at once against a per-key limit of 10: 10 pass, 90 get 429 with Retry-After,
    and the other key is not held back (the door counts a request before it awaits anything)."""
    app.backend.gate.clear()  # the engine holds every request until the gate opens
    url = str(app.base_url)
    transport = httpx.ASGITransport(app=app.app)

    async def burst():
        async with httpx.AsyncClient(transport=transport, base_url=url, headers=auth(A)) as client:
            sends = [
                asyncio.create_task(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}))
                for _ in range(100)
            ]
            for _ in range(3000):  # the refusals come back while the engine holds the others
                if sum(s.done() for s in sends) >= 90:
                    break
                await asyncio.sleep(0.01)
            threading.Timer(0.5, app.backend.gate.set).start()
            other = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=auth(B))
            return await asyncio.gather(*sends), other

    answers, other = asyncio.run(burst())
    codes = [r.status_code for r in answers]
    assert codes.count(200) == 10 and codes.count(429) == 90
    assert all(r.headers["retry-after"] == "1" for r in answers if r.status_code == 429)
    assert other.status_code == 200
    assert json.loads(answers[codes.index(429)].text)["error"]["type"] == "rate_limit_exceeded"


def test_a_plugin_that_cannot_start_stops_vllm_rather_than_serve_without_its_door(monkeypatch, tmp_path):
    """vLLM serves on without an endpoint plugin whose factory raises an Exception: with a bad key file
    that would be a server open to all. The plugin raises SystemExit instead, which stops vLLM."""
    from justitia.server.plugin import ENV_SERVE, JustitiaPlugin

    keys = tmp_path / "keys.txt"
    keys.write_text(f"{A} team-a 2 trusted\n")
    monkeypatch.setenv(
        ENV_SERVE, json.dumps({"predictor": "mean", "api_keys_file": str(keys), "limits": {"key_rate": 5}})
    )
    plugin = JustitiaPlugin()
    assert len(plugin.keys) == 1 and plugin.settings.key_rate == 5 and plugin.manager is None
    for config, words in (
        ({"api_keys_file": str(tmp_path / "missing.txt")}, "cannot read"),
        ({"api_keys": ["short"]}, "at least 8"),
        ({"colour": "red"}, "unknown key"),
        ({"limits": {"bogus": 1}}, "bogus"),
        ({"predictor": "no-such"}, "no-such"),
    ):
        monkeypatch.setenv(ENV_SERVE, json.dumps(config))
        with pytest.raises(SystemExit, match=words):
            JustitiaPlugin()
    monkeypatch.setenv(ENV_SERVE, "{not json")
    with pytest.raises(SystemExit, match="not JSON"):
        JustitiaPlugin()
