"""The inference endpoints of a front end (``--upstream``, ``--ray``): every body that vLLM's own
server takes, validated by vLLM's own request models and errors, then forwarded unchanged but for
the identity the door wrote (``server.door.Door``) and the policy's tag.

The front end prices a request before any engine has tokenized it: the text of its prompt fields
(messages, prompt, input, system, instructions, tools) through the model's tokenizer, and its
``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens`` (the rest of the context when it
sets none), times ``n``. What the backend refuses (``ForwardRefused``: a backend that cannot serve
an endpoint, 501; no replica to take it, 502 or 503) is answered in the endpoint's own error shape
(``server.errors.error_doc``).
"""

# no ``from __future__ import annotations``: FastAPI must see the routes' vLLM models, imported locally
import asyncio
import json
import uuid
from argparse import Namespace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from justitia.backends.base import ForwardRefused
from justitia.backends.wire import prompt_text
from justitia.server.errors import error_doc


def output_budget(doc: dict, prompt_tokens: int, max_model_len: int) -> int:
    """The tokens the request may generate, all its choices together."""
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = doc.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            break
    else:
        value = max(1, max_model_len - prompt_tokens)
    n = doc.get("n")
    return value * (n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1)


def add_forwarding_routes(app: FastAPI, manager) -> None:
    """``POST`` chat, completions, responses and messages, and ``GET /v1/models``, on ``app``."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler

    app.state.args = Namespace(log_error_stack=False)  # what vLLM's error handlers read
    init_exception_handler(app)  # a bad body gets vLLM's own 400 and message

    async def forward(kind: str, raw: Request):
        doc = json.loads(await raw.body())  # as the door passed it on (vLLM's model has validated it)
        tok = manager.tokenizer
        text = prompt_text(doc)
        tokens = len(await asyncio.to_thread(tok.encode, text)) if len(text) > 2000 else len(tok.encode(text))
        budget = output_budget(doc, tokens, manager.settings.max_model_len)
        request_id = f"{kind}-{uuid.uuid4().hex[:16]}"
        try:
            return await manager.backend.forward(raw.url.path, kind, doc, tokens, budget, request_id)
        except ForwardRefused as exc:
            return JSONResponse(error_doc(kind, exc.status, str(exc)), status_code=exc.status, headers=exc.headers)

    def route(path: str, kind: str, model) -> None:  # FastAPI validates the body with vLLM's ``model``
        async def endpoint(request: model, raw: Request):
            return await forward(kind, raw)

        app.post(path, name=f"forward_{kind}")(endpoint)

    for path, kind, model in (
        ("/v1/chat/completions", "chat", ChatCompletionRequest),
        ("/v1/completions", "completions", CompletionRequest),
        ("/v1/responses", "responses", ResponsesRequest),
        ("/v1/messages", "messages", AnthropicMessagesRequest),
    ):
        route(path, kind, model)

    @app.get("/v1/models")
    async def models():
        settings = manager.settings
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.model,
                    "object": "model",
                    "created": int(manager.t_start),
                    "owned_by": "justitia",
                    "root": settings.model,
                    "max_model_len": settings.max_model_len,
                }
            ],
        }
