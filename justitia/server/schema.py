"""What ``POST /v1/agents`` accepts, how it is checked, and the stage placeholders.

    {"type": "mrs",
     "stages": [[{"prompt": "Summarize: ...", "max_tokens": 128}, {"prompt": "Summarize: ...", "max_tokens": 128}],
                [{"prompt": "Combine these summaries:\\n{{prev}}", "max_tokens": 256}]]}

Stages run in order; the tasks of a stage run in parallel. A prompt may quote the outputs of
earlier stages (stages and tasks count from 0):

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

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

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


class AgentSpec(BaseModel):
    """An agent: its type (for the cost predictor) and its stages of tasks."""

    model_config = ConfigDict(extra="forbid")

    type: AgentType = "default"
    stages: Annotated[list[Annotated[list[TaskSpec], Field(min_length=1)]], Field(min_length=1)]


class SpecError(ValueError):
    """An agent document that cannot run: the message names the field."""


def check_agent(spec: AgentSpec, max_tasks: int, max_tokens_limit: int) -> None:
    """Limits and placeholders that pydantic does not know about; raises SpecError."""
    n = sum(len(stage) for stage in spec.stages)
    if n > max_tasks:
        raise SpecError(f"field 'stages': the agent has {n} tasks, more than this server's limit of {max_tasks}.")
    for s, stage in enumerate(spec.stages):
        for i, task in enumerate(stage):
            where = f"stages[{s}][{i}]"
            if task.max_tokens > max_tokens_limit:
                raise SpecError(f"field '{where}.max_tokens': {task.max_tokens} is more than the model's context "
                                f"allows ({max_tokens_limit}).")
            found = PLACEHOLDER.findall(task.prompt)
            if len(found) > MAX_PLACEHOLDERS:
                raise SpecError(f"field '{where}.prompt': {len(found)} placeholders, more than {MAX_PLACEHOLDERS}.")
            for m in PLACEHOLDER.finditer(task.prompt):
                k = s - 1 if m.group(1) == "prev" else int(m.group(2))
                if not 0 <= k < s:
                    raise SpecError(f"field '{where}.prompt': placeholder {m.group(0)} must name an earlier stage.")
                if m.group(3) is not None and int(m.group(3)) >= len(spec.stages[k]):
                    raise SpecError(f"field '{where}.prompt': placeholder {m.group(0)} names task {m.group(3)}, "
                                    f"but stage {k} has {len(spec.stages[k])} tasks.")


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
            raise SpecError(f"stage {stage}: the prompt with its placeholders filled has {size} characters, more "
                            f"than this server's limit of {limit}.")
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
