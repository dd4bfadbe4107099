"""Turn detection from what agent harnesses really send: requests captured from Claude Code 2.1.332,
Codex CLI 0.171.0 and OpenCode 1.18.33 (``tests/data/harness``: their headers and body shapes, texts cut short, no
key), each run against a loopback server that recorded them (docs/sessions.md, "Harnesses")."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from justitia.server.identity import harness_turn, identify, opens_turn, turn_opener
from justitia.server.limits import INFERENCE_PATHS

CAPTURED = Path(__file__).parents[1] / "data" / "harness"
# file -> whether it opens a user turn
EXPECTED = {
    "claude-code-turn-1.json": True,
    "claude-code-turn-2.json": True,  # ends with a mid-conversation system message after the user's
    "claude-code-tool-turn-1.json": True,  # so does this first turn
    "claude-code-tool-result.json": False,  # the Bash tool's result: inside turn 1
    "claude-code-tool-turn-2.json": True,
    "claude-code-subagent.json": False,  # a subagent's request (x-claude-code-agent-id): inside its turn
    "claude-code-notification.json": False,  # a background subagent's end, as <system-reminder> blocks
    "opencode-title.json": True,  # its title request: the door counts it or the agent's, not both (below)
    "opencode-turn-1.json": True,
    "opencode-tool-result.json": False,  # the bash tool's result (role "tool")
    "opencode-turn-2.json": True,
    "opencode-subagent.json": False,  # the task tool's child session, a subagent under X-Parent-Session-Id
    "codex-turn-1.json": True,
    "codex-turn-2.json": True,
}


def load(name: str) -> tuple[str, dict, dict]:
    doc = json.loads((CAPTURED / name).read_text())
    return INFERENCE_PATHS[urlsplit(doc["path"]).path], doc["headers"], doc["body"]


def test_every_capture_is_listed():
    assert sorted(p.name for p in CAPTURED.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_captured_request_opens_a_turn_exactly_when_its_harness_began_one(name):
    kind, headers, body = load(name)
    who = identify(headers, body, "key")
    assert who.session and who.agent_id is not None  # each harness names its session
    assert opens_turn(kind, body, who.subagent, headers) is EXPECTED[name]


def test_one_session_across_a_harness_continuing_it():
    for group in (
        ("claude-code-turn",),
        ("claude-code-tool",),
        ("claude-code-subagent", "claude-code-notification"),
        ("codex-turn",),
        ("opencode",),
    ):
        ids = {identify(load(n)[1], load(n)[2], "key").agent_id for n in EXPECTED if n.startswith(group)}
        assert len(ids) == 1, group


def test_claude_codes_trailing_system_message_is_what_hid_its_turns():
    kind, headers, body = load("claude-code-turn-2.json")
    assert body["messages"][-1]["role"] == "system" and body["messages"][-2]["role"] == "user"
    assert not opens_turn(kind, dict(body, messages=body["messages"] + [{"role": "assistant", "content": "Sure"}]))


def test_codex_turn_metadata_says_which_requests_are_a_turns_steps():
    kind, headers, body = load("codex-turn-2.json")
    assert harness_turn(headers) == "turn"
    meta = json.loads(headers["x-codex-turn-metadata"])
    other = dict(headers, **{"x-codex-turn-metadata": json.dumps(dict(meta, request_kind="compaction"))})
    assert not opens_turn(kind, body, None, other)  # not a step of a user turn, whatever its body ends with
    for bad in ("{", "[]", json.dumps({"request_kind": 3}), "x" * 20_000):  # the body decides then
        assert harness_turn({"x-codex-turn-metadata": bad}) is None
        assert opens_turn(kind, body, None, {"x-codex-turn-metadata": bad})


def test_a_user_message_of_harness_reminders_alone_is_not_the_users():
    """Claude Code tells the model that a background subagent ended in a user message made only of
    <system-reminder> blocks; a user message with the user's own text beside reminders is a turn."""
    kind, headers, body = load("claude-code-notification.json")
    note = body["messages"][-1]
    assert note["role"] == "user" and all(p["text"].startswith("<system-reminder>") for p in note["content"])
    spoken = dict(note, content=note["content"] + [{"type": "text", "text": "And now?"}])
    assert opens_turn(kind, dict(body, messages=body["messages"][:-1] + [spoken]), None, headers)
    for kind, key in (("chat", "messages"), ("responses", "input")):  # the same rule on every endpoint
        assert not opens_turn(kind, {key: [{"role": "user", "content": "<system-reminder>\nthe task ended"}]})
        assert opens_turn(kind, {key: [{"role": "user", "content": "the task ended"}]})


def test_opencodes_title_request_and_its_agents_first_open_one_turn_and_its_child_session_is_a_subagent():
    """OpenCode asks for a title with the user's first message while its agent answers it: the same
    opener, so the door counts one turn (a retry is the same case); its task tool's child session
    names the parent in X-Parent-Session-Id and runs as a subagent of it."""
    openers = {
        n: turn_opener(*load(n)[::2]) for n in ("opencode-title.json", "opencode-turn-1.json", "opencode-turn-2.json")
    }
    assert openers["opencode-title.json"] == openers["opencode-turn-1.json"] != openers["opencode-turn-2.json"]
    _, headers, body = load("opencode-subagent.json")
    who = identify(headers, body, "key")
    assert who.given == headers["x-parent-session-id"] and who.subagent == headers["x-session-id"] != who.given
    assert who.source == "X-Parent-Session-Id" and who.session
