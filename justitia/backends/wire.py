"""What a backend and the server both put on the wire: errors in each endpoint's own shape, the
text a prompt is made of (to price a body before any engine tokenized it), and two ASGI helpers.

It sits below the server and the backends alike, so that a backend answering an endpoint itself
(``Backend.forward``) writes the same errors as the server's door.
"""

from __future__ import annotations

PROMPT_FIELDS = ("messages", "prompt", "input", "system", "instructions", "tools")


def error_doc(kind: str, status: int, message: str, param: str | None = None) -> dict:
    """An error in the endpoint's own shape: Anthropic's for /v1/messages, OpenAI's elsewhere."""
    if kind == "messages":
        kinds = {401: "authentication_error", 429: "rate_limit_error", 501: "api_error", 503: "overloaded_error"}
        return {"type": "error", "error": {"type": kinds.get(status, "invalid_request_error"), "message": message}}
    kinds = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_exceeded",
             501: "not_implemented", 503: "overloaded"}
    return {"error": {"message": message, "type": kinds.get(status, "invalid_request_error"), "param": param,
                      "code": status}}


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
