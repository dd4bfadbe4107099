"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` on the same engine.

A request joins an agent through ``vllm_xargs: {"agent_id": ...}`` (what the ``openai`` client
sends with ``extra_body={"vllm_xargs": {...}}``) or an ``X-Agent-Id`` header; without either it is
an agent of its own. Agent ids live in the key's own namespace (``keys``): two keys naming the same
id name two agents. ``vllm_xargs`` takes only the request-metadata keys
(``core.protocol.RequestMeta``), each a scalar: any client may send ``agent_id``, ``agent_type`` and
``agent_done``; prices and shares (``agent_cost``, ``request_cost``, ``agent_weight``, ``tenant``)
only a trusted key (anyone else: 400 naming the field). The server's predictor prices a request
as a one-task agent, and the key's tenant and weight place it. ``model``, when given, must be the
served model (404, as OpenAI answers). ``stream: true`` answers with server-sent chunks; a
client that disconnects from a stream has its request aborted in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from justitia.core import KV, META_KEYS, PRICE_KEYS, RequestMeta
from justitia.server.backend import BackendError
from justitia.server.keys import client_of
from justitia.server.limits import retry_after
from justitia.server.schema import TYPE_PATTERN, Penalty, Prompt, Seed, Stop, StopWord, Temperature, Text, TopP
from justitia.vllm.models import chat_ids
from justitia.workload import Agent, Task

log = logging.getLogger("justitia.server")


def check_xargs(xargs: dict[str, Any] | None, trusted: bool) -> str | None:
    """Why ``vllm_xargs`` is refused (naming the field), or None if it is fine."""
    for key, value in (xargs or {}).items():
        field = f"vllm_xargs.{key}"
        if key not in META_KEYS:
            return f"field '{field}': unknown key; vllm_xargs takes only {', '.join(META_KEYS)}."
        if key in PRICE_KEYS and not trusted:
            return f"field '{field}': set by the server (its predictor and your key's tenant); only a trusted key may send it."
        if value is not None and not isinstance(value, (str, int, float, bool)):
            return f"field '{field}': must be a string, number or boolean, got {type(value).__name__}."
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            return f"field '{field}': integer out of range."
        if isinstance(value, str) and len(value) > 256:
            return f"field '{field}': longer than 256 characters."
        if isinstance(value, str) and key == "agent_type" and not re.match(TYPE_PATTERN, value):
            return f"field '{field}': 1-64 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-' (it labels metrics)."
        if isinstance(value, float) and not math.isfinite(value):
            return f"field '{field}': must be finite."
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"field '{field}': contains a lone surrogate, which is not valid UTF-8."
    return None


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1
    stop: StopWord | Stop | None = None
    seed: Seed | None = None
    stream: StrictBool = False
    stream_options: dict[str, StrictBool] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    user: Annotated[Text, Field(max_length=256)] | None = None
    ignore_eos: StrictBool = False  # vLLM's extension: generate exactly max_tokens
    vllm_xargs: dict[str, Any] | None = None


class CompletionRequest(_Common):
    """``POST /v1/completions`` (one prompt, n = 1)."""

    prompt: Prompt


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Annotated[StrictStr, Field(pattern=r"^(system|user|assistant|developer|tool|function)$")]
    content: Text
    name: Annotated[Text, Field(max_length=64)] | None = None


class ChatRequest(_Common):
    """``POST /v1/chat/completions`` (text messages, n = 1)."""

    messages: Annotated[list[Message], Field(min_length=1)]


