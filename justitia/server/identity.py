"""Which agent or session an OpenAI or Anthropic request belongs to, and whether it opens a user
turn, read from the headers, fields and bodies agent harnesses already send.

``SOURCES`` is the table, highest precedence first; the first one a request carries names its
agent. ``X-Claude-Code-Agent-Id`` names a subagent inside the session, and so does OpenCode's child
session under ``X-Parent-Session-Id`` (its ``X-Session-ID``). Every id is checked (a
string of 1-256 printable characters; 400 naming the header or field otherwise) and lives in the
key's own namespace (``owner/id``): two keys sending the same id name two agents, so an id is
used for correlation only, never to authorize anything. A request that carries none is an agent of
its own. docs/reference.md, "Who a request belongs to", has the table for users.

A source whose third column is ``session`` names a session (docs/sessions.md): the door marks its
requests ``session`` and reads from each body whether it opens a user turn (``opens_turn``). The
first two name agents and keep agent semantics.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

from justitia.server.limits import load_json

MAX_ID_CHARS = 256

# (where, name, what it names, who sends it), highest precedence first
SOURCES: tuple[tuple[str, str, str, str], ...] = (
    ("header", "X-Agent-Id", "agent", "Justitia's own"),
    ("field", "vllm_xargs.agent_id", "agent", "Justitia's own, through vLLM's extra-args field"),
    ("field", "session_id", "session", "vLLM's native session field"),
    (
        "header",
        "X-Parent-Session-Id",
        "session",
        "OpenCode, on a subagent's requests (their X-Session-ID: the subagent)",
    ),
    ("header", "X-Session-ID", "session", "vLLM's native session header; llm-d, SGLang-style routers"),
    ("header", "X-Claude-Code-Session-Id", "session", "Claude Code, on every request"),
    ("field", "prompt_cache_key", "session", "OpenAI's prompt-cache key (Codex, the Agents SDK when set)"),
    ("field", "user", "session", "OpenAI's end-user id"),
)
SUBAGENT_HEADER = "X-Claude-Code-Agent-Id"  # a subagent of the session (Claude Code's Task tool)
PARENT_HEADER = "X-Parent-Session-Id"  # OpenCode's child session runs as a subagent of this one
SESSION_SOURCES = frozenset(name for _, name, names, _ in SOURCES if names == "session")


class IdentityError(ValueError):
    """A bad id; ``field`` names the header or field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field!s}: {message}")
        self.field = field


@dataclass(frozen=True)
class Identity:
    """A request's agent: ``agent_id`` (namespaced by the key), the raw id, where it came from, and
    the subagent it runs under (if the harness says)."""

    agent_id: str | None  # owner/id, or None: an agent of its own
    given: str | None = None
    source: str | None = None  # the header or field that named it
    subagent: str | None = None
    turn_start: bool = False  # the request opens a user turn (what the door sent on: ``opens_turn``, or the client's)
    opener: str | None = None  # the user's message it opens the turn with (``turn_opener``), if it does
    step: bool = False  # a step of its session's turn (it opens it, or goes on after a tool): its answer may end it

    @property
    def session(self) -> bool:
        """Whether the source that named it names a session (not an agent)."""
        return self.source in SESSION_SOURCES


