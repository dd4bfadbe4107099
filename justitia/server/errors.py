"""What a refused request looks like on Justitia's HTTP surface: an error in each endpoint's own
shape (``error_doc``: Anthropic's for ``/v1/messages``, OpenAI's elsewhere) and its plain ASGI
answer (``answer``). The door writes them (``door``, ``limits``), and so does a front end for what
its backend refuses (``justitia.gateway.forward``: ``ForwardRefused``)."""

from __future__ import annotations

import json


def error_doc(kind: str, status: int, message: str, param: str | None = None) -> dict:
    """An error in the endpoint's own shape: Anthropic's for /v1/messages, OpenAI's elsewhere."""
    if kind == "messages":
        kinds = {401: "authentication_error", 429: "rate_limit_error", 501: "api_error", 503: "overloaded_error"}
        return {"type": "error", "error": {"type": kinds.get(status, "invalid_request_error"), "message": message}}
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        429: "rate_limit_exceeded",
        501: "not_implemented",
        503: "overloaded",
    }
    return {
        "error": {
            "message": message,
            "type": kinds.get(status, "invalid_request_error"),
            "param": param,
            "code": status,
        }
    }


async def answer(send, status: int, doc: dict, headers: list | None = None) -> None:
    body = json.dumps(doc).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