def add_openai_routes(app: FastAPI, manager) -> None:
    """Register the endpoints on ``app``; ``manager`` is the server's AgentManager."""
    settings = manager.settings

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)

    async def answer(req: _Common, ids: list[int], http: Request, chat: bool):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        max_tokens = req.max_completion_tokens or req.max_tokens or (settings.max_model_len - len(ids) if chat else 16)
        if max_tokens < 1:
            return error(400, f"field '{'messages' if chat else 'prompt'}': {len(ids)} prompt tokens fill the model's "
                              f"context of {settings.max_model_len} tokens; nothing is left to generate.")
        if len(ids) + max_tokens > settings.max_model_len:
            return error(400, f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the model's context of "
                              f"{settings.max_model_len} tokens.")
        client = client_of(http)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        given = RequestMeta.parse(req.vllm_xargs, rid, log)
        named = given.agent_id or http.headers.get("x-agent-id")
        if named is not None and not 1 <= len(named) <= 256:
            return error(400, "field 'agent_id': must be 1-256 characters.")
        # the key's own namespace: another key naming the same id names another agent
        agent_id = f"{client.owner}/{named}" if named else f"req-{uuid.uuid4().hex[:12]}"
        agent_type = given.agent_type or "default"
        agent_cost = given.agent_cost if client.trusted else None
        if agent_cost is None:  # priced by the server's predictor, as a one-task agent
            view = Agent(agent_id, agent_type, 0.0, ((Task("", len(ids), max_tokens),),))
            agent_cost = await manager.predicted(lambda: manager.predictor.agent_cost(view, KV))
        weight, tenant = client.weight, client.tenant
        if client.trusted:  # a front end that places its own requests
            weight, tenant = given.agent_weight or weight, given.tenant or tenant
        meta = RequestMeta(agent_id, agent_type, agent_cost, given.request_cost if client.trusted else None,
                           given.agent_done or not named, None if weight == 1 else weight, tenant)
        stream = req.stream
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                                stop=req.stop, presence_penalty=req.presence_penalty,
                                frequency_penalty=req.frequency_penalty, ignore_eos=req.ignore_eos,
                                extra_args=meta.to_extra_args(),
                                output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
        created = int(time.time())
        model = req.model or settings.model
        obj = "chat.completion" if chat else "text_completion"
        manager.count_request("chat" if chat else "completions")
        gen = manager.backend.generate({"prompt_token_ids": ids}, params, rid)
        owner = client.owner

        def hold(n: int) -> None:  # the request is in flight (n = 1) or no longer (n = -1)
            manager.requests_in_flight += n
            manager.owner_requests[owner] = manager.owner_requests.get(owner, 0) + n

        if not stream:
            final = None

            async def consume():
                nonlocal final
                async for out in gen:
                    final = out

            hold(1)
            work = asyncio.ensure_future(consume())
            try:
                while not work.done():  # a client that leaves has its request aborted in the engine
                    await asyncio.wait({work}, timeout=0.5)
                    if not work.done() and await http.is_disconnected():
                        work.cancel()
                        await asyncio.gather(work, return_exceptions=True)
                        log.info(json.dumps({"event": "client_left", "request_id": rid}))
                        return JSONResponse({"error": {"message": "the client left", "type": "client_closed"}},
                                            status_code=499)
                work.result()
            except BackendError as exc:  # the engine failed the request (--upstream: a replica's reason)
                return JSONResponse({"error": {"message": str(exc), "type": "upstream_error"}}, status_code=502)
            finally:
                if not work.done():
                    work.cancel()
                hold(-1)
                await gen.aclose()
            o = final.outputs[0]
            choice = {"index": 0, "finish_reason": o.finish_reason, "logprobs": None}
            choice |= {"message": {"role": "assistant", "content": o.text}} if chat else {"text": o.text}
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(o.token_ids),
                     "total_tokens": len(ids) + len(o.token_ids)}
            return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage}

        async def chunks():
            # a disconnected client stops this generator; closing ``gen`` aborts the request in vLLM
            hold(1)
            try:
                first = True
                async for out in gen:
                    o = out.outputs[0]
                    if chat:
                        delta = {"content": o.text} | ({"role": "assistant"} if first else {})
                        choice = {"index": 0, "delta": delta, "finish_reason": o.finish_reason}
                    else:
                        choice = {"index": 0, "text": o.text, "finish_reason": o.finish_reason, "logprobs": None}
                    first = False
                    doc = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created, "model": model,
                           "choices": [choice]}
                    yield f"data: {json.dumps(doc)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                hold(-1)
                await gen.aclose()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    def refused(req: _Common, http: Request) -> JSONResponse | None:
        """The answer to a request refused at the door, or None."""
        if req.model is not None and req.model not in (settings.model, settings.model.rstrip("/").rsplit("/", 1)[-1]):
            return JSONResponse({"error": {"message": f"The model `{req.model[:100]}` does not exist.",
                                           "type": "NotFoundError", "param": "model", "code": 404}}, status_code=404)
        client = client_of(http)
        why = check_xargs(req.vllm_xargs, client.trusted)
        if why is not None:
            return error(400, why)
        if manager.requests_in_flight >= settings.max_requests_in_flight:
            return JSONResponse({"error": {"message": f"{manager.requests_in_flight} requests are in flight, this "
                                           "server's limit; retry later.", "type": "overloaded", "code": 503}},
                                status_code=503, headers=retry_after(1))
        mine = manager.owner_requests.get(client.owner, 0)
        if mine >= settings.key_requests_in_flight:
            return JSONResponse({"error": {"message": f"your key has {mine} requests in flight, its limit; retry later.",
                                           "type": "rate_limit_exceeded", "code": 429}}, status_code=429,
                                headers=retry_after(1))
        if (wait := manager.rate.take(client.owner)) is not None:
            return JSONResponse({"error": {"message": f"your key's rate limit ({settings.key_rate:g} requests a "
                                           "second); retry later.", "type": "rate_limit_exceeded", "code": 429}},
                                status_code=429, headers=retry_after(wait))
        return None

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": settings.model, "object": "model", "created": int(manager.t_start),
                                            "owned_by": "justitia", "max_model_len": settings.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, http: Request):
        if (no := refused(req, http)) is not None:
            return no
        if len(req.prompt) > settings.max_prompt_chars:
            return error(400, f"field 'prompt': {len(req.prompt)} characters, more than this server's limit of "
                              f"{settings.max_prompt_chars}.")
        return await answer(req, await asyncio.to_thread(manager.tokenizer.encode, req.prompt), http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, http: Request):
        if (no := refused(req, http)) is not None:
            return no
        tok = manager.tokenizer
        if not tok.chat_template:
            return error(400, f"model '{settings.model}' has no chat template; use /v1/completions.")
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        size = sum(len(m["content"]) for m in messages)
        if size > settings.max_prompt_chars:
            return error(400, f"field 'messages': {size} characters, more than this server's limit of "
                              f"{settings.max_prompt_chars}.")
        return await answer(req, await asyncio.to_thread(chat_ids, tok, messages), http, chat=True)
