"""The server's own cost per request: `justitia serve` against ``AsyncLLM.generate`` called directly.

    python -m justitia.lab.costs.bench_server [--requests 300] [--concurrency 32] [--tokens 16] [--ray N]
        [--out results/server.json]

Both sides run the same engine (the tiny model, the Justitia plug-in, the settings of
`justitia serve`), one after the other, never at once. Each serves the same short requests
(a one-sentence prompt, ``--tokens`` forced output tokens) three ways:

- ``direct``: ``AsyncLLM.generate`` in this process (vLLM tokenizes the prompt);
- ``completions``: ``POST /v1/completions`` to the server over loopback HTTP;
- ``agents``: a one-task agent, ``POST /v1/agents`` then its ``/events`` stream to the end.

Sequential: ``--requests`` requests one after another, latency per request (mean and p50).
Concurrent: ``--requests`` requests with ``--concurrency`` in flight, requests per second. The
server's overhead is its latency minus the direct one; on these 2-core machines that includes the
HTTP client's own time, which shares the CPUs with the server and the engine.

CPU per request (both phases): the CPU time of the process that holds ``AsyncLLM`` (this one for
``direct``, the server's for the others; vLLM's engine core is another process, in neither),
divided by the requests. What the server spends over the direct figure is its own cost (HTTP,
keys, validation, the agent's bookkeeping, the journal), whatever else shares the machine, so it
is the steadiest figure here (Linux: read from ``/proc``).

``--ray N``: the server fronts N replicas on Ray Serve (``justitia serve --ray``); each request
then also crosses a Ray handle to the replica process that holds ``AsyncLLM``. Compare latency and
throughput then: the server's CPU no longer includes ``AsyncLLM``'s, so CPU per request is not
comparable with ``direct``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path

from justitia.lab.report import write_doc

PROMPT = "Summarize the quarterly report in one sentence."


def process_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, every thread) the process has used: this one, or ``pid``'s."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def _measure(one, n: int, concurrency: int, warmup: int = 20, pid: int | None = None) -> dict:
    """Latency of ``one(i)`` run ``n`` times in a row, then throughput with ``concurrency`` in flight;
    and the CPU per request of the process that serves them (``pid``; None: this one)."""
    for i in range(warmup):
        await one(-1 - i)
    cpu0 = process_cpu_s(pid)
    lat = []
    for i in range(n):
        t = time.perf_counter()
        await one(i)
        lat.append(time.perf_counter() - t)
    gate = asyncio.Semaphore(concurrency)

    async def limited(i):
        async with gate:
            await one(n + i)

    t = time.perf_counter()
    await asyncio.gather(*(limited(i) for i in range(n)))
    wall = time.perf_counter() - t
    return {
        "mean_ms": 1000 * statistics.mean(lat),
        "p50_ms": 1000 * statistics.median(lat),
        "requests_per_s": n / wall,
        "cpu_ms_per_request": 1000 * (process_cpu_s(pid) - cpu0) / (2 * n),
    }


async def direct(n: int, concurrency: int, tokens: int) -> dict:
    result = await _direct(n, concurrency, tokens)
    gc.collect()  # the engine is collected here, not at interpreter exit
    return result


async def _direct(n: int, concurrency: int, tokens: int) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from justitia.engine.launch import plugin_environment, start_engine
    from justitia.gateway.serve import local_spec

    # the engine `justitia serve` starts (same spec, same plug-in), called directly
    llm, _ = start_engine(local_spec("tiny", None, 256, 2048), plugin_env=plugin_environment("justitia"))
    try:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

        async def one(i: int) -> None:
            async for _ in llm.generate(PROMPT, params, f"direct-{i}"):
                pass

        result = await _measure(one, n, concurrency)
    finally:
        llm.shutdown()
    return result


async def served(url: str, pid: int, n: int, concurrency: int, tokens: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=2 * concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def completion(i: int) -> None:
            r = await client.post(
                "/v1/completions", json={"prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
            )
            r.raise_for_status()

        async def agent(i: int) -> None:
            r = await client.post(
                "/v1/agents", json={"stages": [[{"prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True}]]}
            )
            r.raise_for_status()
            async with client.stream("GET", f"/v1/agents/{r.json()['agent_id']}/events") as events:
                async for line in events.aiter_lines():
                    if line.startswith("event: ") and line[7:] in ("done", "failed", "cancelled"):
                        if line[7:] != "done":
                            raise RuntimeError(f"agent ended {line[7:]}")
                        break

        return {
            "completions": await _measure(completion, n, concurrency, pid=pid),
            "agents": await _measure(agent, n, concurrency, pid=pid),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request (forced)")
    ap.add_argument("--no-journal", action="store_true", help="the server without its journal (the default has one)")
    ap.add_argument(
        "--ray",
        type=int,
        default=0,
        help="serve through `justitia serve --ray --replicas N` (engines on "
        "Ray Serve; the server's CPU then excludes the engines' processes)",
    )
    ap.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = ap.parse_args()
    result = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "direct": asyncio.run(direct(args.requests, args.concurrency, args.tokens)),
    }
    from justitia.lab.live.servers import start_server, stop

    ray = ("--ray", "--replicas", str(args.ray)) if args.ray else ()
    proc, url = start_server("--predictor", "mean", *ray, quiet=True, journal=not args.no_journal)
    result["journal"] = not args.no_journal
    result["ray_replicas"] = args.ray
    try:
        result |= asyncio.run(served(url, proc.pid, args.requests, args.concurrency, args.tokens))
    finally:
        stop(proc)
    d = result["direct"]
    print(f"{args.requests} requests of {args.tokens} tokens; sequential latency, then {args.concurrency} in flight")
    print(
        "| path | latency mean ms | p50 ms | overhead ms | requests/s | vs direct | extra ms per request (all in "
        "flight) "
        "| CPU ms per request | over direct |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("direct", "completions", "agents"):
        r = result[name]
        r["overhead_ms"] = r["mean_ms"] - d["mean_ms"]
        r["throughput_vs_direct"] = r["requests_per_s"] / d["requests_per_s"]
        # with every CPU busy: the machine time each request costs, over the direct path's
        r["extra_ms_per_request"] = 1000 / r["requests_per_s"] - 1000 / d["requests_per_s"]
        r["cpu_ms_over_direct"] = r["cpu_ms_per_request"] - d["cpu_ms_per_request"]  # the server's own
        print(
            f"| {name} | {r['mean_ms']:.1f} | {r['p50_ms']:.1f} | {r['overhead_ms']:+.1f} | "
            f"{r['requests_per_s']:.0f} | {r['throughput_vs_direct']:.2f}x | {r['extra_ms_per_request']:+.1f} | "
            f"{r['cpu_ms_per_request']:.2f} | {r['cpu_ms_over_direct']:+.2f} |"
        )
    if args.out:
        write_doc(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
