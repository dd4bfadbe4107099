"""What an agent sends an engine and gets back (``Call``, ``Answer``), and its outcome in a run
(``AgentResult``, ``RunResult``), on any engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from justitia.core import RequestMeta


@dataclass(frozen=True)
class Call:
    """One request of an agent, ready for an engine."""

    request_id: str
    stage: int
    index: int
    task: Any  # the task as the agent gave it: a workload Task, or a server TaskSpec
    prompt: str  # the task's prompt, placeholders filled from earlier answers
    meta: RequestMeta
    pause_s: float = 0.0  # how long the driver waits, from the moment it gets the call, before sending it
    turn: int = 0  # the user turn it belongs to
    flow: str | None = None  # the flow it is served in, when not its agent's (a subagent's, ``subagents="flows"``)


@dataclass(frozen=True)
class Answer:
    """What an engine gave back for one call."""

    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str | None = None


@dataclass
class AgentResult:
    """One agent's outcome in a run."""

    agent_id: str
    type: str
    arrival_s: float
    finish_s: float
    jct_s: float
    cost_token_iters: float  # its true KV token-time, from the answers' lengths
    predicted_cost: float
    turns_s: list[float] | None = None  # a session's turn times (first request sent to last answer), in order
    bursts: list[list[float]] | None = None  # a session's bursts: [sent at (s), true KV cost], in order
    turn_costs: list[list[float]] | None = None  # a session priced by turn: [predicted, true] cost per turn

    def to_json(self) -> dict:
        """The result as a results-file document."""
        return {k: v for k, v in self.__dict__.items() if v is not None or k not in ("turns_s", "bursts", "turn_costs")}


@dataclass
class RunResult:
    """One policy's run over one workload, on any engine."""

    policy: str
    agents: list[AgentResult]
    makespan_s: float
    iterations: int
    steps: int  # loop passes of the engine (the simulator: single iterations plus skipped spans)
    preemptions: int
    wall_s: float
    capacity_schedule: list[tuple[float, float]] | None = None  # (t_s, M) when the clock's M was measured
    served: list[tuple[float, str, float]] | None = None  # (finish_s, agent id, KV token-time) per request (simulator)
    prefix_cache: dict | None = None  # the engines' prefix cache: tokens looked up and hit (simulator, cache on)
    guard_lag_s: float | None = None  # justitia's lag guard: the largest L it ran at (simulator, one engine)


Render = Callable[[str, int, list[list[str]]], str]  # (prompt, stage, earlier answers' texts) -> prompt
