"""Identified sessions at the door (``server/identity.py``, ``server/door.py``): a session header or
field marks the request ``session``, the body says whether it opens a user turn (``turn_start``),
the door's reading replaces the client's, and ``GET /v1/sessions`` counts the turns (the front end's
app in process, over a backend that records what reaches it; no engine)."""

from __future__ import annotations

import pytest
from inprocess import auth, door_app

from justitia.core.book import SESSION_KEEP_S
from justitia.defaults import policy_settings
from justitia.server.identity import SESSION_SOURCES, SOURCES, opens_turn

KEY = "sk-door-sessions-a"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER, TOOL = {"role": "user", "content": "go on"}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
}
# one body a turn start and one a tool's return, for each endpoint with turns, as its harnesses send them
BODIES = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "be brief"}, USER], "max_tokens": 2},
        {"messages": [USER, CALL, TOOL], "max_tokens": 2},
    ),
    "responses": (
        "/v1/responses",
        {"input": "go on", "max_output_tokens": 2},
        {
            "input": [
                {"role": "user", "content": "go on"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "max_output_tokens": 2,
        },
    ),
    "messages": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "go on"}]}], "max_tokens": 2},
        {
            "messages": [
                {"role": "user", "content": "go on"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
            ],
            "max_tokens": 2,
        },
    ),
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
    assert opens_turn(
        "responses", {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    )
    assert not opens_turn("responses", {"input": [{"role": "assistant", "content": "hi"}]})
    assert not opens_turn("responses", {"previous_response_id": "r1"})  # no input: nothing the user said
    assert not opens_turn("messages", {"messages": [{"role": "assistant", "content": "Sure,"}]})
    assert not opens_turn("completions", {"prompt": "hi"}) and not opens_turn("generate", {"token_ids": [1]})
    assert SESSION_SOURCES == {name for _, name, names, _ in SOURCES if names == "session"}
    assert "X-Agent-Id" not in SESSION_SOURCES and "vllm_xargs.agent_id" not in SESSION_SOURCES


def next_turn(kind: str, tool: dict) -> dict:
    """The tool's body, answered, then the user's same words again: a second turn."""
    key = "input" if kind == "responses" else "messages"
    return dict(
        tool, **{key: tool[key] + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "go on"}]}
    )


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_sessions_requests_are_marked_session_and_its_turns_start_where_the_user_speaks(app, kind):
    """A turn, its tool's return, a subagent's request, the turn's first request again (a retry: no
    new turn), then the same words after an answer (a new turn)."""
    path, turn, tool = BODIES[kind]
    for body, headers in (
        (turn, {}),
        (tool, {}),
        (turn, {"X-Claude-Code-Agent-Id": "explorer"}),
        (turn, {}),
        (next_turn(kind, tool), {}),
    ):
        r = app.post(path, json={"model": "tiny"} | body, headers=AUTH | {"X-Claude-Code-Session-Id": "cc-1"} | headers)
        assert r.status_code == 200, r.text
    metas = app.backend.metas
    assert all(m.session and m.agent_id.endswith("/cc-1") for m in metas)
    assert [m.turn_start for m in metas] == [True, False, False, False, True]
    (doc,) = app.get("/v1/sessions", headers=AUTH).json()["data"]
    assert (doc["requests"], doc["turns"], doc["subagents"]) == (5, 2, ["explorer"])
    assert app.backend.book.agent(metas[0].agent_id).info.session  # the engine's book took it as a session


def test_completions_have_no_turns(app):
    r = app.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
        headers=AUTH | {"X-Session-ID": "s-1"},
    )
    assert r.status_code == 200, r.text
    (meta,) = app.backend.metas
    assert meta.session and not meta.turn_start
    assert app.get("/v1/sessions", headers=AUTH).json()["data"][0]["turns"] == 0


