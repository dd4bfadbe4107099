"""Agents, their stages and tasks, and the JSONL workload file that carries them.

A workload file holds one agent per line (gzip-compressed when its name ends in ``.gz``):

    {"agent_id": str, "type": str, "arrival_s": float, "weight": float (optional, > 0, default 1),
     "tenant": str (optional, 1-128 characters), "stages": [[{"prompt": str, "prompt_tokens": int, "output_tokens": int}, ...], ...]}

Stages run one after another; the tasks inside a stage run in parallel. ``output_tokens`` is the
task's true decode length: engines use it, predictors must not.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from justitia.core import CostModel, is_positive_finite


class WorkloadError(ValueError):
    """A workload file or document that does not match the schema."""


@dataclass(frozen=True)
class Task:
    """One inference request of an agent."""

    prompt: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Agent:
    """A task-parallel agent: stages run in order, the tasks of a stage in parallel."""

    agent_id: str
    type: str
    arrival_s: float
    stages: tuple[tuple[Task, ...], ...]
    meta: dict = field(default_factory=dict, compare=False)
    weight: float = 1.0  # its share under weighted GPS (its tenant's, if it has one)
    tenant: str | None = None  # its tenant: tenants share the engine by weight, agents their tenant's part

    @property
    def tasks(self) -> list[Task]:
        """All tasks, stage by stage."""
        return [t for stage in self.stages for t in stage]

    def cost(self, model: CostModel) -> float:
        """The agent's true total cost under ``model``."""
        return sum(model.request_cost(t.prompt_tokens, t.output_tokens) for t in self.tasks)

    def to_json(self) -> dict:
        """The agent as a workload-file document."""
        doc = {
            "agent_id": self.agent_id,
            "type": self.type,
            "arrival_s": self.arrival_s,
            "stages": [[asdict(t) for t in stage] for stage in self.stages],
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
    stages = []
    for si, stage in enumerate(doc["stages"]):
        if not isinstance(stage, list) or not stage:
            raise WorkloadError(f"{where}: field 'stages[{si}]' must be a non-empty list of tasks.")
        tasks = []
        for ti, task in enumerate(stage):
            at = f"stages[{si}][{ti}]"
            if not isinstance(task, dict):
                raise WorkloadError(f"{where}: field '{at}' must be an object.")
            _check_fields(task, _TASK_FIELDS, where, prefix=f"{at}.")
            if task["prompt_tokens"] < 1:
                raise WorkloadError(f"{where}: field '{at}.prompt_tokens' must be >= 1.")
            if task["output_tokens"] < 1:
                raise WorkloadError(f"{where}: field '{at}.output_tokens' must be >= 1.")
            tasks.append(Task(task["prompt"], task["prompt_tokens"], task["output_tokens"]))
        stages.append(tuple(tasks))
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise WorkloadError(f"{where}: field 'meta' must be an object.")
    weight = doc.get("weight", 1.0)
    if isinstance(weight, bool) or not is_positive_finite(weight):
        raise WorkloadError(f"{where}: field 'weight' must be a finite number > 0, got {json.dumps(weight)[:60]}.")
    tenant = doc.get("tenant")
    if "tenant" in doc and not (isinstance(tenant, str) and 1 <= len(tenant) <= 128):
        raise WorkloadError(f"{where}: field 'tenant' must be a string of 1-128 characters, got {json.dumps(tenant)[:60]}.")
    return Agent(doc["agent_id"], doc["type"], arrival, tuple(stages), meta, float(weight), tenant)


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

    return [
        Agent(a.agent_id, a.type, a.arrival_s,
              tuple(tuple(Task(t.prompt, shrink(t.prompt_tokens), shrink(t.output_tokens)) for t in stage)
                    for stage in a.stages),
              a.meta, a.weight, a.tenant)
        for a in agents
    ]


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
