"""The server's app in process, over a backend that records what reaches it (no engine), and what
its tests share besides: a key's headers (``auth``) and an agent polled until it ends (``settle``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from justitia.backends.base import Backend, BackendError, BackendInterrupted
from justitia.core import AgentBook, RequestMeta


def auth(key: str) -> dict:
    """The headers that present ``key`` as a Bearer token."""
    return {"Authorization": f"Bearer {key}"}


def settle(client, agent_id: str, key: str | None = None) -> dict:
    """Poll the agent (with ``key``'s Bearer token, if given) until it ends; its document."""
    headers = auth(key) if key else {}
    deadline = time.time() + 60
    while (doc := client.get(f"/v1/agents/{agent_id}", headers=headers).json())["status"] not in (
        "done",
        "failed",
        "cancelled",
    ):
        assert time.time() < deadline, doc
        time.sleep(0.01)
    return doc


class WordTokenizer:
    """One token a word; with ``chat``, a chat template that just joins the messages' words."""

    def __init__(self, chat: bool = False):
        self.chat_template = "words" if chat else None

    def encode(self, text):
        return list(range(1, len(text.split()) + 1))

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=True):
        return self.encode(" ".join(m["content"] for m in messages) + " assistant:")


class RecordingBackend(Backend):
    """Answers every request with one token (with ``tool_calls``, a forwarded one calls a tool);
    keeps each request's metadata, each registration and each turn the door saw end.
    Its book runs ``policy`` at ``capacity`` (its clock's M); every event is at t=0, and ``state``
    reads the book at ``state_at`` seconds."""

    model, tokenizer_dir, kv_tokens, max_model_len = "tiny", Path("."), 4096, 512

    def __init__(self, policy: str = "justitia", capacity: float = 1000.0, state_at: float = 0.0):
        self.policy, self.state_at = policy, state_at
        self.book = AgentBook.for_policy(policy, capacity)
        self.metas: list[RequestMeta] = []
        self.registered: list[tuple] = []
        self.gate = threading.Event()  # cleared: requests wait (in flight) until it is set
        self.gate.set()
        self.dead = False  # True: the engine has died
        self.cuts = 0  # so many of the next requests fail midway (a replica lost after its first token)
        self.request_ids: list[str] = []
        self.register_failures = 0  # so many of the next registrations fail
        self.tool_calls = False  # True: a forwarded request's answer calls a tool
        self.ended: list[str] = []  # the sessions whose turn the door saw end (turn_ended), in order

    async def generate(self, prompt, params, request_id):
        if not self.gate.is_set():
            await asyncio.to_thread(self.gate.wait)
        if self.dead:
            raise BackendError("the engine core died")
        self.request_ids.append(request_id)
        if self.cuts:
            self.cuts -= 1
            raise BackendInterrupted("the replica's stream was cut midway")
        meta = RequestMeta.parse(params.extra_args)
        self.metas.append(meta)
        self.book.arrive(request_id, meta, len(prompt["prompt_token_ids"]), params.max_tokens, 0.0)
        self.book.finish(request_id, 0.0)
        yield SimpleNamespace(outputs=[SimpleNamespace(text="ok", token_ids=[7], finish_reason="length")])

    async def forward(self, path, kind, doc, prompt_tokens, max_tokens, request_id):
        """An OpenAI-shaped answer of one token; the request's metadata kept, as ``generate`` keeps it."""
        from starlette.responses import JSONResponse, StreamingResponse

        if not self.gate.is_set():
            await asyncio.to_thread(self.gate.wait)
        self.request_ids.append(request_id)
        meta = RequestMeta.parse(doc.get("vllm_xargs"))
        self.metas.append(meta)
        self.book.arrive(request_id, meta, prompt_tokens, max_tokens, 0.0)
        self.book.finish(request_id, 0.0)
        choice = {"index": 0, "text": "ok", "finish_reason": "length"}
        if self.tool_calls:
            call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        answer = {"id": request_id, "object": "text_completion", "model": doc.get("model"), "choices": [choice]}
        if doc.get("stream"):

            async def chunks():
                yield f"data: {json.dumps(answer)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse(answer)

    async def register(self, reg):
        if self.register_failures:  # the engine cannot take an agent now
            self.register_failures -= 1
            raise BackendError("the engine is busy")
        self.registered.append((reg.agent_id, reg.weight, reg.tenant))
        self.book.register(replace(reg, dist=None), 0.0)
        return self.book.virtual_finish(reg.agent_id)

    async def retire(self, agent_id, pause=False):
        if pause:
            self.book.pause(agent_id, 0.0)
        else:
            self.book.release(agent_id, 0.0)

    async def turn_ended(self, agent_id):
        self.ended.append(agent_id)

    async def state(self, detail=False, bound_s=None):
        return self.book.state(self.state_at, detail, bound_s)

    def unfinished(self):
        return 0

    def alive(self):
        return not self.dead


def open_app(backend, settings, keyring, journal=None):
    """The server's app in process over ``backend`` (a ``RecordingBackend``), entered: a
    ``TestClient`` with ``backend``, ``manager`` and ``journal`` on it; ``close_app`` ends it."""
    from fastapi.testclient import TestClient

    from justitia.gateway.app import create_app
    from justitia.predictors import make_predictor

    app = create_app(backend, WordTokenizer(), settings, make_predictor("oracle"), keyring, journal)
    client = TestClient(app).__enter__()
    client.backend, client.manager, client.journal = backend, app.state.manager, journal
    return client


def close_app(client) -> None:
    """End an ``open_app`` client: requests held at the backend's gate go on, then its journal closes."""
    client.backend.gate.set()
    client.__exit__(None, None, None)
    if client.journal is not None:
        client.journal.close()


@contextlib.contextmanager
def app_opener(tmp_path, keys: str):
    """``open_app`` with the key file ``keys`` (one key per line, as ``KeyRing`` reads it): yields
    ``opener(backend, settings, journal=None, keyring=None)``, which opens an app over ``backend``
    (with ``keyring`` in place of the file's keys, if given); every app it opened is closed
    (``close_app``) at the end."""
    from justitia.server.keys import KeyRing

    path = tmp_path / "keys.txt"
    path.write_text(keys)
    opened = []

    def opener(backend, settings, journal=None, keyring=None):
        client = open_app(backend, settings, KeyRing.load(path=path) if keyring is None else keyring, journal)
        opened.append(client)
        return client

    yield opener
    for client in opened:
        close_app(client)


@contextlib.contextmanager
def door_app(tmp_path, keys: str):
    """The front end's app in process over a ``RecordingBackend`` (``client.backend``), with the
    key file ``keys`` (one key per line, as ``KeyRing`` reads it)."""
    from fastapi.testclient import TestClient

    from justitia.gateway.app import Settings, create_app
    from justitia.predictors import make_predictor
    from justitia.server.keys import KeyRing

    path = tmp_path / "keys.txt"
    path.write_text(keys)
    backend = RecordingBackend()
    application = create_app(
        backend,
        WordTokenizer(chat=True),
        Settings(max_model_len=512, key_requests_in_flight=10),
        make_predictor("oracle"),
        KeyRing.load(None, path),
    )
    with TestClient(application) as client:
        client.backend = backend
        yield client
