"""Every default and environment variable of justitia, in one place; read when asked, never at import.

The vLLM plug-in is configured by environment variables because vLLM builds the scheduler in its
own engine process; ``policy_settings()`` reads them (for the plug-in, and for the ``--upstream``
front end, which keeps the same policy state), with one clear error per bad value.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from justitia.core import AGENT_IDLE_S, SESSION_KEEP_S, is_positive_finite

# Nominal seconds of a memory-saturated engine step, where no latency profile says otherwise: the
# clock's M is the engine's KV tokens over this (core.cost.capacity_per_s).
ITERATION_S = 0.02
# AGENT_IDLE_S (imported above): an agent with no open request for this long is released even if it
# never said agent_done. The core holds the number (its AgentBook's default): it imports nothing outside it.
# SESSION_KEEP_S (imported above, the core's too): a session (requests marked ``session``: the door marks
# those a session header or field names) with nothing open is kept this long across its pauses, then released.

# fcfs|sjf|parrot|vtc|srjf|justitia|las, or justitia-guarded|justitia-eligible|justitia-chained|tagged
ENV_POLICY = "JUSTITIA_POLICY"
# (default justitia)
ENV_COST = "JUSTITIA_COST"  # kv|compute (default kv)
ENV_CAPACITY = "JUSTITIA_CAPACITY"  # the clock's M in cost units per second (default: from ITERATION_S)
ENV_CALIBRATION = "JUSTITIA_CALIBRATION"  # a `justitia calibrate` file: the plug-in's clock starts at the M it measured
ENV_ITERATION_S = "JUSTITIA_ITERATION_S"  # the nominal step time (default ITERATION_S)
ENV_AGENT_IDLE_S = "JUSTITIA_AGENT_IDLE_S"  # default AGENT_IDLE_S
ENV_SESSION_KEEP_S = "JUSTITIA_SESSION_KEEP_S"  # default SESSION_KEEP_S
ENV_LOG_AGENTS = "JUSTITIA_LOG_AGENTS"  # 1: one log line per agent arrival and release
ENV_MEASURE_CAPACITY = "JUSTITIA_MEASURE_CAPACITY"  # 0: keep the formula's M (default 1: measure it)
# justitia-guarded: the largest burst (cost units) a deployment has served before (default 0: learned)
ENV_GUARD_SCALE = "JUSTITIA_GUARD_SCALE"
ENV_PRICING = (
    "JUSTITIA_PRICING"  # online|max-tokens: how the plug-in prices a burst that comes without a price (default online)
)
ENV_PRICING_STATE = (
    "JUSTITIA_PRICING_STATE"  # where the plug-in keeps what its online pricing learned (default: nowhere)
)
# benches only: a CSV file the engine's scheduler logs every step to from its start, line by line
# (justitia.vllm.steplog; default: none), so a bench reads the speed of an engine it did not start itself
ENV_STEP_LOG = "JUSTITIA_STEP_LOG"
ENV_RETAG = "JUSTITIA_RETAG"  # 0: an agent keeps its first tag (default 1: it moves back when it reveals more work)
# whether the plug-in reads agent_cost, request_cost, agent_weight, tenant, agent_tag and agent_rank
# from a request: 1, from every one; 0, from none; unset, from every one in an engine with no door
# token (one a program runs in its own process, LLM or AsyncLLM: its caller is its only client), and
# in vLLM's OpenAI server (which has one: justitia.vllm.general) only from those the door checked
ENV_CLIENT_PRICES = "JUSTITIA_CLIENT_PRICES"
# the secret Justitia's door (the endpoint plugin, in vLLM's API server process) and the plug-in (in
# its engine process) share: set once per server (justitia.vllm.general), inherited by vLLM's processes
ENV_DOOR_TOKEN = "JUSTITIA_DOOR_TOKEN"
DOOR_KEY = "justitia_door"  # the extra-args key that carries it
# benches only: an answer's length, read by the scripted logits processor (justitia.engine.scripted), never by pricing
ANSWER_TOKENS_KEY = "justitia_answer_tokens"
# benches only: the answer stands for a tool call (a scripted answer's text calls none), read by the door
# as it reads a real answer's tool calls (server.door.AnswerWatch), never by pricing
ANSWER_CALLS_TOOL_KEY = "justitia_answer_calls_tool"
ENV_CACHE = "JUSTITIA_CACHE"  # built models and trained predictors (default ~/.cache/justitia)
ENV_STATE_DIR = "JUSTITIA_STATE_DIR"  # the server's journal (default ~/.local/state/justitia)
# `justitia serve`'s settings for its vLLM endpoint plug-in, as JSON (server.plugin.serve_config)
ENV_SERVE = "JUSTITIA_SERVE"
ENV_API_KEY = "JUSTITIA_API_KEY"  # `justitia top`'s key when --api-key is not given
# benches only: the scripted answers' rules file (justitia.engine.scripted), never read by pricing
ENV_SCRIPT = "JUSTITIA_SCRIPT"
# vLLM's own, read where Justitia starts or joins an engine: the plug-ins it loads, whether Hugging
# Face may reach the network, the CPU backend's KV cache size and its threads' cores
VLLM_ENV = ("VLLM_PLUGINS", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")


def env(name: str, default: str | None = None) -> str | None:
    """The environment variable ``name`` (one of the ``ENV_*`` above or ``VLLM_ENV``), or
    ``default`` when it is unset; every read of the environment goes through here."""
    if not (name.startswith("JUSTITIA_") or name in VLLM_ENV):
        raise KeyError(f"{name} is not an environment variable justitia reads (justitia.defaults).")
    return os.environ.get(name, default)


def door_token() -> str | None:
    """The secret the door and the plug-in share (``ENV_DOOR_TOKEN``), or None if none is set yet."""
    return os.environ.get(ENV_DOOR_TOKEN) or None


def cache_dir() -> Path:
    """Where built models and trained predictors live: ``$JUSTITIA_CACHE`` or ``~/.cache/justitia``."""
    return Path(os.environ.get(ENV_CACHE, Path.home() / ".cache" / "justitia"))


def state_dir() -> Path:
    """Where ``justitia serve`` keeps its journal: ``$JUSTITIA_STATE_DIR`` (if set and not empty) or
    ``~/.local/state/justitia``."""
    return Path(os.environ.get(ENV_STATE_DIR) or Path.home() / ".local" / "state" / "justitia")


@functools.cache
def process_cpus() -> frozenset[int]:
    """The cores this process may run on, as first asked (then kept): the lab pins its front end to
    one of them once an engine has started, and lays out every later engine from these, not from the
    pinned set. ``justitia.lab.live.runner`` asks when it is imported, before any engine has pinned it."""
    return frozenset(os.sched_getaffinity(0))


PRICINGS = ("online", "max-tokens")


@dataclass(frozen=True)
class PolicySettings:
    """A policy holder's configuration (the plug-in's, or a front end's), from the environment."""

    policy: str = "justitia"
    cost: str = "kv"
    capacity_per_s: float | None = None  # None: a calibration's measured M, else the engine's KV tokens / iteration_s
    calibration: str | None = None  # a `justitia calibrate` file to start the clock's M from
    iteration_s: float = ITERATION_S
    agent_idle_s: float = AGENT_IDLE_S
    session_keep_s: float = SESSION_KEEP_S
    log_agents: bool = False
    measure_capacity: bool = True  # the clock's M follows what the engine delivers
    retag: bool = True  # an agent that reveals more work than predicted moves back
    client_prices: bool | None = None  # read costs, weights and tenants: True, always; False, never; None: auto
    door_token: str | None = None  # auto: from a request that carries this (the door's), or from all if None
    pricing: str = "online"  # a burst without a price: learned from the engine's own bursts, or its max_tokens alone
    pricing_state: str | None = None  # the online pricing's state file, kept across restarts
    guard_scale: float = 0.0  # justitia-guarded: its lag guard starts from this largest burst seen (0: cold)


