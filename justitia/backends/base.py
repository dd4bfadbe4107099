"""What the server needs from an engine: one interface, whatever runs the model.

``EngineBackend`` (``local.py``): the engine client of vLLM's own server (``AsyncLLM`` with the plug-in).
``UpstreamBackend`` (``upstream.py``): stock vLLM OpenAI servers, ordered by front-end tagging.
``RayBackend`` (``ray/backend.py``): engine replicas with the plug-in on Ray Serve, one clock here.
The last two share ``tagging.TaggingBackend``, the one clock kept in front of several engines.
The agent API talks to ``Backend`` only; so do a front end's inference endpoints (``forward``).
The backends sit below the server (``tests/test_architecture.py``): nothing here imports it.

``generate`` has ``AsyncLLM.generate``'s shape in the contract's own types: a token-id prompt, a
``Sampling`` (``extra_args`` carrying the request's ``RequestMeta``) and a request id; it yields
``Output``s (``.outputs[0].text``, ``.token_ids``, ``.finish_reason``). No vLLM type crosses it: a
backend that runs vLLM converts (``local.vllm_params``). Closing the generator early aborts the request. A request
the backend cannot
serve raises ``BackendError`` with the reason. A backend that can send a request again when its
engine dies (``RayBackend``) does so until ``DEADLINE`` (set by the agent API to the agent's own
deadline, for the task it serves).

The agents' virtual finish tags and the clock's readings come from the clock that orders the
engine (``register``, ``state``); under a policy without one they are None.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

from justitia.core import PolicyState, Registration


def metric_lines(name: str, kind: str, text: str, *samples: str) -> list[str]:
    """One metric in the Prometheus text format: ``justitia_<name>``'s HELP and TYPE, then its samples."""
    return [f"# HELP justitia_{name} {text}", f"# TYPE justitia_{name} {kind}", *samples]


def label(value: str) -> str:
    """A label value as the text format wants it: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def histogram_samples(name: str, tag: str, bounds: tuple, counts: list[int], total: float) -> list[str]:
    """A histogram's samples: ``counts`` per bucket of ``bounds`` (the last +Inf) made cumulative,
    each labelled ``tag`` (``a="b",...``) and its ``le``, then its sum and count."""
    out, running = [], 0
    for bound, n in zip(bounds, counts):
        running += n
        le = "+Inf" if bound == float("inf") else f"{bound:g}"
        out.append(f'{name}_bucket{{{tag},le="{le}"}} {running}')
    return out + [f"{name}_sum{{{tag}}} {total:.6g}", f"{name}_count{{{tag}}} {running}"]


def with_model(lines: list[str], model: str) -> list[str]:
    """Every sample of ``lines`` labelled ``model_name`` (vLLM's label), first, where it has none."""
    tag = f'model_name="{label(model)}"'
    out = []
    for line in lines:
        if line.startswith("#") or not line or line.partition("{")[2].startswith("model_name="):
            out.append(line)
            continue
        name, brace, rest = line.partition("{")
        if brace and " " not in name:
            out.append(f"{name}{{{tag},{rest}")
        else:
            name, _, value = line.partition(" ")
            out.append(f"{name}{{{tag}}} {value}")
    return out


# The monotonic time until which a request whose engine died may be sent again (an agent's task:
# its agent's deadline); None: the backend's own bound. A context variable: set per task, read by
# the backend in the same asyncio task.
DEADLINE: ContextVar[float | None] = ContextVar("justitia_deadline", default=None)


class BackendError(RuntimeError):
    """An engine that cannot be used, or that failed a request: the message says why."""


class ForwardRefused(BackendError):
    """A request ``Backend.forward`` answers with an error of its own (no replica could take it, or
    the backend serves no such endpoint): its HTTP status, message and headers. The front end
    writes it in the endpoint's own shape (``server.errors.error_doc``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


class BackendInterrupted(BackendError):
    """The engine failed a request after it had begun to answer (a replica lost midway); sending the
    request again may succeed."""


@dataclass
class Sampling:
    """How one request is sampled: what the agent API takes for a task (docs/reference.md), bounded as
    vLLM bounds it; ``extra_args``, the request's ``RequestMeta`` (``to_extra_args``)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    extra_args: dict = field(default_factory=dict)
    stream: bool = False  # yield each new piece as it comes; else only the finished answer


@dataclass
class Completion:
    """One choice of an answer, shaped like vLLM's ``CompletionOutput``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class Output:
    """An answer so far (or its latest delta), shaped like vLLM's ``RequestOutput``."""

    request_id: str
    outputs: list[Completion]
    finished: bool


class Backend(ABC):
    """An engine behind the server."""

    model: str  # the served model's name
    tokenizer_dir: Path  # where the tokenizer that prices and encodes prompts lives
    kv_tokens: int  # the KV cache (all replicas together), in tokens
    max_model_len: int
    policy: str

    @abstractmethod
    def generate(self, prompt: dict, params: Sampling, request_id: str) -> AsyncIterator[Output]:
        """Serve one request (``prompt``: ``{"prompt_token_ids": [...]}``); see the module's docstring."""

    @abstractmethod
    async def register(self, reg: Registration) -> float | None:
        """Register an agent (``Registration``) with the policy that orders the engine, ahead of its
        requests; its virtual finish tag (None under a policy without a clock). An engine that
        charges service as it schedules it reprices an agent priced as a distribution by its
        Gittins index."""

    @abstractmethod
    async def retire(self, agent_id: str, pause: bool = False) -> None:
        """A cancelled or failed agent leaves the policy as soon as the engine holds none of its
        requests (``AgentBook.retire``, wherever the book is kept: at once if none is held; else
        when the last, aborted, has left). A done agent needs no call: its last requests say so.
        ``pause``: a session waits between two bursts and will return (``AgentBook.pause``)."""

    async def turn_ended(self, agent_id: str) -> None:
        """The door saw a session's turn end (an answer that calls no tool): an engine that prices
        bursts without a price learns what the turn cost now. Others keep nothing of it."""

    @abstractmethod
    async def state(self, detail: bool = False, bound_s: float | None = None) -> PolicyState:
        """The policy that orders the engine, read now (its clock included, under justitia); with
        ``detail``, each tenant's figures and the head of the queue too (``AgentBook.state``;
        ``bound_s``: the bound the engine judges bursts by from now on)."""

    @abstractmethod
    def unfinished(self) -> int:
        """Requests inside the engine (sent and not finished)."""

    async def forward(self, path: str, kind: str, doc: dict, prompt_tokens: int, max_tokens: int, request_id: str):
        """Serve one OpenAI or Anthropic request (``doc``: its JSON body, identity written in, checked
        by vLLM's request model for ``path``) as vLLM's own server answers it: a Starlette response.
        ``prompt_tokens`` and ``max_tokens`` price it. What it refuses raises ``ForwardRefused``: a
        backend that cannot serve the endpoint, 501."""
        raise ForwardRefused(
            501, f"'{path}' is not served by this backend ({type(self).__name__}); see docs/reference.md."
        )

    def metrics_lines(self) -> list[str]:
        """Prometheus lines of the backend's own (its queues, its replicas)."""
        return []

    def alive(self) -> bool:
        """Whether the engine can still serve (a dead engine core: False)."""
        return True

    async def aclose(self) -> None:
        """Stop the engine, or close the connections to it."""
