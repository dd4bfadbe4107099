"""Load test of `justitia serve`: many agents at once, every one must finish with all its outputs.

    python -m justitia.lab.costs.bench_load [--agents 1000] [--stages A:B --tasks A:B --tokens A:B]
                                    [--url http://127.0.0.1:PORT | --upstream N | --ray N] [--out results/load.json]

Without --url it starts `justitia serve` (tiny model) on a free loopback port and stops it at the
end; with --upstream N it starts N stock vLLM OpenAI servers (tiny model, priority policy) and
`justitia serve --upstream` in front of them, and reports how the requests split between them; with
--ray N, `justitia serve --ray --replicas N` (N engines on a local Ray Serve instance), and the
requests each replica answered. It submits every agent at once (by default each 4 stages of 1-2 tasks of 200-250 tokens;
later stages quote the previous one's first answer), waits until all are done, failed or
cancelled (or --timeout passes), checks each one's outputs, and counts the most agents in flight
at once (from the server's own arrival and finish times). Loopback only:
it refuses any other host. Exit code 1 if an agent is lost, stuck or failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from justitia.lab.live.servers import ray_split, replica_split, samples, start_replica, start_server, stop
from justitia.lab.report import write_doc


def agent_body(
    rng: random.Random, k: int, stages: tuple[int, int], tasks: tuple[int, int], tokens: tuple[int, int]
) -> dict:
    out = []
    for s in range(rng.randint(*stages)):
        quote = " Earlier: {{prev[0]}}" if s else ""
        out.append(
            [
                {
                    "prompt": f"Agent {k} stage {s} task {i}.{quote}",
                    "max_tokens": rng.randint(*tokens),
                    "ignore_eos": True,
                }
                for i in range(rng.randint(*tasks))
            ]
        )
    return {"type": rng.choice(["mrs", "kqa", "fv", "search"]), "stages": out}


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    lo_, hi_ = int(lo), int(hi or lo)
    if not 1 <= lo_ <= hi_:
        raise argparse.ArgumentTypeError(f"'{text}' is not a range A:B with 1 <= A <= B")
    return lo_, hi_


async def run(
    url: str,
    n: int,
    timeout_s: float,
    seed: int,
    stages=(4, 4),
    tasks=(1, 2),
    tokens=(200, 250),
    keys: list[str] | None = None,
) -> dict:
    rng = random.Random(seed)
    bodies = [agent_body(rng, k, stages, tasks, tokens) for k in range(n)]
    # agent k is submitted (and read back) with key k mod len(keys); none: an open server
    auth = [{"Authorization": f"Bearer {keys[k % len(keys)]}"} if keys else {} for k in range(n)]
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        peak = 0
        finished = asyncio.Event()

        async def sample() -> None:  # the most agents the server held at once
            nonlocal peak
            async with httpx.AsyncClient(base_url=url, timeout=60) as probe:
                while not finished.is_set():
                    peak = max(peak, await agents_in_flight(probe))
                    await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.post("/v1/agents", json=b, headers=h) for b, h in zip(bodies, auth)))
        submit_s = time.perf_counter() - t0
        rejected = [r.text for r in replies if r.status_code != 202]
        ids = [(r.json()["agent_id"], h) for r, h in zip(replies, auth) if r.status_code == 202]
        while time.perf_counter() - t0 < timeout_s and await agents_in_flight(client) > 0:
            await asyncio.sleep(0.5)
        wall_s = time.perf_counter() - t0
        finished.set()
        await sampler
        docs = await asyncio.gather(*(client.get(f"/v1/agents/{i}", headers=h) for i, h in ids))
    statuses: dict[str, int] = {}
    lost, incomplete, jcts = 0, 0, []
    for reply, body in zip(docs, [b for b, r in zip(bodies, replies) if r.status_code == 202]):
        if reply.status_code != 200:
            lost += 1
            continue
        doc = reply.json()
        statuses[doc["status"]] = statuses.get(doc["status"], 0) + 1
        if doc["status"] == "done":
            shape_ok = [len(s) for s in doc["stages"]] == [len(s) for s in body["stages"]]
            if not shape_ok or any(t is None or t["output_tokens"] < 1 for s in doc["stages"] for t in s):
                incomplete += 1
            jcts.append(doc["jct_s"])
    stuck = sum(v for k, v in statuses.items() if k not in ("done", "failed", "cancelled"))
    # the most agents in flight at once, exactly, from the server's own arrival and finish times
    edges = sorted(
        e
        for r in docs
        if r.status_code == 200
        for e in ((r.json()["arrival_s"], 1), (r.json()["finish_s"] or float("inf"), -1))
    )
    level = most = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        level += step
        most = max(most, level)
    return {
        "agents": n,
        "accepted": len(ids),
        "rejected": len(rejected),
        "max_in_flight": most,
        "peak_in_flight_sampled": peak,
        "statuses": statuses,
        "lost": lost,
        "stuck": stuck,
        "incomplete": incomplete,
        "tasks": sum(len(s) for b in bodies for s in b["stages"]),
        "submit_s": round(submit_s, 3),
        "wall_s": round(wall_s, 3),
        "mean_jct_s": round(sum(jcts) / len(jcts), 3) if jcts else None,
        "first_rejection": rejected[0] if rejected else None,
    }


async def agents_in_flight(client: httpx.AsyncClient) -> int:
    """``justitia_agents_in_flight`` from the server's /metrics (vLLM's own, or a front end's)."""
    for _, _, value in samples((await client.get("/metrics")).text, "justitia_agents_in_flight"):
        return int(value)
    raise RuntimeError("the server's /metrics has no justitia_agents_in_flight")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--url", help="a running server on loopback (default: start one)")
    ap.add_argument(
        "--upstream",
        type=int,
        default=0,
        help="start N stock vLLM replicas behind `justitia serve "
        "--upstream` (default 0: one server with its own engine)",
    )
    ap.add_argument(
        "--ray",
        type=int,
        default=0,
        help="run N engine replicas on Ray Serve behind `justitia serve "
        "--ray` (default 0: one server with its own engine)",
    )
    ap.add_argument("--timeout", type=float, default=1500, help="seconds to wait for all agents (default 1500)")
    ap.add_argument("--seed", type=int, default=0)
    # defaults: long enough (4 stages in a row) that no agent finishes while 1,000 are being submitted
    ap.add_argument("--stages", type=_range, default=(4, 4), help="stages per agent, A:B (default 4:4)")
    ap.add_argument("--tasks", type=_range, default=(1, 2), help="tasks per stage, A:B (default 1:2)")
    ap.add_argument("--tokens", type=_range, default=(200, 250), help="max_tokens of a task, A:B (default 200:250)")
    ap.add_argument(
        "--keys", type=int, default=4, help="API keys the agents are spread over (default 4; 0: an open server)"
    )
    ap.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = ap.parse_args()
    keys = [f"sk-load-{secrets.token_hex(8)}" for _ in range(args.keys)] if args.url is None else []
    procs = []
    url = args.url
    serve_args = (
        "--predictor",
        "mean",
        "--max-agents-in-flight",
        str(max(args.agents, 1)),
        *(x for key in keys for x in ("--api-key", key)),
    )
    if url is None and args.upstream:
        from justitia.engine.models import resolve_model

        model = str(resolve_model("tiny"))
        replicas = [start_replica(model) for _ in range(args.upstream)]
        procs += [p for p, _ in replicas]
        proc, url = start_server(*serve_args, "--model", "tiny", "--upstream", *(u for _, u in replicas))
        procs.append(proc)
    elif url is None and args.ray:
        proc, url = start_server(*serve_args, "--max-num-seqs", "256", "--ray", "--replicas", str(args.ray))
        procs.append(proc)
    elif url is None:
        proc, url = start_server(*serve_args, "--max-num-seqs", "256")
        procs.append(proc)
    elif urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        print(f"load test: {url} is not a loopback address; this script only loads a local server", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run(url, args.agents, args.timeout, args.seed, args.stages, args.tasks, args.tokens, keys))
        result["keys"] = len(keys)
        if args.upstream:
            result["replicas"] = replica_split(url)
        if args.ray:
            result["replicas"] = ray_split(url)
    finally:
        for proc in reversed(procs):  # the front end first, then the replicas
            stop(proc)
    print(json.dumps(result, indent=1))
    if args.out:
        write_doc(args.out, result)
    ok = (
        result["lost"] == result["stuck"] == result["incomplete"] == result["rejected"] == 0
        and result["statuses"].get("done", 0) == args.agents
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
