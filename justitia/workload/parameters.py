"""The workflow parameter file, ``justitia/data/workflows.json``: where it is, what it must hold, and
the checks that name the file and the field when it does not. Every number of the generators lives
there (fan-outs, lengths, hint noise, the size mix); ``load_workflow_params`` reads and checks it.
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

from justitia.workload.agents import WorkloadError
from justitia.workload.files import read_data_file

WORKFLOW_TYPES: tuple[str, ...] = ("mrs", "dm", "cc", "kqa", "ev", "fv", "alfworld", "sc", "search")
SIZE_CLASSES: tuple[str, ...] = ("small", "medium", "large")
PARAMS_PATH = Path(__file__).parents[1] / "data" / "workflows.json"

_CONTEXTS = ("none", "previous", "all", "paired", "history")
HINT_FIELDS = {"topic", "i", "n", "n_hint", "body_words", "length_word", "out_sentences", "out_words", "detail_word"}


def load_workflow_params() -> dict:
    """Read and validate ``justitia/data/workflows.json``."""
    params = read_data_file(PARAMS_PATH, "workflow parameter")
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


def for_size(spec: dict, size: str) -> dict:
    """The distribution of ``size`` in a (possibly size-keyed) distribution spec."""
    return spec[size] if "dist" not in spec else spec


def dist_max(spec: dict) -> int:
    """The largest value a (possibly size-keyed) distribution can produce."""
    if set(spec) == set(SIZE_CLASSES):
        return max(dist_max(spec[s]) for s in SIZE_CLASSES)
    return spec["max_total"] if spec.get("per_item", False) else spec["max"]


def _check_bands(bands: object, where: str) -> None:
    ok = (
        isinstance(bands, list)
        and bands
        and all(
            isinstance(b, list) and len(b) == 2 and (b[0] is None or _is_num(b[0])) and isinstance(b[1], str)
            for b in bands
        )
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
    mix = _need(params, "size_mix", "(top level)")
    if not (
        isinstance(mix, dict)
        and set(mix) == set(SIZE_CLASSES)
        and all(_is_num(mix[s]) and mix[s] >= 0 for s in SIZE_CLASSES)
        and abs(sum(mix.values()) - 1) <= 1e-6
    ):
        _fail("size_mix", f"an object of probabilities for {', '.join(SIZE_CLASSES)} summing to 1", mix)
    workflows = _need(params, "workflows", "(top level)")
    if not isinstance(workflows, dict) or set(workflows) != set(WORKFLOW_TYPES):
        _fail(
            "workflows",
            f"an object with exactly the workflows {', '.join(WORKFLOW_TYPES)}",
            sorted(workflows) if isinstance(workflows, dict) else workflows,
        )
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
        _fail(f"{at}.tasks", '"n" (the fan-out) or an integer >= 1', tasks)
    context = _need(st, "context", at)
    if context not in _CONTEXTS:
        _fail(f"{at}.context", f"one of {', '.join(_CONTEXTS)}", context)
    if context in ("previous", "all", "paired") and si == 0:
        _fail(f"{at}.context", "'none' or 'history' in the first stage", context)
    if context == "paired" and (tasks != "n" or stages[si - 1].get("tasks") != "n"):
        _fail(f"{at}.tasks", '"n" in a paired stage and in the stage before it', tasks)
    if context == "history":
        if tasks != "n":
            _fail(f"{at}.tasks", '"n" (the number of rounds) in a history stage', tasks)
        _check_dist(_need(st, "observation_tokens", at), f"{at}.observation_tokens")
    if context in ("none", "history") or "body_tokens" in st:
        _check_dist(_need(st, "body_tokens", at), f"{at}.body_tokens")
    _check_dist(_need(st, "output_tokens", at), f"{at}.output_tokens")
    if dist_max(st["output_tokens"]) > max_ctx // 2:
        _fail(f"{at}.output_tokens.max", f"at most half the context ({max_ctx // 2})", dist_max(st["output_tokens"]))
    if "body_tokens" in st and dist_max(st["body_tokens"]) + dist_max(st["output_tokens"]) > max_ctx - 200:
        _fail(
            f"{at}.body_tokens.max",
            f"small enough that body + output + instruction fit in {max_ctx} tokens",
            dist_max(st["body_tokens"]),
        )
    for flag in ("shared_body", "shared_prompt"):
        if not isinstance(st.get(flag, False), bool):
            _fail(f"{at}.{flag}", "true or false", st[flag])
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(st["instruction"]) if f is not None}
    except ValueError as exc:
        raise WorkloadError(f"{PARAMS_PATH}: field '{at}.instruction' is not a valid template ({exc}).") from None
    unknown = fields - HINT_FIELDS
    if unknown:
        _fail(
            f"{at}.instruction",
            f"a template using only {{{'}, {'.join(sorted(HINT_FIELDS))}}}",
            f"{{{sorted(unknown)[0]}}}",
        )
    if st.get("shared_prompt", False) and "i" in fields:
        _fail(f"{at}.instruction", "free of {i} when shared_prompt is true", st["instruction"])
