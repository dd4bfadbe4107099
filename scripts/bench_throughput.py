"""The plug-in's throughput at saturation against stock vLLM's scheduler, on this machine.

    python scripts/bench_throughput.py [--repeats 3] [--bursts 3] [--out results/throughput.json]

One in-process engine per scheduler and repeat (the embedded tiny model, the same settings: 64 KV
blocks, 32 sequences, the prefix cache on, vLLM's async-scheduling default, which vLLM's CPU platform
turns off): stock vLLM's default (``Scheduler``, FCFS) and the plug-in (``JustitiaScheduler``,
``JUSTITIA_POLICY=justitia``, the priority policy it needs). Engines are interleaved (stock, plug-in,
stock, ...) so that a slow spell of the machine falls on both. Each engine is warmed up, then serves
``--bursts`` bursts of ``--requests`` requests (``--prompt`` prompt tokens, ``--output`` output
tokens each, ``ignore_eos``), all queued at once, in eight-request agents. Reported: output tokens per
second of every burst, each scheduler's median, and the plug-in's median over stock's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def run(label: str, scheduler_cls, model: str, args) -> list[float]:
    """One engine: its bursts' output tokens per second."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    options = {"scheduler_cls": scheduler_cls}
    if label != "stock":
        options["scheduling_policy"] = "priority"
        os.environ["JUSTITIA_POLICY"] = "justitia"
    llm = LLM(model=model, num_gpu_blocks_override=64, max_model_len=2048, max_num_seqs=32, enforce_eager=True,
              dtype="float32", **options)
    rates = []
    try:
        for burst in range(args.bursts + 1):  # the first warms up
            prompts, params = [], []
            for i in range(args.requests):
                base = 3 + burst * 7919 + i * 13  # no prompt repeats another's prefix
                prompts.append(TokensPrompt(prompt_token_ids=[(base + k) % 2000 + 3 for k in range(args.prompt)]))
                params.append(SamplingParams(max_tokens=args.output, ignore_eos=True, detokenize=False,
                                             extra_args={"agent_id": f"b{burst}-a{i // 8}"}))
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            if burst:
                rates.append(tokens / wall)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="engines per scheduler, interleaved (default 3)")
    ap.add_argument("--bursts", type=int, default=3, help="timed bursts per engine (default 3)")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=96)
    ap.add_argument("--out", type=Path, default=Path("results/throughput.json"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.v1.core.sched.scheduler import Scheduler

    from justitia.vllm.models import tiny_model
    from justitia.vllm.plugin import JustitiaScheduler

    model = str(tiny_model())
    configs = [("stock", Scheduler), ("plug-in", JustitiaScheduler)]
    rates: dict[str, list[float]] = {label: [] for label, _ in configs}
    for r in range(args.repeats):
        for label, cls in (configs if r % 2 == 0 else configs[::-1]):
            got = run(label, cls, model, args)
            rates[label] += got
            print(f"repeat {r + 1}  {label:<8} " + "  ".join(f"{x:7.0f}" for x in got) + "  tokens/s", flush=True)
    median = {label: statistics.median(v) for label, v in rates.items()}
    ratio = median["plug-in"] / median["stock"]
    print(f"median tokens/s: stock {median['stock']:.0f}, plug-in {median['plug-in']:.0f}; plug-in / stock = {ratio:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "tokens_per_s": rates,
                                    "median": median, "ratio": ratio}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
