"""What a predictor sees of an agent when it arrives, and of a request when it is submitted.

Prompts put their instructions (and length hints) first; reading only the head keeps a prediction
well under a millisecond however long the documents are. Lengths enter as numbers.
"""

from __future__ import annotations

import math

from justitia.workload import Agent, Task

ALL_TYPES = "*"  # the model (or mean) over every type, for types never seen in training
PROMPT_HEAD_CHARS = 600
AGENT_TEXT_CHARS = 4000
MAX_REQUESTS_PER_TYPE = 500  # requests sampled per type to fit a request-cost model


def agent_text(agent: Agent) -> str:
    """What the predictor reads of an agent at arrival: the head of each first-stage prompt."""
    return "\n".join(t.prompt[:PROMPT_HEAD_CHARS] for t in agent.stages[0])[:AGENT_TEXT_CHARS]


def request_text(task: Task) -> str:
    """What the predictor reads of a request: the head of its prompt."""
    return task.prompt[:AGENT_TEXT_CHARS]


def agent_numbers(agent: Agent) -> list[float]:
    """Known at arrival: first-stage prompt tokens and tasks, log-scaled."""
    first = agent.stages[0]
    return [math.log1p(sum(t.prompt_tokens for t in first)), math.log1p(len(first))]


def request_numbers(task: Task) -> list[float]:
    """Known when a request is submitted: its prompt tokens, log-scaled."""
    return [math.log1p(task.prompt_tokens), 0.0]
