"""Identified sessions at the door (``server/identity.py``, ``server/door.py``): a session header or
field marks the request ``session``, the body says whether it opens a user turn (``turn_start``),
the door's reading replaces the client's, and ``GET /v1/sessions`` counts the turns (the front end's
app in process, over a backend that records what reaches it; no engine)."""

from __future__ import annotations

import pytest

from inprocess import door_app
from justitia.core.book import SESSION_KEEP_S
from justitia.defaults import policy_settings
from justitia.server.identity import SESSION_SOURCES, SOURCES, opens_turn

KEY = "sk-door-sessions-a"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER, TOOL = {"role": "user", "content": "go on"}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}
# one body a turn start and one a tool's return, for each endpoint with turns, as its harnesses send them
BODIES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"}, USER], "max_tokens": 2},
             {"messages": [USER, CALL, TOOL], "max_tokens": 2}),
    "responses": ("/v1/responses", {"input": "go on", "max_output_tokens": 2},
                  {"input": [{"role": "user", "content": "go on"},
                             {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
                   "max_output_tokens": 2}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": "go on"}]}],
                                  "max_tokens": 2},
                 {"messages": [{"role": "user", "content": "go on"},
                               {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather",
                                                                  "input": {}}]},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                             "content": "sunny"}]}],
                  "max_tokens": 2}),
}


@pytest.fixture
def app(tmp_path):
    with door_app(tmp_path, f"{KEY}\n") as client:
        yield client


def test_a_turn_opens_with_the_users_own_message_on_each_endpoint_and_never_for_a_subagent_or_a_prompt():
    for kind, (_, turn, tool) in BODIES.items():
        assert opens_turn(kind, turn), kind
        assert not opens_turn(kind, tool), kind  # a tool's result continues the turn
        assert not opens_turn(kind, turn, subagent="explorer"), kind  # a subagent runs inside its session's turn
    assert not opens_turn("chat", {"messages": [USER, {"role": "assistant", "content": "Sure,"}]})  # a prefill
    assert not opens_turn("chat", {"messages": []}) and not opens_turn("chat", {"messages": "hi"})
    assert opens_turn("responses", {"input": [{"type": "message", "role": "user",
                                               "content": [{"type": "input_text", "text": "hi"}]}]})
    assert not opens_turn("responses", {"input": [{"role": "assistant", "content": "hi"}]})
    assert not opens_turn("responses", {"previous_response_id": "r1"})  # no input: nothing the user said
    assert not opens_turn("messages", {"messages": [{"role": "assistant", "content": "Sure,"}]})
    assert not opens_turn("completions", {"prompt": "hi"}) and not opens_turn("generate", {"token_ids": [1]})
    assert SESSION_SOURCES == {name for _, name, names, _ in SOURCES if names == "session"}
    assert "X-Agent-Id" not in SESSION_SOURCES and "vllm_xargs.agent_id" not in SESSION_SOURCES


def next_turn(kind: str, tool: dict) -> dict:
    """The tool's body, answered, then the user's same words again: a second turn."""
    key = "input" if kind == "responses" else "messages"
    return dict(tool, **{key: tool[key] + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "go on"}]})


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_sessions_requests_are_marked_session_and_its_turns_start_where_the_user_speaks(app, kind):
    """A turn, its tool's return, a subagent's request, the turn's first request again (a retry: no
    new turn), then the same words after an answer (a new turn)."""
    path, turn, tool = BODIES[kind]
    for body, headers in ((turn, {}), (tool, {}), (turn, {"X-Claude-Code-Agent-Id": "explorer"}), (turn, {}),
                          (next_turn(kind, tool), {})):
        r = app.post(path, json={"model": "tiny"} | body, headers=AUTH | {"X-Claude-Code-Session-Id": "cc-1"} | headers)
        assert r.status_code == 200, r.text
    metas = app.backend.metas
    assert all(m.session and m.agent_id.endswith("/cc-1") for m in metas)
    assert [m.turn_start for m in metas] == [True, False, False, False, True]
    doc, = app.get("/v1/sessions", headers=AUTH).json()["data"]
    assert (doc["requests"], doc["turns"], doc["subagents"]) == (5, 2, ["explorer"])
    assert app.backend.book.agent(metas[0].agent_id).info.session  # the engine's book took it as a session


