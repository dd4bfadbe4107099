"""``Door``: Justitia's checks in front of vLLM's own OpenAI and Anthropic endpoints.

Plain ASGI middleware on ``POST`` to the inference paths (``INFERENCE_PATHS``). It runs after
``limits.BodyLimit`` (413) and ``limits.Authenticate`` (401), before any route reads the body, and
does only what is Justitia's:

1. ``vllm_xargs``: only the request-metadata keys, each a scalar; prices, shares and a bench's
   answer length only from a trusted key (``check_xargs``; 400 naming the field);
2. identity: the agent the harness headers and fields name (``identity.identify``; 400 naming a
   bad one), in the key's namespace;
3. limits: requests in flight for the key (429) and for the server (503), the key's rate (429),
   each with ``Retry-After`` (``admission.Admission``: checked and counted at once, so concurrent
   requests cannot all pass; the sessions seen, for ``GET /v1/sessions``, are kept there too);
4. the body goes on with the agent's identity written into ``vllm_xargs`` (``agent_id``,
   ``session_id``, the key's ``tenant`` and ``agent_weight``, and the door's token, which tells the
   plug-in that these were checked: ``justitia.vllm.general``), and vLLM's own ``session_id`` field
   and ``X-Session-ID`` header taken out, so that vLLM's ``Request.session_id`` is the namespaced id.
   An id from a source that names a session (``identity.SESSION_SOURCES``) also writes ``session``,
   and ``turn_start`` when the body opens a user turn (``identity.opens_turn``): the door's reading
   replaces the client's own for these; an agent's id (``X-Agent-Id``, ``vllm_xargs.agent_id``)
   keeps what its client sent;
5. a step of a session's turn (a request that opens it, or goes on after a tool's result) has its
   answer read as it passes (``AnswerWatch``): one that calls no tool ends the turn, and the engine
   learns what the turn cost then (``Backend.turn_ended``), not when the next turn opens.

Everything else (the body's shape, the model's name, the context length, tools, structured output)
is vLLM's validation, with vLLM's messages. A body that is not a JSON object goes on untouched, for
vLLM to refuse.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import replace
from typing import Any

from justitia.backends.wire import replay
from justitia.core import META_KEYS, PRICE_KEYS, SESSION, TURN_START
from justitia.defaults import ANSWER_CALLS_TOOL_KEY, ANSWER_TOKENS_KEY, DOOR_KEY, door_token
from justitia.server.errors import answer, error_doc
from justitia.server.identity import Identity, IdentityError, harness_turn, identify, opens_turn, turn_opener
from justitia.server.keys import ANONYMOUS
from justitia.server.limits import INFERENCE_PATHS, JsonTooDeep, load_json
from justitia.server.schema import TYPE_PATTERN

# where a body carries vLLM's extra args: ``vllm_xargs``, except on vLLM's token-in generate endpoint
EXTRA_ARGS_AT = {"/inference/v1/generate": ("sampling_params", "extra_args")}
XARGS_KEYS = (*META_KEYS, "session_id")  # session_id: vLLM's own, the third place it looks for a session
# a bench's answer length (justitia.engine.scripted) and its answer standing for a tool call, from a
# trusted key only: pricing never reads them
TRUSTED_XARGS_KEYS = (ANSWER_TOKENS_KEY, ANSWER_CALLS_TOOL_KEY)
TURN_KINDS = ("chat", "messages", "responses")  # the endpoints whose conversations have turns
log = logging.getLogger("justitia.server")


def check_xargs(xargs: Any, trusted: bool) -> str | None:
    """Why ``vllm_xargs`` is refused (naming the field), or None if it is fine."""
    if xargs is None:
        return None
    if not isinstance(xargs, dict):
        return f"field 'vllm_xargs': must be an object, got {type(xargs).__name__}."
    for key, value in xargs.items():
        where = f"field 'vllm_xargs.{key}'"
        if key not in XARGS_KEYS and not (trusted and key in TRUSTED_XARGS_KEYS):
            return f"{where}: unknown key; vllm_xargs takes only {', '.join(XARGS_KEYS)}."
        if key in PRICE_KEYS and not trusted:
            return f"{where}: set by the server (its pricing and your key's tenant); only a trusted key may send it."
        if value is not None and not isinstance(value, (str, int, float, bool)):
            return f"{where}: must be a string, number or boolean, got {type(value).__name__}."
        if key in (SESSION, TURN_START) and value is not None and not isinstance(value, bool):
            return f"{where}: must be a boolean, got {type(value).__name__}."
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            return f"{where}: integer out of range."
        if isinstance(value, str) and len(value) > 256:
            return f"{where}: longer than 256 characters."
        if key == "agent_type" and isinstance(value, str) and not re.match(TYPE_PATTERN, value):
            return f"{where}: 1-64 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-' (it labels metrics)."
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where}: must be finite."
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"{where}: contains a lone surrogate, which is not valid UTF-8."
    return None


def calls_tool(raw: bytes) -> bool:
    """Whether an answer (a JSON body, or one event of its stream) calls a tool: an OpenAI chat
    message or delta with ``tool_calls`` (or that finish reason), an Anthropic ``tool_use`` block
    (or that stop reason), a Responses ``function_call`` item. One that cannot be read counts as
    calling one (its turn is not taken to have ended)."""
    try:
        doc = load_json(raw)
    except (ValueError, UnicodeDecodeError):
        return True
    todo = [doc]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, dict):
            if (
                item.get("tool_calls")
                or item.get("type") in ("tool_use", "function_call")
                or item.get("finish_reason") == "tool_calls"
                or item.get("stop_reason") == "tool_use"
            ):
                return True
            todo.extend(v for v in item.values() if isinstance(v, (dict, list)))
    return False


class AnswerWatch:
    """An answer read as it passes (its ASGI messages, ``see``): ``ends_turn`` once its last byte
    has, if it was a 200 whose body or stream called no tool and reported no error."""

    def __init__(self):
        self.ok = self.stream = self.ends_turn = False
        self.goes_on = False  # the stream called a tool, or broke off: its turn has not ended
        self._buffer = bytearray()  # a JSON body, or a stream's line not yet ended

    def see(self, message) -> None:
        if message["type"] == "http.response.start":
            self.ok = message["status"] == 200
            kind = dict(message.get("headers") or []).get(b"content-type", b"")
            self.stream = kind.startswith(b"text/event-stream")
            return
        if message["type"] != "http.response.body" or not self.ok:
            return
        self._buffer += message.get("body", b"")
        more = message.get("more_body", False)
        if self.stream:
            *lines, rest = self._buffer.split(b"\n")
            self._buffer = bytearray(rest)
            for line in lines if more else lines + [rest]:
                line = bytes(line).strip()
                if line.startswith(b"data:") and not self.goes_on:  # an event read only if it may say so
                    data = line[5:].strip()
                    self.goes_on = (
                        (b"tool" in data or b"function_call" in data)
                        and calls_tool(data)
                        or b'"error"' in data
                        and _error_event(data)
                    )
        if not more:
            self.ends_turn = not (self.goes_on if self.stream else calls_tool(bytes(self._buffer)))
            self.ok = False  # seen whole


def _error_event(data: bytes) -> bool:
    """Whether a stream's event reports an error (the answer broke off: its turn has not ended)."""
    try:
        doc = load_json(data)
    except (ValueError, UnicodeDecodeError):
        return True
    return isinstance(doc, dict) and ("error" in doc or "error" in (doc.get("type"), doc.get("object")))


