"""What one vLLM step served, read off vLLM's requests: the plug-in's step accounting.

The core prices and charges service in its own units (``core.Charge``: prefill tokens, decode
tokens, KV token-iterations) and knows no engine. This module is where vLLM's request fields are
read: ``num_computed_tokens`` (this step's tokens included), ``num_tokens`` (prompt and output so
far), ``num_prompt_tokens``, and under async scheduling ``num_output_placeholders`` and
``is_prefill_chunk``. It imports nothing of vLLM, so the step log, the replay and the tests use it
without an engine; ``requests`` is any mapping from request ids to objects with those fields.

- ``step_delivered``: what a step delivered in all (``StepDelivered``), for the clock's meter and
  the step log;
- ``step_charges``: the same step per agent, ``Charge.step_tokens`` added up, charged once each;
- ``prefix_step_charges``: ``step_charges`` under ``KV_PREFIX``, a shared full block split evenly
  among the requests that hold it (``core.shared_kv_savings``: the rule lives in the core);
- ``prefill_attention``: the query-key pairs of a step's prefill chunks, for the step log.

These run on every engine step, so the rule of ``Charge.step_tokens`` is written inline in each
walk; ``tests/core/test_policies.py`` holds them to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

from justitia.core import shared_kv_savings


@dataclass(frozen=True, slots=True)
class StepDelivered:
    """What one engine step delivered, summed over the requests it scheduled."""

    prefill_tokens: int  # prompt tokens computed
    samples: int  # requests that sample a token (a decode step, or a prompt's last chunk)
    kv_tokens: int  # the KV tokens those hold (``Charge.step_tokens`` added up, as the clock's meter reads it)
    prefills: int  # requests computing prompt tokens (for a step log)
    context_tokens: int  # the decoding requests' context tokens (for a step log)


def _seq_tokens(request, ahead: int) -> int:
    """Prompt and output tokens so far; under async scheduling (``ahead`` tokens sampled per step)
    the tokens in flight counted as if they had come back, this step's own left out."""
    seq = request.num_tokens
    if ahead:
        seq += request.num_output_placeholders - (0 if request.is_prefill_chunk else ahead)
    return seq


def step_delivered(requests: Mapping[str, Any], scheduled: Mapping[str, int], ahead: int = 0) -> StepDelivered:
    """What one step delivered, read after vLLM scheduled it: ``scheduled`` maps request ids to the
    tokens each computes (``SchedulerOutput.num_scheduled_tokens``), ``requests`` ids to vLLM's
    requests (a request has output once ``num_tokens`` is above ``num_prompt_tokens``, read so rather
    than through ``num_output_tokens``, a property). ``ahead``: the tokens a sampling request samples
    per step under vLLM's async scheduling (0: sync). There the next step is scheduled before the
    last one's tokens come back: each in-flight token is a placeholder (``num_output_placeholders``,
    this step's included unless the request is still mid-prefill, ``is_prefill_chunk``), counted
    here as if it had come back, so a step reads the same under both."""
    p = d = kv = prefills = ctx = 0
    get = requests.get
    for request_id, n in scheduled.items():
        request = get(request_id)
        if request is None:
            continue
        held, seq = request.num_computed_tokens, request.num_tokens
        if ahead:  # async scheduling: the tokens in flight, this step's own left out
            seq += request.num_output_placeholders - (0 if request.is_prefill_chunk else ahead)
        if held - n == seq - 1 and seq > request.num_prompt_tokens:  # a decode step (it has output)
            d += 1
            ctx += held
            continue
        p += n
        prefills += 1
        if held == seq:  # the prompt's last chunk: it samples
            d += 1
            kv += held
    return StepDelivered(p, d, kv + ctx, prefills, ctx)


def step_charges(
    requests: Mapping[str, Any],
    scheduled: Mapping[str, int],
    info_of: Callable[[str], Any],
    ahead: int = 0,
    each: dict | None = None,
) -> dict[str, list]:
    """One step's service per agent (``step_delivered``'s arguments, and ``info_of``, a request id's
    info or None, which names its agent), ``agent_id -> [a request's info, prefill, decode, kv]``:
    ``Charge.step_tokens`` of its scheduled requests added up, so that each agent is charged once.
    ``each``, if given, gets every charged request's ``request id -> (agent id, kv, decode)``."""
    per_agent: dict[str, list] = {}
    get_info, get_request = info_of, requests.get
    for request_id, n in scheduled.items():
        info = get_info(request_id)
        request = get_request(request_id)
        if info is None or request is None:
            continue
        held, seq = request.num_computed_tokens, request.num_tokens
        if ahead:  # async scheduling: the tokens in flight, this step's own left out
            seq += request.num_output_placeholders - (0 if request.is_prefill_chunk else ahead)
        if held - n == seq - 1 and seq > request.num_prompt_tokens:  # a decode step (it has output)
            p, d = 0, 1
        else:
            p, d = n, int(held == seq)
        if each is not None:
            each[request_id] = (info.agent_id, held, d)
        total = per_agent.get(info.agent_id)
        if total is None:
            per_agent[info.agent_id] = [info, p, d, held]
        else:
            total[1] += p
            total[2] += d
            total[3] += held
    return per_agent


def prefix_step_charges(
    requests: Mapping[str, Any],
    scheduled: Mapping[str, int],
    info_of: Callable[[str], Any],
    blocks_of: Callable[[str], Sequence[Hashable] | None],
    block_size: int,
    ahead: int = 0,
    never_shared: Hashable = None,
) -> tuple[dict[str, list], float]:
    """``step_charges`` under ``KV_PREFIX``: the same per-agent ``[info, prefill, decode, kv]``, each
    charged request's ``kv`` less its ``shared_kv_savings`` among the requests charged this step
    (``blocks_of``: a request id's block ids in token order, or the first few of them, or None: as
    ``shared_kv_savings`` takes them), so a block that several of them hold, of one agent or of
    several, is paid for once, split evenly. With nothing shared it is ``step_charges``'s result,
    untouched. Also returns what that takes off the KV tokens ``step_delivered`` reads (the
    requests that sample this step), so a meter reads the step's service as it was charged."""
    each: dict = {}  # request id -> (agent id, kv held, whether it samples), from the one walk
    per_agent = step_charges(requests, scheduled, info_of, ahead, each)
    if len(each) < 2:
        return per_agent, 0
    held = {r: kv for r, (_, kv, _) in each.items()}
    saved = shared_kv_savings({r: blocks_of(r) for r in held}, held, block_size, never_shared)
    metered = 0
    for request_id, off in saved.items():
        agent_id, _, samples = each[request_id]
        per_agent[agent_id][3] -= off
        if samples:
            metered += off
    return per_agent, metered


def attention_pairs(offset: int, n: int) -> int:
    """Query-key pairs of a prefill chunk of ``n`` tokens after ``offset`` held ones: each new token
    attends to the tokens before it and to itself (causal attention)."""
    return n * offset + n * (n + 1) // 2


def prefill_attention(requests: Mapping[str, Any], scheduled: Mapping[str, int], ahead: int = 0) -> int:
    """``attention_pairs`` of one step's prefill chunks added up (``step_delivered``'s arguments; a
    decode step is not a chunk). For a step log: it is not on the plug-in's path without one."""
    total = 0
    for request_id, n in scheduled.items():
        request = requests.get(request_id)
        if request is None:
            continue
        held, seq = request.num_computed_tokens, _seq_tokens(request, ahead)
        if not (held - n == seq - 1 and seq > request.num_prompt_tokens):
            total += attention_pairs(held - n, n)
    return total
