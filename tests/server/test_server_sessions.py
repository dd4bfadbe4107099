"""Sessions over the agent API (docs/reference.md, "Sessions over the agent API"): stages with pauses
the server waits, a session's turns as one flow paused between them, the checks on what a client
sends, and a session kept across a restart. The app in process over a recording backend."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from inprocess import RecordingBackend, app_opener, auth, settle

from justitia.backends import BackendError
from justitia.core.book import SESSION_KEEP_S
from justitia.server.app import Settings
from justitia.server.journal import Journal

A, B = "sk-alpha-0001", "sk-bravo-0002"
TASK = {"prompt": "look at the code", "max_tokens": 3}


class SessionBackend(RecordingBackend):
    """A recording backend that also keeps, per request, when it came and whether its agent was
    paused in the book just before; each retire; and holds forever (until cancelled) the requests
    of stages from ``hold`` on."""

    def __init__(self):
        super().__init__()
        self.arrivals: list[tuple[str, float, bool]] = []  # (request id, time, its agent paused before it)
        self.retired: list[tuple[str, bool]] = []
        self.hold: int | None = None
        self.pause_fails = False

    async def generate(self, prompt, params, request_id):
        agent_id, stage = request_id.split("/")[0], int(request_id.split("/")[1])
        if self.hold is not None and stage >= self.hold:
            await asyncio.Event().wait()  # the engine never answers (until the server stops)
        standing = self.book.agent(agent_id)
        self.arrivals.append((request_id, time.monotonic(), standing is not None and standing.paused))
        async for out in super().generate(prompt, params, request_id):
            yield out

    async def retire(self, agent_id, pause=False):
        self.retired.append((agent_id, pause))
        if pause and self.pause_fails:
            raise BackendError("the engine did not answer")
        await super().retire(agent_id, pause)


@pytest.fixture
def start(tmp_path):
    with app_opener(tmp_path, f"{A} team-a 1\n{B} team-b 1\n") as opener:

        def build(journal=True, **settings):
            return opener(
                SessionBackend(),
                Settings(**{"max_model_len": 64} | settings),
                Journal(tmp_path / "journal.sqlite") if journal else None,
            )

        yield build


def until(client, agent_id, status, key=A) -> dict:
    """Poll the agent until its status is ``status``; its document."""
    deadline = time.time() + 30
    while (doc := client.get(f"/v1/agents/{agent_id}", headers=auth(key)).json())["status"] != status:
        assert time.time() < deadline, doc
        time.sleep(0.01)
    return doc


def session(client, stages, key=A) -> str:
    r = client.post("/v1/agents", json={"type": "chat", "session": True, "stages": stages}, headers=auth(key))
    assert r.status_code == 202, r.text
    return r.json()["agent_id"]


def turn(client, agent_id, body, key=A):
    return client.post(f"/v1/agents/{agent_id}/turns", json=body, headers=auth(key))


def stop(client, agent_id):
    """What shutting the server down does to a session (not a client's DELETE)."""
    run = client.manager.agents[agent_id]

    async def cancel():
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)

    client.portal.call(cancel)