def policy_settings(environ: Mapping[str, str] | None = None) -> PolicySettings:
    """Read ``JUSTITIA_*`` from ``environ`` (default ``os.environ``); a bad value raises ValueError."""
    env = os.environ if environ is None else environ

    def number(name: str, default: float | None, strict: bool = True) -> float | None:
        raw = env.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (is_positive_finite(value) if strict else math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={raw!r}: expected a finite number {'>' if strict else '>='} 0.")
        return value

    prices = env.get(ENV_CLIENT_PRICES)
    if prices not in (None, "", "0", "1"):
        raise ValueError(
            f"{ENV_CLIENT_PRICES}={prices!r}: expected 1 (read every request's prices) or 0 (none); "
            "unset: only those Justitia's door checked, in vLLM's OpenAI server."
        )

    pricing = env.get(ENV_PRICING, "online")
    if pricing not in PRICINGS:
        raise ValueError(f"{ENV_PRICING}={pricing!r}: expected one of {', '.join(PRICINGS)}.")

    return PolicySettings(
        policy=env.get(ENV_POLICY, "justitia"),
        cost=env.get(ENV_COST, "kv"),
        capacity_per_s=number(ENV_CAPACITY, None),
        calibration=env.get(ENV_CALIBRATION) or None,
        iteration_s=number(ENV_ITERATION_S, ITERATION_S),
        agent_idle_s=number(ENV_AGENT_IDLE_S, AGENT_IDLE_S, strict=False),
        session_keep_s=number(ENV_SESSION_KEEP_S, SESSION_KEEP_S, strict=False),
        log_agents=env.get(ENV_LOG_AGENTS) == "1",
        measure_capacity=env.get(ENV_MEASURE_CAPACITY, "1") != "0",
        retag=env.get(ENV_RETAG, "1") != "0",
        client_prices={"1": True, "0": False}.get(prices or "", None),
        door_token=env.get(ENV_DOOR_TOKEN) or None,
        pricing=pricing,
        pricing_state=env.get(ENV_PRICING_STATE) or None,
        guard_scale=number(ENV_GUARD_SCALE, 0.0, strict=False),
    )
