"""Request and agent costs, and the service an engine step gives a request.

A cost model is a type: it prices a request from its lengths, measures one step's service in the
same unit, and says how much a saturated engine iteration delivers (the clock's M per iteration).

``KV``: KV token-time, the tokens a request holds in the KV cache summed over the engine iterations
it decodes: ``p*d + d**2/2`` token-iterations (unit name ``token_iters``); a saturated iteration
delivers the whole cache, ``kv_tokens``. ``KV_PREFIX``: the same, seeing the prefix cache: requests
of one agent held together that begin with the same text hold its blocks once, for as long as the
longest of them holds them (``group_cost``; one request alone costs what it does under ``KV``): that
is its prediction. Its charge, per engine step, is what the engine shares (an engine's step accounting,
``justitia.vllm.accounting``, applies the rule): each request pays for the tokens it holds, a full KV block that
``n`` requests hold at once counted
``1/n`` to each, across agents too (``shared_kv_charge``; with nothing shared, ``KV``'s charge to
the bit). ``COMPUTE``: VTC's weighted compute tokens ``p + 2*d``
(the paper's Justitia/C ablation); a saturated iteration delivers the token budget,
``max_num_batched_tokens``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import chain
from typing import Any, Hashable, Mapping, Sequence

from justitia.core.validate import positive_finite


@dataclass(frozen=True)
class Charge:
    """Service a request was given: tokens computed and KV token-time held (token-iterations: one
    step's is the tokens held; under ``KV_PREFIX`` less a share of shared blocks, so not always an int)."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    kv_token_iters: int = 0

    @staticmethod
    def for_step(computed_tokens: int, new_tokens: int, seq_tokens: int, output_tokens: int) -> "Charge":
        """What one engine step gives a request that had ``computed_tokens`` of its ``seq_tokens``
        (prompt + ``output_tokens`` so far) in the KV cache and computes ``new_tokens`` more."""
        return Charge(*Charge.step_tokens(computed_tokens, new_tokens, seq_tokens, output_tokens))

    @staticmethod
    def step_tokens(computed_tokens: int, new_tokens: int, seq_tokens: int, output_tokens: int) -> tuple[int, int, int]:
        """``for_step``'s (prefill_tokens, decode_tokens, kv_token_iters) as a plain tuple, for an
        engine that adds up many requests' steps before it charges them (the plug-in's step
        accounting, ``justitia.vllm.accounting``, adds it up inline; a test holds them to it)."""
        held = computed_tokens + new_tokens
        if output_tokens >= 1 and computed_tokens == seq_tokens - 1:  # a decode step
            return 0, 1, held
        return new_tokens, 1 if held == seq_tokens else 0, held


NO_CHARGE = Charge()


def shared_kv_savings(
    blocks: Mapping[Hashable, Sequence[Hashable]],
    tokens: Mapping[Hashable, int],
    block_size: int,
    never_shared: Hashable = None,
) -> dict[Hashable, float]:
    """What a prefix cache takes off each request's KV charge for one step: the KV token-time of the
    full blocks it holds with other requests. ``tokens`` maps each holder (a request) to the tokens
    it holds in the KV cache (the ``held`` of ``Charge.step_tokens``: its computed tokens once the
    step's tokens are scheduled, the tokens this step is charged for); ``blocks`` maps it to its block ids in token
    order (block ``i`` holds tokens ``[i *
    block_size, (i + 1) * block_size)``), or to the first few of them (those it may share: a prefix
    cache shares a run of blocks from the first); blocks left out, or a missing list, are its own.

    The rule: a request's first ``tokens // block_size`` blocks are full; a full block that ``n``
    holders in ``tokens`` hold at once (the same id among their full blocks) is counted
    ``block_size / n`` to each, whoever's agent it is. A partial last block (the ``tokens %
    block_size`` after the full ones) is its holder's alone, as are blocks past it (allocated ahead,
    holding nothing yet) and the id ``never_shared`` (an engine's null block, which stands in for blocks a
    sliding window dropped). So a request's charge is ``tokens[r] - saved[r]`` token-iterations (one
    step's ``Charge.kv_token_iters``), and the charges of all holders add up to the tokens held
    counted once: ``block_size`` per distinct full block plus every partial block's tokens.

    Returns ``request -> block_size * (n - 1) / n`` summed over its shared full blocks, only for
    requests that share one: with nothing shared it is empty, and the charges are ``tokens`` to the
    bit. O(blocks given)."""
    full: dict[Hashable, Sequence[Hashable]] = {}
    for r, held in tokens.items():
        ids = blocks.get(r)
        if ids:
            full[r] = ids[: held // block_size]
    counts = Counter(chain.from_iterable(full.values()))
    counts.pop(never_shared, None)
    if not counts or max(counts.values()) == 1:
        return {}
    saved: dict[Hashable, float] = {}
    get = counts.get
    for r, ids in full.items():
        off = 0.0
        for n in map(get, ids):
            if n is not None and n > 1:
                off += block_size - block_size / n
        if off:
            saved[r] = off
    return saved


def shared_kv_charge(
    blocks: Mapping[Hashable, Sequence[Hashable]],
    tokens: Mapping[Hashable, int],
    block_size: int,
    never_shared: Hashable = None,
) -> dict[Hashable, int | float]:
    """One step's KV charge per request under ``KV_PREFIX``, in token-iterations (``Charge.kv_token_iters``
    for one step): ``tokens[r]`` less ``shared_kv_savings`` (its arguments and rule), so a full block
    ``n`` requests hold at once costs each ``block_size / n``. A request that shares nothing is
    charged ``tokens[r]`` exactly (an int, as ``Charge.step_tokens`` counts it)."""
    saved = shared_kv_savings(blocks, tokens, block_size, never_shared)
    return {r: held - saved[r] if r in saved else held for r, held in tokens.items()}


def kv_token_iters(prompt_tokens: float, output_tokens: float) -> float:
    """KV token-time of one request, in token-iterations: ``p*d + d^2/2``."""
    return prompt_tokens * output_tokens + output_tokens * output_tokens / 2.0


def compute_tokens(prompt_tokens: float, output_tokens: float) -> float:
    """VTC's compute cost of one request or step: input weight 1, output weight 2."""
    return prompt_tokens + 2 * output_tokens


class CostModel:
    """How lengths and service become one cost number; ``KV`` and ``COMPUTE`` are the instances."""

    name: str

    def request_cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """The cost of one request with ``prompt_tokens`` in and ``output_tokens`` out."""
        raise NotImplementedError

    def service(self, charge: Charge) -> int:
        """One step's (or several steps') service, in this model's unit."""
        raise NotImplementedError

    def per_iteration(self, kv_tokens: int, max_num_batched_tokens: int) -> int:
        """What one saturated engine iteration delivers, in this model's unit."""
        raise NotImplementedError

    def group_cost(self, holders: Sequence[tuple[Sequence[tuple[Any, int]], int]]) -> float:
        """The cost of requests held together (sent at once): ``holders`` are (prompt runs
        ``(source, tokens)``, output tokens). By default each is priced alone."""
        return sum(self.request_cost(sum(n for _, n in runs), d) for runs, d in holders)

    def __repr__(self) -> str:
        return f"<cost model {self.name}>"


class _KvCost(CostModel):
    name = "kv"

    def request_cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """KV token-time: ``p*d + d^2/2``."""
        return kv_token_iters(prompt_tokens, output_tokens)

    def service(self, charge: Charge) -> int:
        """KV token-time held."""
        return charge.kv_token_iters

    def per_iteration(self, kv_tokens: int, max_num_batched_tokens: int) -> int:
        """The whole KV cache, held for one iteration."""
        return kv_tokens


class _ComputeCost(CostModel):
    name = "compute"

    def request_cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """Weighted tokens ``p + 2d``."""
        return float(compute_tokens(prompt_tokens, output_tokens))

    def service(self, charge: Charge) -> int:
        """Weighted tokens computed."""
        return compute_tokens(charge.prefill_tokens, charge.decode_tokens)

    def per_iteration(self, kv_tokens: int, max_num_batched_tokens: int) -> int:
        """The token budget of one step."""
        return max_num_batched_tokens


def common_prefix_tokens(a: Sequence[tuple[Any, int]], b: Sequence[tuple[Any, int]]) -> int:
    """How many tokens two prompts, as runs, begin with alike."""
    n = 0
    for (sa, ta), (sb, tb) in zip(a, b):
        if sa != sb:
            break
        n += min(ta, tb)
        if ta != tb:
            break
    return n


class _KvPrefixCost(_KvCost):
    name = "kv-prefix"

    def group_cost(self, holders: Sequence[tuple[Sequence[tuple[Any, int]], int]]) -> float:
        """KV token-time of requests held together, a prefix they share held once: the longest
        holder (most output tokens) pays for it, the others for what they hold beyond it, each
        ``d**2/2`` for its own output. One request alone: ``kv_token_iters``."""
        total, seen = 0.0, []
        for runs, d in sorted(holders, key=lambda h: -h[1]):
            shared = max((common_prefix_tokens(runs, other) for other in seen), default=0)
            total += (sum(n for _, n in runs) - shared) * d + d * d / 2.0
            seen.append(runs)
        return total


KV: CostModel = _KvCost()
KV_PREFIX: CostModel = _KvPrefixCost()
COMPUTE: CostModel = _ComputeCost()
COST_MODELS: dict[str, CostModel] = {m.name: m for m in (KV, KV_PREFIX, COMPUTE)}


def cost_model(name: str | CostModel) -> CostModel:
    """The cost model called ``name`` (``kv``, ``kv-prefix`` or ``compute``); a model is returned as it is."""
    if isinstance(name, CostModel):
        return name
    try:
        return COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model '{name}'; expected one of: {', '.join(COST_MODELS)}.") from None


def capacity_per_s(cost: CostModel, kv_tokens: int, max_num_batched_tokens: int, iteration_s: float) -> float:
    """The virtual clock's M: what a saturated engine delivers per second, in ``cost``'s unit.

    ``iteration_s`` is the nominal latency of a memory-saturated step (a fitted or named latency
    profile's, or ``defaults.ITERATION_S``)."""
    positive_finite(iteration_s, "the nominal iteration time (seconds)")
    return cost.per_iteration(kv_tokens, max_num_batched_tokens) / iteration_s