@pytest.mark.parametrize(
    "headers, body",
    [
        ({"X-Session-ID": "s"}, {}),
        ({}, {"session_id": "s"}),
        ({}, {"prompt_cache_key": "s"}),
        ({}, {"user": "s"}),
        ({"X-Claude-Code-Session-Id": "s"}, {}),
    ],
)
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
    (plain,) = app.backend.metas
    assert plain.agent_id.endswith("/a") and not plain.session and not plain.turn_start  # a user message or not
    app.post(
        "/v1/chat/completions",
        json=chat | {"vllm_xargs": xargs | {"session": True, "turn_start": True}},
        headers=AUTH | headers,
    )
    said = app.backend.metas[1]
    assert said.session and said.turn_start  # its client's own (they are not prices)
    (doc,) = app.get("/v1/sessions", headers=AUTH).json()["data"]
    assert (doc["requests"], doc["turns"]) == (2, 1)


def test_an_unnamed_request_is_no_session(app):
    app.post("/v1/chat/completions", json={"model": "tiny", "messages": [USER], "max_tokens": 2}, headers=AUTH)
    (meta,) = app.backend.metas
    assert meta.agent_id is None and not meta.session and not meta.turn_start and meta.agent_done


@pytest.mark.parametrize("key", ["session", "turn_start"])
def test_a_session_flag_that_is_not_a_boolean_is_a_400_naming_it(app, key):
    r = app.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [USER], "max_tokens": 2, "vllm_xargs": {key: "yes"}},
        headers=AUTH,
    )
    assert r.status_code == 400 and f"vllm_xargs.{key}" in r.json()["error"]["message"], r.text
    assert app.backend.metas == []


def test_the_session_keep_time_is_a_setting_with_a_clear_error():
    assert policy_settings({}).session_keep_s == SESSION_KEEP_S == 600.0
    assert policy_settings({"JUSTITIA_SESSION_KEEP_S": "30"}).session_keep_s == 30.0
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match=f"JUSTITIA_SESSION_KEEP_S='{bad}': expected a finite number >= 0"):
            policy_settings({"JUSTITIA_SESSION_KEEP_S": bad})


def test_the_benchs_door_runs_shape_their_calls_as_a_harness_does():
    """``lab.live.door``: a call that opens a turn ends with the user's message, one after a tool pause
    with a tool's result; the door reads them so, and the turns' openers differ."""
    from justitia.lab.live.door import messages
    from justitia.server.identity import turn_opener

    first, inside = messages("context ", "turn one", True), messages("context turn one", " tool said", False)
    assert opens_turn("chat", {"messages": first}) and not opens_turn("chat", {"messages": inside})
    assert turn_opener("chat", {"messages": first}) != turn_opener(
        "chat", {"messages": messages("c", "turn two", True)}
    )


def test_a_door_run_reads_the_engines_prefix_cache_hits_from_the_doors_metrics():
    """``lab.live.door.door_prefix_cache``: the door's counters of its requests' prompt tokens and the
    tokens vLLM's cache held, summed over models; none counted (the cache off) is no report."""
    from justitia.lab.live.door import door_prefix_cache

    text = (
        'justitia_prefix_cache_queries_total{model_name="tiny"} 1000\n'
        'justitia_prefix_cache_hits_total{model_name="tiny"} 600\n'
        'justitia_prefix_cache_queries_total{model_name="other"} 1000\n'
        'justitia_prefix_cache_hits_total{model_name="other"} 200\n'
        'vllm:prefix_cache_queries_total{model_name="tiny"} 99999\n'
    )
    assert door_prefix_cache(text) == {"queried_tokens": 2000, "hit_tokens": 800, "hit_rate": 0.4}
    assert door_prefix_cache('justitia_prefix_cache_queries_total{model_name="tiny"} 0\n') is None