async def _whole_body(receive) -> bytes | None:
    """The request's whole body (``limits.BodyLimit``, outside, stops one that is too large), or
    None if the client left first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


class Door:
    """The checks above, on ``holder.manager``'s ``admission`` (``admission.Admission``: the limits,
    the counts and the sessions seen, through its methods); its requests are counted for
    ``/metrics`` in the manager's ``counts``. The manager is looked up per request, since a vLLM
    plugin builds it after the app."""

    def __init__(self, app, holder):
        self.app, self.holder = app, holder

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        kind = INFERENCE_PATHS.get(path)
        if kind is None and scope["type"] == "http" and scope["method"] == "POST" and not path.startswith("/v1/agents"):
            kind = "other"  # any other POST of vLLM's: its vllm_xargs checked, nothing more
        if kind is None or scope["method"] != "POST":
            if scope["type"] == "http" and scope["path"] == "/metrics" and hasattr(self.holder, "policy_state"):
                await self._read_policy()
            return await self.app(scope, receive, send)
        body = await _whole_body(receive)
        if body is None:  # the client left
            return
        try:
            doc = load_json(body)
        except JsonTooDeep as exc:  # before vLLM's own parser, which would recurse past its stack (a 500)
            return await answer(send, 400, error_doc(kind, 400, str(exc)))
        except (ValueError, UnicodeDecodeError):
            doc = None
        manager = self.holder.manager
        client = scope.get("state", {}).get("client", ANONYMOUS)
        hold = watch = None
        if kind == "other":
            why = check_xargs(doc.get("vllm_xargs"), client.trusted) if isinstance(doc, dict) else None
            if why is not None:
                return await answer(send, 400, error_doc(kind, 400, why, "vllm_xargs"))
            return await self.app(scope, replay(body, receive), send)
        if isinstance(doc, dict):
            refused = self._check(path, kind, doc, scope, client, manager)
            if isinstance(refused, tuple):
                status, message, param, headers = refused
                return await answer(
                    send,
                    status,
                    error_doc(kind, status, message, param),
                    [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
                )
            who = refused
            try:
                body = json.dumps(doc, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:  # valid JSON (a "\\udXXX" escape) that no tokenizer can take
                return await answer(
                    send, 400, error_doc(kind, 400, "the body holds a lone surrogate, which is not valid UTF-8 text.")
                )
            scope = dict(
                scope,
                headers=[(k, v) for k, v in scope["headers"] if k not in (b"x-session-id", b"content-length")]
                + [(b"content-length", str(len(body)).encode())],
            )
            hold = manager.admission.sessions.seen(who, client.owner, kind) if who.agent_id is not None else None
            watch = AnswerWatch() if who.step else None
        manager.counts.request(kind)
        release = manager.admission.open_request(client.owner, hold)

        async def tracked(message):
            if watch is not None:
                watch.see(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                release()
            await send(message)
            if watch is not None and watch.ends_turn:
                watch.ends_turn = False
                try:  # the engine learns the turn now (its next turn, or its release, would otherwise)
                    await manager.backend.turn_ended(who.agent_id)
                except Exception as exc:  # noqa: BLE001  (the answer is given; learning waits for the next turn)
                    log.warning(json.dumps({"event": "turn_end_failed", "agent_id": who.agent_id, "error": str(exc)}))

        try:
            await self.app(scope, replay(body, receive), tracked)
        finally:
            release()

    async def _read_policy(self) -> None:
        """vLLM's /metrics: the policy read now, for the collector (``server.metrics``)."""
        manager = self.holder.manager
        if manager is not None:
            try:
                await manager.watch.read()  # the per-tenant state, read at most once a second
                self.holder.policy_state = await manager.backend.state()  # the clock, read now
            except Exception:  # noqa: BLE001  (an engine going away: vLLM's metrics still answer)
                self.holder.policy_state = None

    @staticmethod
    def _check(path: str, kind: str, doc: dict, scope, client, manager):
        """Identity written into ``doc``; or the refusal ``(status, message, param, headers)``."""
        admission = manager.admission
        outer, name = EXTRA_ARGS_AT.get(path, (None, "vllm_xargs"))
        holder = doc.get(outer) if outer else doc
        if not isinstance(holder, dict):  # vLLM refuses the body itself
            return Identity(None)
        xargs = holder.get(name)
        why = check_xargs(xargs, client.trusted)
        if why is not None:
            return 400, why.replace("'vllm_xargs", f"'{outer}.{name}" if outer else "'vllm_xargs"), name, None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            who = identify(headers, doc, client.owner)
        except IdentityError as exc:
            return 400, str(exc), exc.field, None
        if (refused := admission.refuse_request(client.owner)) is not None:
            status, message, retry = refused
            return status, message, None, retry
        given = dict(xargs or {})
        given.pop("session_id", None)
        tool_said = given.pop(ANSWER_CALLS_TOOL_KEY, None) is True  # a bench's: the answer stands for a tool call
        if who.agent_id is not None:
            given["agent_id"] = who.agent_id
            given["session_id"] = who.agent_id
            if who.session:  # the door's reading, not the client's (a subagent never opens a turn)
                given[SESSION] = True
                given.pop(TURN_START, None)
                if opens_turn(kind, doc, who.subagent, headers):
                    opener = turn_opener(kind, doc)
                    known = admission.sessions.get(who.agent_id)
                    if known is None or opener is None or known.opener != opener:  # not a retry, nor a side request
                        given[TURN_START] = True
                        who = replace(who, opener=opener)
            who = replace(who, turn_start=given.get(TURN_START) is True)
            # its answer may end the turn: it opens the turn, or goes on with it after a tool (a side
            # request, a retry of the turn's opener, a subagent's or a harness's own request does not)
            step = (
                who.session
                and kind in TURN_KINDS
                and who.subagent is None
                and harness_turn(headers) in (None, "turn")
                and (who.turn_start or not opens_turn(kind, doc))
            )
            who = replace(who, step=step and not tool_said)
        else:  # an agent of its own, done when its one request is
            given.pop("agent_id", None)
            given["agent_done"] = True
        if not client.trusted or "tenant" not in given:
            if client.tenant is not None:
                given["tenant"] = client.tenant
        if not client.trusted or "agent_weight" not in given:
            if client.weight != 1:
                given["agent_weight"] = client.weight
        token = door_token()
        if token:  # checked here: the plug-in may read the prices and the tenant above (justitia.vllm.general)
            given[DOOR_KEY] = token
        holder[name] = given
        doc.pop("session_id", None)  # vLLM reads it before vllm_xargs: the namespaced id must win
        return who
