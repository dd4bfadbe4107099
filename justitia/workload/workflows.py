"""Generators for the nine task-parallel agent workflows of the paper's benchmark.

NOTE: every number lives in ``justitia/data/workflows.json``; this module only reads it. An agent
is drawn in three steps: its fan-out ``n`` from the size class, its stages in order (each task's
output length first, then its prompt: instruction + fresh body + listed earlier outputs, shortened
to fit the context), and its prompt text. Prompts are real sentences from a per-workflow phrase
bank, and their instructions state noisy hints of the true lengths ("about 812 words", "in about
6 sentences") so that a text-based predictor has something to learn. All randomness comes from the
``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import itertools
import json
import math
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from justitia.workload.agents import Agent, Task, WorkloadError

WORKFLOW_TYPES: tuple[str, ...] = ("mrs", "dm", "cc", "kqa", "ev", "fv", "alfworld", "sc", "search")
SIZE_CLASSES: tuple[str, ...] = ("small", "medium", "large")
PARAMS_PATH = Path(__file__).parents[1] / "data" / "workflows.json"

_CONTEXTS = ("none", "previous", "all", "paired", "history")
_HINT_FIELDS = {"topic", "i", "n", "n_hint", "body_words", "length_word", "out_sentences", "out_words", "detail_word"}


def load_workflow_params() -> dict:
    """Read and validate ``justitia/data/workflows.json``."""
    try:
        params = json.loads(PARAMS_PATH.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"{PARAMS_PATH}: the workflow parameter file is missing.") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{PARAMS_PATH}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}).") from None
    _validate_params(params)
    return params


# ---------------------------------------------------------------------------------------------
# Validation of the parameter file


def _fail(field: str, expected: str, got: object = ...) -> None:
    tail = "" if got is ... else f", got {json.dumps(got)[:60]}"
    raise WorkloadError(f"{PARAMS_PATH}: field '{field}' must be {expected}{tail}.")


def _need(doc: dict, key: str, where: str) -> object:
    if not isinstance(doc, dict) or key not in doc:
        raise WorkloadError(f"{PARAMS_PATH}: field '{where}.{key}' is missing.")
    return doc[key]


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_dist(spec: object, where: str) -> None:
    if isinstance(spec, dict) and set(spec) == set(SIZE_CLASSES):
        for size in SIZE_CLASSES:
            _check_dist(spec[size], f"{where}.{size}")
        return
    if not isinstance(spec, dict):
        _fail(where, "a distribution object", spec)
    kind = _need(spec, "dist", where)
    lo, hi = _need(spec, "min", where), _need(spec, "max", where)
    if not (_is_int(lo) and lo >= 1):
        _fail(f"{where}.min", "an integer >= 1", lo)
    if not (_is_int(hi) and hi >= lo):
        _fail(f"{where}.max", f"an integer >= min ({lo})", hi)
    if kind == "lognormal":
        if not (_is_num(_need(spec, "median", where)) and spec["median"] > 0):
            _fail(f"{where}.median", "a number > 0", spec["median"])
        if not (_is_num(_need(spec, "sigma", where)) and spec["sigma"] >= 0):
            _fail(f"{where}.sigma", "a number >= 0", spec["sigma"])
    elif kind != "uniform":
        _fail(f"{where}.dist", "'uniform' or 'lognormal'", kind)
    if "agent_sigma" in spec and not (_is_num(spec["agent_sigma"]) and spec["agent_sigma"] >= 0):
        _fail(f"{where}.agent_sigma", "a number >= 0", spec["agent_sigma"])
    if spec.get("per_item", False) and not (_is_int(spec.get("max_total")) and spec["max_total"] >= 1):
        _fail(f"{where}.max_total", "an integer >= 1 when per_item is true", spec.get("max_total"))


def _dist_max(spec: dict) -> int:
    """The largest value a (possibly size-keyed) distribution can produce."""
    if set(spec) == set(SIZE_CLASSES):
        return max(_dist_max(spec[s]) for s in SIZE_CLASSES)
    return spec["max_total"] if spec.get("per_item", False) else spec["max"]


def _check_bands(bands: object, where: str) -> None:
    ok = isinstance(bands, list) and bands and all(
        isinstance(b, list) and len(b) == 2 and (b[0] is None or _is_num(b[0])) and isinstance(b[1], str)
        for b in bands
    )
    if not ok or bands[-1][0] is not None:
        _fail(where, "a list of [upper_bound, word] pairs ending with [null, word]", bands)


def _validate_params(params: object) -> None:
    if not isinstance(params, dict):
        _fail("(top level)", "a JSON object", params)
    max_ctx = _need(params, "max_context_tokens", "(top level)")
    if not (_is_int(max_ctx) and max_ctx >= 512):
        _fail("max_context_tokens", "an integer >= 512", max_ctx)
    for key in ("words_per_token", "tokens_per_sentence"):
        if not (_is_num(_need(params, key, "(top level)")) and params[key] > 0):
            _fail(key, "a number > 0", params[key])
    if not (_is_num(_need(params, "hint_noise_sigma", "(top level)")) and params["hint_noise_sigma"] >= 0):
        _fail("hint_noise_sigma", "a number >= 0", params["hint_noise_sigma"])
    _check_bands(_need(params, "length_words", "(top level)"), "length_words")
    _check_bands(_need(params, "detail_words", "(top level)"), "detail_words")
    workflows = _need(params, "workflows", "(top level)")
    if not isinstance(workflows, dict) or set(workflows) != set(WORKFLOW_TYPES):
        _fail("workflows", f"an object with exactly the workflows {', '.join(WORKFLOW_TYPES)}",
              sorted(workflows) if isinstance(workflows, dict) else workflows)
    for name in WORKFLOW_TYPES:
        _validate_workflow(workflows[name], f"workflows.{name}", max_ctx)


def _validate_workflow(wf: object, where: str, max_ctx: int) -> None:
    if not isinstance(wf, dict):
        _fail(where, "an object", wf)
    for key in ("name", "why", "sizes_why"):
        if not isinstance(_need(wf, key, where), str):
            _fail(f"{where}.{key}", "a string", wf[key])
    fanout = _need(wf, "fanout", where)
    if not isinstance(fanout, dict) or set(fanout) != set(SIZE_CLASSES):
        _fail(f"{where}.fanout", "an object with one distribution per size class (small, medium, large)", fanout)
    _check_dist(fanout, f"{where}.fanout")
    vocab = _need(wf, "vocabulary", where)
    for key in ("topics", "subjects", "verbs", "objects"):
        words = _need(vocab, key, f"{where}.vocabulary")
        if not (isinstance(words, list) and words and all(isinstance(w, str) and w.strip() for w in words)):
            _fail(f"{where}.vocabulary.{key}", "a non-empty list of non-empty strings", words)
    stages = _need(wf, "stages", where)
    if not isinstance(stages, list) or not stages:
        _fail(f"{where}.stages", "a non-empty list of stages", stages)
    for si, st in enumerate(stages):
        _validate_stage(st, f"{where}.stages[{si}]", si, stages, max_ctx)


def _validate_stage(st: object, at: str, si: int, stages: list, max_ctx: int) -> None:
    if not isinstance(st, dict):
        _fail(at, "an object", st)
    for key in ("name", "output_label", "why", "instruction"):
        if not isinstance(_need(st, key, at), str):
            _fail(f"{at}.{key}", "a string", st[key])
    tasks = _need(st, "tasks", at)
    if not (tasks == "n" or (_is_int(tasks) and tasks >= 1)):
        _fail(f"{at}.tasks", "\"n\" (the fan-out) or an integer >= 1", tasks)
    context = _need(st, "context", at)
    if context not in _CONTEXTS:
        _fail(f"{at}.context", f"one of {', '.join(_CONTEXTS)}", context)
    if context in ("previous", "all", "paired") and si == 0:
        _fail(f"{at}.context", "'none' or 'history' in the first stage", context)
    if context == "paired" and (tasks != "n" or stages[si - 1].get("tasks") != "n"):
        _fail(f"{at}.tasks", "\"n\" in a paired stage and in the stage before it", tasks)
    if context == "history":
        if tasks != "n":
            _fail(f"{at}.tasks", "\"n\" (the number of rounds) in a history stage", tasks)
        _check_dist(_need(st, "observation_tokens", at), f"{at}.observation_tokens")
    if context in ("none", "history") or "body_tokens" in st:
        _check_dist(_need(st, "body_tokens", at), f"{at}.body_tokens")
    _check_dist(_need(st, "output_tokens", at), f"{at}.output_tokens")
    if _dist_max(st["output_tokens"]) > max_ctx // 2:
        _fail(f"{at}.output_tokens.max", f"at most half the context ({max_ctx // 2})", _dist_max(st["output_tokens"]))
    if "body_tokens" in st and _dist_max(st["body_tokens"]) + _dist_max(st["output_tokens"]) > max_ctx - 200:
        _fail(f"{at}.body_tokens.max", f"small enough that body + output + instruction fit in {max_ctx} tokens",
              _dist_max(st["body_tokens"]))
    for flag in ("shared_body", "shared_prompt"):
        if not isinstance(st.get(flag, False), bool):
            _fail(f"{at}.{flag}", "true or false", st[flag])
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(st["instruction"]) if f is not None}
    except ValueError as exc:
        raise WorkloadError(f"{PARAMS_PATH}: field '{at}.instruction' is not a valid template ({exc}).") from None
    unknown = fields - _HINT_FIELDS
    if unknown:
        _fail(f"{at}.instruction", f"a template using only {{{'}, {'.join(sorted(_HINT_FIELDS))}}}",
              f"{{{sorted(unknown)[0]}}}")
    if st.get("shared_prompt", False) and "i" in fields:
        _fail(f"{at}.instruction", "free of {i} when shared_prompt is true", st["instruction"])


# ---------------------------------------------------------------------------------------------
# Compiled parameters: phrase banks and lookups built once


@dataclass(frozen=True)
class _Bank:
    """All subject-verb-object sentences of one workflow, with their word counts."""

    topics: tuple[str, ...]
    sentences: np.ndarray  # object array of str
    words: np.ndarray  # int array, words per sentence
    mean_words: float


def _make_bank(vocab: dict) -> _Bank:
    sentences = [f"{s} {v} {o}." for s, v, o in itertools.product(vocab["subjects"], vocab["verbs"], vocab["objects"])]
    words = np.array([len(s.split()) for s in sentences], dtype=np.int64)
    return _Bank(tuple(vocab["topics"]), np.array(sentences, dtype=object), words, float(words.mean()))


@lru_cache(maxsize=1)
def _compiled() -> tuple[dict, dict[str, _Bank]]:
    params = load_workflow_params()
    banks = {name: _make_bank(params["workflows"][name]["vocabulary"]) for name in WORKFLOW_TYPES}
    return params, banks


# ---------------------------------------------------------------------------------------------
# Drawing lengths and text


def _for_size(spec: dict, size: str) -> dict:
    return spec[size] if "dist" not in spec else spec


def _draw(spec: dict, size: str, rng: np.random.Generator, count: int, n: int = 1) -> np.ndarray:
    """``count`` integer lengths from a distribution spec (``per_item`` sums ``n`` draws each)."""
    d = _for_size(spec, size)
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


def _text(bank: _Bank, n_words: int, rng: np.random.Generator) -> str:
    """About ``n_words`` words of sentences drawn from the bank."""
    if n_words <= 0:
        return ""
    parts: list[str] = []
    need = n_words
    while need > 0:
        idx = rng.integers(0, len(bank.sentences), size=int(need / bank.mean_words * 1.25) + 2)
        cum = np.cumsum(bank.words[idx])
        cut = int(np.searchsorted(cum, need))
        if cut == len(idx):
            parts.extend(bank.sentences[idx].tolist())
            need -= int(cum[-1])
            continue
        chosen = bank.sentences[idx[: cut + 1]].tolist()
        excess = int(cum[cut]) - need
        if excess:
            last = chosen[-1].split()
            chosen[-1] = " ".join(last[: len(last) - excess])
        parts.extend(chosen)
        need = 0
    return " ".join(parts)


def _noisy(value: float, sigma: float, rng: np.random.Generator) -> int:
    """``value`` times a lognormal factor, rounded to an integer >= 1."""
    return max(1, int(round(value * math.exp(sigma * rng.standard_normal()))))


def _band(bands: list, value: float) -> str:
    for bound, word in bands:
        if bound is None or value < bound:
            return word
    return bands[-1][1]


@dataclass
class _Ctx:
    """What one agent's generation shares across its stages."""

    params: dict
    bank: _Bank
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
        n_words = len(template.format(**{f: "x" for f in _HINT_FIELDS - {"topic"}}, topic=self.topic).split())
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


