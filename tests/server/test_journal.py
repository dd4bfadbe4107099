"""The journal: accepted agents and finished tasks survive a restart; unfinished agents resume
from their first stage not fully answered, same id and owner, in their old order and before later
arrivals; Idempotency-Key; /health when the engine dies; draining. The app in process over a
recording backend (the SIGKILL test with a real engine is in test_server.py)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from types import SimpleNamespace

import pytest
from inprocess import RecordingBackend, app_opener, auth, settle

from justitia.core import AgentBook, AgentScheduler, RequestMeta
from justitia.server.app import Settings
from justitia.server.journal import Journal, JournalError, Record, resume_order
from justitia.server.keys import ANONYMOUS, KeyRing
from justitia.server.schema import AgentSpec

A, B = "sk-alpha-0001", "sk-bravo-0002"
TWO_STAGES = {
    "type": "mrs",
    "stages": [
        [{"prompt": "one two", "max_tokens": 3}, {"prompt": "three", "max_tokens": 3}],
        [{"prompt": "sum: {{prev}}", "max_tokens": 2}],
    ],
}


@pytest.fixture
def start(tmp_path):
    with app_opener(tmp_path, f"{A} team-a 2\n{B} team-b 1\n") as opener:

        def build(journal_path=tmp_path / "journal.sqlite", backend=None, open_server=False):
            return opener(
                backend or RecordingBackend(),
                Settings(max_model_len=64),
                Journal(journal_path),
                KeyRing() if open_server else None,
            )

        yield build


def test_a_finished_agent_is_journaled_and_answers_the_same_after_a_restart(start, tmp_path):
    first = start()
    agent_id = first.post("/v1/agents", json=TWO_STAGES, headers=auth(A)).json()["agent_id"]
    before = settle(first, agent_id, A)
    assert before["status"] == "done"
    rows = (
        sqlite3.connect(tmp_path / "journal.sqlite")
        .execute("SELECT status, owner, tenant, weight FROM agents")
        .fetchall()
    )
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
        await journal.accept(
            Record("agent-crashed", owner, "team-a", 2.0, spec, "idem-1", 99.0, "running", None, time.time() - 5, None)
        )
        for task in (0, 1):
            await journal.task_done(
                "agent-crashed",
                0,
                task,
                {"output": f"before-{task}", "prompt_tokens": 2, "output_tokens": 3, "finish_reason": "length"},
            )

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
    bad = app.post(
        "/v1/agents", json={"stages": [[{"prompt": "{{prev}}"}]]}, headers=auth(A) | {"Idempotency-Key": "k3"}
    )
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
    assert app.manager.agents[agent_id].status == "running" and app.manager.counts.finished["failed"] == 0


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
        await journal.accept(
            Record("agent-part", owner, "team-a", 2.0, TWO_STAGES, None, 99.0, "running", None, time.time() - 5, None)
        )
        await journal.task_done(
            "agent-part", 0, 1, {"output": "kept-1", "prompt_tokens": 2, "output_tokens": 3, "finish_reason": "length"}
        )

    asyncio.run(crashed())
    journal.close()
    app = start(path)
    assert app.portal.call(app.manager.recover) == (0, 1)
    doc = settle(app, "agent-part", A)
    assert doc["status"] == "done"
    assert [t["output"] for t in doc["stages"][0]] == ["ok", "kept-1"]  # task 1 kept, task 0 run
    assert app.backend.request_ids == ["agent-part/0/0", "agent-part/1/0"]  # task 0 and stage 1 only


def test_a_first_try_the_journal_could_not_write_is_released_and_leaves_its_idempotency_key_free(start, tmp_path):
    path = tmp_path / "unwritten.sqlite"
    app = start(path)
    accept = app.journal.accept

    async def broken(record):
        app.journal.accept = accept
        raise JournalError("disk full")

    app.journal.accept = broken
    r = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k-unwritten"})
    assert r.status_code == 503 and r.headers["retry-after"]
    assert app.backend.book.state(0.0).agents == 0  # registered, then released: the policy forgot it
    retry = app.post("/v1/agents", json=TWO_STAGES, headers=auth(A) | {"Idempotency-Key": "k-unwritten"})
    assert retry.status_code == 202, retry.text
    assert settle(app, retry.json()["agent_id"], A)["status"] == "done"
    assert sqlite3.connect(path).execute("SELECT agent_id FROM agents").fetchall() == [(retry.json()["agent_id"],)]


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


class OrderedBackend(RecordingBackend):
    """Holds every request until ``serve`` is called, then runs them one at a time in the policy's
    order (``served``: their agents, in that order), with retagging on: a resumed agent's requests
    add up to its whole cost, which the core keeps (``resume_cost`` only places it)."""

    def __init__(self):
        super().__init__()
        self.core = AgentScheduler.for_policy("justitia", 1000.0)
        self.book = AgentBook(self.core)
        self.served: list[str] = []
        self.held, self.busy, self.turn = True, False, None

    async def serve(self):
        self.held = False
        async with self._turn():
            self.turn.notify_all()

    def _turn(self):
        if self.turn is None:  # made on the app's event loop
            self.turn = asyncio.Condition()
        return self.turn

    async def generate(self, prompt, params, request_id):
        meta = RequestMeta.parse(params.extra_args)
        info, _ = self.book.arrive(request_id, meta, len(prompt["prompt_token_ids"]), params.max_tokens, 0.0)
        async with self._turn():
            self.turn.notify_all()
            await self.turn.wait_for(lambda: not self.held and not self.busy and self.core.peek() is info)
            self.core.dequeue(info)
            self.busy = True
        self.served.append(meta.agent_id)
        self.book.finish(request_id, 0.0)
        async with self.turn:
            self.busy = False
            self.turn.notify_all()
        yield SimpleNamespace(outputs=[SimpleNamespace(text="ok", token_ids=[7], finish_reason="length")])


def crashed_journal(path, owner, agents):
    """A journal as a killed server left it: ``agents`` are (id, tenant, weight, predicted cost,
    status, its run, V at its registration, its tag); an unfinished one has its stage 0 answered."""
    journal = Journal(path)

    async def write():
        for i, (agent_id, tenant, weight, cost, status, run, v, f) in enumerate(agents):
            await journal.accept(
                Record(
                    agent_id,
                    owner,
                    tenant,
                    weight,
                    TWO_STAGES,
                    None,
                    cost,
                    status,
                    None,
                    time.time() - 60 + i,
                    None,
                    run,
                    f,
                    v,
                )
            )
            for task in (0, 1):
                await journal.task_done(
                    agent_id,
                    0,
                    task,
                    {"output": "before", "prompt_tokens": 2, "output_tokens": 3, "finish_reason": "length"},
                )

    asyncio.run(write())
    journal.close()


def waiting_for(app, requests):
    deadline = time.time() + 60
    while len(app.backend.core) < requests:
        assert time.time() < deadline
        time.sleep(0.01)


def test_a_resumed_agent_keeps_its_place_before_agents_that_arrive_after_the_restart(start, tmp_path):
    probe = start(tmp_path / "probe.sqlite", open_server=True)
    small = {"type": "small", "stages": [[{"prompt": "one", "max_tokens": 2}]]}
    cost, small_cost = (
        probe.manager.pricer.priced("probe", AgentSpec.model_validate(spec), ANONYMOUS)[0].predicted_cost
        for spec in (TWO_STAGES, small)
    )
    assert small_cost < cost
    # run 3 stopped with V at least 100 + cost - small_cost / 2 (a finished agent's reading): A, stamped
    # f = 100 + cost at V = 100, was still owed small_cost / 2; run 2's clock is another clock
    stop = 100 + cost - small_cost / 2
    path = tmp_path / "crashed.sqlite"
    crashed_journal(
        path,
        ANONYMOUS.owner,
        [
            ("agent-old", None, 1.0, cost, "done", 2, 1e9, 1e9 + cost),
            ("agent-a", None, 1.0, cost, "queued", 3, 100.0, 100 + cost),
            ("agent-late", None, 1.0, cost, "done", 3, stop, stop + cost),
        ],
    )
    app = start(path, backend=OrderedBackend(), open_server=True)
    assert app.journal.run == 4
    assert app.portal.call(app.manager.recover) == (2, 1)
    a = app.manager.agents["agent-a"]
    assert a.virtual_finish == pytest.approx(small_cost / 2)  # V(restart) = 0, + what GPS still owed it
    b = app.manager.agents[app.post("/v1/agents", json=TWO_STAGES).json()["agent_id"]]  # its cost, after the restart
    s = app.manager.agents[app.post("/v1/agents", json=small).json()["agent_id"]]  # dearer than what A was owed
    assert a.virtual_finish < s.virtual_finish == small_cost < b.virtual_finish == cost
    waiting_for(app, 4)  # A's stage 1, B's stage 0, S
    app.portal.call(app.backend.serve)
    docs = {name: settle(app, run.agent_id) for name, run in (("a", a), ("b", b), ("s", s))}
    assert all(doc["status"] == "done" for doc in docs.values())
    assert app.backend.served[0] == "agent-a" and docs["a"]["finish_s"] < min(
        docs["b"]["finish_s"], docs["s"]["finish_s"]
    )
    assert [t["output"] for t in docs["a"]["stages"][0]] == ["before", "before"]  # kept, not run again
    rows = dict(
        (
            (r[0], r[1:])
            for r in sqlite3.connect(path).execute(
                "SELECT agent_id, clock_run, virtual_finish, virtual_time FROM agents"
            )
        )
    )
    assert rows["agent-a"] == (4, pytest.approx(small_cost / 2), 0.0)  # stamped again in this run's clock
    assert rows[b.agent_id] == (4, pytest.approx(cost), 0.0)  # a new one: its tag and V at its registration


def test_resumed_agents_keep_their_old_order(start, tmp_path):
    owner = KeyRing.load([A]).authenticate(f"Bearer {A}").owner
    path = tmp_path / "crashed.sqlite"
    # three agents of team-a (weight 2), each arrived later than the last with a smaller cost, so
    # that their whole costs would put them in the reverse order; V was at least 130 at the stop
    crashed_journal(
        path,
        owner,
        [
            ("agent-x", "team-a", 2.0, 99.0, "running", 5, 100.0, 149.5),
            ("agent-y", "team-a", 2.0, 60.0, "queued", 5, 120.0, 150.0),
            ("agent-z", "team-a", 2.0, 42.0, "queued", 5, 130.0, 151.0),
        ],
    )
    app = start(path, backend=OrderedBackend())
    assert app.portal.call(app.manager.recover) == (0, 3)
    tags = [app.manager.agents[f"agent-{n}"].virtual_finish for n in "xyz"]
    assert tags == sorted(tags) and len(set(tags)) == 3
    assert [r[0] for r in app.backend.registered] == ["agent-x", "agent-y", "agent-z"]
    waiting_for(app, 3)
    app.portal.call(app.backend.serve)
    assert all(settle(app, f"agent-{n}", A)["status"] == "done" for n in "xyz")
    assert app.backend.served == ["agent-x", "agent-y", "agent-z"]


def test_resume_order_reads_each_run_by_its_own_clock():
    def rec(agent_id, status, run, v, f, cost=10.0, weight=2.0):
        return Record(agent_id, "o", None, weight, {}, None, cost, status, None, 0.0, None, run, f, v)

    records = [
        rec("done-1", "done", 1, 500.0, 505.0),
        rec("late-1", "queued", 1, 400.0, 402.0),
        rec("owed-0", "running", 1, 200.0, 300.0),
        rec("early-2", "queued", 2, 7.0, 8.0),
        rec("old", "queued", None, None, None),
        rec("clamped", "queued", 2, 1.0, 50.0),
    ]
    plan = [(r.agent_id, owed) for r, owed in resume_order(records)]
    # run 1 stopped at V >= 500: late-1 and owed-0 were owed nothing (tag behind V); run 2 at V >= 7;
    # clamped's tag says more than its whole cost: its cost; no stamps: its whole cost, last
    assert plan == [("owed-0", 0.0), ("late-1", 0.0), ("early-2", 2.0), ("clamped", 10.0), ("old", None)]


def test_a_journal_written_before_the_stamps_is_read_and_resumed_at_whole_cost(start, tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE agents (
            agent_id TEXT PRIMARY KEY, owner TEXT NOT NULL, tenant TEXT, weight REAL NOT NULL, spec TEXT NOT NULL,
            idempotency_key TEXT, predicted_cost REAL NOT NULL, status TEXT NOT NULL, error TEXT,
            arrival_wall REAL NOT NULL, finish_wall REAL);""")
    db.execute(
        "INSERT INTO agents VALUES ('agent-old', 'open', NULL, 1.0, ?, NULL, 99.0, 'queued', NULL, ?, NULL)",
        (json.dumps(TWO_STAGES), time.time()),
    )
    db.commit()
    db.close()
    app = start(path, open_server=True)
    assert app.journal.run == 1
    assert app.portal.call(app.manager.recover) == (0, 1)
    assert settle(app, "agent-old")["status"] == "done"
    assert app.manager.agents["agent-old"].virtual_finish == pytest.approx(99.0)  # whole cost, at V(restart) = 0
