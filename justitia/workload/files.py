"""The JSONL workload file: one agent a line, read with every field checked, and written.

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
from pathlib import Path
from typing import Iterable, Iterator

from justitia.core import is_positive_finite
from justitia.workload.agents import (
    SEGMENT_KINDS,
    Agent,
    Segment,
    Stage,
    Task,
    WorkloadError,
    context_tokens,
    tasks_by_id,
)

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
        raise WorkloadError(
            f"{where}: field 'tenant' must be a string of 1-128 characters, got {json.dumps(tenant)[:60]}."
        )
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
            raise WorkloadError(
                f"{where}: field '{here}.pause_s' must be a finite number >= 0, got {json.dumps(pause)[:60]}."
            )
        t = stage.get("turn")
        if t is not None:
            if not top:
                raise WorkloadError(f"{where}: field '{here}.turn': a branch's stages belong to their stage's turn.")
            if isinstance(t, bool) or not isinstance(t, int) or t < turn:
                raise WorkloadError(
                    f"{where}: field '{here}.turn' must be an integer >= {turn} (turns never go back), "
                    f"got {json.dumps(t)[:60]}."
                )
            turn = t
        chain_docs = []
        for bi, branch in enumerate(branches):
            if not isinstance(branch, list) or not branch:
                raise WorkloadError(f"{where}: field '{here}.branches[{bi}]' must be a non-empty list of stages.")
            chain_docs.append(_chain_from_json(branch, where, f"{here}.branches[{bi}]", top=False))
        chain.append(
            Stage(
                (_task_from_json(x, where, f"{here}.tasks[{ti}]") for ti, x in enumerate(tasks)),
                float(pause),
                chain_docs,
                t,
            )
        )
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
        raise WorkloadError(
            f"{where}: field '{at}.id' must be a string of 1-128 characters, got {json.dumps(task_id)[:60]}."
        )
    context = task.get("context", [])
    if not isinstance(context, list):
        raise WorkloadError(f"{where}: field '{at}.context' must be a list of segments.")
    segments = []
    for ci, seg in enumerate(context):
        here = f"{at}.context[{ci}]"
        kinds = [k for k in SEGMENT_KINDS if isinstance(seg, dict) and k in seg]
        if len(kinds) != 1 or not isinstance(seg[kinds[0]], str) or not seg[kinds[0]]:
            raise WorkloadError(
                f'{where}: field \'{here}\' must be one of {{"shared": name, "tokens": n}}, '
                f'{{"prompt_of": task id}}, {{"output_of": task id}}.'
            )
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
                        raise WorkloadError(
                            f"{where}: a context segment of task '{t.id or t.prompt[:30]}' names '{seg.ref}', {what}."
                        )
                if context_tokens(t, by_id) >= t.prompt_tokens:
                    raise WorkloadError(
                        f"{where}: task '{t.id or t.prompt[:30]}': its context's "
                        f"{context_tokens(t, by_id)} tokens leave none of its {t.prompt_tokens} "
                        f"prompt tokens for its own text."
                    )
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
            raise WorkloadError(
                f"{where}: field 'agent_id' repeats '{agent.agent_id}' from line {seen[agent.agent_id]}."
            )
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


def read_data_file(path: Path, what: str) -> dict:
    """A JSON data file shipped with Justitia (``what`` names it in errors), parsed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"{path}: the {what} file is missing.") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}).") from None
