"""What a server keeps of each agent it runs (``AgentRun``: what it asked, where it is, what it
produced) and the server's limits (``Settings``): the records the agent API, its recovery and its
metrics share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from justitia.agent import AgentProcess
from justitia.server.keys import ANONYMOUS, Client
from justitia.server.schema import AgentSpec

TERMINAL = ("done", "failed", "cancelled")


@dataclass
class Settings:
    """Limits and identity of one server."""

    model: str = "tiny"
    policy: str = "justitia"
    max_model_len: int = 2048
    max_tasks_per_agent: int = 256
    max_agents_in_flight: int = 2048
    max_body_bytes: int = 1_000_000
    finished_bytes: int = 64 << 20  # finished agents' documents kept for GET, oldest dropped first (then 410)
    finished_s: float = 24 * 3600.0  # and for at most this long
    chars_per_context_token: int = 16  # a rendered prompt longer than this x max_model_len is refused untokenized
    chat: bool = True  # wrap agent prompts in the model's chat template when it has one
    key_agents_in_flight: int | None = None  # per key (None: max_agents_in_flight)
    key_requests_in_flight: int = 256  # OpenAI requests per key
    key_rate: float = 0.0  # requests (agents and completions) per second per key; 0: no rate limit
    key_burst: int = 0  # the rate limit's burst (0: one second's worth, at least 1)
    max_requests_in_flight: int = 1024  # OpenAI requests in all (beyond: 503)
    max_streams_per_agent: int = 8  # open event streams of one agent

    @property
    def max_prompt_chars(self) -> int:
        return self.chars_per_context_token * self.max_model_len


@dataclass
class AgentRun:
    """One submitted agent: what it asked, where it is, what it produced."""

    agent_id: str
    spec: AgentSpec
    process: AgentProcess
    arrival_s: float
    virtual_finish: float | None
    owner: str = ANONYMOUS.owner  # the key that submitted it (its owner id, not the key)
    status: str = "queued"
    error: str | None = None
    finish_s: float | None = None
    outputs: list[list[dict | None]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    streams: int = 0  # open event streams
    client: Client = ANONYMOUS  # who submitted it (owner, tenant, weight)
    cancelled_by_client: bool = False  # (a task cancelled otherwise is the server stopping)
    first_ids: dict[int, list[int]] = field(default_factory=dict)  # the first stage's prompts, tokenized at submission

    def emit(self, kind: str, **data) -> None:
        self.events.append({"event": kind, "agent_id": self.agent_id, "t_s": round(time.monotonic(), 6)} | data)
        self.changed.set()
        self.changed = asyncio.Event()

    def doc(self) -> dict:
        jct = None if self.finish_s is None else self.finish_s - self.arrival_s
        return {
            "agent_id": self.agent_id, "type": self.spec.type, "status": self.status, "error": self.error,
            "arrival_s": self.arrival_s, "finish_s": self.finish_s, "jct_s": jct,
            "predicted_cost": self.process.predicted_cost, "virtual_finish": self.virtual_finish,
            "stages": self.outputs,
        }
