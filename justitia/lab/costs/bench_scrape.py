"""What reading ``/metrics`` every second costs a server's throughput, judged inside one run.

    python -m justitia.lab.costs.bench_scrape [--rounds 20] [--requests 320] [--concurrency 32] [--tokens 16]
                                        [--out results/scrape.json] [--report FILE]

One ``justitia serve`` (the tiny model, the settings of ``bench_flags``) takes bursts of short chat
requests (``bench_flags.load``: ``--requests`` of them, ``--concurrency`` in flight, ``--tokens``
forced output tokens each). Each round has three bursts back to back, their order rotating from
round to round: one while a thread reads ``/metrics`` every second, as a Prometheus would (each
read asks the engine for its per-tenant state, ``server.observe.Watch``), and two while nobody
reads it. The figure is the median over rounds of the read burst's requests per second over the
two unread bursts' mean, with its quartiles; the second unread burst over the first is the bench's
own spread (``a_a``), what "no measurable cost" is judged against. One server and the same minute
for all three: ``bench_flags --scrape`` compares two servers, and two identical servers alone
differed by 1.19x in one run. Also the scrapes' own time (p50, p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
from pathlib import Path

from justitia.lab.costs.bench_flags import load, scraper, start_one

PHASES = ("read every 1 s", "unread", "unread again")


def quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    from justitia.engine.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("results/scrape.json"))
    ap.add_argument("--report", type=Path, metavar="FILE", help="print the figures of a saved run and exit")
    args = ap.parse_args(argv)
    if args.report is not None:
        report(json.loads(args.report.read_text()))
        return 0
    if args.rounds < 4:
        ap.error("--rounds: at least 4 (quartiles)")
    logs = args.out.with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    resolve_model("tiny")  # there, or a clear error before a server starts
    cmd = [
        sys.executable,
        "-m",
        "justitia",
        "serve",
        "--predictor",
        "mean",
        "--no-journal",
    ]  # the tiny model, as bench_flags
    proc, url = start_one(cmd, {}, logs / "server.log")
    rate: dict[str, list[float]] = {phase: [] for phase in PHASES}
    took: list[float] = []
    try:
        asyncio.run(load(url, 2 * args.concurrency, args.concurrency, args.tokens))  # warm-up
        for r in range(args.rounds):
            order = PHASES[r % 3 :] + PHASES[: r % 3]
            for phase in order:
                stop = threading.Event()
                thread = scraper(url, stop, took) if phase == PHASES[0] else None
                wall, _ = asyncio.run(load(url, args.requests, args.concurrency, args.tokens))
                stop.set()
                if thread is not None:
                    thread.join()
                rate[phase].append(args.requests / wall)
            print(f"round {r + 1}: " + "  ".join(f"{p} {rate[p][-1]:.1f}/s" for p in PHASES), flush=True)
    finally:
        stop(proc, 120)
    doc = {
        "rounds": args.rounds,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "requests_per_s": rate,
        "scrape_s": took,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    report(doc)
    return 0


def report(doc: dict) -> None:
    """The figures of a run: the read bursts over the unread ones, the bench's own spread, the scrapes."""
    rate = doc["requests_per_s"]
    read, first, second = (rate[p] for p in PHASES)
    scraped = [s / ((a + b) / 2) for s, a, b in zip(read, first, second)]
    a_a = [b / a for a, b in zip(first, second)]
    took = sorted(doc["scrape_s"])
    print(
        "/metrics read every 1 s, over the same server unread in the same round: median "
        f"{statistics.median(scraped):.3f} "
        f"(quartiles {quartiles(scraped)[0]:.3f}-{quartiles(scraped)[1]:.3f}, {len(scraped)} rounds)"
    )
    print(
        f"unread over unread (the bench's own spread): median {statistics.median(a_a):.3f} "
        f"(quartiles {quartiles(a_a)[0]:.3f}-{quartiles(a_a)[1]:.3f})"
    )
    if took:
        print(
            f"{len(took)} scrapes: p50 {1e3 * took[len(took) // 2]:.1f} ms, p99 "
            f"{1e3 * took[int(0.99 * (len(took) - 1))]:.1f} ms"
        )


if __name__ == "__main__":
    raise SystemExit(main())
