"""A replica killed mid-run under ``justitia serve --ray --replicas 2``: is any agent lost?

    python -m justitia.lab.costs.ray_kill [--runs 3] [--out results/ray-kill.json]

One server (two replicas of the tiny model, journal on). Each run submits an elephant (a 40-task map
of 256 forced tokens each, then a reduce quoting the first map answer) and 10 mice (one task of 16
tokens), waits until the
replicas are answering the run's requests, then SIGKILLs the process of the replica that has answered
most, and waits for all 11 agents. Between runs it waits until Ray's replacement replica answers.
Reported per run: agents done (of 11), failed, the requests sent again and interrupted, and how long
the run took. Exits 1 if any run lost an agent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import httpx

from justitia.lab.live.servers import TERMINAL, ray_split, start_server, wait_agent
from justitia.lab.report import write_doc


def agents() -> list[dict]:
    """The elephant, then ten mice."""
    elephant = {
        "type": "mrs",
        "stages": [
            [
                {"prompt": f"Summarise part {i} of the annual report.", "max_tokens": 256, "ignore_eos": True}
                for i in range(40)
            ],
            [{"prompt": "Combine the summaries, starting from:\n{{prev[0]}}", "max_tokens": 16, "ignore_eos": True}],
        ],
    }
    mice = [
        {
            "type": "qa",
            "stages": [[{"prompt": f"Question {i}: what is the capital?", "max_tokens": 16, "ignore_eos": True}]],
        }
        for i in range(10)
    ]
    return [elephant, *mice]


def answers(url: str) -> dict[int, float]:
    """Requests each replica answered, by process id."""
    return {int(k.split()[1]): v for k, v in ray_split(url).items() if k.startswith("pid ")}


def one_run(client: httpx.Client, url: str, k: int) -> dict:
    before = answers(url)
    started = time.time()
    ids = [client.post("/v1/agents", json=body).json()["agent_id"] for body in agents()]
    while sum(answers(url).values()) == sum(before.values()) and time.time() - started < 300:
        time.sleep(0.1)  # kill once the replicas answer this run's requests: others are in flight
    now = answers(url)
    victim = max(now, key=lambda pid: now[pid] - before.get(pid, 0))
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time() - started
    docs = [
        doc if doc["status"] in TERMINAL else {"status": "stuck"}
        for doc in (wait_agent(client, a, 900, 0.5, stuck_ok=True) for a in ids)
    ]
    statuses = [d["status"] for d in docs]
    split = ray_split(url)
    run = {
        "run": k,
        "killed_pid": victim,
        "killed_at_s": round(killed_at, 1),
        "done": statuses.count("done"),
        "agents": len(ids),
        "not_done": {a: d.get("error") or d["status"] for a, d in zip(ids, docs) if d["status"] != "done"},
        "sent_again": split.get("retries_total", 0),
        "interrupted": split.get("interrupted_total", 0),
        "took_s": round(time.time() - started, 1),
    }
    print(json.dumps(run), flush=True)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("results/ray-kill.json"))
    args = ap.parse_args()
    proc, url = start_server("--ray", "--replicas", "2", "--kv-blocks", "24", quiet=True)
    runs = []
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            for k in range(1, args.runs + 1):
                if k > 1:  # the dead replica's replacement answers before the next kill
                    seen, deadline = set(answers(url)), time.time() + 300
                    while time.time() < deadline:
                        probes = [client.post("/v1/agents", json=body).json()["agent_id"] for body in agents()[1:5]]
                        for probe in probes:
                            wait_agent(client, probe, 120)
                        if set(answers(url)) - seen:
                            break
                        time.sleep(2)
                runs.append(one_run(client, url, k))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except Exception:  # noqa: BLE001
            proc.kill()
    lost = sum(r["agents"] - r["done"] for r in runs)
    print(f"{len(runs)} runs: " + ", ".join(f"{r['done']} of {r['agents']} done" for r in runs))
    write_doc(args.out, {"runs": runs})
    print(f"wrote {args.out}")
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
