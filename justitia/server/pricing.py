"""How the server prices what a client submits: the prompts tokenized (in the model's chat
template), each checked against the context, and the agent's predicted cost, raised to what its
``ignore_eos`` tasks will surely cost and capped by what its tasks could cost at most
(docs/reference.md, "Keys, owners and prices"). It reads only the request; the engine never sees a client's price.
"""

from __future__ import annotations

import asyncio
import functools
import time

from justitia.agent import AgentProcess
from justitia.core import KV
from justitia.engine.models import chat_ids
from justitia.predictors import Predictor
from justitia.server.keys import Client
from justitia.server.schema import PLACEHOLDER, AgentSpec, SpecError, render
from justitia.workload import Agent, Task


class Pricer:
    """Tokenizes and prices agents for one server (its tokenizer, settings and predictor)."""

    def __init__(self, tokenizer, settings, predictor: Predictor):
        self.tokenizer, self.settings, self.predictor = tokenizer, settings, predictor

    def ids_of(self, prompt: str) -> list[int]:
        """A prompt's token ids, in the model's chat template when it has one (and ``settings.chat``)."""
        tok = self.tokenizer
        if self.settings.chat and tok.chat_template:
            return chat_ids(tok, [{"role": "user", "content": prompt}])
        return tok.encode(prompt)

    def ids_checked(self, prompt: str) -> list[int]:
        """``ids_of``, refused untokenized if the prompt is longer than any prompt that could fit the context."""
        if len(prompt) > self.settings.max_prompt_chars:
            raise SpecError(
                f"the prompt has {len(prompt)} characters, more than this server's limit of "
                f"{self.settings.max_prompt_chars}."
            )
        return self.ids_of(prompt)

    async def encode(self, prompt: str) -> list[int]:
        """``ids_checked`` off the event loop (tokenizing a long prompt takes time)."""
        if len(prompt) > self.settings.max_prompt_chars:  # no trip to a thread for that
            return self.ids_checked(prompt)
        return await asyncio.to_thread(self.ids_checked, prompt)

    def process(self, agent_id: str, spec: AgentSpec, client: Client) -> tuple[AgentProcess, list[list[int]]]:
        """The agent's process, with what the predictor sees at arrival: the first stage's prompts
        and lengths (later stages' prompts still hold their placeholders; their lengths are not known
        yet); and the first stage's token ids, which its tasks then send as they are. Tokenizes: run
        it off the event loop."""
        first = []
        for i, t in enumerate(spec.stages[0]):
            try:
                first.append(self.ids_checked(t.prompt))
            except SpecError as exc:
                raise SpecError(f"field 'stages[0][{i}].prompt': {exc}") from None
            if len(first[i]) + t.max_tokens > self.settings.max_model_len:
                raise SpecError(
                    f"field 'stages[0][{i}].prompt': {len(first[i])} prompt tokens + max_tokens "
                    f"{t.max_tokens} exceed the model's context of {self.settings.max_model_len} tokens."
                )
        later = {}  # a later stage's own text (placeholders left out), tokenized: a floor on its prompt
        for s, stage in enumerate(spec.stages[1:], 1):
            for i, t in enumerate(stage):
                own = PLACEHOLDER.sub("", t.prompt)
                try:
                    later[s, i] = len(self.ids_checked(own))
                except SpecError as exc:
                    raise SpecError(f"field 'stages[{s}][{i}].prompt': {exc}") from None
                if later[s, i] + t.max_tokens > self.settings.max_model_len:
                    raise SpecError(
                        f"field 'stages[{s}][{i}].prompt': its own text is {later[s, i]} tokens, with "
                        f"max_tokens {t.max_tokens} more than the model's context of "
                        f"{self.settings.max_model_len} tokens before any placeholder is filled."
                    )
        view = Agent(
            agent_id,
            spec.type,
            0.0,
            tuple(
                tuple(
                    Task(t.prompt, len(first[i]) if s == 0 else max(later[s, i], len(t.prompt) // 4), t.max_tokens)
                    for i, t in enumerate(stage)
                )
                for s, stage in enumerate(spec.stages)
            ),
            weight=client.weight,
            tenant=client.tenant,
        )
        # submitted whole: priced on every stage, so that a cheap first stage cannot hide heavy later ones
        process = AgentProcess(
            view,
            self.predictor,
            KV,
            tasks=spec.stages,
            pricing="all-stages",
            render=functools.partial(render, limit=self.settings.max_prompt_chars),
        )
        return process, first

    def priced(self, agent_id: str, spec: AgentSpec, client: Client) -> tuple[AgentProcess, list[list[int]], float]:
        """``_process`` and its price (and how long the predictor took), in one trip to a worker
        thread. The rule (docs/reference.md, "Keys, owners and prices"): a task's KV token-time is at
        most ``p*m + m^2/2`` for its prompt's ``p`` tokens and ``m = max_tokens`` (its bound), and
        exactly that with ``ignore_eos``. The price is the predictor's, raised to what the
        ``ignore_eos`` tasks will cost (whatever a predictor reads of their text) and never above the
        sum of every task's bound (a prompt with placeholders, whose filled length is not known yet,
        at the longest the context allows: ``max_model_len - m``); the process applies both
        (``AgentProcess.predict``'s ``bounds``). What the predictor misses below that, retagging on
        attained service catches in the engine."""
        process, first = self.process(agent_id, spec, client)
        t0 = time.perf_counter()
        known = ceiling = 0.0
        for s, stage in enumerate(process.agent.stages):
            for i, task in enumerate(stage):
                given = spec.stages[s][i]
                p = task.prompt_tokens
                if PLACEHOLDER.search(given.prompt):
                    p = max(p, self.settings.max_model_len - task.output_tokens)
                ceiling += KV.request_cost(p, task.output_tokens)
                if given.ignore_eos:
                    known += KV.request_cost(task.prompt_tokens, task.output_tokens)
        process.predict((known, ceiling))  # every value of a distribution within the same limits
        return process, first, time.perf_counter() - t0
