"""What ``POST /v1/agents`` accepts, how it is checked, and the stage placeholders.

    {"type": "mrs",
     "stages": [[{"prompt": "Summarize: ...", "max_tokens": 128}, {"prompt": "Summarize: ...", "max_tokens": 128}],
                [{"prompt": "Combine these summaries:\\n{{prev}}", "max_tokens": 256}]]}

Stages run in order; the tasks of a stage run in parallel. A stage is a list of tasks, or an object
``{"tasks": [...], "pause_s": 2.5}`` whose ``pause_s`` the server waits before sending the stage (a
tool's time; at most ``Settings.max_pause_s``). With ``"session": true`` the agent is a session:
its stages are its first turn, and ``TurnSpec`` continues it (``server.turns``). A prompt may quote
the outputs of earlier stages (stages and tasks count from 0, across a session's turns):

    {{prev}}          every output of the previous stage, in task order, separated by a blank line
    {{prev[i]}}       task i of the previous stage
    {{stage[k]}}      every output of stage k
    {{stage[k][i]}}   task i of stage k

A placeholder must name an earlier stage and an existing task, and a prompt holds at most
``MAX_PLACEHOLDERS``: anything else is rejected when the agent is submitted, before anything runs.
Other text in braces is left as it is. A rendered prompt longer than the server's
``max_prompt_chars`` fails its task before it is tokenized.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Sequence, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
)

from justitia.workload import Stage

PLACEHOLDER = re.compile(r"\{\{\s*(prev|stage\[(\d+)\])(?:\[(\d+)\])?\s*\}\}")
TYPE_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"  # agent types are metric labels: a safe alphabet
MAX_PLACEHOLDERS = 64  # per prompt


# Sampling fields, bounded as vLLM's SamplingParams bounds them, so that what is accepted runs.
# (StrictStr also refuses lone surrogates, which JSON can carry and tokenizers choke on.)
Text = StrictStr
Prompt = Annotated[StrictStr, Field(min_length=1)]
Temperature = Annotated[StrictFloat | StrictInt, Field(ge=0, le=2)]
TopP = Annotated[StrictFloat | StrictInt, Field(gt=0, le=1)]
Penalty = Annotated[StrictFloat | StrictInt, Field(ge=-2, le=2)]
Seed = Annotated[StrictInt, Field(ge=0, lt=2**63)]
StopWord = Annotated[StrictStr, Field(min_length=1, max_length=256)]
Stop = Annotated[list[StopWord], Field(max_length=16)]
AgentType = Annotated[StrictStr, Field(pattern=TYPE_PATTERN)]
PauseS = Annotated[StrictFloat | StrictInt, Field(ge=0)]  # bounded by the server (``check_stages``)


class TaskSpec(BaseModel):
    """One request of an agent: the prompt and its sampling fields."""

    model_config = ConfigDict(extra="forbid")

    prompt: Prompt
    max_tokens: Annotated[StrictInt, Field(ge=1)] = 256
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    stop: Stop | None = None
    ignore_eos: StrictBool = False  # generate exactly max_tokens (benchmarks)


class StageSpec(BaseModel):
    """A stage as an object: its tasks and the pause before it."""

    model_config = ConfigDict(extra="forbid")

    tasks: Annotated[list[TaskSpec], Field(min_length=1)]
    pause_s: PauseS = 0.0


def _stage_form(value) -> str | None:
    """Which form a stage takes (the tags name no field in ``first_error``)."""
    return "list" if isinstance(value, (list, tuple)) else "dict" if isinstance(value, (dict, StageSpec)) else None


def _as_stage(value: list[TaskSpec] | StageSpec) -> Stage:
    """Either form as a ``workload.Stage`` of its tasks (a tuple, so code that reads a stage as its
    tasks works unchanged); ``boxed`` remembers the object form, to name its fields."""
    stage = Stage(value.tasks, value.pause_s) if isinstance(value, StageSpec) else Stage(value)
    stage.boxed = isinstance(value, StageSpec)
    return stage


def stage_doc(stage: Stage) -> list | dict:
    """A stage as JSON, in the form it came in (what the journal keeps)."""
    tasks = [t.model_dump() for t in stage]
    return {"tasks": tasks, "pause_s": stage.pause_s} if getattr(stage, "boxed", False) else tasks


StageField = Annotated[
    Union[Annotated[Annotated[list[TaskSpec], Field(min_length=1)], Tag("list")], Annotated[StageSpec, Tag("dict")]],
    Discriminator(
        _stage_form,
        custom_error_type="stage_type",
        custom_error_message='a stage is a list of tasks or an object {"tasks": [...], "pause_s": number}',
    ),
    AfterValidator(_as_stage),
    PlainSerializer(stage_doc),
]


class AgentSpec(BaseModel):
    """An agent: its type (for the cost predictor) and its stages of tasks; a session (``session``)
    takes more stages later, turn by turn (``TurnSpec``)."""

    model_config = ConfigDict(extra="forbid")

    type: AgentType = "default"
    session: StrictBool = False
    stages: Annotated[list[StageField], Field(min_length=1)]


class TurnSpec(BaseModel):
    """A session's next turn (``POST /v1/agents/{id}/turns``): its stages, and whether it is the last
    (``last`` with no stages ends a waiting session)."""

    model_config = ConfigDict(extra="forbid")

    stages: list[StageField] = []
    last: StrictBool = False


class SpecError(ValueError):
    """An agent document that cannot run: the message names the field."""


def task_field(s: int, stage: Stage, i: int) -> str:
    """How a request body names task ``i`` of its stage ``s``, in the form the stage came in."""
    return f"stages[{s}].tasks[{i}]" if getattr(stage, "boxed", False) else f"stages[{s}][{i}]"


def check_agent(spec: AgentSpec, max_tasks: int, max_tokens_limit: int, max_pause_s: float = math.inf) -> None:
    """Limits and placeholders that pydantic does not know about; raises SpecError."""
    check_stages(spec.stages, max_tasks, max_tokens_limit, max_pause_s)


def check_stages(
    stages: Sequence[Stage], max_tasks: int, max_tokens_limit: int, max_pause_s: float, earlier: Sequence[int] = ()
) -> None:
    """``check_agent`` for stages that follow ``earlier`` ones (a session's later turn: the task
    counts of the stages before it, which its placeholders may name; the fields are named as its
    own body names them, from ``stages[0]``); raises SpecError."""
    n = sum(earlier) + sum(len(stage) for stage in stages)
    if n > max_tasks:
        whole = "session has" if earlier else "agent has"
        raise SpecError(f"field 'stages': the {whole} {n} tasks, more than this server's limit of {max_tasks}.")
    sizes = [*earlier, *(len(stage) for stage in stages)]
    for s, stage in enumerate(stages):
        if not stage.pause_s <= max_pause_s:  # (inf too: JSON's Infinity parses)
            raise SpecError(
                f"field 'stages[{s}].pause_s': {stage.pause_s:g} is more than this server's limit of "
                f"{max_pause_s:g} seconds."
            )
        g = len(earlier) + s  # the stage's number in the session
        for i, task in enumerate(stage):
            where = task_field(s, stage, i)
            if task.max_tokens > max_tokens_limit:
                raise SpecError(
                    f"field '{where}.max_tokens': {task.max_tokens} is more than the model's context "
                    f"allows ({max_tokens_limit})."
                )
            found = PLACEHOLDER.findall(task.prompt)
            if len(found) > MAX_PLACEHOLDERS:
                raise SpecError(f"field '{where}.prompt': {len(found)} placeholders, more than {MAX_PLACEHOLDERS}.")
            for m in PLACEHOLDER.finditer(task.prompt):
                k = g - 1 if m.group(1) == "prev" else int(m.group(2))
                if not 0 <= k < g:
                    raise SpecError(f"field '{where}.prompt': placeholder {m.group(0)} must name an earlier stage.")
                if m.group(3) is not None and int(m.group(3)) >= sizes[k]:
                    raise SpecError(
                        f"field '{where}.prompt': placeholder {m.group(0)} names task {m.group(3)}, "
                        f"but stage {k} has {sizes[k]} tasks."
                    )


def render(prompt: str, stage: int, outputs: list[list[str]], limit: int | None = None) -> str:
    """``prompt`` with its placeholders replaced by the outputs of earlier stages; SpecError if the
    result would pass ``limit`` characters (checked before it is built)."""

    def piece(m: re.Match) -> list[str]:
        k = stage - 1 if m.group(1) == "prev" else int(m.group(2))
        return [outputs[k][int(m.group(3))]] if m.group(3) is not None else outputs[k]

    if limit is not None:
        size = len(prompt)
        for m in PLACEHOLDER.finditer(prompt):
            parts = piece(m)
            size += sum(len(p) for p in parts) + 2 * max(len(parts) - 1, 0) - len(m.group(0))
        if size > limit:
            raise SpecError(
                f"stage {stage}: the prompt with its placeholders filled has {size} characters, more "
                f"than this server's limit of {limit}."
            )
    return PLACEHOLDER.sub(lambda m: "\n\n".join(piece(m)), prompt)


_UNION_TAG = re.compile(r"^(str|int|float|bool|list|dict|none)$|[^A-Za-z0-9_]")  # pydantic's names of union members


def _field_path(error: dict) -> list:
    """The error's location without the body and without union members' tags."""
    return [p for p in error.get("loc", ()) if p != "body" and not (isinstance(p, str) and _UNION_TAG.search(p))]


def first_error(errors: list[dict]) -> str:
    """One sentence for the first of pydantic's validation errors, naming the field."""
    if not errors:
        return "the request body is not valid."
    # a union's members each add an error, with the member's tag in the location: of the first field's
    # errors, name the most specific (``stop[0]`` under ``list[str]``, not ``stop`` under ``str``)
    locs = [_field_path(e) for e in errors]
    top = locs[0][:1]
    e, loc = max(((e, loc) for e, loc in zip(errors, locs) if loc[:1] == top), key=lambda el: len(el[1]))
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    kind = e.get("type", "")
    if kind == "json_invalid":
        return "the request body is not valid JSON."
    if kind == "extra_forbidden":
        return f"field '{field}' is not a known field."
    if kind == "missing":
        return f"field '{field}' is missing."
    msg = str(e.get("msg", "is not valid")).rstrip(".")
    if not field:
        return f"the request body is not valid: {msg[0].lower() + msg[1:]}."
    return f"field '{field}': {msg[0].lower() + msg[1:]}."
