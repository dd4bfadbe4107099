"""A vLLM scheduler built and driven without an engine, as vLLM's own scheduler tests do
(``tests/v1/core/utils.py``): a ``VllmConfig`` over the embedded tiny model's config, a KV cache
config of a few blocks, requests made by hand, and each step's model output faked (one token per
request that samples). ``Driver`` runs the engine core's loop, in step (sync) or one step ahead
(async: the next step is scheduled before the last one's output comes back, as vLLM's batch queue
does)."""

from __future__ import annotations

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from justitia.engine.models import tiny_model

BLOCK = 16
init_none_hash(sha256)
_HASHER = get_request_block_hasher(BLOCK, sha256)


def make_scheduler(
    cls, async_scheduling: bool, num_blocks: int = 64, max_num_seqs: int = 8, max_num_batched_tokens: int = 128
):
    """``cls`` built as vLLM's engine core builds its scheduler, ``async_scheduling`` as configured
    (set after the config is made: vLLM's CPU platform turns it off while making it)."""
    sc = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=512,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        policy="priority",
    )
    mc = ModelConfig(model=str(tiny_model()), dtype="float32", seed=0, skip_tokenizer_init=True)
    cc = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=True)
    config = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)
    config.scheduler_config.async_scheduling = async_scheduling
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    config.cache_config.num_gpu_blocks = num_blocks
    return cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=False,
    )


def count_charges(scheduler) -> tuple[list[tuple], dict[str, list[int]]]:
    """Record what the plug-in charges from now on: each charge in order, ``(agent, prefill,
    decode, kv)``, and each agent's running ``[prefill, decode, kv]`` (both filled as it runs)."""
    calls: list[tuple] = []
    totals: dict[str, list[int]] = {}
    charge = scheduler.core.charge

    def counting(info, service, *rest):
        calls.append((info.agent_id, service.prefill_tokens, service.decode_tokens, service.kv_token_iters))
        total = totals.setdefault(info.agent_id, [0, 0, 0])
        total[0] += service.prefill_tokens
        total[1] += service.decode_tokens
        total[2] += service.kv_token_iters
        charge(info, service, *rest)

    scheduler.core.charge = counting
    return calls, totals


def request(request_id: str, prompt_tokens: int, max_tokens: int, first_token: int = 7, **extra_args) -> Request:
    """A request of ``prompt_tokens`` tokens that decodes exactly ``max_tokens`` (``ignore_eos``),
    with ``extra_args`` (vllm_xargs) as given."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args or None)
    prompt = [(first_token + i) % 1000 + 3 for i in range(prompt_tokens)]
    return Request(request_id, prompt, params, None, block_hasher=_HASHER)


class Driver:
    """The engine core's loop over a scheduler with faked model outputs; ``depth`` steps in flight
    (1: sync; 2: async, vLLM's batch queue)."""

    def __init__(self, scheduler, depth: int):
        self.scheduler, self.depth = scheduler, depth
        self.in_flight: list = []  # (scheduler output, the ids that sample)
        self.admitted: list[str] = []  # request ids in the order they were first scheduled
        self.steps = 0

    def schedule(self) -> None:
        """One step scheduled (its output faked now, as the sampling requests are known now)."""
        out = self.scheduler.schedule()
        self.steps += 1
        self.admitted += [r.req_id for r in out.scheduled_new_reqs]
        sampling = [rid for rid in out.num_scheduled_tokens if not self.scheduler.requests[rid].is_prefill_chunk]
        self.in_flight.append((out, sampling))

    def complete(self) -> None:
        """The oldest step's output comes back."""
        out, sampling = self.in_flight.pop(0)
        ids = list(out.num_scheduled_tokens)
        tokens = [[11] if rid in sampling else [] for rid in ids]
        result = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=tokens
        )
        self.scheduler.update_from_output(out, result)

    def run(self, max_steps: int = 10_000) -> None:
        """Until every request has finished."""
        while self.scheduler.has_unfinished_requests() or self.in_flight:
            if self.scheduler.has_unfinished_requests() and len(self.in_flight) < self.depth:
                self.schedule()
                if len(self.in_flight) < self.depth:
                    continue
            self.complete()
            assert self.steps < max_steps, "the scheduler did not finish"
