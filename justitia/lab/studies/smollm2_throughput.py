"""Prefill and decode throughput of SmolLM2-135M-Instruct on vLLM here (what budgets `justitia profile`).

    python -m justitia.lab.studies.smollm2_throughput [float32|bfloat16]

Random token prompts, forced lengths (ignore_eos), one offline engine; prints tokens/s per shape.
"""

import os
import random
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")

if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from justitia.engine.models import smollm2_model

    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    llm = LLM(
        model=str(smollm2_model()),
        dtype=dtype,
        enforce_eager=True,
        max_model_len=4096,
        max_num_seqs=128,
        enable_prefix_caching=False,
        max_num_batched_tokens=4096,
    )
    rng = random.Random(0)

    def prompts(n: int, length: int) -> list:
        return [TokensPrompt(prompt_token_ids=[rng.randrange(100, 40000) for _ in range(length)]) for _ in range(n)]

    llm.generate(prompts(1, 16), SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
    for n, length, out in [(16, 1024, 1), (8, 256, 1), (1, 16, 64), (32, 16, 64), (96, 16, 64)]:
        params = SamplingParams(max_tokens=out, ignore_eos=True, temperature=0)
        t = time.perf_counter()
        llm.generate(prompts(n, length), params, use_tqdm=False)
        dt = time.perf_counter() - t
        kind = f"prefill {n * length / dt:6.0f} tokens/s" if out == 1 else f"decode {n * out / dt:6.0f} tokens/s"
        print(f"{dtype}: {n} prompts x {length} tokens, {out} out: {dt:6.2f} s  {kind}", flush=True)
