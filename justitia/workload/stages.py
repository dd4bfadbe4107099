"""Stage construction: one agent's stages in order, each task's output length drawn first, then its
prompt (instruction + fresh body + listed earlier outputs, shortened to fit the context). The
instructions state noisy hints of the true lengths ("about 812 words", "in about 6 sentences").

A stage-by-stage generation is sent back, per stage, either None (drawn lengths, bank text) or per
task the (output text, output tokens) of a real model's answer; later stages quote those outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from justitia.workload.agents import Task
from justitia.workload.parameters import HINT_FIELDS, dist_max, for_size
from justitia.workload.text import Bank, bank_text, cut_words


def draw(spec: dict, size: str, rng: np.random.Generator, count: int, n: int = 1) -> np.ndarray:
    """``count`` integer lengths from a distribution spec (``per_item`` sums ``n`` draws each)."""
    d = for_size(spec, size)
    per_item = d.get("per_item", False)
    k = count * n if per_item else count
    if d["dist"] == "uniform":
        vals = rng.integers(d["min"], d["max"] + 1, size=k)
    else:
        median = d["median"]
        if d.get("agent_sigma", 0) > 0:
            median *= math.exp(d["agent_sigma"] * rng.standard_normal())
        vals = np.rint(median * np.exp(d["sigma"] * rng.standard_normal(k)))
        vals = np.clip(vals, d["min"], d["max"]).astype(np.int64)
    if per_item:
        vals = np.minimum(vals.reshape(count, n).sum(axis=1), d["max_total"])
    return vals.astype(np.int64)


def _noisy(value: float, sigma: float, rng: np.random.Generator) -> int:
    """``value`` times a lognormal factor, rounded to an integer >= 1."""
    return max(1, int(round(value * math.exp(sigma * rng.standard_normal()))))


def _band(bands: list, value: float) -> str:
    for bound, word in bands:
        if bound is None or value < bound:
            return word
    return bands[-1][1]


@dataclass
class Ctx:
    """What one agent's generation shares across its stages."""

    params: dict
    bank: Bank
    size: str
    n: int
    topic: str
    rng: np.random.Generator
    scale: float = 1.0  # every drawn length divided by this (at least 1): agents in miniature

    def shrink(self, vals: np.ndarray) -> np.ndarray:
        """Drawn lengths divided by ``scale``; the draws themselves do not change."""
        if self.scale == 1:
            return vals
        return np.maximum(1, np.rint(vals / self.scale)).astype(np.int64)

    @property
    def wpt(self) -> float:
        return self.params["words_per_token"]

    def words(self, tokens: int) -> int:
        return int(round(tokens * self.wpt))

    def render(self, template: str, i: int, body_words: int, out_tokens: float) -> str:
        """The instruction with exact and noisy hint fields filled in."""
        p, rng = self.params, self.rng
        sigma = p["hint_noise_sigma"]
        noisy_body = _noisy(body_words, sigma, rng)
        noisy_out = _noisy(out_tokens, sigma, rng)
        return template.format(
            topic=self.topic,
            i=i,
            n=self.n,
            n_hint=_noisy(self.n, sigma, rng),
            body_words=noisy_body,
            length_word=_band(p["length_words"], noisy_body),
            out_sentences=max(1, int(round(noisy_out / p["tokens_per_sentence"]))),
            out_words=max(1, int(round(noisy_out * self.wpt))),
            detail_word=_band(p["detail_words"], noisy_out),
        )

    def instruction_tokens(self, template: str) -> int:
        """Tokens of the rendered instruction; every hint field renders as one word."""
        n_words = len(template.format(**{f: "x" for f in HINT_FIELDS - {"topic"}}, topic=self.topic).split())
        return math.ceil(n_words / self.wpt)


