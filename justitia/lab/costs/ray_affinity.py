"""What prefix affinity buys on Ray Serve: `justitia serve --ray --replicas 2` under each router, the
same agents each time.

    python -m justitia.lab.costs.ray_affinity [--agents 24] [--routers least-load,affinity,round-robin]
        [--out results/ray-affinity.json]

Each agent reads one document of its own (about 1,200 tokens of the tiny model): its first stage asks 3 questions of
it, its second stage 3 more of the same document with the first answers appended, so every prompt
of an agent starts with the same KV blocks. vLLM's prefix cache (on, as `justitia serve` starts its
engines) can skip a prompt's blocks that its replica computed before; least-load spreads an agent's
tasks over both replicas, affinity sends a prompt whose first block a replica served lately back to
it. All agents are submitted at once; the script reports the mean JCT and the wall time per router
(tiny model, two replicas on this machine's CPUs, one run each).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import httpx

from justitia.lab.live.servers import samples, start_server, stop
from justitia.lab.report import write_doc

WORDS = (
    "river bridge council budget harbor school winter market railway station museum garden "
    "hospital factory library festival tower village airport forest"
).split()


def agents(n: int, seed: int) -> list[dict]:
    """``n`` two-stage agents, each over a document of its own."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        doc = f"Document {i}. " + " ".join(rng.choice(WORDS) for _ in range(500))
        first = [
            {
                "prompt": f"{doc}\nQuestion {q}: what does it say about the {rng.choice(WORDS)}?",
                "max_tokens": 16,
                "ignore_eos": True,
            }
            for q in range(3)
        ]
        second = [
            {
                "prompt": f"{doc}\nEarlier answers: {{{{prev}}}}\nQuestion {q + 3}: and the {rng.choice(WORDS)}?",
                "max_tokens": 16,
                "ignore_eos": True,
            }
            for q in range(3)
        ]
        out.append({"type": "mrs", "stages": [first, second]})
    return out


async def run(url: str, bodies: list[dict]) -> dict:
    """Submit every agent at once, wait for all; mean JCT and wall time."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        ids = []
        for b in bodies:
            r = await client.post("/v1/agents", json=b)
            if r.status_code != 202:
                raise SystemExit(f"the server refused an agent: {r.status_code} {r.text[:300]}")
            ids.append(r.json()["agent_id"])
        docs = {}
        while len(docs) < len(ids):
            for a in ids:
                if a not in docs:
                    d = (await client.get(f"/v1/agents/{a}")).json()
                    if d["status"] in ("done", "failed", "cancelled"):
                        docs[a] = d
            await asyncio.sleep(0.5)
        wall = time.perf_counter() - t0
        answers = [
            f"pid {labels['replica_pid']}: {value:g}"
            for _, labels, value in samples((await client.get("/metrics")).text, "justitia_ray_replica_answers_total")
        ]
    jcts = [d["jct_s"] for d in docs.values() if d["status"] == "done"]
    return {"done": len(jcts), "mean_jct_s": sum(jcts) / len(jcts), "wall_s": wall, "answers": answers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=24)
    ap.add_argument("--routers", default="least-load,affinity,round-robin")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bodies = agents(args.agents, args.seed)
    result = {"agents": args.agents, "runs": {}}
    for router in args.routers.split(","):
        proc, url = start_server(
            "--predictor", "mean", "--ray", "--replicas", "2", "--router", router, quiet=True, journal=False
        )
        try:
            r = asyncio.run(run(url, bodies))
        finally:
            stop(proc, 120)
        result["runs"][router] = r
        print(
            f"{router:<12} done {r['done']}/{args.agents}  mean JCT {r['mean_jct_s']:.2f} s  wall {r['wall_s']:.2f} s  "
            f"{'; '.join(r['answers'])}",
            flush=True,
        )
    base = result["runs"].get("least-load")
    if base:
        for router, r in result["runs"].items():
            r["mean_jct_vs_least_load"] = r["mean_jct_s"] / base["mean_jct_s"]
    if args.out:
        write_doc(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
