"""The door, as plain ASGI middleware (FastAPI's own middleware wraps ``receive`` in ways that
turn an error raised while reading a body into a 400): ``Authenticate`` (a key on every ``/v1/``
route) and ``BodyLimit`` (the request body, counted on the bytes received).

``BodyLimit`` is plain ASGI middleware. A ``Content-Length`` over the limit is refused without
reading the body into memory; otherwise (a chunked body, or a ``Content-Length`` that lies) the
bytes are counted as they arrive and the request is refused with 413 as soon as they pass the
limit. Either way the rest of the body is read and dropped first (within ``DRAIN_BYTES`` and
``DRAIN_S``), so that every common client reads the 413 rather than a reset connection.
"""

from __future__ import annotations

import json
import math
import time

from starlette.exceptions import HTTPException

from justitia.server.errors import answer, error_doc


class BodyTooLarge(HTTPException):
    """Raised from the request's ``receive`` once its body passes the limit. An HTTPException, so
    that FastAPI's body parsing lets it through (it turns any other error into a 400); the app
    answers it with ``body_too_large``."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body has more than {limit} bytes, this server's limit.")


def body_too_large(request, exc: BodyTooLarge):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": exc.detail}, status_code=413, headers={"connection": "close"})


INFERENCE_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/chat/completions/batch": "chat",
    "/inference/v1/generate": "generate",
}


KEYED_PATHS = ("/justitia/state",)  # beside every /v1/ path: what a key must be sent to (the page itself is open)


class Authenticate:
    """Every ``/v1/`` route, and the live page's state (``KEYED_PATHS``), needs a client ``keys`` knows (401
    otherwise, before the body is read);
    the client goes to ``request.state.client``. The key comes as ``Authorization: Bearer KEY``
    (OpenAI's and vLLM's way) or, with no ``Authorization`` header, as Anthropic's ``x-api-key: KEY``
    (what Claude Code sends with ``ANTHROPIC_API_KEY``)."""

    def __init__(self, app, keys):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (scope["path"].startswith("/v1/") or scope["path"] in KEYED_PATHS):
            headers = dict(scope["headers"])
            header = headers.get(b"authorization", b"").decode("latin-1")
            if not header and b"x-api-key" in headers:
                header = "Bearer " + headers[b"x-api-key"].decode("latin-1")
            client = self.keys.authenticate(header)
            if client is None:
                message = "a valid API key is required: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')."
                kind = INFERENCE_PATHS.get(scope["path"], "models" if scope["path"] == "/v1/models" else None)
                doc = {"error": message} if kind is None else error_doc(kind, 401, message)
                return await answer(send, 401, doc, [(b"www-authenticate", b"Bearer")])
            scope.setdefault("state", {})["client"] = client
        await self.app(scope, receive, send)


MAX_JSON_DEPTH = 64  # arrays and objects inside one another, in any body Justitia parses


class JsonTooDeep(ValueError):
    """A JSON document nested past ``MAX_JSON_DEPTH``."""

    def __init__(self) -> None:
        super().__init__(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels, this server's limit.")


def load_json(raw: bytes | str):
    """``json.loads`` with nesting capped at ``MAX_JSON_DEPTH`` (``JsonTooDeep``, a ValueError, past
    it). Python's parser recurses once a level and fails past its stack's limit with a
    RecursionError (a 500); the cap is checked without recursion, and only walks the document when
    it holds more brackets than the cap."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise JsonTooDeep() from None
    opening = raw.count(b"[") + raw.count(b"{") if isinstance(raw, bytes) else raw.count("[") + raw.count("{")
    if opening <= MAX_JSON_DEPTH:
        return doc
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise JsonTooDeep()
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return doc


DRAIN_BYTES = 64 << 20  # the most of a refused body read (and dropped) before the 413, so that the client reads it
DRAIN_S = 10.0  # and for at most this long


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 (JSON ``{"error": ...}``)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def _refuse(self, send, size: str) -> None:
        await answer(
            send,
            413,
            {"error": f"the request body has {size} bytes, more than this server's limit of {self.limit}."},
            [(b"connection", b"close")],
        )

    @staticmethod
    async def _drain(receive, more: bool = True) -> None:
        """Read and drop the rest of a refused body, at most ``DRAIN_BYTES`` within ``DRAIN_S``: a
        server that closes while the client still sends resets the connection, and clients such as
        Python's ``urllib`` then see the reset, not the 413."""
        import asyncio

        loop = asyncio.get_running_loop()
        deadline, dropped = loop.time() + DRAIN_S, 0
        while more and dropped < DRAIN_BYTES:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            more = message.get("more_body", False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await self._drain(receive)
            return await self._refuse(send, length.decode())
        received, started = 0, False

        async def counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    await self._drain(receive, message.get("more_body", False))
                    raise BodyTooLarge(self.limit)
            return message

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:  # raised where no handler answered it
            if not started:
                await self._refuse(send, f"more than {self.limit}")


class RateLimit:
    """A token bucket per owner: ``rate`` requests a second, bursts of ``burst``; 0: no limit."""

    def __init__(self, rate: float, burst: int = 0, clock=time.monotonic):
        self.rate, self.burst = rate, float(burst or max(1, math.ceil(rate)))
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # owner -> (tokens, when)

    def take(self, owner: str) -> float | None:
        """Take one request's token: None if granted, else the seconds until one is (Retry-After)."""
        if self.rate <= 0:
            return None
        now = self.clock()
        tokens, when = self._buckets.get(owner, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens >= 1:
            self._buckets[owner] = (tokens - 1, now)
            return None
        self._buckets[owner] = (tokens, now)
        return (1 - tokens) / self.rate


def retry_after(seconds: float) -> dict[str, str]:
    """The ``Retry-After`` header, in whole seconds (at least 1)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def http_with_header_timeout(header_timeout_s: float):
    """uvicorn's HTTP protocol (httptools when installed, as uvicorn's "auto" picks; else h11),
    closing a connection whose request headers have not all arrived ``header_timeout_s`` after it
    opened or after its previous response (uvicorn itself waits forever for them: a hundred idle
    half-requests would hold a hundred connections)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
    except ImportError:  # pragma: no cover (httptools is not installed)
        from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol

    class HeaderTimeout(Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self._waiting_for_headers():
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)
            super().data_received(data)
            if self._header_timer is not None and not self._waiting_for_headers():
                self._header_timer.cancel()  # a request's headers are in
                self._header_timer = None

        def connection_lost(self, exc) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

    return HeaderTimeout