def _fit(budget: int, fresh: int, items: list[int]) -> tuple[int, list[int]]:
    """Shrink listed outputs (proportionally), then the fresh body, so their sum fits ``budget``."""
    total = sum(items)
    if fresh + total <= budget:
        return fresh, items
    room = max(budget - fresh, len(items))
    if total > room:
        items = [max(1, t * room // total) for t in items]
    fresh = max(0, min(fresh, budget - sum(items)))
    return fresh, items


def _stage_tasks(ctx: Ctx, spec: dict, earlier: list[tuple[dict, list[int], list[str] | None]]) -> tuple[Task, ...]:
    """The tasks of one non-history stage; ``earlier`` holds (stage spec, output lengths, output
    texts or None) so far."""
    rng, size = ctx.rng, ctx.size
    max_ctx = ctx.params["max_context_tokens"]
    count = ctx.n if spec["tasks"] == "n" else spec["tasks"]
    outs = ctx.shrink(draw(spec["output_tokens"], size, rng, count, ctx.n))
    shared_prompt = spec.get("shared_prompt", False)
    shared_body = shared_prompt or spec.get("shared_body", False)
    if "body_tokens" in spec:
        fresh = ctx.shrink(draw(spec["body_tokens"], size, rng, 1 if shared_body else count))
        fresh = np.repeat(fresh, count) if shared_body else fresh
    else:
        fresh = np.zeros(count, dtype=np.int64)
    instr_tokens = ctx.instruction_tokens(spec["instruction"])

    def listed(j: int) -> list[tuple[str, int, str | None]]:
        mode = spec["context"]
        sources = earlier[-1:] if mode in ("previous", "paired") else earlier if mode == "all" else []
        items = []
        for src, src_outs, src_texts in sources:
            numbered = len(src_outs) > 1 or src["tasks"] == "n"
            for k, t in enumerate(src_outs):
                if mode == "paired" and k != j:
                    continue
                label = f"{src['output_label']} {k + 1}" if numbered else src["output_label"]
                items.append((label, int(t), None if src_texts is None else src_texts[k]))
        return items

    shared_text: str | None = None
    tasks = []
    for j in range(count):
        out = int(outs[j])
        if shared_prompt:
            out_hint = float(outs.mean())
            budget = max_ctx - int(outs.max()) - instr_tokens
        else:
            out_hint, budget = out, max_ctx - out - instr_tokens
        items = listed(j)
        body, item_tokens = _fit(budget, int(fresh[j]), [t for _, t, _ in items])
        if shared_body and shared_text is not None:
            body_text = shared_text
        else:
            body_text = bank_text(ctx.bank, ctx.words(body), rng)
            shared_text = body_text
        blocks = [body_text] if body_text else []
        blocks += [
            f"{label}:\n{bank_text(ctx.bank, ctx.words(t), rng) if text is None else cut_words(text, full, t)}"
            for (label, full, text), t in zip(items, item_tokens)
        ]
        body_words = ctx.words(body) + sum(ctx.words(t) for t in item_tokens)
        if shared_prompt and tasks:
            prompt = tasks[0].prompt
        else:
            prompt = ctx.render(spec["instruction"], j + 1, body_words, out_hint) + "\n\n" + "\n\n".join(blocks)
        tasks.append(Task(prompt, instr_tokens + body + sum(item_tokens), out))
    return tuple(tasks)


def _history_stages(ctx: Ctx, spec: dict):
    """n sequential one-task rounds whose prompts carry the growing action/observation history.

    A generator: yields each round's stage and takes back its outputs; returns
    the rounds' (output lengths, output texts or None)."""
    rng, size, rounds = ctx.rng, ctx.size, ctx.n
    max_ctx = ctx.params["max_context_tokens"]
    cap = max_ctx - dist_max(for_size(spec["output_tokens"], size))
    outs = ctx.shrink(draw(spec["output_tokens"], size, rng, rounds))
    obs = ctx.shrink(draw(spec["observation_tokens"], size, rng, rounds))
    instr_tokens = ctx.instruction_tokens(spec["instruction"])
    base = min(int(ctx.shrink(draw(spec["body_tokens"], size, rng, 1))[0]), cap - instr_tokens)
    base_text = bank_text(ctx.bank, ctx.words(base), rng)
    pieces: list[tuple[str, int]] = []  # (text, tokens) of each finished round
    done: list[tuple[int, str | None]] = []
    for r in range(rounds):
        budget = cap - instr_tokens - base
        hist_full = sum(t for _, t in pieces)
        hist = min(hist_full, budget)
        kept, used = [], 0
        for text, t in reversed(pieces):
            if used + t > hist:
                break
            kept.append(text)
            used += t
        kept.reverse()
        if len(kept) < len(pieces):
            kept.insert(0, "(earlier steps omitted)")
        body_words = ctx.words(base) + sum(len(k.split()) for k in kept)
        prompt = ctx.render(spec["instruction"], r + 1, body_words, int(outs[r])) + "\n\n" + base_text
        if kept:
            prompt += "\n\n" + "\n".join(kept)
        real = yield (Task(prompt, instr_tokens + base + hist, int(outs[r])),)
        if real is None:
            act, act_tokens = bank_text(ctx.bank, ctx.words(int(outs[r])), rng), int(outs[r])
        else:
            act, act_tokens = real[0]
        seen = bank_text(ctx.bank, ctx.words(int(obs[r])), rng)
        pieces.append((f"> {act}\n{seen}", int(act_tokens + obs[r])))
        done.append((int(act_tokens), None if real is None else act))
    return done


def agent_stages(ctx: Ctx, wf: dict):
    """All stages of one agent in order: yields each stage, takes back its outputs."""
    earlier: list[tuple[dict, list[int], list[str] | None]] = []
    for spec in wf["stages"]:
        if spec["context"] == "history":
            rounds = yield from _history_stages(ctx, spec)
            earlier.extend((spec, [t], None if text is None else [text]) for t, text in rounds)
        else:
            stage = _stage_tasks(ctx, spec, earlier)
            real = yield stage
            if real is None:
                earlier.append((spec, [t.output_tokens for t in stage], None))
            else:
                earlier.append((spec, [t for _, t in real], [text for text, _ in real]))
