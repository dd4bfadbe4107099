"""Scripted answers, for benches and tests only: a vLLM logits processor that makes a random-weight
model (``tiny``) answer as a test or a bench needs, by a means that Justitia's pricing never sees.

Loaded with vLLM's own flag, ``--logits-processors justitia.engine.scripted:ScriptedAnswers`` (or
``LLM(logits_processors=[ScriptedAnswers])``); a deployment never loads it. Two ways to drive it:

- **An answer length** (benches): ``SamplingParams.extra_args["justitia_answer_tokens"] = n``,
  sent by an OpenAI client as ``"vllm_xargs": {"justitia_answer_tokens": n}``. The answer is
  ``n`` tokens, the last of them the end-of-sequence token, whatever ``max_tokens`` allows above
  that. The door and the predictors read ``max_tokens`` and the prompt, never ``vllm_xargs``: a
  bench can send a cap well above the answer, as a harness does, and still end the answer at the
  workload's length.
- **A script** (harness tests): ``JUSTITIA_SCRIPT`` names a JSON file, a list of rules
  ``{"match": REGEX, "answer": TEXT}``. For each request, the rule whose pattern matches latest in
  the prompt (decoded with the model's tokenizer) wins, and the answer is its text's tokens, then
  end-of-sequence; no rule matching leaves the model alone. So a harness's own requests get a
  scripted tool call (``<tool_call>{...}</tool_call>`` for vLLM's ``hermes`` parser) after the
  user's message that asks for it, and a plain answer once the tool's output follows it. The file
  is read again whenever it changes.

Forcing a token sets every other logit to ``-inf``; an answer's position is the length of the
request's output so far (vLLM keeps it current for custom logits processors, async scheduling
included).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from justitia.defaults import ANSWER_TOKENS_KEY, ENV_SCRIPT, env

SCRIPT_ENV = ENV_SCRIPT
MAX_ANSWER_TOKENS = 1 << 20


@dataclass
class _Plan:
    output: list[int]  # the request's output so far (vLLM's list, kept current)
    tokens: list[int] | None = None  # forced tokens, then end-of-sequence
    length: int | None = None  # or: end-of-sequence as token number `length`, never before


def load_script(path: str) -> list[tuple[re.Pattern, str]]:
    """The rules of a script file, checked: a list of ``{"match": REGEX, "answer": TEXT}``."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, list):
        raise ValueError(f"{path}: a script is a JSON list of {{'match', 'answer'}} rules")
    rules = []
    for i, rule in enumerate(doc):
        if not (isinstance(rule, dict) and isinstance(rule.get("match"), str) and isinstance(rule.get("answer"), str)):
            raise ValueError(f"{path}: rule {i} needs string fields 'match' and 'answer'")
        rules.append((re.compile(rule["match"]), rule["answer"]))
    return rules


def pick(rules: list[tuple[re.Pattern, str]], text: str) -> str | None:
    """The answer of the rule whose pattern matches latest in ``text`` (the first such rule on a tie)."""
    best, best_end = None, -1
    for pattern, answer in rules:
        end = max((m.end() for m in pattern.finditer(text)), default=-1)
        if end > best_end:
            best, best_end = answer, end
    return best


class ScriptedAnswers(LogitsProcessor):
    """Forces answers (module docstring). Not argmax-invariant: it decides the answer."""

    @classmethod
    def validate_params(cls, params) -> None:
        n = (params.extra_args or {}).get(ANSWER_TOKENS_KEY)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ANSWER_TOKENS):
            raise ValueError(f"vllm_xargs.{ANSWER_TOKENS_KEY} must be an integer in 1..{MAX_ANSWER_TOKENS}")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        model = vllm_config.model_config
        self.tokenizer = AutoTokenizer.from_pretrained(model.tokenizer, trust_remote_code=model.trust_remote_code)
        self.eos = self.tokenizer.eos_token_id
        self.script, self.script_mtime, self.rules = env(SCRIPT_ENV), None, []
        self.plans: dict[int, _Plan] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def _reload(self) -> None:
        """The script's rules, read again when its file changed (a test may change it between requests)."""
        mtime = os.stat(self.script).st_mtime_ns
        if mtime != self.script_mtime:
            self.rules, self.script_mtime = load_script(self.script), mtime

    def _plan(self, params, prompt: list[int] | None, output: list[int]) -> _Plan | None:
        n = (params.extra_args or {}).get(ANSWER_TOKENS_KEY)
        if n is not None:
            return _Plan(output, length=int(n))
        if self.script:
            self._reload()
        if self.rules and prompt:
            answer = pick(self.rules, self.tokenizer.decode(prompt, skip_special_tokens=True))
            if answer is not None:
                return _Plan(output, tokens=self.tokenizer.encode(answer, add_special_tokens=False))
        return None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.plans.pop(index, None)
        for index, params, prompt, output in batch_update.added:
            plan = self._plan(params, prompt, output)
            if plan is None:
                self.plans.pop(index, None)
            else:
                self.plans[index] = plan
        for a, b, direction in batch_update.moved:
            pa, pb = self.plans.pop(a, None), self.plans.pop(b, None)
            if pa is not None:
                self.plans[b] = pa
            if direction == MoveDirectionality.SWAP and pb is not None:
                self.plans[a] = pb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, plan in self.plans.items():
            if index >= logits.shape[0]:
                continue
            at = len(plan.output)
            if plan.tokens is not None:
                token = plan.tokens[at] if at < len(plan.tokens) else self.eos
            elif at + 1 < plan.length:
                logits[index, self.eos] = float("-inf")  # no end before the answer's length
                continue
            else:
                token = self.eos
            row = logits[index]
            keep = row[token].item() if torch.isfinite(row[token]) else 0.0
            row.fill_(float("-inf"))
            row[token] = keep
        return logits
