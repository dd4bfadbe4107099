"""``session``: a session's next turn predicted online, from its own earlier turns and its type's.

The paper's predictors price an agent once, from its first stage; a session's turns arrive one by
one, and the best guide to the next is what the session's earlier turns cost (its conversation
only grows), then what other sessions of its type cost. Nothing is trained beforehand: the
predictor learns as turns finish (``observe_turn``) and calls are answered (``observe_call``).

    turn 0        the typical true cost of the first turns its type has finished so far (a first
                  turn carries the system prompt and no history), or, before any, its first
                  call's predicted cost
    turn k > 0    the typical cost of its own last ``HISTORY`` turns, grown by the typical ratio
                  of a turn of its type to the one before (1 before any)

"Typical" is the geometric mean: turn costs are heavy-tailed (most turns are one or two calls, a
few are dozens), and the geometric mean is what minimises the error in ratio terms. A turn that
proves larger moves back as its calls are revealed (the core's retagging).
    a request     its prompt's KV token-time with the type's mean output length so far (a prior
                  of ``PRIOR_OUTPUT_TOKENS`` before any answer): the prompt is known when it is
                  sent, the output is not
"""

from __future__ import annotations

import math

from justitia.core import CostModel
from justitia.predictors.base import Predictor
from justitia.workload import Agent

HISTORY = 3  # earlier turns of the session that predict its next
PRIOR_OUTPUT_TOKENS = 32  # a request's output length before any answer of its type was seen


class _Mean:
    """A running mean, of the values or (``geometric``) of their logarithms."""

    __slots__ = ("n", "total", "geometric")

    def __init__(self, geometric: bool = False) -> None:
        self.n = 0
        self.total = 0.0
        self.geometric = geometric

    def add(self, x: float) -> None:
        if self.geometric and x <= 0:
            return
        self.n += 1
        self.total += math.log(x) if self.geometric else x

    def get(self, default: float) -> float:
        if not self.n:
            return default
        return math.exp(self.total / self.n) if self.geometric else self.total / self.n


class SessionPredictor(Predictor):
    """Turn costs learned online (the module's docstring)."""

    name = "session"

    def __init__(self) -> None:
        self._first: dict[str, _Mean] = {}  # type -> its sessions' first turns' true costs
        self._growth: dict[str, _Mean] = {}  # type -> turn k's true cost over turn k-1's
        self._output: dict[str, _Mean] = {}  # type -> answered calls' output tokens

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        out = self._output.get(agent.type, _Mean()).get(PRIOR_OUTPUT_TOKENS)
        return model.request_cost(agent.task(stage, index).prompt_tokens, max(1.0, out))

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        return self.turn_cost(agent, 0, [], model)

    def turn_cost(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> float:
        if earlier:
            recent = [max(c, 1.0) for c in earlier[-HISTORY:]]
            typical = math.exp(sum(math.log(c) for c in recent) / len(recent))
            return typical * self._growth.get(agent.type, _Mean(True)).get(1.0)
        first = self._first.get(agent.type)
        if first is not None and first.n:
            return first.get(0.0)
        s, i = agent.turn_calls(turn)[0]
        return self.request_cost(agent, s, i, model)

    def observe_turn(
        self, agent_type: str, turn: int, predicted: float, actual: float, earlier: float | None = None
    ) -> None:
        if turn == 0:
            self._first.setdefault(agent_type, _Mean(True)).add(actual)
        if earlier:
            self._growth.setdefault(agent_type, _Mean(True)).add(actual / earlier)

    def observe_call(self, agent_type: str, prompt_tokens: int, output_tokens: int) -> None:
        self._output.setdefault(agent_type, _Mean()).add(output_tokens)
