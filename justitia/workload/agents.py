"""Agents, their stages and tasks, and the JSONL workload file that carries them.

A workload file holds one agent per line (gzip-compressed when its name ends in ``.gz``):

    {"agent_id": str, "type": str, "arrival_s": float, "weight": float (optional, > 0, default 1),
     "tenant": str (optional, 1-128 characters), "stages": [stage, ...]}
    stage := [task, ...] | {"tasks": [task, ...], "branches": [[stage, ...], ...], "pause_s": float, "turn": int}
    task  := {"prompt": str, "prompt_tokens": int, "output_tokens": int, "id": str, "context": [segment, ...]}
    segment := {"shared": str, "tokens": int} | {"prompt_of": task id} | {"output_of": task id}

Stages run one after another; the tasks inside a stage run in parallel, beside its branches
(subagents: chains of stages of their own); ``pause_s`` is waited before a stage (tool time, a
client's own work); ``turn`` numbers the user turn a top-level stage belongs to. A task's prompt
begins with its ``context`` (text shared by name, or an earlier task's prompt or output) and
``prompt_tokens`` counts it. Every field after ``output_tokens`` is optional; ``docs/sessions.md``
gives the rules. ``output_tokens`` is the task's true decode length: engines use it, predictors
must not.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

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

    def __new__(cls, tasks: Iterable[Task] = (), pause_s: float = 0.0, branches: Iterable[Iterable["Stage"]] = (),
                turn: int | None = None):
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
            (self.pause_s, self.branches, self.turn) == (getattr(other, "pause_s", 0.0), getattr(other, "branches", ()),
                                                         getattr(other, "turn", None)))

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return f"Stage({tuple(self)!r})" if self.plain else \
            f"Stage({tuple(self)!r}, pause_s={self.pause_s!r}, branches={self.branches!r}, turn={self.turn!r})"

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
        return Stage((fn(t) for t in self), self.pause_s, (tuple(s.map_tasks(fn) for s in chain) for chain in self.branches),
                     self.turn)

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

    def __post_init__(self):
        if not all(type(s) is Stage for s in self.stages):
            object.__setattr__(self, "stages", tuple(s if isinstance(s, Stage) else Stage(s) for s in self.stages))

    @property
    def tasks(self) -> list[Task]:
        """All tasks, stage by stage (a stage's branches after its own tasks)."""
        return [t for stage in self.stages for t in stage.all_tasks()]

    @property
    def is_session(self) -> bool:
        """Whether any stage pauses, branches or names a turn (a session, not the paper's agent)."""
        return not all(s.plain for s in self.stages)

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


_AGENT_FIELDS = {"agent_id": str, "type": str, "arrival_s": (int, float), "stages": list}
_TASK_FIELDS = {"prompt": str, "prompt_tokens": int, "output_tokens": int}


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return "a number"
    return {str: "a string", int: "an integer", list: "a list"}[t]


def _check_fields(doc: dict, fields: dict, where: str, prefix: str = "", optional: frozenset = frozenset()) -> None:
    """Every field present with its type, and no unknown ones."""
    for name, typ in fields.items():
        if name not in doc:
            raise WorkloadError(f"{where}: field '{prefix}{name}' is missing; expected {_type_name(typ)}.")
        value = doc[name]
        if isinstance(value, bool) or not isinstance(value, typ):
            raise WorkloadError(
                f"{where}: field '{prefix}{name}' must be {_type_name(typ)}, got {json.dumps(value)[:60]}."
            )
    unknown = set(doc) - set(fields) - optional
    if unknown:
        raise WorkloadError(f"{where}: unknown field '{prefix}{sorted(unknown)[0]}'.")


def agent_from_json(doc: object, where: str) -> Agent:
    """Validate one workload document and build the agent; ``where`` names it in errors."""
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected a JSON object for the agent, got {type(doc).__name__}.")
    _check_fields(doc, _AGENT_FIELDS, where, optional=frozenset({"meta", "weight", "tenant"}))
    if not doc["agent_id"]:
        raise WorkloadError(f"{where}: field 'agent_id' must be a non-empty string.")
    arrival = float(doc["arrival_s"])
    if not math.isfinite(arrival) or arrival < 0:
        raise WorkloadError(f"{where}: field 'arrival_s' must be a finite number >= 0, got {arrival}.")
    if not doc["stages"]:
        raise WorkloadError(f"{where}: field 'stages' must hold at least one stage.")
    stages = _chain_from_json(doc["stages"], where, "stages", top=True)
    _check_context(stages, where)
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise WorkloadError(f"{where}: field 'meta' must be an object.")
    weight = doc.get("weight", 1.0)
    if isinstance(weight, bool) or not is_positive_finite(weight):
        raise WorkloadError(f"{where}: field 'weight' must be a finite number > 0, got {json.dumps(weight)[:60]}.")
    tenant = doc.get("tenant")
    if "tenant" in doc and not (isinstance(tenant, str) and 1 <= len(tenant) <= 128):
        raise WorkloadError(f"{where}: field 'tenant' must be a string of 1-128 characters, got {json.dumps(tenant)[:60]}.")
    return Agent(doc["agent_id"], doc["type"], arrival, stages, meta, float(weight), tenant)


_STAGE_FIELDS = frozenset({"tasks", "branches", "pause_s", "turn"})


def _chain_from_json(docs: list, where: str, at: str, top: bool) -> tuple[Stage, ...]:
    """A chain of stages (the agent's, or a branch's), each checked with its field named."""
    chain = []
    turn = 0
    for si, stage in enumerate(docs):
        here = f"{at}[{si}]"
        if isinstance(stage, list):
            if not stage:
                raise WorkloadError(f"{where}: field '{here}' must be a non-empty list of tasks.")
            chain.append(Stage(_task_from_json(t, where, f"{here}[{ti}]") for ti, t in enumerate(stage)))
            continue
        if not isinstance(stage, dict):
            raise WorkloadError(f"{where}: field '{here}' must be a list of tasks or an object.")
        unknown = set(stage) - _STAGE_FIELDS
        if unknown:
            raise WorkloadError(f"{where}: unknown field '{here}.{sorted(unknown)[0]}'.")
        tasks = stage.get("tasks", [])
        branches = stage.get("branches", [])
        if not isinstance(tasks, list) or not isinstance(branches, list):
            name = "tasks" if not isinstance(tasks, list) else "branches"
            raise WorkloadError(f"{where}: field '{here}.{name}' must be a list.")
        if not tasks and not branches:
            raise WorkloadError(f"{where}: field '{here}' must hold at least one task or one branch.")
        pause = stage.get("pause_s", 0.0)
        if isinstance(pause, bool) or not isinstance(pause, (int, float)) or not math.isfinite(pause) or pause < 0:
            raise WorkloadError(f"{where}: field '{here}.pause_s' must be a finite number >= 0, got {json.dumps(pause)[:60]}.")
        t = stage.get("turn")
        if t is not None:
            if not top:
                raise WorkloadError(f"{where}: field '{here}.turn': a branch's stages belong to their stage's turn.")
            if isinstance(t, bool) or not isinstance(t, int) or t < turn:
                raise WorkloadError(f"{where}: field '{here}.turn' must be an integer >= {turn} (turns never go back), "
                                    f"got {json.dumps(t)[:60]}.")
            turn = t
        chain_docs = []
        for bi, branch in enumerate(branches):
            if not isinstance(branch, list) or not branch:
                raise WorkloadError(f"{where}: field '{here}.branches[{bi}]' must be a non-empty list of stages.")
            chain_docs.append(_chain_from_json(branch, where, f"{here}.branches[{bi}]", top=False))
        chain.append(Stage((_task_from_json(x, where, f"{here}.tasks[{ti}]") for ti, x in enumerate(tasks)),
                           float(pause), chain_docs, t))
    return tuple(chain)


def _task_from_json(task: object, where: str, at: str) -> Task:
    if not isinstance(task, dict):
        raise WorkloadError(f"{where}: field '{at}' must be an object.")
    _check_fields(task, _TASK_FIELDS, where, prefix=f"{at}.", optional=frozenset({"id", "context"}))
    if task["prompt_tokens"] < 1:
        raise WorkloadError(f"{where}: field '{at}.prompt_tokens' must be >= 1.")
    if task["output_tokens"] < 1:
        raise WorkloadError(f"{where}: field '{at}.output_tokens' must be >= 1.")
    task_id = task.get("id")
    if "id" in task and not (isinstance(task_id, str) and 1 <= len(task_id) <= 128):
        raise WorkloadError(f"{where}: field '{at}.id' must be a string of 1-128 characters, got {json.dumps(task_id)[:60]}.")
    context = task.get("context", [])
    if not isinstance(context, list):
        raise WorkloadError(f"{where}: field '{at}.context' must be a list of segments.")
    segments = []
    for ci, seg in enumerate(context):
        here = f"{at}.context[{ci}]"
        kinds = [k for k in SEGMENT_KINDS if isinstance(seg, dict) and k in seg]
        if len(kinds) != 1 or not isinstance(seg[kinds[0]], str) or not seg[kinds[0]]:
            raise WorkloadError(f"{where}: field '{here}' must be one of {{\"shared\": name, \"tokens\": n}}, "
                                f"{{\"prompt_of\": task id}}, {{\"output_of\": task id}}.")
        kind = kinds[0]
        if kind == "shared":
            n = seg.get("tokens")
            if set(seg) != {"shared", "tokens"} or isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise WorkloadError(f"{where}: field '{here}.tokens' must be an integer >= 1 (and no other field).")
            segments.append(Segment.shared(seg["shared"], n))
        else:
            if len(seg) != 1:
                raise WorkloadError(f"{where}: unknown field '{here}.{sorted(set(seg) - {kind})[0]}'.")
            segments.append(Segment(kind, seg[kind]))
    return Task(task["prompt"], task["prompt_tokens"], task["output_tokens"], task_id, tuple(segments))


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


def _check_context(stages: tuple[Stage, ...], where: str) -> None:
    """Ids unique; a context names only tasks finished before its stage starts (an earlier stage of
    its chain, or of a chain that holds it); its tokens fewer than the prompt's."""
    seen: set[str] = set()
    for s in stages:
        for t in s.all_tasks():
            if t.id is not None:
                if t.id in seen:
                    raise WorkloadError(f"{where}: task id '{t.id}' appears twice in the agent.")
                seen.add(t.id)
    by_id = tasks_by_id(stages)

    def chain(ch: tuple[Stage, ...], done: frozenset) -> set[str]:
        done = set(done)
        ids: set[str] = set()
        for s in ch:
            for t in s:
                for seg in t.context:
                    if seg.kind != "shared" and seg.ref not in done:
                        what = "no task" if seg.ref not in by_id else "a task not finished before it starts"
                        raise WorkloadError(f"{where}: a context segment of task '{t.id or t.prompt[:30]}' names "
                                            f"'{seg.ref}', {what}.")
                if context_tokens(t, by_id) >= t.prompt_tokens:
                    raise WorkloadError(f"{where}: task '{t.id or t.prompt[:30]}': its context's "
                                        f"{context_tokens(t, by_id)} tokens leave none of its {t.prompt_tokens} "
                                        f"prompt tokens for its own text.")
            stage_ids = {t.id for t in s if t.id is not None}
            for br in s.branches:
                stage_ids |= chain(br, frozenset(done))
            done |= stage_ids
            ids |= stage_ids
        return ids

    chain(stages, frozenset())


def read_jsonl(path: Path) -> Iterator[tuple[int, str, object]]:
    """Yield (line number, "file:line", parsed document) for each non-blank line of a JSONL file."""
    with _open(path, "rt") as fh:
        lines = enumerate(fh, start=1)
        while True:
            try:
                lineno, line = next(lines)
            except StopIteration:
                return
            except (OSError, EOFError) as exc:  # a cut or corrupt .gz
                raise WorkloadError(f"{path}: cannot be read as gzip-compressed JSONL ({exc}).") from None
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield lineno, where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}).") from None