def test_the_door_tells_the_engine_a_turn_ended_when_an_answer_calls_no_tool(app):
    """The engine learns a turn's cost when the door sees it end: an answer to a step of the turn
    (its opening request, or one after a tool's result) that calls no tool, streamed or not; an
    answer that calls one, a retry of the turn's opener, a subagent's request or an agent's (not a
    session's) ends nothing."""
    path, turn, tool = BODIES["chat"]
    headers = AUTH | {"X-Claude-Code-Session-Id": "cc-1"}
    app.backend.tool_calls = True  # the turn's first answer calls a tool
    assert app.post(path, json={"model": "tiny"} | turn, headers=headers).status_code == 200
    assert app.backend.ended == []
    app.backend.tool_calls = False
    for body, more in ((turn, {}), (turn, {"X-Claude-Code-Agent-Id": "explorer"})):  # a retry; a subagent
        assert app.post(path, json={"model": "tiny"} | body, headers=headers | more).status_code == 200
    assert app.post(path, json={"model": "tiny"} | tool, headers=AUTH | {"X-Agent-Id": "a"}).status_code == 200
    assert app.backend.ended == []
    assert app.post(path, json={"model": "tiny"} | tool, headers=headers).status_code == 200  # the tool's result
    session = app.backend.metas[0].agent_id
    assert app.backend.ended == [session]
    streamed = next_turn("chat", tool) | {"model": "tiny", "stream": True}
    r = app.post(path, json=streamed, headers=headers)
    assert r.status_code == 200 and "[DONE]" in r.text
    assert app.backend.ended == [session, session]


def test_a_bench_answer_that_stands_for_a_tool_call_ends_no_turn_and_only_a_trusted_key_says_so(tmp_path):
    """``justitia_answer_calls_tool`` (the door bench's, ``lab.live.door.goes_on``): the door reads it
    and the engine never sees it; from a key that is not trusted it is a 400 naming the field."""
    path, turn, _ = BODIES["chat"]
    says = {"model": "tiny", "vllm_xargs": {"justitia_answer_calls_tool": True}} | turn
    with door_app(tmp_path, f"{KEY}\nsk-door-trusted bench 1 trusted\n") as client:
        r = client.post(path, json=says, headers=auth("sk-door-trusted") | {"X-Session-ID": "s"})
        assert r.status_code == 200 and client.backend.ended == []
        assert "justitia_answer_calls_tool" not in client.backend.metas[0].to_extra_args()
        r = client.post(path, json=says, headers=AUTH | {"X-Session-ID": "s"})
        assert r.status_code == 400 and "vllm_xargs.justitia_answer_calls_tool" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "answer, calls",
    [
        (b'{"choices": [{"message": {"content": "done", "tool_calls": []}, "finish_reason": "stop"}]}', False),
        (b'{"choices": [{"message": {"content": "tool_calls", "tool_calls": [{"id": "c"}]}}]}', True),
        (b'{"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}', True),
        (b'{"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}', True),
        (b'{"content": [{"type": "text", "text": "the tool_use said"}], "stop_reason": "end_turn"}', False),
        (b'{"content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}], "stop_reason": "tool_use"}', True),
        (b'{"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1"}}', True),
        (b'{"type": "message_delta", "delta": {"stop_reason": "tool_use"}}', True),
        (b'{"output": [{"type": "function_call", "call_id": "c1", "name": "w"}], "parallel_tool_calls": true}', True),
        (b'{"output": [{"type": "message"}], "tools": [{"type": "function"}], "parallel_tool_calls": true}', False),
        (b'{"not json, with a tool', True),  # unread: the turn is not taken to have ended
    ],
)
def test_what_counts_as_an_answer_that_calls_a_tool(answer, calls):
    from justitia.server.door import calls_tool

    assert calls_tool(answer) is calls


