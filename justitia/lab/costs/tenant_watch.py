"""What `/metrics` says of each tenant, against the run's own log (``make tenant-watch``).

``justitia serve`` on the tiny model with three keyed tenants: ``batch-a`` and ``batch-b`` each
submit ``--agents`` agents of eight 128-token tasks at the start (``batch-a``'s prompts open with
the same brief, ``BRIEF``), ``stream`` submits a one-task
agent of 32 tokens every ``--every`` seconds for the whole run. ``/metrics`` is scraped every second, as a Prometheus
would. At the end, each tenant's share of the service is read three ways:

- ``/metrics``: ``justitia_tenant_service_total`` (what the engine charged, in KV token-iterations);
- the run's own log: every task's prompt and output tokens, as the agent API returned them, priced
  at ``p*d + d^2/2`` and added up per tenant;
- the live page's JSON (``/justitia/state``, an admin key) and ``justitia top --once``, whose window
  covers the run.

The server reads the engine's per-tenant state at most once a second, so the three are read a
second after the last agent ends. Also the prefix cache as Justitia saw it (``justitia_prefix_cache_*``:
each finished request's prompt tokens once, at its first schedule, against the log's prompt
tokens), beside vLLM's own counters (every lookup).

    python -m justitia.lab.costs.tenant_watch --out results/tenant-watch.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from justitia.core import kv_token_iters
from justitia.lab.live.servers import samples, start_server, stop, wait_agent

KEYS = {"batch-a": "sk-watch-batch-a-1", "batch-b": "sk-watch-batch-b-2", "stream": "sk-watch-stream-3"}
ADMIN = "sk-watch-admin-0"


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"})


BRIEF = "The brief every batch-a task shares: " + "the quarterly figures, their notes and the auditors' remarks; " * 24


def _run_agent(url: str, tenant: str, tasks: int, tokens: int, log: list, lock: threading.Lock) -> None:
    brief = (
        BRIEF if tenant == "batch-a" else ""
    )  # two KV blocks and more: vLLM's prefix cache holds them after the first
    body = {
        "type": tenant,
        "stages": [
            [
                {"prompt": f"{brief}{tenant}: part {i} of the job.", "max_tokens": tokens, "ignore_eos": True}
                for i in range(tasks)
            ]
        ],
    }
    with _client(url, KEYS[tenant]) as client:
        doc = wait_agent(client, client.post("/v1/agents", json=body).json()["agent_id"])
    with lock:
        for task in (t for stage in doc["stages"] for t in stage if t):
            log.append((tenant, task["prompt_tokens"], task["output_tokens"]))


def _metric_shares(text: str) -> dict[str, float]:
    service = {labels["tenant"]: value for _, labels, value in samples(text, "justitia_tenant_service_total")}
    total = sum(service.values())
    return {t: s / total for t, s in service.items()} if total else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=24, help="agents of each batch tenant (default 24)")
    ap.add_argument("--every", type=float, default=0.25, help="seconds between the stream's agents (default 0.25)")
    ap.add_argument("--out", type=Path, default=Path("results/tenant-watch.json"))
    args = ap.parse_args(argv)
    keys = Path(tempfile.mkdtemp(prefix="justitia-watch-")) / "keys.txt"
    keys.write_text("".join(f"{key} {tenant} 1\n" for tenant, key in KEYS.items()) + f"{ADMIN} ops 1 admin\n")
    proc, url = start_server("--api-keys", str(keys), "--metrics-window", "3600", quiet=True)
    log: list[tuple[str, int, int]] = []
    lock, done = threading.Lock(), threading.Event()
    scrapes: list[float] = []
    try:

        def scrape() -> None:
            with httpx.Client(base_url=url, timeout=30) as client:
                while not done.is_set():
                    t = time.perf_counter()
                    assert client.get("/metrics").status_code == 200
                    scrapes.append(time.perf_counter() - t)
                    done.wait(1.0)

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        t0 = time.time()
        with ThreadPoolExecutor(64) as pool:
            batches = [
                pool.submit(_run_agent, url, tenant, 8, 128, log, lock)
                for _ in range(args.agents)
                for tenant in ("batch-a", "batch-b")
            ]
            streamed = []
            while not all(f.done() for f in batches):
                streamed.append(pool.submit(_run_agent, url, "stream", 1, 32, log, lock))
                time.sleep(args.every)
            for f in batches + streamed:
                f.result()
        wall = time.time() - t0
        done.set()
        scraper.join()
        time.sleep(1.1)  # the server's last reading of the engine is now after the last agent ended
        text = httpx.get(url + "/metrics", timeout=30).text
        state = httpx.get(url + "/justitia/state", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
        top = subprocess.run(
            [sys.executable, "-m", "justitia", "top", "--once", "--url", url, "--api-key", ADMIN],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, COLUMNS="200"),
        ).stdout
    finally:
        done.set()
        stop(proc)
    served: dict[str, float] = {}
    for tenant, p, d in log:
        served[tenant] = served.get(tenant, 0.0) + kv_token_iters(p, d)
    total = sum(served.values())
    from_log = {t: s / total for t, s in served.items()}
    from_metrics = _metric_shares(text)
    from_page = {t["tenant"]: t["share"] for t in state["tenants"]}
    rows = []
    print(
        f"{len(log)} tasks in {wall:.0f} s; /metrics scraped {len(scrapes)} times "
        f"(p50 {1e3 * sorted(scrapes)[len(scrapes) // 2]:.1f} ms)"
    )
    print(f"{'tenant':10} {'log':>8} {'/metrics':>9} {'off':>7} {'page':>8} {'top':>8}")
    for tenant in KEYS:
        cells = next((row for row in top.splitlines() if f" {tenant} " in row), "").replace("│", " ").split()
        top_share = next((cells[i - 1] + " %" for i, w in enumerate(cells) if w == "%"), None)  # its share column
        off = from_metrics.get(tenant, 0.0) / from_log[tenant] - 1
        rows.append(
            {
                "tenant": tenant,
                "log": from_log[tenant],
                "metrics": from_metrics.get(tenant),
                "off": off,
                "page": from_page.get(tenant),
                "top": top_share,
            }
        )
        print(
            f"{tenant:10} {100 * from_log[tenant]:7.1f}% {100 * from_metrics.get(tenant, 0):8.1f}% "
            f"{100 * off:+6.1f}% {100 * (from_page.get(tenant) or 0):7.1f}% {top_share or '-':>8}"
        )
    cache = {
        name: sum(v for _, _, v in samples(text, name))
        for name in (
            "justitia_prefix_cache_queries_total",
            "justitia_prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
        )
    }
    prompts = sum(p for _, p, _ in log)
    queries, hits = cache["justitia_prefix_cache_queries_total"], cache["justitia_prefix_cache_hits_total"]
    print(
        f"prefix cache as Justitia saw it: {hits:.0f} of {queries:.0f} prompt tokens held "
        f"({100 * hits / max(queries, 1):.1f} %; "
        f"the log's prompts: {prompts} tokens); vLLM's own counters, every lookup: "
        f"{cache['vllm:prefix_cache_hits_total']:.0f} of {cache['vllm:prefix_cache_queries_total']:.0f}"
    )
    per_tenant = {
        labels["tenant"]: [0.0, 0.0] for _, labels, _ in samples(text, "justitia_tenant_prefix_cache_queries_total")
    }
    for k, name in enumerate(("justitia_tenant_prefix_cache_queries_total", "justitia_tenant_prefix_cache_hits_total")):
        for _, labels, value in samples(text, name):
            per_tenant[labels["tenant"]][k] = value
    cache["tenants"] = per_tenant
    print("  by tenant: " + ", ".join(f"{t} {100 * h / q:.1f} %" for t, (q, h) in sorted(per_tenant.items()) if q))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "wall_s": wall,
                "tasks": len(log),
                "scrapes": len(scrapes),
                "tenants": rows,
                "prefix_cache": cache | {"log_prompt_tokens": prompts},
            },
            indent=1,
        )
    )
    worst = max(abs(r["off"]) for r in rows)
    print(f"worst /metrics share off the log's: {100 * worst:.1f} % (target: within 10 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