# ------------------------------------------------------------------------------ one flow
def test_a_sessions_turns_are_registered_ahead_as_one_flow_paused_between_them(start):
    app = start(journal=False)
    agent_id = session(app, [[TASK, TASK]])
    doc = until(app, agent_id, "waiting")
    assert doc["session"] and [t["stages"] for t in doc["turns"]] == [1]
    assert app.backend.registered == [(agent_id, 1.0, "team-a")]  # registered ahead, as a session
    first_tag = doc["virtual_finish"]
    assert first_tag == pytest.approx(doc["turns"][0]["predicted_cost"])  # V = 0 here: f = C
    assert app.backend.retired == [(agent_id, True)] and app.backend.book.agent(agent_id).paused
    assert app.backend.book.state(0.0).agents == 1  # kept while it waits

    r = turn(
        app, agent_id, {"stages": [[{"prompt": "tool said: {{stage[0]}}", "max_tokens": 2}], [TASK]], "last": True}
    )
    assert r.status_code == 202 and r.json()["turn"] == 1 and r.json()["first_stage"] == 1
    doc = settle(app, agent_id, A)
    assert doc["status"] == "done" and [len(s) for s in doc["stages"]] == [2, 1, 1]
    assert doc["stages"][1][0]["prompt_tokens"] == 4  # "tool said: ok ok": an earlier turn's outputs quoted
    assert doc["predicted_cost"] == pytest.approx(sum(t["predicted_cost"] for t in doc["turns"]))
    # registered again, it returned at its next turn's price: the fake engine's clock stands still
    # (V = 0, GPS served nothing), so the pause settled it at its start and f = max(V, f) + C = C;
    # had the engine still held it open, its tag would have stayed the first turn's
    metas = app.backend.metas
    assert len(app.backend.registered) == 2
    assert doc["virtual_finish"] == pytest.approx(doc["turns"][1]["predicted_cost"]) != first_tag
    assert all(m.session and m.agent_id == agent_id for m in metas)
    assert not any(m.turn_start for m in metas)  # each turn was opened by its registration
    assert [m.agent_done for m in metas] == [False, False, False, True]  # only the last turn's last stage
    assert not any(paused for _, _, paused in app.backend.arrivals)  # returned before its requests came
    assert app.backend.book.agent(agent_id) is None  # released by its agent_done
    assert app.backend.book.state(0.0).agents == 0


def test_a_turn_the_engine_could_not_pause_before_is_opened_by_its_first_request(start):
    app = start(journal=False)
    app.backend.pause_fails = True
    agent_id = session(app, [[TASK]])
    until(app, agent_id, "waiting")
    assert not app.backend.book.agent(agent_id).paused  # the pause failed: the engine may hold it open
    assert turn(app, agent_id, {"stages": [[TASK]], "last": True}).status_code == 202
    doc = settle(app, agent_id, A)
    assert doc["status"] == "done" and len(app.backend.registered) == 1  # its second turn: not registered
    metas = app.backend.metas
    assert [m.turn_start for m in metas] == [False, True]  # so its first request opens it, at its price
    assert metas[1].agent_cost == pytest.approx(doc["turns"][1]["predicted_cost"])
    assert [paused for _, _, paused in app.backend.arrivals] == [False, False]
    assert app.backend.book.agent(agent_id) is None


def test_the_server_waits_each_stages_pause_before_sending_it(start):
    app = start(journal=False)
    r = app.post("/v1/agents", json={"stages": [[TASK], {"tasks": [TASK], "pause_s": 0.4}]}, headers=auth(A))
    doc = settle(app, r.json()["agent_id"], A)
    assert doc["status"] == "done"
    (_, t0, _), (_, t1, _) = app.backend.arrivals
    assert t1 - t0 >= 0.4  # tool time, waited by the server


def test_a_session_ends_by_its_client_or_after_its_keep_time_and_is_released(start):
    assert Settings().session_keep_s == SESSION_KEEP_S  # the server's keep time is the engine book's
    app = start(journal=False, session_keep_s=0.5)
    closed = session(app, [[TASK]])
    until(app, closed, "waiting")
    r = turn(app, closed, {"last": True})
    assert r.status_code == 200 and r.json()["status"] == "done"
    assert (closed, False) in app.backend.retired and app.backend.book.agent(closed) is None

    left = session(app, [[TASK]])
    until(app, left, "waiting")
    t0 = time.monotonic()
    until(app, left, "done")
    assert time.monotonic() - t0 >= 0.3 and app.backend.book.agent(left) is None
    assert turn(app, left, {"stages": [[TASK]]}).status_code == 409


