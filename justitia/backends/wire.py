"""What a backend and the server both use on the wire: the text a prompt is made of (to price a body
before any engine tokenized it, or to route it by its prefix) and two ASGI helpers. It sits below
the server and the backends alike. The errors a client reads are the server's (``server.errors``):
a backend that refuses a request raises ``ForwardRefused`` (``base``).
"""

from __future__ import annotations

PROMPT_FIELDS = ("messages", "prompt", "input", "system", "instructions", "tools")


def once(fn):
    """``fn`` that runs on its first call only (a count released on whichever way a request ends)."""
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call


def replay(body: bytes, after):
    """An ASGI ``receive`` that gives ``body``, read already, then whatever ``after()`` gives (the
    client's own next message, its disconnect)."""
    given = False

    async def receive():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await after()

    return receive


def strings(value, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            strings(v, out)
    elif isinstance(value, list):
        for v in value:
            strings(v, out)


def prompt_text(doc: dict) -> str:
    """The text a request's prompt is made of (its template's tokens left out)."""
    out: list[str] = []
    for name in PROMPT_FIELDS:
        strings(doc.get(name), out)
    return "\n".join(out)
