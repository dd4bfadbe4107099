"""Which agent (later: which session) an OpenAI or Anthropic request belongs to, read from the
headers and fields agent harnesses already send.

``SOURCES`` is the table, highest precedence first; the first one a request carries names its
agent. ``X-Claude-Code-Agent-Id`` names a subagent inside the session. Every id is checked (a
string of 1-256 printable characters; 400 naming the header or field otherwise) and lives in the
key's own namespace (``owner/id``): two keys sending the same id name two agents, so an id is
used for correlation only, never to authorize anything. A request that carries none is an agent of
its own. docs/server.md, "Who a request belongs to", has the table for users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

MAX_ID_CHARS = 256

# (where, name, what it names, who sends it), highest precedence first
SOURCES: tuple[tuple[str, str, str, str], ...] = (
    ("header", "X-Agent-Id", "agent", "Justitia's own"),
    ("field", "vllm_xargs.agent_id", "agent", "Justitia's own, through vLLM's extra-args field"),
    ("field", "session_id", "session", "vLLM's native session field"),
    ("header", "X-Session-ID", "session", "vLLM's native session header; llm-d, SGLang-style routers"),
    ("header", "X-Claude-Code-Session-Id", "session", "Claude Code, on every request"),
    ("field", "prompt_cache_key", "session", "OpenAI's prompt-cache key (Codex, the Agents SDK when set)"),
    ("field", "user", "session", "OpenAI's end-user id"),
)
SUBAGENT_HEADER = "X-Claude-Code-Agent-Id"  # a subagent of the session (Claude Code's Task tool)


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
    for where, name, _, _ in SOURCES:
        value = _lookup(where, name, headers, body)
        if value is None or (where == "field" and name == "user" and value == ""):
            continue
        text = checked_id(value, f"{where} '{name}'")
        if found is None:
            found = (text, name)
    sub = headers.get(SUBAGENT_HEADER.lower())
    subagent = checked_id(sub, f"header '{SUBAGENT_HEADER}'") if sub is not None else None
    if found is None:
        return Identity(None, subagent=subagent)
    return Identity(f"{owner}/{found[0]}", found[0], found[1], subagent)