# A stage-by-stage generation is sent back, per stage, either None (drawn lengths, bank text) or
# per task the (output text, output tokens) of a real model's answer ("outputs" below).


def _cut_words(text: str, tokens: int, keep: int) -> str:
    """The first ``keep / tokens`` of ``text``'s words (an output shortened to fit the context)."""
    if keep >= tokens:
        return text
    words = text.split()
    return " ".join(words[: max(1, len(words) * keep // max(tokens, 1))])


def _stage_tasks(ctx: _Ctx, spec: dict, earlier: list[tuple[dict, list[int], list[str] | None]]) -> tuple[Task, ...]:
    """The tasks of one non-history stage; ``earlier`` holds (stage spec, output lengths, output
    texts or None) so far."""
    rng, size = ctx.rng, ctx.size
    max_ctx = ctx.params["max_context_tokens"]
    count = ctx.n if spec["tasks"] == "n" else spec["tasks"]
    outs = ctx.shrink(_draw(spec["output_tokens"], size, rng, count, ctx.n))
    shared_prompt = spec.get("shared_prompt", False)
    shared_body = shared_prompt or spec.get("shared_body", False)
    if "body_tokens" in spec:
        fresh = ctx.shrink(_draw(spec["body_tokens"], size, rng, 1 if shared_body else count))
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
            body_text = _text(ctx.bank, ctx.words(body), rng)
            shared_text = body_text
        blocks = [body_text] if body_text else []
        blocks += [
            f"{label}:\n{_text(ctx.bank, ctx.words(t), rng) if text is None else _cut_words(text, full, t)}"
            for (label, full, text), t in zip(items, item_tokens)
        ]
        body_words = ctx.words(body) + sum(ctx.words(t) for t in item_tokens)
        if shared_prompt and tasks:
            prompt = tasks[0].prompt
        else:
            prompt = ctx.render(spec["instruction"], j + 1, body_words, out_hint) + "\n\n" + "\n\n".join(blocks)
        tasks.append(Task(prompt, instr_tokens + body + sum(item_tokens), out))
    return tuple(tasks)


def _history_stages(ctx: _Ctx, spec: dict):
    """n sequential one-task rounds whose prompts carry the growing action/observation history.

    A generator: yields each round's stage and takes back its outputs; returns
    the rounds' (output lengths, output texts or None)."""
    rng, size, rounds = ctx.rng, ctx.size, ctx.n
    max_ctx = ctx.params["max_context_tokens"]
    cap = max_ctx - _dist_max(_for_size(spec["output_tokens"], size))
    outs = ctx.shrink(_draw(spec["output_tokens"], size, rng, rounds))
    obs = ctx.shrink(_draw(spec["observation_tokens"], size, rng, rounds))
    instr_tokens = ctx.instruction_tokens(spec["instruction"])
    base = min(int(ctx.shrink(_draw(spec["body_tokens"], size, rng, 1))[0]), cap - instr_tokens)
    base_text = _text(ctx.bank, ctx.words(base), rng)
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
            act, act_tokens = _text(ctx.bank, ctx.words(int(outs[r])), rng), int(outs[r])
        else:
            act, act_tokens = real[0]
        seen = _text(ctx.bank, ctx.words(int(obs[r])), rng)
        pieces.append((f"> {act}\n{seen}", int(act_tokens + obs[r])))
        done.append((int(act_tokens), None if real is None else act))
    return done


def _agent_stages(ctx: _Ctx, wf: dict):
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


# ---------------------------------------------------------------------------------------------
# Public generators


def _check_names(workflow: str, size: str) -> None:
    if workflow not in WORKFLOW_TYPES:
        raise ValueError(f"unknown workflow '{workflow}'; expected one of: {', '.join(WORKFLOW_TYPES)}.")
    if size not in SIZE_CLASSES:
        raise ValueError(f"unknown size class '{size}'; expected one of: {', '.join(SIZE_CLASSES)}.")


def _start(workflow: str, size: str, rng: np.random.Generator, scale: float) -> tuple[_Ctx, dict]:
    _check_names(workflow, size)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a number > 0, got {scale}.")
    params, banks = _compiled()
    wf = params["workflows"][workflow]
    bank = banks[workflow]
    n = int(_draw(wf["fanout"], size, rng, 1)[0])
    topic = bank.topics[int(rng.integers(len(bank.topics)))]
    return _Ctx(params, bank, size, n, topic, rng, scale), wf


def generate_agent(workflow: str, size: str, agent_id: str, arrival_s: float, rng: np.random.Generator,
                   scale: float = 1.0) -> Agent:
    """Draw one agent of ``workflow`` in size class ``size`` arriving at ``arrival_s``; ``scale``
    divides every drawn length (the same shapes, shorter texts)."""
    if not (isinstance(arrival_s, (int, float)) and math.isfinite(arrival_s) and arrival_s >= 0):
        raise ValueError(f"arrival_s must be a finite number >= 0, got {arrival_s!r}.")
    ctx, wf = _start(workflow, size, rng, scale)
    meta = {"size": size} if scale == 1 else {"size": size, "scale": scale}
    return Agent(agent_id, workflow, float(arrival_s), tuple(_agent_stages(ctx, wf)), meta)


def output_cap(workflow: str, size: str, scale: float = 1.0, limit: int | None = None) -> int:
    """A ``max_tokens`` for a real model answering ``workflow``'s tasks: the longest output its
    stages can draw in ``size``, divided by ``scale``, at least 32 and at most ``limit``."""
    _check_names(workflow, size)
    wf = _compiled()[0]["workflows"][workflow]
    cap = max(_dist_max(_for_size(st["output_tokens"], size)) for st in wf["stages"])
    cap = max(32, math.ceil(cap / scale))
    return cap if limit is None else min(cap, limit)


def staged_agent(workflow: str, size: str, rng: np.random.Generator, scale: float = 1.0):
    """Generate an agent stage by stage around a real model: a generator that yields each stage's
    tasks (their ``output_tokens`` are the drawn lengths, which the instructions hint at) and must
    be sent, per task, the model's (output text, output tokens) before it yields the next stage.
    Later stages quote those real outputs, as a map-reduce agent would."""
    ctx, wf = _start(workflow, size, rng, scale)
    return _agent_stages(ctx, wf)


def generate_agents(
    arrivals_s: Sequence[float],
    rng: np.random.Generator,
    types: Sequence[str] | None = None,
    size_probs: Sequence[float] = (0.72, 0.26, 0.02),
    id_prefix: str = "agent",
) -> list[Agent]:
    """One agent per arrival time, its type uniform over ``types`` and its size drawn from ``size_probs``."""
    types = tuple(WORKFLOW_TYPES if types is None else types)
    if not types:
        raise ValueError(f"types must name at least one workflow; expected some of: {', '.join(WORKFLOW_TYPES)}.")
    for t in types:
        _check_names(t, "small")
    probs = np.asarray(size_probs, dtype=float)
    if probs.shape != (3,) or not np.all(np.isfinite(probs)) or np.any(probs < 0) or abs(probs.sum() - 1) > 1e-6:
        raise ValueError(
            f"size_probs must be three non-negative probabilities for {', '.join(SIZE_CLASSES)} summing to 1, "
            f"got {tuple(size_probs)}."
        )
    m = len(arrivals_s)
    type_idx = rng.integers(0, len(types), size=m)
    size_idx = rng.choice(len(SIZE_CLASSES), size=m, p=probs / probs.sum())
    return [
        generate_agent(types[int(t)], SIZE_CLASSES[int(s)], f"{id_prefix}-{i:04d}", float(a), rng)
        for i, (a, t, s) in enumerate(zip(arrivals_s, type_idx, size_idx))
    ]
