"""What a server keeps of each agent it runs (``AgentRun``: what it asked, where it is, what it
produced; a session's turns, ``Turn``) and the server's limits (``Settings``): the records the
agent API, its recovery and its metrics share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from justitia.agent import AgentProcess
from justitia.core import AGENT_IDLE_S
from justitia.server.keys import ANONYMOUS, Client
from justitia.server.schema import AgentSpec
from justitia.workload import Stage

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
    metrics_window_s: float = 300.0  # the window of /metrics' and the live page's shares
    metrics_tenants: int = 10  # tenants with /metrics series of their own; the rest are "other"
    # a stage's pause_s, waited by the server: at most the engine's idle release, so that no agent is
    # released while it waits (a session's pause inside a turn keeps its place for session_keep_s)
    max_pause_s: float = AGENT_IDLE_S
    session_keep_s: float = 600.0  # a waiting session not continued for this long ends (the core's SESSION_KEEP_S)

    @property
    def max_prompt_chars(self) -> int:
        return self.chars_per_context_token * self.max_model_len


@dataclass
class Turn:
    """One turn of a session: its stages as submitted, where they begin among the session's, its
    predicted cost (its first request's ``agent_cost``) and whether it is the last."""

    stages: list[Stage]
    first_stage: int
    predicted_cost: float
    last: bool = False

    def doc(self) -> dict:
        return {
            "first_stage": self.first_stage,
            "stages": len(self.stages),
            "predicted_cost": self.predicted_cost,
            "last": self.last,
        }


@dataclass
class AgentRun:
    """One submitted agent: what it asked, where it is, what it produced."""

    agent_id: str
    spec: AgentSpec
    process: AgentProcess | None  # (a session's current turn's; None for a session restored while waiting)
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
    # the (current turn's) first stage's prompts, tokenized at submission: task -> (prompt, its token ids)
    first_ids: dict[int, tuple[str, list[int]]] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)  # a session's (an agent's: none)
    turn_opened: bool = False  # the current turn is open in the engine: registered ahead, or a request has gone out
    # a session: the engine holds it paused, or not at all (a restart), so its next turn is
    # registered ahead; False when pausing it failed: its next turn's first request says turn_start
    engine_idle: bool = True
    turn_ready: asyncio.Event = field(default_factory=asyncio.Event)  # a waiting session: a turn came, or its end
    closed: bool = False  # a waiting session ended by its client with nothing more to send
    waiting_wall: float | None = None  # a waiting session: the wall-clock time it began waiting

    @property
    def session(self) -> bool:
        return self.spec.session

    @property
    def base(self) -> int:
        """The session's number of the current turn's first stage (its process counts from 0)."""
        return self.turns[-1].first_stage if self.turns else 0

    @property
    def predicted_cost(self) -> float | None:
        """The agent's predicted cost; a session's, its turns' summed."""
        if self.turns:
            return sum(t.predicted_cost for t in self.turns)
        return self.process.predicted_cost

    def emit(self, kind: str, **data) -> None:
        self.events.append({"event": kind, "agent_id": self.agent_id, "t_s": round(time.monotonic(), 6)} | data)
        self.changed.set()
        self.changed = asyncio.Event()

    def doc(self) -> dict:
        jct = None if self.finish_s is None else self.finish_s - self.arrival_s
        return {
            "agent_id": self.agent_id,
            "type": self.spec.type,
            "status": self.status,
            "error": self.error,
            "arrival_s": self.arrival_s,
            "finish_s": self.finish_s,
            "jct_s": jct,
            "predicted_cost": self.predicted_cost,
            "virtual_finish": self.virtual_finish,
            "stages": self.outputs,
        } | ({"session": True, "turns": [t.doc() for t in self.turns]} if self.session else {})