def _open(path: Path, mode: str):
    """A text file, through gzip when its name ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def load_workload(path: str | Path) -> list[Agent]:
    """Read and validate a JSONL workload; the first bad line raises and nothing is returned."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such workload file.")
    agents: list[Agent] = []
    seen: dict[str, int] = {}
    for lineno, where, doc in read_jsonl(path):
        agent = agent_from_json(doc, where)
        if agent.agent_id in seen:
            raise WorkloadError(f"{where}: field 'agent_id' repeats '{agent.agent_id}' from line {seen[agent.agent_id]}.")
        seen[agent.agent_id] = lineno
        agents.append(agent)
    if not agents:
        raise WorkloadError(f"{path}: the workload holds no agents.")
    return sorted(agents, key=lambda a: a.arrival_s)


def save_workload(agents: Iterable[Agent], path: str | Path) -> Path:
    """Write agents as a JSONL workload file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "wt") as fh:
        for agent in agents:
            fh.write(json.dumps(agent.to_json(), ensure_ascii=False) + "\n")
    return path


def append_agent(agent: Agent, path: str | Path) -> None:
    """Add one agent to a workload file (a new gzip member for ``.gz``: readers see one stream)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "at") as fh:
        fh.write(json.dumps(agent.to_json(), ensure_ascii=False) + "\n")


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
        stages = tuple(Stage(Task(t.prompt, shrink(t.prompt_tokens), shrink(t.output_tokens), t.id) for t in st)
                       for st in a.stages)
        return Agent(a.agent_id, a.type, a.arrival_s, stages, a.meta, a.weight, a.tenant)
    old = tasks_by_id(a.stages)
    new: dict[str, Task] = {}

    def one(t: Task) -> Task:
        context = tuple(Segment.shared(c.ref, shrink(c.tokens)) if c.kind == "shared" else c for c in t.context)
        own = shrink(t.prompt_tokens - context_tokens(t, old))
        scaled = Task(t.prompt, own + context_tokens(Task("", 1, 1, None, context), new), shrink(t.output_tokens),
                      t.id, context)
        if t.id is not None:
            new[t.id] = scaled
        return scaled

    return Agent(a.agent_id, a.type, a.arrival_s, tuple(st.map_tasks(one) for st in a.stages), a.meta, a.weight,
                 a.tenant)


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
