"""One agent's life, written once: the process every engine drives.

NOTE: an agent runs its stages in order and the tasks of a stage in parallel. When it arrives its
predictor prices it (the cost the policies order it by); every request carries the agent's
``RequestMeta``; when its last task is answered, the predictor observes what it really cost.
``AgentProcess`` holds that logic and nothing about time, in the spirit of a SimPy process: the
simulator drives it on simulated time (``start``, then ``answered`` as tasks finish), and
``drive`` runs it with asyncio on a real engine (the bench runner, the server).

States of an ``AgentProcess`` (``state``):
    new       created; ``predict()`` prices it (once), ``start()`` returns the first stage's calls
    running   stage ``stage`` is out; ``answered(call, answer)`` for each of its calls; the stage's
              last answer returns the next stage's calls, prompts filled from earlier answers
    done      every stage answered; the predictor has observed the agent's true cost
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from justitia.core import KV, CostModel, RequestMeta
from justitia.predictors import Predictor
from justitia.workload import Agent


PRICINGS = ("first-stage", "all-stages")


@dataclass(frozen=True)
class Call:
    """One request of an agent, ready for an engine."""

    request_id: str
    stage: int
    index: int
    task: Any  # the task as the agent gave it: a workload Task, or a server TaskSpec
    prompt: str  # the task's prompt, placeholders filled from earlier answers
    meta: RequestMeta


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

    def to_json(self) -> dict:
        """The result as a results-file document."""
        return dict(self.__dict__)


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


Render = Callable[[str, int, list[list[str]]], str]  # (prompt, stage, earlier answers' texts) -> prompt


class AgentProcess:
    """The life of one agent; see the module's docstring for its states."""

    def __init__(self, agent: Agent, predictor: Predictor, cost: CostModel = KV, *,
                 tasks: Sequence[Sequence[Any]] | None = None, request_prefix: str = "",
                 render: Render | None = None, pricing: str = "first-stage"):
        """``agent`` is what the predictor sees (its id, type and stages with the lengths known at
        arrival); ``tasks`` are the stages' tasks to hand the engine (default: ``agent.stages``);
        ``render`` fills a prompt's placeholders from earlier answers (default: prompts as given).
        ``pricing``: ``first-stage``, the predictor's agent cost (it reads the first stage: the
        paper's rule, and all an engine that sees only requests can do), or ``all-stages``, for an
        agent submitted whole: at least the sum of its requests' predicted costs over every stage,
        so that a cheap first stage cannot hide heavy later ones."""
        if pricing not in PRICINGS:
            raise ValueError(f"pricing must be one of {', '.join(PRICINGS)}, got '{pricing}'.")
        self.agent = agent
        self.predictor = predictor
        self.cost = cost
        self.tasks = agent.stages if tasks is None else tasks
        self.request_prefix = request_prefix
        self.render = render
        self.pricing = pricing
        self.state = "new"
        self.stage = -1
        self.predicted_cost: float | None = None
        self.answers: list[list[Answer | None]] = [[None] * len(stage) for stage in self.tasks]
        self._open = 0

    @property
    def done(self) -> bool:
        """Whether every stage has been answered."""
        return self.state == "done"

    def predict(self) -> float:
        """The agent's predicted total cost (the predictor runs once)."""
        if self.predicted_cost is None:
            cost = float(self.predictor.agent_cost(self.agent, self.cost))
            if self.pricing == "all-stages":
                p, a, m = self.predictor, self.agent, self.cost
                cost = max(cost, sum(float(p.request_cost(a, s, i, m)) for s, st in enumerate(a.stages) for i in range(len(st))))
            self.predicted_cost = cost
        return self.predicted_cost

    def start(self) -> list[Call]:
        """Predict (if not yet done) and return the first stage's calls."""
        if self.state != "new":
            raise RuntimeError(f"agent '{self.agent.agent_id}' has already started.")
        self.predict()
        self.state = "running"
        return self._stage_calls(0)

    def resume(self, answers: list[list[Answer | None]]) -> list[Call]:
        """Start after what ``answers`` holds (a restarted server): the stages answered in full, then
        perhaps one answered in part (None where a task is not). Predict (if not yet done) and return
        the calls still to make: the part stage's missing tasks, or the next stage's (none if every
        stage is answered)."""
        if self.state != "new":
            raise RuntimeError(f"agent '{self.agent.agent_id}' has already started.")
        self.predict()
        self.state = "running"
        full = 0
        while full < len(answers) and len(answers[full]) == len(self.tasks[full]) and None not in answers[full]:
            self.answers[full] = list(answers[full])
            full += 1
        if full >= len(self.tasks):
            self.state = "done"
            return []
        calls = self._stage_calls(full)
        if full < len(answers):  # answered in part: its answered tasks are kept, the rest run
            kept = list(answers[full]) + [None] * (len(self.tasks[full]) - len(answers[full]))
            self.answers[full] = kept
            calls = [c for c in calls if kept[c.index] is None]
            self._open = len(calls)
        return calls

    def answered(self, call: Call, answer: Answer) -> list[Call]:
        """Record ``answer``; the next stage's calls if it completes its stage (none after the last)."""
        if self.state != "running" or call.stage != self.stage or self.answers[call.stage][call.index] is not None:
            raise RuntimeError(f"request '{call.request_id}' was not expected now.")
        self.answers[call.stage][call.index] = answer
        self._open -= 1
        if self._open:
            return []
        if self.stage + 1 < len(self.tasks):
            return self._stage_calls(self.stage + 1)
        self.state = "done"
        self.predictor.observe(self.agent.type, self.predicted_cost, self.true_cost(self.cost), self.agent.tenant)
        return []

    def true_cost(self, cost: CostModel) -> float:
        """What the answered requests cost, in ``cost``'s unit."""
        return sum(cost.request_cost(a.prompt_tokens, a.output_tokens) for stage in self.answers for a in stage if a)

    def result(self, arrival_s: float, finish_s: float) -> AgentResult:
        """The outcome of a finished agent that arrived at ``arrival_s`` and finished at ``finish_s``."""
        return AgentResult(self.agent.agent_id, self.agent.type, arrival_s, finish_s, finish_s - arrival_s,
                           self.true_cost(KV), self.predicted_cost)

    def _stage_calls(self, s: int) -> list[Call]:
        self.stage = s
        stage = self.tasks[s]
        self._open = len(stage)
        texts = [[a.text for a in answers] for answers in self.answers[:s]]
        last = s == len(self.tasks) - 1
        a = self.agent
        calls = []
        for i, task in enumerate(stage):
            prompt = task.prompt if self.render is None else self.render(task.prompt, s, texts)
            meta = RequestMeta(a.agent_id, a.type, self.predicted_cost,
                               float(self.predictor.request_cost(a, s, i, self.cost)), last,
                               None if a.weight == 1 else a.weight, a.tenant)
            calls.append(Call(f"{self.request_prefix}{a.agent_id}/{s}/{i}", s, i, task, prompt, meta))
        return calls


async def drive(process: AgentProcess, serve: Callable[[Call], Awaitable[Answer]],
                resume: list[list[Answer]] | None = None) -> None:
    """Run ``process`` to its end on a real engine: each stage's calls served in parallel by
    ``serve`` (after the stages ``resume`` answered, if given). If one call fails (or the agent is
    cancelled), the stage's other calls are cancelled and the error propagates."""
    calls = process.start() if resume is None else process.resume(resume)
    while calls:
        pending = [asyncio.ensure_future(serve(c)) for c in calls]
        try:
            answers = await asyncio.gather(*pending)
        except BaseException:
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise
        for c, a in zip(calls, answers):
            upcoming = process.answered(c, a)
        calls = upcoming