def checked_id(value, field: str) -> str:
    """``value`` as an id, or IdentityError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise IdentityError(field, f"must be a string, got {type(value).__name__}.")
    text = str(value)
    if not 1 <= len(text) <= MAX_ID_CHARS:
        raise IdentityError(field, f"must be 1-{MAX_ID_CHARS} characters, got {len(text)}.")
    if not text.isprintable():
        raise IdentityError(field, "must be printable characters (no control characters).")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise IdentityError(field, "contains a lone surrogate, which is not valid UTF-8.") from None
    return text


def _lookup(where: str, name: str, headers: Mapping[str, str], body: Mapping):
    if where == "header":
        return headers.get(name.lower())
    if "." in name:
        outer, inner = name.split(".", 1)
        nested = body.get(outer)
        return nested.get(inner) if isinstance(nested, Mapping) else None
    return body.get(name)


def identify(headers: Mapping[str, str], body: Mapping, owner: str) -> Identity:
    """The agent ``body`` (a request's JSON) and ``headers`` (lower-case names) name, in ``owner``'s
    namespace. Every id present is checked, not only the one that wins."""
    found: tuple[str, str] | None = None
    child: str | None = None  # under a parent session: the next session id, OpenCode's child session
    for where, name, names, _ in SOURCES:
        value = _lookup(where, name, headers, body)
        if value is None or (where == "field" and name == "user" and value == ""):
            continue
        text = checked_id(value, f"{where} '{name}'")
        if found is None:
            found = (text, name)
        elif found[1] == PARENT_HEADER and child is None and names == "session":
            child = text
    sub = headers.get(SUBAGENT_HEADER.lower())
    subagent = checked_id(sub, f"header '{SUBAGENT_HEADER}'") if sub is not None else child
    if found is None:
        return Identity(None, subagent=subagent)
    return Identity(f"{owner}/{found[0]}", found[0], found[1], subagent)


def _last(items) -> Mapping | None:
    """The last element of a list, if it is an object."""
    if isinstance(items, list) and items and isinstance(items[-1], Mapping):
        return items[-1]
    return None


CODEX_TURN_HEADER = "x-codex-turn-metadata"  # Codex CLI: JSON with turn_id, request_kind, thread_id, ...
# roles a harness appends after the user's message without it being a reply: Claude Code (2.1.332)
# ends a continued session's request with a mid-conversation "system" message (the model's name);
# OpenAI's chat format calls the same "developer"
TRAILING_ROLES = frozenset({"system", "developer"})
# Claude Code (2.1.332) also tells the model of a background subagent's end in a message of role
# "user" made only of <system-reminder> blocks ("[SYSTEM NOTIFICATION - NOT USER INPUT]"): the
# harness speaks there, not its user
HARNESS_NOTE = "<system-reminder>"


def _harness_note(item: Mapping) -> bool:
    """Whether a user message is only a harness's own reminders (every text in it one)."""
    content = item.get("content")
    if isinstance(content, str):
        return content.lstrip().startswith(HARNESS_NOTE)
    if not isinstance(content, list) or not content:
        return False
    return all(
        isinstance(part, Mapping)
        and part.get("type") in ("text", "input_text")
        and isinstance(part.get("text"), str)
        and part["text"].lstrip().startswith(HARNESS_NOTE)
        for part in content
    )


def _last_spoken(items) -> Mapping | None:
    """The last message of a list that is not a trailing system or developer message, nor a user
    message made only of a harness's reminders."""
    if not isinstance(items, list):
        return None
    for item in reversed(items):
        if not isinstance(item, Mapping):
            return None
        if item.get("role") not in TRAILING_ROLES and not (item.get("role") == "user" and _harness_note(item)):
            return item
    return None


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def turn_opener(kind: str, body: Mapping) -> str | None:
    """A digest of the user's message a turn-opening request ends with, and of how many assistant
    messages come before it. A request that repeats the one that opened its session's current turn
    opens no other: a client's retry, or a harness's side request on the same message (OpenCode
    1.18.33 asks for a title with the user's first message while its agent answers it); the same
    words said again after an answer ("continue") are a new turn."""
    items = body.get("input") if kind == "responses" else body.get("messages")
    if isinstance(items, str):
        said, answers = items, 0
    else:
        last = _last_spoken(items)
        if last is None:
            return None
        said = _text(last.get("content"))
        answers = sum(1 for m in items if isinstance(m, Mapping) and m.get("role") == "assistant")
    return hashlib.blake2b(f"{answers}\n{said}".encode("utf-8", "replace"), digest_size=16).hexdigest()


def harness_turn(headers: Mapping[str, str]) -> str | None:
    """What a harness's own turn metadata says the request is (Codex's ``request_kind``: ``turn``
    for a step of a user turn), or None if it sends none (or sends it malformed: the body decides)."""
    raw = headers.get(CODEX_TURN_HEADER)
    if raw is None or len(raw) > 16_384:
        return None
    try:
        meta = load_json(raw)  # a header nested past the limit is malformed metadata: ignored
    except ValueError:
        return None
    kind = meta.get("request_kind") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) else None


def opens_turn(kind: str, body: Mapping, subagent: str | None = None, headers: Mapping[str, str] | None = None) -> bool:
    """Whether a request (``kind``: the endpoint, as ``limits.INFERENCE_PATHS`` names it) opens a new
    user turn of its session, read from its body as harnesses send it: the conversation ends with the
    user's own message (trailing system or developer messages aside), not a tool's result or an
    assistant's prefill. A subagent's request never does (a subagent runs inside its session's
    turn), nor a completion's (a prompt has no turns), nor one a harness's turn metadata says is not
    a turn's step (``harness_turn``; docs/sessions.md has the table of harnesses)."""
    if subagent is not None:
        return False
    said = harness_turn(headers or {})
    if said is not None and said != "turn":
        return False
    if kind == "chat":  # a tool's result is role "tool" (or the legacy "function")
        last = _last_spoken(body.get("messages"))
        return last is not None and last.get("role") == "user"
    if kind == "responses":  # a string is the user's; a list ends with a user message, not a function_call_output
        given = body.get("input")
        if isinstance(given, str):
            return True
        last = _last_spoken(given)
        return last is not None and last.get("role") == "user" and last.get("type", "message") == "message"
    if kind == "messages":  # Anthropic: a tool's result is a tool_result block in a user message
        last = _last_spoken(body.get("messages"))
        if last is None or last.get("role") != "user":
            return False
        content = last.get("content")
        return not (
            isinstance(content, list)
            and any(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
        )
    return False  # completions, generate: no turn structure
