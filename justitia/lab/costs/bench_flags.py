"""What Justitia costs on vLLM's own server: stock `vllm serve`, `vllm serve` with Justitia's flags,
and `justitia serve`, side by side in one run (tiny model, this machine).

    python -m justitia.lab.costs.bench_flags [--rounds 20] [--requests 320] [--concurrency 32] [--sequential 30]
                                       [--tokens 16] [--scrape] [--out results/flags.json]

The servers run the same engine settings (the tiny model, float32, eager, a 2,048-token context,
1 GiB of KV cache) and are all started first. Then, in each round, each server in turn takes short
chat requests (a one-sentence prompt, ``--tokens`` forced output tokens, ``max_tokens`` set, as
agent frameworks send): ``--sequential`` of them one at a time (the latency a request pays with
nothing else in flight: what the door and the plug-in add to each), then a burst of ``--requests``
with ``--concurrency`` in flight (saturation). Only one server has traffic at a time (the others sit
idle). The order rotates every round and is reversed every other round, so each server's burst is
seconds from stock's and a slow spell of the machine falls on each in turn.

Two of the servers are stock: ``vllm serve`` with its defaults, and with ``--no-async-scheduling``,
which on vLLM's CPU platform is the same server (the platform turns async scheduling off for every
server). Two identical servers still differ here (the one started first ran about 8 % faster in one
run), so stock is their mean: the throughput figure is paired, each round's requests per second
over the two stock servers' mean in the same round, and the median of those ratios (with their
quartiles), as ``justitia.lab.costs.bench_throughput --paired`` does for the plug-in alone; the second
stock server over the first (``a_a``) is the bench's own spread. The machine's slow spells last
longer than a round, so a ratio within a round moves far less than the rate itself. Latencies are
pooled over rounds: the median and p99 at saturation, the median one at a time, each against the
two stock servers' mean. Stock vLLM runs its defaults (FCFS); with Justitia's flags the plug-in
orders the queue and the door checks each request.

``--scrape`` adds a fifth server, ``justitia serve`` again, whose ``/metrics`` a thread reads every
second for the whole run, as a Prometheus would: each read asks the engine for its per-tenant state
(``server.observe.Watch``), so this is what watching the server costs its throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from justitia.lab.live.servers import free_port as _free_port
from justitia.lab.live.servers import start

PROMPT = "Summarize the quarterly report in one sentence."
ENGINE = ["--max-model-len", "2048", "--enforce-eager", "--dtype", "float32", "--served-model-name", "tiny"]
FLAGS = ["--scheduler-cls", "justitia.vllm.plugin.JustitiaScheduler", "--scheduling-policy", "priority"]


SCRAPED = "justitia serve, /metrics read every 1 s"


def servers(model_dir: str, scrape: bool = False) -> dict[str, tuple[list[str], dict]]:
    """name -> (command, extra environment), each without its port."""
    api = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, *ENGINE]
    serve = json.dumps({"predictor": "mean", "journal": None})
    justitia = [sys.executable, "-m", "justitia", "serve", "--predictor", "mean", "--no-journal"]
    return {
        "stock vllm serve": (api, {}),
        "stock, async scheduling off": (api + ["--no-async-scheduling"], {}),
        "vllm serve + Justitia's flags": (api + FLAGS, {"VLLM_PLUGINS": "justitia", "JUSTITIA_SERVE": serve}),
        "justitia serve": (justitia, {}),
    } | ({SCRAPED: (justitia, {})} if scrape else {})


def scraper(url: str, stop: threading.Event, took: list[float] | None = None) -> threading.Thread:
    """A thread reading ``url``'s /metrics every second until ``stop`` (each read's seconds appended
    to ``took``)."""

    def run() -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                t = time.perf_counter()
                client.get("/metrics").raise_for_status()
                if took is not None:
                    took.append(time.perf_counter() - t)
                stop.wait(1.0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def start_one(cmd: list[str], env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    return start([*cmd, "--port", str(port)], port, "/health", env={"HF_HUB_OFFLINE": "1"} | env, log=log)


async def load(url: str, n: int, concurrency: int, tokens: int) -> tuple[float, list[float]]:
    """``n`` chat requests, ``concurrency`` in flight; (seconds in all, each request's latency)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=concurrency)) as c:

        async def one() -> None:
            async with slots:
                t = time.perf_counter()
                r = await c.post("/v1/chat/completions", json=body)
                latencies.append(time.perf_counter() - t)
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t0, latencies


def main() -> None:
    from justitia.engine.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--sequential", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--scrape", action="store_true", help=f"a fifth server: {SCRAPED}")
    ap.add_argument("--out", type=Path, default=Path("results/flags.json"))
    ap.add_argument("--report", type=Path, metavar="FILE", help="print the table of a saved run and exit")
    args = ap.parse_args()
    if args.report is not None:
        report(json.loads(args.report.read_text()))
        return
    logs = args.out.with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    kinds = servers(str(resolve_model("tiny")), args.scrape)
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    stop = threading.Event()
    try:
        for k, (name, (cmd, env)) in enumerate(kinds.items()):
            procs[name] = start_one(cmd, env, logs / f"server{k}.log")
            print(f"started: {name} at {procs[name][1]}", flush=True)
        if args.scrape:
            scraper(procs[SCRAPED][1], stop)
        for name, (_, url) in procs.items():  # warm-up: first requests compile and allocate
            asyncio.run(load(url, 2 * args.concurrency, args.concurrency, args.tokens))
        rate: dict[str, list[float]] = {name: [] for name in procs}
        lat: dict[str, list[float]] = {name: [] for name in procs}
        alone: dict[str, list[float]] = {name: [] for name in procs}
        names = list(procs)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order if r % 2 == 0 else order[::-1]:
                alone[name] += asyncio.run(load(procs[name][1], args.sequential, 1, args.tokens))[1]
                seconds, each = asyncio.run(load(procs[name][1], args.requests, args.concurrency, args.tokens))
                rate[name].append(args.requests / seconds)
                lat[name] += each
            stock_now = (rate[names[0]][-1] + rate[names[1]][-1]) / 2
            print(
                f"round {r + 1}: "
                + "  ".join(f"{rate[n][-1] / stock_now:.3f}" for n in names)
                + f"  x stock ({stock_now:.1f} requests/s)",
                flush=True,
            )
    finally:
        stop.set()
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows = {}
    stock_rate = [(a + b) / 2 for a, b in zip(rate[names[0]], rate[names[1]])]  # the two stock servers' mean
    for name in names:
        q = statistics.quantiles(lat[name], n=100)
        ratios = [a / b for a, b in zip(rate[name], stock_rate)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        rows[name] = {
            "requests_per_s": statistics.median(rate[name]),
            "rounds_requests_per_s": rate[name],
            "throughput_vs_stock": statistics.median(ratios),
            "rounds_vs_stock": ratios,
            "quartiles_vs_stock": [quartiles[0], quartiles[2]],
            "p50_ms": 1000 * statistics.median(lat[name]),
            "p99_ms": 1000 * q[98],
            "alone_p50_ms": 1000 * statistics.median(alone[name]),
        }
    stock = {k: (rows[names[0]][k] + rows[names[1]][k]) / 2 for k in ("p50_ms", "alone_p50_ms")}
    for row in rows.values():
        row["p50_added_ms"] = row["p50_ms"] - stock["p50_ms"]
        row["alone_p50_added_ms"] = row["alone_p50_ms"] - stock["alone_p50_ms"]
    a_a = statistics.median(b / a for a, b in zip(rate[names[0]], rate[names[1]]))
    doc = {
        "command": "python -m justitia.lab.costs.bench_flags " + " ".join(sys.argv[1:]),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "sequential": args.sequential,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "servers": rows,
        "a_a": a_a,
    }
    args.out.write_text(json.dumps(doc, indent=1))
    report(doc)


def report(doc: dict) -> None:
    """The table of a run (``--report FILE`` prints a saved one); with ``--scrape``, the scraped
    server over the same server unscraped, round by round."""
    rows = doc["servers"]
    print(f"stock: the two stock servers' mean; the second over the first (A/A): {doc['a_a']:.3f}")
    print(
        f"{'server':30} {'req/s':>6} {'x stock':>7} {'quartiles':>11} {'p50 ms':>7} {'+p50':>6} {'p99 ms':>7} "
        f"{'alone p50':>9} {'+alone':>7}"
    )
    for name, row in rows.items():
        lo, hi = row["quartiles_vs_stock"]
        print(
            f"{name:30} {row['requests_per_s']:6.1f} {row['throughput_vs_stock']:7.3f} {lo:5.3f}-{hi:5.3f} "
            f"{row['p50_ms']:7.1f} "
            f"{row['p50_added_ms']:6.1f} {row['p99_ms']:7.1f} {row['alone_p50_ms']:9.1f} "
            f"{row['alone_p50_added_ms']:7.2f}"
        )
    if SCRAPED in rows:
        paired = [
            s / u
            for u, s in zip(rows["justitia serve"]["rounds_requests_per_s"], rows[SCRAPED]["rounds_requests_per_s"])
        ]
        q = statistics.quantiles(paired, n=4)
        print(
            f"{SCRAPED} over justitia serve unscraped, median of {len(paired)} paired rounds: "
            f"{statistics.median(paired):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})"
        )


if __name__ == "__main__":
    main()
