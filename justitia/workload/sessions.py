"""The session generator: coding-agent sessions (``justitia workload generate --kind sessions``).

NOTE: every number lives in ``justitia/data/sessions.json`` with its source; this module only
draws from it. A session is user turns; a turn is a chain of the main agent's LLM calls, each a
one-task stage, with a tool pause before every call but the turn's first (the first call of turn
k > 0 waits the user's think time instead, and carries ``turn=k``). Sometimes a turn spawns
subagents: after one of its calls comes a stage of 2-4 parallel branches, each its own short
conversation on a shared subagent system prompt, and the next main call reads their outputs.

Every call's prompt is its chain's conversation so far: the first call's context is the session's
system prompt (``Segment.shared``, one of a few variants shared by all sessions), every later
call's is ``[prompt_of(previous), output_of(previous)]``, then its own new text (a tool result,
the subagents' results, or the user's next message); ``prompt_tokens`` counts all of it. Token
lengths are drawn in real tokens and divided by the file's scale factor; a session whose next call
would exceed the file's share of the KV cache ends there. All randomness comes from one seeded
``numpy.random.Generator``: the same seed gives the same sessions.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from justitia.core import is_positive_finite
from justitia.workload.agents import Agent, Segment, Stage, Task, WorkloadError
from justitia.workload.arrivals import arrival_times
from justitia.workload.files import read_data_file

__all__ = [
    "SESSIONS_PATH",
    "load_session_params",
    "session_kv_cap",
    "generate_session",
    "generate_sessions",
    "build_sessions",
]

SESSIONS_PATH = Path(__file__).parents[1] / "data" / "sessions.json"

_DISTS = (
    "turns_per_session",
    "calls_per_turn",
    "tool_pause_s",
    "think_time_s",
    "output_tokens",
    "user_message_tokens",
    "tool_result_tokens",
)
_SUB_DISTS = ("fanout", "calls_per_branch", "task_tokens")


def _fail(field: str, expected: str, got: object = ...) -> None:
    tail = "" if got is ... else f", got {json.dumps(got)[:60]}"
    raise WorkloadError(f"{SESSIONS_PATH}: field '{field}' must be {expected}{tail}.")


def _num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_dist(spec: object, where: str) -> None:
    if not isinstance(spec, dict) or spec.get("dist") not in ("lognormal", "uniform"):
        _fail(f"{where}.dist", "'lognormal' or 'uniform'", spec.get("dist") if isinstance(spec, dict) else spec)
    lo, hi = spec.get("min"), spec.get("max")
    if not (_num(lo) and lo >= 0 and _num(hi) and hi >= lo):
        _fail(f"{where}.min/max", "numbers with 0 <= min <= max", [lo, hi])
    if spec["dist"] == "lognormal":
        if not (_num(spec.get("median")) and spec["median"] > 0):
            _fail(f"{where}.median", "a number > 0", spec.get("median"))
        if not (_num(spec.get("sigma")) and spec["sigma"] >= 0):
            _fail(f"{where}.sigma", "a number >= 0", spec.get("sigma"))


def validate_session_params(p: object) -> dict:
    """Check a parameter document (the file's, or one passed to the generator); return it."""
    if not isinstance(p, dict):
        _fail("(top level)", "a JSON object", p)
    for name in _DISTS:
        if name not in p:
            raise WorkloadError(f"{SESSIONS_PATH}: field '{name}' is missing.")
        _check_dist(p[name], name)
    for name in ("calls_per_turn", "turns_per_session"):
        if p[name]["min"] < 1:
            _fail(f"{name}.min", "an integer >= 1", p[name]["min"])
    sub = p.get("subagents")
    if not isinstance(sub, dict):
        _fail("subagents", "an object", sub)
    for name in _SUB_DISTS:
        _check_dist(sub.get(name), f"subagents.{name}")
    if not (_num(sub.get("turn_probability")) and 0 <= sub["turn_probability"] <= 1):
        _fail("subagents.turn_probability", "a probability", sub.get("turn_probability"))
    if sub["fanout"]["min"] < 1:
        _fail("subagents.fanout.min", "an integer >= 1", sub["fanout"]["min"])
    if not (_num(sub.get("result_overhead_tokens")) and sub["result_overhead_tokens"] >= 0):
        _fail("subagents.result_overhead_tokens", "a number >= 0", sub.get("result_overhead_tokens"))
    sp = p.get("system_prompt")
    if not isinstance(sp, dict):
        _fail("system_prompt", "an object", sp)
    n = sp.get("variants")
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        _fail("system_prompt.variants", "an integer >= 1", n)
    for key, lst in (
        ("system_prompt.tokens", sp.get("tokens")),
        ("system_prompt.weights", sp.get("weights")),
        ("subagents.system_prompt_tokens", sub.get("system_prompt_tokens")),
    ):
        if not (isinstance(lst, list) and len(lst) == n and all(_num(x) and x > 0 for x in lst)):
            _fail(key, f"a list of {n} numbers > 0 (one per system prompt variant)", lst)
    scale = p.get("scale", {}).get("factor")
    if not is_positive_finite(scale) or isinstance(scale, bool):
        _fail("scale.factor", "a number > 0", scale)
    kv = p.get("kv", {})
    if not (isinstance(kv.get("kv_tokens"), int) and kv["kv_tokens"] >= 64):
        _fail("kv.kv_tokens", "an integer >= 64", kv.get("kv_tokens"))
    if not (_num(kv.get("max_conversation_fraction")) and 0 < kv["max_conversation_fraction"] <= 1):
        _fail("kv.max_conversation_fraction", "a number in (0, 1]", kv.get("max_conversation_fraction"))
    rate = p.get("arrivals", {}).get("rate_per_s")
    if not is_positive_finite(rate) or isinstance(rate, bool):
        _fail("arrivals.rate_per_s", "a number > 0", rate)
    text = p.get("text", {})
    for key in ("user", "tools", "subagent"):
        words = text.get(key)
        if not (isinstance(words, list) and words and all(isinstance(w, str) and w for w in words)):
            _fail(f"text.{key}", "a non-empty list of non-empty strings", words)
    if not (isinstance(p.get("type", {}).get("value"), str) and p["type"]["value"]):
        _fail("type.value", "a non-empty string", p.get("type"))
    return p


@lru_cache(maxsize=1)
def _file_params() -> dict:
    return validate_session_params(read_data_file(SESSIONS_PATH, "session parameter"))


def load_session_params() -> dict:
    """``justitia/data/sessions.json``, read and checked (a fresh copy: callers may change it)."""
    return json.loads(json.dumps(_file_params()))


def session_kv_cap(params: dict | None = None) -> int:
    """The most tokens (prompt + output) one call may hold: the file's share of the KV cache."""
    p = _file_params() if params is None else params
    return int(p["kv"]["kv_tokens"] * p["kv"]["max_conversation_fraction"])


# ---------------------------------------------------------------------------------------------
# Draws


def _draw(spec: dict, rng: np.random.Generator, integer: bool = True) -> float:
    """One draw from a distribution spec (see the file's ``_doc.distributions``)."""
    if spec["dist"] == "uniform":
        return int(rng.integers(int(spec["min"]), int(spec["max"]) + 1))
    x = spec["median"] * math.exp(spec["sigma"] * rng.standard_normal())
    if integer:
        x = float(np.rint(x))
    x = min(max(x, spec["min"]), spec["max"])
    return int(x) if integer else float(x)


class _Gen:
    """What one session's generation shares: parameters, rng, scale, cap, the next ids."""

    def __init__(self, p: dict, rng: np.random.Generator, variant: int):
        self.p, self.rng, self.variant = p, rng, variant
        self.scale = float(p["scale"]["factor"])
        self.cap = session_kv_cap(p)
        self.next_main = 0

    def tokens(self, spec_or_value) -> int:
        """A token length: drawn (or given) in real tokens, divided by the scale, at least 1."""
        real = _draw(spec_or_value, self.rng) if isinstance(spec_or_value, dict) else spec_or_value
        return max(1, int(round(real / self.scale)))

    def output(self) -> int:
        return self.tokens(self.p["output_tokens"])

    def pick(self, key: str) -> str:
        words = self.p["text"][key]
        return words[int(self.rng.integers(len(words)))]

    def tool_text(self, step: int) -> str:
        return f"[{self.pick('tools')} result {step}]"


def _branch(g: _Gen, stage_index: int, b: int) -> tuple[Stage, ...]:
    """One subagent: a short conversation on the variant's subagent system prompt."""
    sub = g.p["subagents"]
    n = _draw(sub["calls_per_branch"], g.rng)
    system = g.tokens(sub["system_prompt_tokens"][g.variant])
    stages: list[Stage] = []
    prev: Task | None = None
    for k in range(n):
        tid = f"s{stage_index}.b{b}.t{k}"
        out = g.output()
        if prev is None:
            new = g.tokens(sub["task_tokens"])
            ctx = (Segment.shared(f"subagent-{_variant_name(g.variant)}", system),)
            prompt = f"Subagent task: {g.pick('subagent')}"
            pause = 0.0
        else:
            new = g.tokens(g.p["tool_result_tokens"])
            ctx = (Segment.prompt_of(prev.id), Segment.output_of(prev.id))
            prompt = g.tool_text(k)
            pause = _draw(g.p["tool_pause_s"], g.rng, integer=False)
        base = (
            sum(c.tokens for c in ctx if c.kind == "shared")
            if prev is None
            else prev.prompt_tokens + prev.output_tokens
        )
        if base + new + out > g.cap:
            break  # the subagent's conversation is full: it ends with its last call that fit
        prev = Task(prompt, base + new, out, id=tid, context=ctx)
        stages.append(Stage((prev,), pause_s=pause))
    return tuple(stages)


def _variant_name(i: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[i] if i < 26 else str(i)


def generate_session(agent_id: str, arrival_s: float, rng: np.random.Generator, params: dict | None = None) -> Agent:
    """Draw one session arriving at ``arrival_s`` (``params``: a parameter document, default the file's)."""
    if not (isinstance(arrival_s, (int, float)) and math.isfinite(arrival_s) and arrival_s >= 0):
        raise ValueError(f"arrival_s must be a finite number >= 0, got {arrival_s!r}.")
    p = _file_params() if params is None else params
    sp = p["system_prompt"]
    weights = np.asarray(sp["weights"], dtype=float)
    variant = int(rng.choice(sp["variants"], p=weights / weights.sum()))
    g = _Gen(p, rng, variant)
    n_turns = _draw(p["turns_per_session"], rng)
    calls = [_draw(p["calls_per_turn"], rng) for _ in range(n_turns)]
    b = _Conversation(g, p, rng, variant, g.tokens(sp["tokens"][variant]))
    truncated = False
    for k, m in enumerate(calls):
        spawn_after = -1
        if m >= 2 and rng.random() < p["subagents"]["turn_probability"]:
            spawn_after = int(rng.integers(0, m - 1))  # never after the turn's last call
        for j in range(m):
            if j == 0:
                pause = 0.0 if k == 0 else _draw(p["think_time_s"], rng, integer=False)
                ok = b.add_call(g.tokens(p["user_message_tokens"]), f"User (turn {k}): {g.pick('user')}", pause, k)
            elif j == spawn_after + 1:
                ok = b.subagents(j)
            else:
                ok = b.tool_call(j)
            if not ok:
                truncated = True
                break
        if truncated:
            break
    meta = {
        "system": f"system-{_variant_name(variant)}",
        "scale": g.scale,
        "turns_drawn": n_turns,
        "calls_drawn": calls,
        "truncated": truncated,
    }
    return Agent(agent_id, p["type"]["value"], float(arrival_s), tuple(b.stages), meta)


class _Conversation:
    """A session's main conversation as it is drawn: each call on top of the one before (the first
    on the system prompt), and the subagents a turn spawns."""

    def __init__(self, g: "_Gen", p: dict, rng: np.random.Generator, variant: int, system: int):
        self.g, self.p, self.rng, self.variant, self.system = g, p, rng, variant, system
        self.stages: list[Stage] = []
        self.prev: Task | None = None

    def add_call(self, new: int, prompt: str, pause: float, turn: int | None) -> bool:
        """The next main call, ``new`` tokens on top of the last one's prompt and answer; False if it
        would not fit the cap on a call (the session ends there)."""
        g, system = self.g, self.system
        out = g.output()
        if self.prev is None:  # the session's first call always fits: its user message is cut to the cap
            ctx = (Segment.shared(f"system-{_variant_name(self.variant)}", system),)
            base = system
            if base + 1 + out > g.cap:
                raise ValueError(
                    f"a {system}-token system prompt and a {out}-token answer do not fit the "
                    f"{g.cap}-token cap on a call (kv.max_conversation_fraction of kv.kv_tokens)."
                )
            new = min(new, g.cap - base - out)
        else:
            ctx = (Segment.prompt_of(self.prev.id), Segment.output_of(self.prev.id))
            base = self.prev.prompt_tokens + self.prev.output_tokens
        if base + new + out > g.cap:
            return False
        self.prev = Task(prompt, base + new, out, id=f"t{g.next_main}", context=ctx)
        g.next_main += 1
        self.stages.append(Stage((self.prev,), pause_s=pause, turn=turn))
        return True

    def tool_call(self, j: int) -> bool:
        """A call after a tool's result, the tool's pause before it."""
        p, g = self.p, self.g
        return self.add_call(
            g.tokens(p["tool_result_tokens"]), g.tool_text(j), _draw(p["tool_pause_s"], self.rng, integer=False), None
        )

    def subagents(self, j: int) -> bool:
        """Subagents spawned here, then the call that reads their results (none fit: a tool call)."""
        sub, g = self.p["subagents"], self.g
        index = len(self.stages)
        fan = _draw(sub["fanout"], self.rng)
        branches = tuple(c for c in (_branch(g, index, b) for b in range(fan)) if c)
        if not branches:  # no subagent's first call fit: the turn goes on with a tool call
            return self.tool_call(j)
        fan = len(branches)
        results = sum(chain[-1][0].output_tokens for chain in branches) + fan * g.tokens(sub["result_overhead_tokens"])
        self.stages.append(Stage((), branches=branches))
        ok = self.add_call(results, f"[results of {fan} subagents]", 0.0, None)
        if not ok:
            self.stages.pop()  # no main call would read them: drop the subagents too
        return ok


def generate_sessions(
    n: int,
    seed: int,
    rate_per_s: float | None = None,
    params: dict | None = None,
    arrivals_s=None,
    id_prefix: str = "session",
) -> list[Agent]:
    """``n`` sessions with Poisson arrivals at ``rate_per_s`` (default: the file's), all drawn from
    ``numpy.random.default_rng(seed)``; ``arrivals_s`` gives the arrival times instead."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}.")
    p = _file_params() if params is None else validate_session_params(params)
    rng = np.random.default_rng(seed)
    if arrivals_s is None:
        rate = p["arrivals"]["rate_per_s"] if rate_per_s is None else rate_per_s
        arrivals_s, _ = arrival_times(n, rng, None, 1.0, rate, 1.0)
    elif len(arrivals_s) != n:
        raise ValueError(f"arrivals_s holds {len(arrivals_s)} times for {n} sessions.")
    return [generate_session(f"{id_prefix}-{i:04d}", float(a), rng, p) for i, a in enumerate(arrivals_s)]


def build_sessions(
    n_agents: int,
    seed: int,
    trace: str | Path | None = None,
    density: float = 1.0,
    rate_per_s: float | None = None,
    cv: float = 1.0,
    params: dict | None = None,
) -> tuple[list[Agent], dict]:
    """Sessions with trace or synthetic arrivals, and a description of them (as ``build_workload``);
    ``params``: the generator's parameters (default: the file's)."""
    if n_agents < 1:
        raise ValueError(f"--agents must be >= 1, got {n_agents}.")
    if density <= 0:
        raise ValueError(f"--density must be > 0, got {density}.")
    p = _file_params() if params is None else validate_session_params(params)
    rate = p["arrivals"]["rate_per_s"] if rate_per_s is None else rate_per_s
    rng = np.random.default_rng(seed)
    arrivals, info = arrival_times(n_agents, rng, trace, density, rate, cv)
    agents = [generate_session(f"session-{i:04d}", float(a), rng, p) for i, a in enumerate(arrivals)]
    return agents, info | {"agents": n_agents, "seed": seed, "kind": "sessions"}