def test_completions_have_no_turns(app):
    r = app.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                 headers=AUTH | {"X-Session-ID": "s-1"})
    assert r.status_code == 200, r.text
    meta, = app.backend.metas
    assert meta.session and not meta.turn_start
    assert app.get("/v1/sessions", headers=AUTH).json()["data"][0]["turns"] == 0


@pytest.mark.parametrize("headers, body", [({"X-Session-ID": "s"}, {}), ({}, {"session_id": "s"}),
                                           ({}, {"prompt_cache_key": "s"}), ({}, {"user": "s"}),
                                           ({"X-Claude-Code-Session-Id": "s"}, {})])
def test_every_session_source_marks_a_session_and_the_doors_reading_replaces_the_clients(app, headers, body):
    chat = {"model": "tiny", "max_tokens": 2} | body
    says = {"vllm_xargs": {"session": False, "turn_start": True}}  # the client's own, both wrong
    app.post("/v1/chat/completions", json=chat | {"messages": [USER, CALL, TOOL]} | says, headers=AUTH | headers)
    says = {"vllm_xargs": {"turn_start": False}}
    app.post("/v1/chat/completions", json=chat | {"messages": [USER]} | says, headers=AUTH | headers)
    tool, turn = app.backend.metas
    assert tool.session and not tool.turn_start
    assert turn.session and turn.turn_start
    assert app.get("/v1/sessions", headers=AUTH).json()["data"][0]["turns"] == 1


@pytest.mark.parametrize("headers, xargs", [({"X-Agent-Id": "a"}, {}), ({}, {"agent_id": "a"})])
def test_an_agents_id_keeps_agent_semantics_and_what_its_client_says(app, headers, xargs):
    chat = {"model": "tiny", "messages": [USER], "max_tokens": 2}
    app.post("/v1/chat/completions", json=chat | {"vllm_xargs": xargs}, headers=AUTH | headers)
    plain, = app.backend.metas
    assert plain.agent_id.endswith("/a") and not plain.session and not plain.turn_start  # a user message or not
    app.post("/v1/chat/completions", json=chat | {"vllm_xargs": xargs | {"session": True, "turn_start": True}},
             headers=AUTH | headers)
    said = app.backend.metas[1]
    assert said.session and said.turn_start  # its client's own (they are not prices)
    doc, = app.get("/v1/sessions", headers=AUTH).json()["data"]
    assert (doc["requests"], doc["turns"]) == (2, 1)


def test_an_unnamed_request_is_no_session(app):
    app.post("/v1/chat/completions", json={"model": "tiny", "messages": [USER], "max_tokens": 2}, headers=AUTH)
    meta, = app.backend.metas
    assert meta.agent_id is None and not meta.session and not meta.turn_start and meta.agent_done


@pytest.mark.parametrize("key", ["session", "turn_start"])
def test_a_session_flag_that_is_not_a_boolean_is_a_400_naming_it(app, key):
    r = app.post("/v1/chat/completions", json={"model": "tiny", "messages": [USER], "max_tokens": 2,
                                               "vllm_xargs": {key: "yes"}}, headers=AUTH)
    assert r.status_code == 400 and f"vllm_xargs.{key}" in r.json()["error"]["message"], r.text
    assert app.backend.metas == []


def test_the_session_keep_time_is_a_setting_with_a_clear_error():
    assert policy_settings({}).session_keep_s == SESSION_KEEP_S == 600.0
    assert policy_settings({"JUSTITIA_SESSION_KEEP_S": "30"}).session_keep_s == 30.0
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match=f"JUSTITIA_SESSION_KEEP_S='{bad}': expected a finite number >= 0"):
            policy_settings({"JUSTITIA_SESSION_KEEP_S": bad})


def test_the_benchs_door_runs_shape_their_calls_as_a_harness_does():
    """``lab.door``: a call that opens a turn ends with the user's message, one after a tool pause
    with a tool's result; the door reads them so, and the turns' openers differ."""
    from justitia.lab.door import messages
    from justitia.server.identity import turn_opener

    first, inside = messages("context ", "turn one", True), messages("context turn one", " tool said", False)
    assert opens_turn("chat", {"messages": first}) and not opens_turn("chat", {"messages": inside})
    assert turn_opener("chat", {"messages": first}) != turn_opener("chat", {"messages": messages("c", "turn two", True)})
