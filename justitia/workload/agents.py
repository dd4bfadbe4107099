"""Agents, their stages and tasks: the workload's data model (its file is ``workload.files``).

An agent runs its stages one after another; the tasks inside a stage run in parallel, beside its
branches (subagents: chains of stages of their own); a stage waits its ``pause_s`` first (tool
time, a client's own work); ``turn`` numbers the user turn a top-level stage belongs to. A task's
prompt begins with its ``context`` (text shared by name, or an earlier task's prompt or output)
and ``prompt_tokens`` counts it. ``docs/sessions.md`` gives the rules. ``output_tokens`` is the
task's true decode length: engines use it, predictors must not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from justitia.core import CostModel, is_positive_finite


class WorkloadError(ValueError):
    """A workload file or document that does not match the schema."""


SEGMENT_KINDS = ("shared", "prompt_of", "output_of")


@dataclass(frozen=True)
class Segment:
    """A block a prompt begins with: text shared by name (``shared``, ``tokens`` long), or the
    whole prompt (``prompt_of``) or the output (``output_of``) of an earlier task, by its id."""

    kind: str
    ref: str
    tokens: int | None = None  # ``shared`` only; the others are as long as the text they name

    @classmethod
    def shared(cls, name: str, tokens: int) -> "Segment":
        return cls("shared", name, tokens)

    @classmethod
    def prompt_of(cls, task_id: str) -> "Segment":
        return cls("prompt_of", task_id)

    @classmethod
    def output_of(cls, task_id: str) -> "Segment":
        return cls("output_of", task_id)

    def to_json(self) -> dict:
        return {"shared": self.ref, "tokens": self.tokens} if self.kind == "shared" else {self.kind: self.ref}


@dataclass(frozen=True)
class Task:
    """One inference request of an agent. ``id`` names it for later tasks' ``context``; its
    prompt is its context's segments, then its own text (``prompt_tokens`` counts both)."""

    prompt: str
    prompt_tokens: int
    output_tokens: int
    id: str | None = None
    context: tuple[Segment, ...] = ()

    def to_json(self) -> dict:
        doc = {"prompt": self.prompt, "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}
        if self.id is not None:
            doc["id"] = self.id
        if self.context:
            doc["context"] = [c.to_json() for c in self.context]
        return doc


class Stage(tuple):
    """A stage: its tasks (the tuple itself, run in parallel), the ``pause_s`` waited before it,
    its ``branches`` (subagents: chains of stages that start with it and that it waits for) and
    the user ``turn`` it begins or continues (None: the one before). A plain stage (no pause, no
    branch, no turn) equals the tuple of its tasks."""

    def __new__(
        cls,
        tasks: Iterable[Task] = (),
        pause_s: float = 0.0,
        branches: Iterable[Iterable["Stage"]] = (),
        turn: int | None = None,
    ):
        self = super().__new__(cls, tasks)
        self.pause_s = float(pause_s)
        self.branches = tuple(tuple(s if isinstance(s, Stage) else Stage(s) for s in chain) for chain in branches)
        self.turn = turn
        return self

    @property
    def plain(self) -> bool:
        return not self.pause_s and not self.branches and self.turn is None

    def __eq__(self, other) -> bool:
        return tuple.__eq__(self, other) is True and (
            (self.pause_s, self.branches, self.turn)
            == (getattr(other, "pause_s", 0.0), getattr(other, "branches", ()), getattr(other, "turn", None))
        )

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return (
            f"Stage({tuple(self)!r})"
            if self.plain
            else f"Stage({tuple(self)!r}, pause_s={self.pause_s!r}, branches={self.branches!r}, turn={self.turn!r})"
        )

    def __reduce__(self):
        return Stage, (tuple(self), self.pause_s, self.branches, self.turn)

    def all_tasks(self) -> list[Task]:
        """Its tasks, then its branches' (depth first, in order): the stage's calls' indices."""
        out = list(self)
        for chain in self.branches:
            for s in chain:
                out.extend(s.all_tasks())
        return out

    def map_tasks(self, fn: Callable[[Task], Task]) -> "Stage":
        """The stage with ``fn`` applied to every task, branches included."""
        return Stage(
            (fn(t) for t in self),
            self.pause_s,
            (tuple(s.map_tasks(fn) for s in chain) for chain in self.branches),
            self.turn,
        )

    def to_json(self) -> list | dict:
        if self.plain:
            return [t.to_json() for t in self]
        doc: dict = {"tasks": [t.to_json() for t in self]}
        if self.branches:
            doc["branches"] = [[s.to_json() for s in chain] for chain in self.branches]
        if self.pause_s:
            doc["pause_s"] = self.pause_s
        if self.turn is not None:
            doc["turn"] = self.turn
        return doc


@dataclass(frozen=True)
class Agent:
    """A task-parallel agent: stages run in order, the tasks of a stage in parallel."""

    agent_id: str
    type: str
    arrival_s: float
    stages: tuple[Stage, ...]  # plain tuples of tasks are taken as plain stages
    meta: dict = field(default_factory=dict, compare=False)
    weight: float = 1.0  # its share under weighted GPS (its tenant's, if it has one)
    tenant: str | None = None  # its tenant: tenants share the engine by weight, agents their tenant's part

    is_session: bool = field(init=False, repr=False, compare=False)  # any stage pauses, branches or names a
    # turn: a session, not the paper's agent (set from the stages)
    _prompts: dict = field(init=False, repr=False, compare=False)  # a named task's prompt runs, once computed

    def __post_init__(self):
        if not all(type(s) is Stage for s in self.stages):
            object.__setattr__(self, "stages", tuple(s if isinstance(s, Stage) else Stage(s) for s in self.stages))
        object.__setattr__(self, "is_session", not all(s.plain for s in self.stages))
        object.__setattr__(self, "_prompts", {})

    def runs(self, stage: int, index: int) -> tuple[tuple[Any, int], ...]:
        """What call ``index`` of top-level stage ``stage`` holds, its prompt then its output, as runs
        ``(source, tokens)``: equal sources are equal text (a shared block by name, a task's own
        text, a task's output; ``docs/sessions.md``). An engine with a prefix cache hashes them into
        block keys; a cost that sees shared prefixes compares them."""
        task = self.task(stage, index)
        key = task.id if task.id is not None else (stage, index)
        return self._prompt(task, key) + (((self.agent_id, key, "out"), task.output_tokens),)

    def _prompt(self, task: Task, key: Any) -> tuple:
        if key in self._prompts:
            return self._prompts[key]
        runs: list = []
        by_id = None
        for seg in task.context:
            if seg.kind == "shared":
                runs.append((("shared", seg.ref), seg.tokens))
                continue
            by_id = by_id or tasks_by_id(self.stages)
            ref = by_id[seg.ref]
            if seg.kind == "prompt_of":
                runs.extend(self._prompt(ref, ref.id))
            else:
                runs.append(((self.agent_id, ref.id, "out"), ref.output_tokens))
        runs.append(((self.agent_id, key, "in"), task.prompt_tokens - sum(n for _, n in runs)))
        runs = tuple(runs)
        if task.id is not None:
            self._prompts[key] = runs
        return runs

    @property
    def tasks(self) -> list[Task]:
        """All tasks, stage by stage (a stage's branches after its own tasks)."""
        return [t for stage in self.stages for t in stage.all_tasks()]

    def turn_calls(self, turn: int) -> list[tuple[int, int]]:
        """Every call of user turn ``turn``, as (top-level stage, call index), branches included."""
        out, current = [], 0
        for s, st in enumerate(self.stages):
            current = st.turn if st.turn is not None else current
            if current == turn:
                out.extend((s, i) for i in range(len(st.all_tasks())))
        return out

    def turn_groups(self, turn: int) -> list[list[tuple[int, int]]]:
        """The calls of user turn ``turn`` in the groups that are sent together: a stage's own
        tasks with the first stages of its branches that have no pause; every other stage alone."""
        out: list[list[tuple[int, int]]] = []
        for s, i_lists in ((s, _groups(st, 0)[0]) for s, st in enumerate(self.stages) if self._turn_of(s) == turn):
            out.extend([(s, i) for i in group] for group in i_lists)
        return out

    @property
    def turn_count(self) -> int:
        """How many user turns the agent's stages hold (1 for a task-parallel agent)."""
        return self._turn_of(len(self.stages) - 1) + 1 if self.stages else 0

    def _turn_of(self, stage: int) -> int:
        current = 0
        for st in self.stages[: stage + 1]:
            current = st.turn if st.turn is not None else current
        return current

    def task(self, stage: int, index: int) -> Task:
        """The task of call ``index`` of top-level stage ``stage`` (its branches' tasks follow its own)."""
        st = self.stages[stage]
        return st[index] if index < len(st) else st.all_tasks()[index]

    def cost(self, model: CostModel) -> float:
        """The agent's true total cost under ``model``."""
        return sum(model.request_cost(t.prompt_tokens, t.output_tokens) for t in self.tasks)

    def to_json(self) -> dict:
        """The agent as a workload-file document."""
        doc = {
            "agent_id": self.agent_id,
            "type": self.type,
            "arrival_s": self.arrival_s,
            "stages": [stage.to_json() for stage in self.stages],
        }
        if self.weight != 1:
            doc["weight"] = self.weight
        if self.tenant is not None:
            doc["tenant"] = self.tenant
        if self.meta:
            doc["meta"] = self.meta
        return doc


def _groups(stage: Stage, offset: int) -> tuple[list[list[int]], int]:
    """``Agent.turn_groups`` for one stage whose calls start at ``offset``: its groups of call
    indices, and how many calls it has (its branches' included)."""
    groups = [list(range(offset, offset + len(stage)))]
    at = offset + len(stage)
    for chain in stage.branches:
        for j, st in enumerate(chain):
            sub, size = _groups(st, at)
            if j == 0 and not st.pause_s:
                groups[0].extend(sub[0])
                groups.extend(sub[1:])
            else:
                groups.extend(sub)
            at += size
    return [g for g in groups if g], at - offset  # a stage of branches only has no own group


def context_tokens(task: Task, by_id: dict[str, Task]) -> int:
    """How many of the task's prompt tokens its context holds (the rest are its own text)."""
    n = 0
    for seg in task.context:
        ref = by_id[seg.ref] if seg.kind != "shared" else None
        n += seg.tokens if ref is None else (ref.prompt_tokens if seg.kind == "prompt_of" else ref.output_tokens)
    return n


def tasks_by_id(stages: Iterable[Stage]) -> dict[str, Task]:
    """Every task with an id, by id."""
    return {t.id: t for s in stages for t in s.all_tasks() if t.id is not None}


def scale_tokens(agents: Iterable[Agent], factor: float) -> list[Agent]:
    """The agents with every ``prompt_tokens`` and ``output_tokens`` divided by ``factor`` (at least 1).

    For engines far smaller than the paper's (a 2-core CPU): the same agent shapes, shorter texts.
    """
    if not is_positive_finite(factor):
        raise ValueError(f"--scale must be a number > 0, got {factor}.")
    if factor == 1:
        return list(agents)

    def shrink(n: int) -> int:
        return max(1, round(n / factor))

    return [_scaled(a, shrink) for a in agents]


def _scaled(a: Agent, shrink: Callable[[int], int]) -> Agent:
    """The agent with ``shrink`` applied to every length: a shared segment's, each task's own text
    and output; a prompt is then its scaled context plus its scaled own text."""
    if not a.is_session and not any(t.context for t in a.tasks):
        stages = tuple(
            Stage(Task(t.prompt, shrink(t.prompt_tokens), shrink(t.output_tokens), t.id) for t in st) for st in a.stages
        )
        return Agent(a.agent_id, a.type, a.arrival_s, stages, a.meta, a.weight, a.tenant)
    old = tasks_by_id(a.stages)
    new: dict[str, Task] = {}

    def one(t: Task) -> Task:
        context = tuple(Segment.shared(c.ref, shrink(c.tokens)) if c.kind == "shared" else c for c in t.context)
        own = shrink(t.prompt_tokens - context_tokens(t, old))
        scaled = Task(
            t.prompt, own + context_tokens(Task("", 1, 1, None, context), new), shrink(t.output_tokens), t.id, context
        )
        if t.id is not None:
            new[t.id] = scaled
        return scaled

    return Agent(
        a.agent_id, a.type, a.arrival_s, tuple(st.map_tasks(one) for st in a.stages), a.meta, a.weight, a.tenant
    )


def fit_tokens(agents: Iterable[Agent], max_task_tokens: int) -> tuple[list[Agent], float]:
    """The agents scaled down (``scale_tokens``) by the least factor >= 1 that makes every task's
    prompt and output fit in ``max_task_tokens`` (an engine's context and KV cache), and that factor.

    For agents the bench makes itself (calibration), which must run on whatever engine it is given."""
    agents = list(agents)
    if max_task_tokens < 2:
        raise ValueError(f"an engine that holds {max_task_tokens} tokens cannot run a task.")
    longest = max((t.prompt_tokens + t.output_tokens for a in agents for t in a.tasks), default=0)
    factor = 1.0
    if longest > max_task_tokens:
        factor = longest / max_task_tokens
    while True:
        scaled = scale_tokens(agents, factor)
        if all(t.prompt_tokens + t.output_tokens <= max_task_tokens for a in scaled for t in a.tasks):
            return scaled, factor
        factor *= 1.01  # rounding left a task one token over
