"""The journal: accepted agents and finished tasks survive a restart; unfinished agents resume
from their first stage not fully answered, same id and owner; Idempotency-Key; /health when the
engine dies; draining. The app in process over a recording backend (the SIGKILL test with a real
engine is in test_server.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from fastapi.testclient import TestClient

from inprocess import RecordingBackend, WordTokenizer, settle
from justitia.predictors import make_predictor
from justitia.server.app import Settings, create_app
from justitia.server.journal import Journal, Record
from justitia.server.keys import KeyRing

A, B = "sk-alpha-0001", "sk-bravo-0002"
TWO_STAGES = {"type": "mrs", "stages": [[{"prompt": "one two", "max_tokens": 3}, {"prompt": "three", "max_tokens": 3}],
                                         [{"prompt": "sum: {{prev}}", "max_tokens": 2}]]}


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def start(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{A} team-a 2\n{B} team-b 1\n")
    opened = []

    def build(journal_path=tmp_path / "journal.sqlite"):
        backend = RecordingBackend()
        journal = Journal(journal_path)
        app = create_app(backend, WordTokenizer(), Settings(max_model_len=64), make_predictor("oracle"),
                         KeyRing.load(path=keys), journal)
        client = TestClient(app).__enter__()
        client.backend, client.manager, client.journal = backend, app.state.manager, journal
        opened.append(client)
        return client

    yield build
    for client in opened:
        client.backend.gate.set()
        client.__exit__(None, None, None)
        client.journal.close()


def test_a_finished_agent_is_journaled_and_answers_the_same_after_a_restart(start, tmp_path):
    first = start()
    agent_id = first.post("/v1/agents", json=TWO_STAGES, headers=auth(A)).json()["agent_id"]
    before = settle(first, agent_id, A)
    assert before["status"] == "done"
    rows = sqlite3.connect(tmp_path / "journal.sqlite").execute(
        "SELECT status, owner, tenant, weight FROM agents").fetchall()
    assert rows == [("done", first.manager.agents[agent_id].owner, "team-a", 2.0)]  # the owner id, not the key
    second = start()
    assert second.portal.call(second.manager.recover) == (1, 0)
    after = second.get(f"/v1/agents/{agent_id}", headers=auth(A)).json()
    assert after["status"] == "done" and after["stages"] == before["stages"]
    assert second.get(f"/v1/agents/{agent_id}", headers=auth(B)).status_code == 404  # still its owner's only


def test_an_unfinished_agent_resumes_from_its_first_stage_not_fully_answered(start, tmp_path):
    path = tmp_path / "crashed.sqlite"
    journal = Journal(path)
    spec = TWO_STAGES
    owner = KeyRing.load([A]).authenticate(f"Bearer {A}").owner

    async def crashed():  # what a killed server left: stage 0 answered, stage 1 not
        await journal.accept(Record("agent-crashed", owner, "team-a", 2.0, spec, "idem-1", 99.0, "running", None,
                                    time.time() - 5, None))
        for task in (0, 1):
            await journal.task_done("agent-crashed", 0, task, {"output": f"before-{task}", "prompt_tokens": 2,
                                                               "output_tokens": 3, "finish_reason": "length"})
    asyncio.run(crashed())
    journal.close()
    app = start(path)
    assert app.portal.call(app.manager.recover) == (0, 1)
    doc = settle(app, "agent-crashed", A)
    assert doc["status"] == "done" and doc["predicted_cost"] == 99.0
    assert [t["output"] for t in doc["stages"][0]] == ["before-0", "before-1"]  # kept, not run again
    assert doc["stages"][1][0]["output"] == "ok"
    assert [m.agent_id for m in app.backend.metas] == ["agent-crashed"]  # only stage 1 reached the engine
    assert app.backend.registered == [("agent-crashed", 2.0, "team-a")]  # registered again, same tenant
    again = app.post("/v1/agents", json=spec, headers=auth(A) | {"Idempotency-Key": "idem-1"})
    assert again.json()["agent_id"] == "agent-crashed"  # the key survives the restart too


def test_a_retried_post_with_its_idempotency_key_returns_the_first_agent(start):
    app = start()
    first = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k1"}).json()["agent_id"]
    retry = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k1"})
    assert retry.status_code == 202 and retry.json()["agent_id"] == first
    other = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k2"}).json()["agent_id"]
    theirs = app.post("/v1/agents", json=TWO_STAGES, headers=auth(B) | {"Idempotency-Key": "k1"}).json()["agent_id"]
    assert len({first, other, theirs}) == 3  # keys are per API key
    bad = app.post("/v1/agents", json={"stages": [[{"prompt": "{{prev}}"}]]}, headers=auth(A) | {"Idempotency-Key": "k3"})
    assert bad.status_code == 400
    good = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k3"})
    assert good.status_code == 202  # a refused first try does not take the key
    assert app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "x" * 300}).status_code == 400


def test_a_server_that_stops_leaves_its_unfinished_agents_to_be_resumed(start, tmp_path):
    app = start()
    app.backend.gate.clear()  # the engine holds every request
    agent_id = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A)).json()["agent_id"]
    run = app.manager.agents[agent_id]

    async def stop():  # what shutting down does to a running agent (not a client's DELETE)
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
    app.portal.call(stop)
    status = sqlite3.connect(tmp_path / "journal.sqlite").execute("SELECT status FROM agents").fetchone()[0]
    assert status == "queued"  # not cancelled: the next start runs it
    assert app.manager.in_flight() == 0
    cancelled = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A)).json()["agent_id"]
    assert app.delete(f"/v1/agents/{cancelled}", headers=auth(A)).json()["status"] == "cancelled"
    app.backend.gate.set()
    again = start()
    assert again.portal.call(again.manager.recover) == (1, 1)  # the cancelled one stays cancelled
    assert settle(again, agent_id, A)["status"] == "done"


def test_health_says_when_the_engine_is_dead_and_a_draining_server_takes_no_agents(start):
    app = start()
    assert app.get("/health").json()["status"] == "ok" and app.get("/health").json()["journal"].endswith(".sqlite")
    app.manager.draining = True
    r = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A))
    assert r.status_code == 503 and r.headers["retry-after"] and app.get("/health").json()["status"] == "draining"
    app.backend.dead = True
    r = app.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "engine_dead"


def test_an_agent_whose_engine_died_under_it_is_left_to_the_next_start(start, tmp_path):
    app = start()
    app.backend.gate.clear()
    agent_id = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A)).json()["agent_id"]
    app.backend.dead = True
    app.backend.gate.set()  # its requests fail as the engine dies
    deadline = time.time() + 60
    while app.manager.in_flight():
        assert time.time() < deadline
        time.sleep(0.01)
    status = sqlite3.connect(tmp_path / "journal.sqlite").execute("SELECT status FROM agents").fetchone()[0]
    assert status == "queued"  # not failed: the restarted server runs it
    assert app.manager.agents[agent_id].status == "running" and app.manager.finished["failed"] == 0


def test_a_task_whose_replica_fails_midway_runs_once_more_and_a_second_failure_fails_the_agent(start):
    app = start()
    one_task = {"stages": [[{"prompt": "one two", "max_tokens": 3}]]}
    app.backend.cuts = 1
    doc = settle(app, app.post("/v1/agents", json=one_task, headers=auth(A)).json()["agent_id"], A)
    assert doc["status"] == "done" and doc["stages"][0][0]["output"] == "ok"
    first, again = app.backend.request_ids
    assert again == first + "/retry"  # sent once more, under its own request id

    app.backend.cuts, app.backend.request_ids = 2, []
    doc = settle(app, app.post("/v1/agents", json=one_task, headers=auth(A)).json()["agent_id"], A)
    assert doc["status"] == "failed" and "midway" in doc["error"]
    assert len(app.backend.request_ids) == 2  # once more, not forever


def test_a_partly_answered_stage_runs_only_its_missing_tasks_after_a_restart(start, tmp_path):
    path = tmp_path / "part.sqlite"
    journal = Journal(path)
    owner = KeyRing.load([A]).authenticate(f"Bearer {A}").owner

    async def crashed():  # a killed server left stage 0 with one of its two tasks answered
        await journal.accept(Record("agent-part", owner, "team-a", 2.0, TWO_STAGES, None, 99.0, "running", None,
                                    time.time() - 5, None))
        await journal.task_done("agent-part", 0, 1, {"output": "kept-1", "prompt_tokens": 2, "output_tokens": 3,
                                                      "finish_reason": "length"})
    asyncio.run(crashed())
    journal.close()
    app = start(path)
    assert app.portal.call(app.manager.recover) == (0, 1)
    doc = settle(app, "agent-part", A)
    assert doc["status"] == "done"
    assert [t["output"] for t in doc["stages"][0]] == ["ok", "kept-1"]  # task 1 kept, task 0 run
    assert app.backend.request_ids == ["agent-part/0/0", "agent-part/1/0"]  # task 0 and stage 1 only


def test_a_first_try_the_engine_refused_leaves_no_journal_entry_and_its_idempotency_key_free(start, tmp_path):
    path = tmp_path / "refused.sqlite"
    app = start(path)
    app.backend.register_failures = 1
    r = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k-refused"})
    assert r.status_code == 503 and r.headers["retry-after"]
    retry = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k-refused"})
    assert retry.status_code == 202, retry.text  # the key was not taken
    agent_id = retry.json()["agent_id"]
    assert settle(app, agent_id, A)["status"] == "done"
    rows = sqlite3.connect(path).execute("SELECT agent_id FROM agents").fetchall()
    assert rows == [(agent_id,)]  # the refused try would not run at the next start