def test_a_stopping_server_waits_for_working_agents_not_for_sessions_waiting_for_their_client(start):
    app = start(journal=False)
    agent_id = session(app, [[TASK]])
    until(app, agent_id, "waiting")
    assert app.manager.in_flight() == 1 and app.manager.working() == 0  # a drain (serve's SIGTERM) ends at once
    app.backend.hold = 0  # a plain agent whose requests the engine holds: a drain waits for it
    plain = app.post("/v1/agents", json={"stages": [[TASK]]}, headers=auth(A)).json()["agent_id"]
    until(app, plain, "running")
    assert app.manager.in_flight() == 2 and app.manager.working() == 1


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "stage, status, words",
    [
        ({"tasks": [TASK], "pause_s": -1}, 422, "field 'stages[1].pause_s'"),
        ({"tasks": [TASK], "pause_s": "soon"}, 422, "field 'stages[1].pause_s'"),
        ({"tasks": [TASK], "pause_s": True}, 422, "field 'stages[1].pause_s'"),
        ({"tasks": [TASK], "pause_s": 61}, 400, "field 'stages[1].pause_s': 61 is more than this server's limit of 60"),
        ({"tasks": [], "pause_s": 1}, 422, "field 'stages[1].tasks'"),
        ({"tasks": [{"prompt": 7}]}, 422, "field 'stages[1].tasks[0].prompt'"),
        ({"tasks": [{"prompt": "{{stage[2]}}", "max_tokens": 2}]}, 400, "field 'stages[1].tasks[0].prompt'"),
        ({"pause_s": 1}, 422, "field 'stages[1].tasks' is missing"),
        ({"tasks": [TASK], "wait": 1}, 422, "field 'stages[1].wait' is not a known field"),
        ("soon", 422, "field 'stages[1]': a stage is a list of tasks or an object"),
    ],
)
def test_a_bad_stage_gets_a_4xx_naming_its_field(start, stage, status, words):
    app = start(journal=False)
    r = app.post("/v1/agents", json={"stages": [[TASK], stage]}, headers=auth(A))
    assert r.status_code == status and words in r.json()["error"], r.text
    r = app.post(
        "/v1/agents",
        content=b'{"stages": [[{"prompt": "a", "max_tokens": 2}], {"tasks": '
        b'[{"prompt": "b", "max_tokens": 2}], "pause_s": Infinity}]}',
        headers=auth(A) | {"content-type": "application/json"},
    )
    assert r.status_code == 400 and "stages[1].pause_s" in r.json()["error"]


def test_turns_are_refused_to_non_sessions_running_or_ended_ones_and_other_keys(start):
    app = start(journal=False)
    plain = app.post("/v1/agents", json={"stages": [[TASK]]}, headers=auth(A)).json()["agent_id"]
    settle(app, plain, A)
    r = turn(app, plain, {"stages": [[TASK]]})
    assert r.status_code == 409 and "not a session" in r.json()["error"] and "'session'" in r.json()["error"]

    agent_id = session(app, [[TASK]])
    until(app, agent_id, "waiting")
    assert turn(app, agent_id, {"stages": [[TASK]]}, key=B).status_code == 404  # another key's: unknown
    assert turn(app, "agent-nobody", {"stages": [[TASK]]}).status_code == 404
    for body, status, words in [
        ({"stages": [[{"prompt": 7}]]}, 422, "field 'stages[0][0].prompt'"),
        ({"stages": [{"tasks": [TASK], "pause_s": -2}]}, 422, "field 'stages[0].pause_s'"),
        ({"stages": [{"tasks": [TASK], "pause_s": 1e9}]}, 400, "field 'stages[0].pause_s'"),
        ({"stages": [[TASK]], "last": "yes"}, 422, "field 'last'"),
        ({"stages": []}, 400, "field 'stages'"),
        ({"stages": [[{"prompt": "{{stage[1]}}", "max_tokens": 2}]]}, 400, "must name an earlier stage"),
        ({"stages": [[{"prompt": "{{prev[3]}}", "max_tokens": 2}]]}, 400, "stage 0 has 1 tasks"),
        ({"stages": [[TASK]] * 300}, 400, "the session has 301 tasks"),
    ]:
        r = turn(app, agent_id, body)
        assert r.status_code == status and words in r.json()["error"], (body, r.text)
    assert until(app, agent_id, "waiting")  # none of them took a turn

    app.backend.hold = 1  # its next turn stays running
    assert turn(app, agent_id, {"stages": [[TASK]]}).status_code == 202
    r = turn(app, agent_id, {"stages": [[TASK]]})
    assert r.status_code == 409 and "running its turn 1" in r.json()["error"]
    assert app.delete(f"/v1/agents/{agent_id}", headers=auth(A)).json()["status"] == "cancelled"
    r = turn(app, agent_id, {"stages": [[TASK]]})
    assert r.status_code == 409 and "has ended (cancelled)" in r.json()["error"]
    assert (agent_id, False) in app.backend.retired  # released


