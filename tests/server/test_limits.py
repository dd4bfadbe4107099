"""Limits per key and on what the server keeps: in-flight agents and requests, rates, event
streams, finished agents by bytes (then 410). The app in process over a recording backend."""

from __future__ import annotations

import time

import pytest
from inprocess import RecordingBackend, app_opener, auth, settle

from justitia.server.app import Settings
from justitia.server.limits import RateLimit

A, B = "sk-alpha-0001", "sk-bravo-0002"
AGENT = {"stages": [[{"prompt": "hi there", "max_tokens": 2}]]}


@pytest.fixture
def make(tmp_path):
    with app_opener(tmp_path, f"{A} a 1\n{B} b 1\n") as opener:
        yield lambda **settings: opener(RecordingBackend(), Settings(max_model_len=64, **settings))


def test_a_key_over_its_agents_in_flight_gets_429_and_the_other_key_does_not(make):
    app = make(key_agents_in_flight=2)
    app.backend.gate.clear()  # hold every request
    held = [app.post("/v1/agents", json=AGENT, headers=auth(A)).json()["agent_id"] for _ in range(2)]
    r = app.post("/v1/agents", json=AGENT, headers=auth(A))
    assert r.status_code == 429 and "your key has 2 agents in flight" in r.json()["error"]
    assert r.headers["retry-after"] == "1"
    assert app.post("/v1/agents", json=AGENT, headers=auth(B)).status_code == 202
    app.backend.gate.set()
    for agent_id in held:
        assert settle(app, agent_id, A)["status"] == "done"
    assert app.post("/v1/agents", json=AGENT, headers=auth(A)).status_code == 202  # room again
    assert app.manager.admission.agents_in_flight(app.manager.agents[held[0]].owner) in (0, 1)


def test_a_key_over_its_rate_gets_429_with_retry_after():
    now = [0.0]
    rate = RateLimit(2.0, burst=3, clock=lambda: now[0])
    assert [rate.take("a") for _ in range(3)] == [None] * 3  # the burst
    assert rate.take("a") == pytest.approx(0.5)  # one token comes back every half second
    assert rate.take("b") is None  # another key's bucket
    now[0] = 0.5
    assert rate.take("a") is None and rate.take("a") == pytest.approx(0.5)
    assert RateLimit(0.0).take("a") is None  # 0: no limit


def test_the_rate_limit_applies_to_agents_and_completions(make):
    app = make(key_rate=0.001, key_burst=2)
    assert app.post("/v1/agents", json=AGENT, headers=auth(A)).status_code == 202
    assert app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=auth(A)).status_code == 200
    for path, body in (("/v1/agents", AGENT), ("/v1/completions", {"prompt": "hi", "max_tokens": 2})):
        r = app.post(path, json=body, headers=auth(A))
        assert r.status_code == 429 and "rate limit" in str(r.json()) and int(r.headers["retry-after"]) >= 999
    assert app.post("/v1/agents", json=AGENT, headers=auth(B)).status_code == 202


def test_openai_requests_are_capped_per_key_and_in_all(make):
    app = make(key_requests_in_flight=0)
    r = app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=auth(A))
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_exceeded" and r.headers["retry-after"]
    app = make(max_requests_in_flight=0)
    r = app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=auth(A))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    app = make()
    for stream in (False, True):
        r = app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": stream}, headers=auth(A))
        assert r.status_code == 200
    assert app.manager.admission.requests_in_flight() == 0


def test_an_agent_has_at_most_so_many_event_streams(make):
    app = make(max_streams_per_agent=1)
    app.backend.gate.clear()
    agent_id = app.post("/v1/agents", json=AGENT, headers=auth(A)).json()["agent_id"]
    with app.stream("GET", f"/v1/agents/{agent_id}/events", headers=auth(A)) as first:
        assert first.status_code == 200
        second = app.get(f"/v1/agents/{agent_id}/events", headers=auth(A))
        assert second.status_code == 429 and "1 event streams open" in second.json()["error"]
        app.backend.gate.set()
        assert any("event: done" in line for line in first.iter_lines())
    assert app.get(f"/v1/agents/{agent_id}/events", headers=auth(A)).status_code == 200  # closed: room again


def submit_until_gone(app):
    """Submit ``AGENT`` as ``A`` and poll it until its owner's look is answered other than 200:
    the agent's id and that answer."""
    agent_id = app.post("/v1/agents", json=AGENT, headers=auth(A)).json()["agent_id"]
    deadline = time.time() + 60
    while (r := app.get(f"/v1/agents/{agent_id}", headers=auth(A))).status_code == 200:
        assert time.time() < deadline
        time.sleep(0.01)
    return agent_id, r


def test_finished_agents_are_kept_by_bytes_and_age_then_answer_410_to_their_owner(make):
    app = make(finished_bytes=1)  # nothing fits: every finished agent is dropped at once
    agent_id, r = submit_until_gone(app)
    assert r.status_code == 410 and "no longer kept" in r.json()["error"]
    assert app.delete(f"/v1/agents/{agent_id}", headers=auth(A)).status_code == 410
    assert app.get(f"/v1/agents/{agent_id}", headers=auth(B)).status_code == 404  # another key learns nothing
    assert app.get("/v1/agents/agent-unknown", headers=auth(A)).status_code == 404
    app = make(finished_s=0.0)  # kept for no time: dropped at the next look
    _, r = submit_until_gone(app)
    assert r.status_code == 410
    kept = make()  # the defaults keep it
    agent_id = kept.post("/v1/agents", json=AGENT, headers=auth(A)).json()["agent_id"]
    assert settle(kept, agent_id, A)["status"] == "done"
    assert kept.manager.store.ended_bytes > 0 and kept.get(f"/v1/agents/{agent_id}", headers=auth(A)).status_code == 200


def test_concurrent_submissions_past_the_keys_agent_limit_are_refused(make):
    """100 agents at once against a per-key limit of 10: 10 accepted. Admission is counted before the
    first await (prediction runs in a thread), so concurrent submissions see each other."""
    import asyncio

    import httpx

    app = make(key_agents_in_flight=10)
    app.backend.gate.clear()  # the accepted agents stay in flight

    async def burst():
        transport = httpx.ASGITransport(app=app.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=auth(A)) as client:
            answers = await asyncio.gather(*(client.post("/v1/agents", json=AGENT) for _ in range(100)))
            app.backend.gate.set()  # the accepted agents finish on this loop
            while app.manager.in_flight():
                await asyncio.sleep(0.01)
            return answers

    codes = [r.status_code for r in asyncio.run(asyncio.wait_for(burst(), 60))]
    assert codes.count(202) == 10 and codes.count(429) == 90, codes
    assert app.manager.in_flight() == 0 and len(app.manager.agents) == 10