def test_an_answer_ends_its_turn_only_when_it_is_whole_a_200_and_no_stream_event_calls_a_tool_or_fails():
    from justitia.server.door import AnswerWatch

    def watched(status, body_parts, stream=False):
        watch = AnswerWatch()
        kind = b"text/event-stream" if stream else b"application/json"
        watch.see({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
        for i, part in enumerate(body_parts):
            watch.see({"type": "http.response.body", "body": part, "more_body": i < len(body_parts) - 1})
        return watch.ends_turn

    plain = b'{"choices": [{"message": {"content": "done"}}]}'
    assert watched(200, [plain[:9], plain[9:]]) and not watched(400, [plain]) and not watched(200, [plain[:9], b""])
    events = [
        b'data: {"choices": [{"delta": {"content": "do"}}]}\n\ndata: {"choices": [{"del',
        b'ta": {"tool_calls": [{"index": 0}]}}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    assert not watched(200, events, stream=True)  # the tool call split across two chunks
    assert watched(200, [events[0].split(b"\n\n")[0] + b"\n\n", events[2]], stream=True)
    assert not watched(200, [b'data: {"error": {"message": "the engine died"}}\n\n'], stream=True)


def test_the_benchs_door_runs_send_one_cap_whatever_the_answer_clipped_to_the_context():
    """``lab.live.door.cap``: ``max_tokens`` reads the prompt's length and the context, never the answer."""
    from justitia.lab.live.door import MAX_TOKENS, TEMPLATE_SLACK, cap

    assert cap(100, 2048) == MAX_TOKENS
    assert cap(1500, 2048) == 2048 - 1500 - TEMPLATE_SLACK


def test_the_benchs_door_runs_say_which_answers_stand_for_a_tool_call():
    """``lab.live.door.goes_on``: every answer of a turn but those of its last stage (a subagent's
    branch's included) stands for a tool call; the last stage's ends the turn."""
    from types import SimpleNamespace

    from helpers import session

    from justitia.lab.live.door import goes_on

    s = session()  # turn 0: stages 0-3 (a fork of two subagents at 2), turn 1: stage 4
    said = {
        (st, i): goes_on(s, SimpleNamespace(stage=st, index=i, turn=0 if st < 4 else 1))
        for st, i in s.turn_calls(0) + s.turn_calls(1)
    }
    assert said == {(0, 0): True, (1, 0): True, (2, 0): True, (2, 1): True, (2, 2): True, (3, 0): False, (4, 0): False}


def test_the_labs_servers_start_without_the_callers_saved_pricing_state(monkeypatch, tmp_path):
    """A bench's ``justitia serve`` (a door run's) starts from nothing learned whatever the caller's
    shell keeps in ``JUSTITIA_PRICING_STATE``; a launch that names a state file keeps it; a door run
    that names a step log has its engine told where to write it. Nothing starts."""
    from justitia.engine.launch import EngineSpec
    from justitia.lab.live import servers
    from justitia.lab.live.door import door_server

    class NotStarted:
        def __init__(self, cmd, env=None, **_):
            launched.append((cmd, env))

        def poll(self):
            return 1  # exited at once: start() gives up without waiting

        def kill(self):
            pass

    launched = []
    monkeypatch.setattr(servers.subprocess, "Popen", NotStarted)
    monkeypatch.setattr(servers.tempfile, "tempdir", str(tmp_path))  # the key file and journal it writes
    monkeypatch.setenv("JUSTITIA_PRICING_STATE", "/home/me/kept.pricing.json")
    with pytest.raises(SystemExit):
        door_server("justitia", EngineSpec())
    with pytest.raises(SystemExit):
        servers.start_server(journal=False, env={"JUSTITIA_PRICING_STATE": "/tmp/this-run.json"})
    with pytest.raises(SystemExit):  # a bench's door run: its engine logs its steps where the bench reads them
        door_server("justitia", EngineSpec(), tmp_path / "steps.csv")
    (door, door_env), (_, asked), (_, logged) = launched
    assert "serve" in door and "JUSTITIA_PRICING_STATE" not in door_env and door_env["PATH"]
    assert asked["JUSTITIA_PRICING_STATE"] == "/tmp/this-run.json"
    assert "JUSTITIA_STEP_LOG" not in door_env and logged["JUSTITIA_STEP_LOG"] == str(tmp_path / "steps.csv")
