"""Engine parameters and named iteration-latency profiles.

A profile predicts one engine iteration's latency from what it computes:

    iteration_ms = scale * (max(floor_ms, base_ms + per_batched_token_ms * batched_tokens)
                            + per_context_token_ms * decode_context_tokens)

``batched_tokens`` counts every token computed in the iteration (prefill chunks and one per decode);
``decode_context_tokens`` sums the KV tokens that the decoding requests attend to. The first term is
the weight-streaming floor or the linear GEMM cost, the second the attention reads of the KV cache.
Latencies are kept as integer picoseconds so that summing iterations one by one and summing a span
of them in closed form give identical times.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from justitia.core import KV, CostModel, capacity_per_s, cost_model
from justitia.sim.prefix import EVICTIONS as KV_EVICTIONS

PS_PER_S = 10**12
PS_PER_MS = 10**9
PROFILE_SCHEMA = "justitia.latency/1"
OLD_PROFILE_SCHEMAS = ("justitia.profile/1",)  # files written before the rename, read the same
FRONTEND_FIELDS = ("request_latency_ms", "answer_latency_ms", "frontend_ms_per_request")
REQUEST_FIELDS = ("per_request_ms", "per_arrival_ms")  # optional in a file: 0 when absent


@dataclass(frozen=True)
class LatencyProfile:
    """Iteration latency model of one model on one device, with its KV-cache size."""

    name: str
    floor_ms: float
    base_ms: float
    per_batched_token_ms: float
    per_context_token_ms: float
    scale: float
    kv_blocks: int
    source: str
    block_size: int = 16
    # The front end, between an agent and the engine's queue (none of it scaled): it takes the
    # requests agents send one at a time, ``frontend_ms_per_request`` each, in the order sent; a
    # request then reaches the engine ``request_latency_ms`` later, and waits there for the next
    # step. An agent learns of a request's end ``answer_latency_ms`` after the engine's step. This is
    # what arrivals and stage hand-offs cost beyond the engine's steps (``calibrate.fit_frontend``).
    request_latency_ms: float = 0.0
    answer_latency_ms: float = 0.0
    frontend_ms_per_request: float = 0.0
    # What a step costs per request in its batch (input preparation, sampling, output processing),
    # and per new request the engine took in just before it (scaled, as the rest of the step)
    per_request_ms: float = 0.0
    per_arrival_ms: float = 0.0
    _ps: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)
    _request_ps: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        coeffs = (self.floor_ms, self.base_ms, self.per_batched_token_ms, self.per_context_token_ms)
        per_request = (self.per_request_ms, self.per_arrival_ms)
        if any(c < 0 or not math.isfinite(c) for c in (*coeffs, *per_request, *self.frontend_ms)) or self.scale <= 0:
            raise ValueError(f"profile '{self.name}': coefficients must be finite and >= 0, scale > 0.")
        object.__setattr__(self, "_ps", tuple(round(c * self.scale * PS_PER_MS) for c in coeffs))
        object.__setattr__(self, "_request_ps", tuple(round(c * self.scale * PS_PER_MS) for c in per_request))

    @property
    def frontend_ms(self) -> tuple[float, float, float]:
        """(``request_latency_ms``, ``answer_latency_ms``, ``frontend_ms_per_request``)."""
        return self.request_latency_ms, self.answer_latency_ms, self.frontend_ms_per_request

    def frontend_ps(self) -> tuple[int, int, int]:
        """``frontend_ms`` in integer picoseconds."""
        return tuple(round(x * PS_PER_MS) for x in self.frontend_ms)

    def iteration_ps(
        self, batched_tokens: int, decode_context_tokens: int, requests: int = 0, arrivals: int = 0
    ) -> int:
        """One iteration's latency in integer picoseconds: ``requests`` in its batch, ``arrivals``
        new requests taken in just before it."""
        floor, base, per_tok, per_ctx = self._ps
        per_req, per_arr = self._request_ps
        return (
            max(floor, base + per_tok * batched_tokens)
            + per_ctx * decode_context_tokens
            + per_req * requests
            + per_arr * arrivals
        )

    def iteration_s(
        self, batched_tokens: int, decode_context_tokens: int, requests: int = 0, arrivals: int = 0
    ) -> float:
        """One iteration's latency in seconds."""
        return self.iteration_ps(batched_tokens, decode_context_tokens, requests, arrivals) / PS_PER_S

    def coefficients_ps(self) -> tuple[int, int, int, int]:
        """(floor, base, per batched token, per context token), scaled, in picoseconds."""
        return self._ps

    def request_coefficients_ps(self) -> tuple[int, int]:
        """(per request in the batch, per arrival), scaled, in picoseconds."""
        return self._request_ps

    def to_json(self) -> dict:
        """The profile as a profile-file document (``justitia calibrate`` writes these)."""
        return {"schema": PROFILE_SCHEMA} | {
            k: getattr(self, k)
            for k in (
                "name",
                "floor_ms",
                "base_ms",
                "per_batched_token_ms",
                "per_context_token_ms",
                "scale",
                "kv_blocks",
                "block_size",
                "source",
                *REQUEST_FIELDS,
                *FRONTEND_FIELDS,
            )
        }

    @staticmethod
    def from_json(doc: dict, where: str = "profile") -> "LatencyProfile":
        """A profile from a profile-file document, with a clear error for a bad one."""
        if not isinstance(doc, dict) or doc.get("schema") not in (PROFILE_SCHEMA, *OLD_PROFILE_SCHEMAS):
            raise ValueError(f'{where}: not a latency profile (expected "schema": "{PROFILE_SCHEMA}").')
        fields = {
            "name": str,
            "floor_ms": (int, float),
            "base_ms": (int, float),
            "per_batched_token_ms": (int, float),
            "per_context_token_ms": (int, float),
            "scale": (int, float),
            "kv_blocks": int,
            "block_size": int,
            "source": str,
        }
        for name, kind in fields.items():
            if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
                raise ValueError(f"{where}: field '{name}' is missing or has the wrong type.")
        # absent from files written before they were measured; a file with only request_latency_ms
        # meant it both ways
        frontend = {"request_latency_ms": doc.get("request_latency_ms", 0.0)}
        frontend |= {
            "answer_latency_ms": doc.get("answer_latency_ms", frontend["request_latency_ms"]),
            "frontend_ms_per_request": doc.get("frontend_ms_per_request", 0.0),
        }
        frontend |= {name: doc.get(name, 0.0) for name in REQUEST_FIELDS}
        for name, value in frontend.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{where}: field '{name}' has the wrong type.")
        return LatencyProfile(**{name: doc[name] for name in fields}, **{k: float(v) for k, v in frontend.items()})