# ------------------------------------------------------------------------------ restarts
def test_a_waiting_session_survives_a_restart_and_can_be_continued(start, tmp_path):
    first = start()
    agent_id = session(first, [[TASK, TASK, TASK]])
    before = until(first, agent_id, "waiting")
    stop(first, agent_id)
    row = sqlite3.connect(tmp_path / "journal.sqlite").execute("SELECT status, waiting_wall FROM agents").fetchone()
    assert row[0] == "waiting" and row[1] is not None

    second = start()
    assert second.portal.call(second.manager.recover) == (0, 1)
    after = until(second, agent_id, "waiting")
    assert after["stages"] == before["stages"] and after["turns"] == before["turns"]
    since = sqlite3.connect(tmp_path / "journal.sqlite").execute("SELECT waiting_wall FROM agents").fetchone()[0]
    assert since == row[1]  # its keep time counts from when it began to wait, not from the restart
    assert turn(second, agent_id, {"stages": [[TASK]]}, key=B).status_code == 404  # still its owner's only
    r = turn(second, agent_id, {"stages": [[{"prompt": "tool said: {{stage[0]}}", "max_tokens": 2}]], "last": True})
    assert r.status_code == 202, r.text
    doc = settle(second, agent_id, A)
    assert doc["status"] == "done" and doc["stages"][1][0]["prompt_tokens"] == 5  # "tool said: ok ok ok"
    assert len(second.backend.metas) == 1  # only the new turn reached the engine
    assert second.backend.registered == [(agent_id, 1.0, "team-a")]  # registered there as it came
    assert not second.backend.metas[0].turn_start

    third = start()  # the finished session answers the same after another restart
    assert third.portal.call(third.manager.recover) == (1, 0)
    again = third.get(f"/v1/agents/{agent_id}", headers=auth(A)).json()
    assert again["stages"] == doc["stages"] and again["turns"] == doc["turns"]


def test_a_running_turn_resumes_after_a_restart_from_its_first_stage_not_fully_answered(start, tmp_path):
    first = start()
    agent_id = session(first, [[TASK]])
    until(first, agent_id, "waiting")
    first.backend.hold = 2  # the engine never answers the turn's second stage
    r = turn(
        first,
        agent_id,
        {"stages": [[TASK], {"tasks": [{"prompt": "then {{prev}}", "max_tokens": 2}], "pause_s": 0.05}], "last": True},
    )
    assert r.status_code == 202
    deadline = time.time() + 30
    while first.get(f"/v1/agents/{agent_id}", headers=auth(A)).json()["stages"][1][0] is None:
        assert time.time() < deadline
        time.sleep(0.01)
    stop(first, agent_id)
    assert sqlite3.connect(tmp_path / "journal.sqlite").execute("SELECT status FROM agents").fetchone()[0] == "running"

    second = start()
    assert second.portal.call(second.manager.recover) == (0, 1)
    doc = settle(second, agent_id, A)
    assert doc["status"] == "done" and [len(s) for s in doc["stages"]] == [1, 1, 1]
    assert doc["stages"][2][0]["prompt_tokens"] == 2  # "then ok": its turn's earlier stage, kept, quoted
    assert [rid for rid, _, _ in second.backend.arrivals] == [f"{agent_id}/2/0"]  # only what was not answered
    (meta,) = second.backend.metas
    assert meta.session and meta.agent_done and not meta.turn_start  # its turn was registered at the start
    assert second.backend.registered == [(agent_id, 1.0, "team-a")] and second.backend.book.agent(agent_id) is None
    # what GPS still owed it, priced at its running turn's cost (not its first turn's): all of it
    # here, as the first server's clock stood still (V = 0)
    assert doc["turns"][0]["predicted_cost"] < doc["turns"][1]["predicted_cost"]
    assert doc["virtual_finish"] == pytest.approx(doc["turns"][1]["predicted_cost"])