def load_profile(name_or_path: str) -> LatencyProfile:
    """A named profile, or one from a JSON profile file."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown latency profile '{name_or_path}'; expected one of {', '.join(sorted(PROFILES))} "
            "or a profile file written by 'justitia calibrate'."
        )
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno}).") from None
    return LatencyProfile.from_json(doc, str(path))


PROFILES: dict[str, LatencyProfile] = {
    "llama7b-a100-40gb": LatencyProfile(
        name="llama7b-a100-40gb",
        floor_ms=9.4,
        base_ms=2.3,
        per_batched_token_ms=0.064,
        per_context_token_ms=3.7e-4,
        scale=1.3,
        kv_blocks=2700,
        source=(
            "LLaMA-7B fp16 on an A100: floor, base and per-token terms fitted to DistServe's vLLM "
            "decode/prefill profiles and Vidur's LLaMA-2-7B profiles (80 GB card); x1.3 for the "
            "40 GB card's lower memory bandwidth. 2,700 blocks of 16 tokens (~43k tokens) is what "
            "vLLM leaves for the KV cache on 40 GB at gpu_memory_utilization 0.9."
        ),
    ),
}


@dataclass(frozen=True)
class EngineConfig:
    """A vLLM-like engine: paged KV cache, token budget per step, cap on running requests."""

    profile: LatencyProfile = PROFILES["llama7b-a100-40gb"]
    kv_blocks: int | None = None  # None: the profile's
    block_size: int | None = None  # None: the profile's (16 on GPUs, 128 on vLLM's CPU backend)
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    # (start_s, end_s, factor): steps that start in [start_s, end_s) take ``factor`` (an integer) times
    # as long, as if the engine slowed down (other tenants, throttling); None: never
    slowdown: tuple[float, float, int] | None = None
    # vLLM's automatic prefix cache (``sim.prefix``; on by default in vLLM): off, every request's
    # prompt is computed whole, as the paper's simulator does
    prefix_caching: bool = False
    # which free cached blocks the prefix cache evicts first: "lru", vLLM's (least recently freed);
    # "tag", tried in the simulator only: those of the sessions whose next tag comes last
    # (``sim.prefix``; docs/sessions.md, "KV kept across tool pauses")
    kv_eviction: str = "lru"

    def __post_init__(self) -> None:
        if self.block_size is None:
            object.__setattr__(self, "block_size", self.profile.block_size)
        if self.slowdown is not None:
            start, end, factor = self.slowdown
            if not (0 <= start < end and isinstance(factor, int) and factor >= 1):
                raise ValueError(
                    "engine config: 'slowdown' must be (start_s, end_s, integer factor >= 1), start < end."
                )
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine config: '{name}' must be >= 1.")
        if self.blocks < 1:
            raise ValueError("engine config: 'kv_blocks' must be >= 1.")
        if self.kv_eviction not in KV_EVICTIONS:
            raise ValueError(
                f"engine config: 'kv_eviction' must be one of {', '.join(KV_EVICTIONS)}, got '{self.kv_eviction}'."
            )

    def slowdown_at(self, now_ps: int) -> tuple[int, int | None]:
        """The latency factor of a step starting at ``now_ps``, and when it next changes (ps, or None)."""
        if self.slowdown is None:
            return 1, None
        start, end = round(self.slowdown[0] * PS_PER_S), round(self.slowdown[1] * PS_PER_S)
        if now_ps < start:
            return 1, start
        return (self.slowdown[2], end) if now_ps < end else (1, None)

    @property
    def blocks(self) -> int:
        """KV-cache capacity in blocks."""
        return self.profile.kv_blocks if self.kv_blocks is None else self.kv_blocks

    @property
    def kv_tokens(self) -> int:
        """KV-cache capacity in tokens: M in the paper."""
        return self.blocks * self.block_size

    @property
    def nominal_iteration_s(self) -> float:
        """Latency of a memory-saturated decode iteration: max_num_seqs requests holding the whole cache."""
        seqs = min(self.max_num_seqs, self.max_num_batched_tokens)
        return self.profile.iteration_s(seqs, self.kv_tokens, seqs)

    def capacity_per_s(self, cost: str | CostModel = KV) -> float:
        """Service a saturated engine gives per second, in the cost model's unit (the clock's M)."""
        return capacity_per_s(cost_model(cost), self.kv_tokens, self.max_num_batched_tokens, self.nominal_iteration_s)

    def to_json(self) -> dict:
        """The configuration as a results-file document."""
        return {
            "profile": self.profile.name,
            "kv_blocks": self.blocks,
            "block_size": self.block_size,
            "kv_tokens": self.kv_tokens,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            **({"slowdown": list(self.slowdown)} if self.slowdown else {}),
            **({"prefix_caching": True} if self.prefix_caching else {}),
            **({"kv_eviction": self.kv_eviction} if self.kv_eviction != "lru" else {}),
            "nominal_iteration_s": self.nominal_iteration_s,
        }
