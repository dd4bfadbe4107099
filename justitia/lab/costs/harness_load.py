"""Harness sessions under load: two keyed tenants, the same offered load, each tenant's turn times
and service share.

    python -m justitia.lab.costs.harness_load --sessions 3 --duration 120 --out results/harness-load.json

``justitia serve`` on ``tiny-long`` (the engine answering from ``harnesses.SCRIPT``, as in CI),
two keys of weight 1 in two tenants. Each tenant runs ``--sessions`` harness sessions at once, in a
closed loop for ``--duration`` seconds: every worker runs one harness session after another,
Claude Code and Codex CLI in turn (two user turns each, a tool round trip, a Claude Code subagent),
so both tenants stay backlogged and offer the same load. A turn is one harness command; its time is
that command's wall clock, and its service the tokens the harness says its requests were served
(prompt, cached prompt and answer). Only turns that ended within the window count. Needs the
harnesses installed (``make harnesses``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from justitia.lab.live.harnesses import BIN, HARNESSES, write_script
from justitia.lab.live.servers import start_server, stop
from justitia.lab.report import write_doc

MODEL = "tiny-long"
TENANTS = {"team-a": "sk-load-team-a-0001", "team-b": "sk-load-team-b-0002"}
ORDER = ("claude-code", "codex")


def worker(url: str, key: str, where: Path, deadline: float, turns: list, errors: list, index: int) -> None:
    """Harness sessions one after another until the deadline; each finished turn to ``turns``."""
    n = 0
    while time.monotonic() < deadline:
        harness = ORDER[(index + n) % len(ORDER)]
        try:
            run = HARNESSES[harness](url, key, MODEL, where / f"w{index}-s{n}")
        except Exception as e:  # noqa: BLE001  (counted and reported: the run goes on)
            errors.append(f"{harness}: {e}"[:500])
            n += 1
            continue
        for i, (s, tokens, ended) in enumerate(zip(run.turn_s, run.tokens, run.ended)):
            turns.append(
                {
                    "harness": harness,
                    "session": run.session_id,
                    "turn": i + 1,
                    "turn_s": s,
                    "tokens": tokens,
                    "ended": ended,
                }
            )
        n += 1


def summary(turns: list[dict], start: float, deadline: float) -> dict:
    inside = [t for t in turns if t["ended"] <= deadline]
    served = sum(t["tokens"] for t in inside) or 1
    times = [t["turn_s"] for t in inside]
    return {
        "turns": len(inside),
        "sessions": len({t["session"] for t in inside}),
        "mean_turn_s": float(np.mean(times)) if times else None,
        "p50_turn_s": float(np.median(times)) if times else None,
        "p90_turn_s": float(np.quantile(times, 0.9)) if times else None,
        "tokens": sum(t["tokens"] for t in inside),
        "tokens_per_s": served / (deadline - start),
        "by_harness": {h: sum(1 for t in inside if t["harness"] == h) for h in ORDER},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=3, help="harness sessions at once per tenant (default 3)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    p.add_argument("--policy", default="justitia")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not (BIN / "claude").exists() or not (BIN / "codex").exists():
        raise SystemExit(f"the harnesses are not installed in {BIN}: run `make harnesses`")
    where = Path(tempfile.mkdtemp(prefix="justitia-harness-load-"))
    keys = where / "keys.txt"
    keys.write_text("".join(f"{key} {tenant} 1\n" for tenant, key in TENANTS.items()))
    os.environ["JUSTITIA_SCRIPT"] = str(write_script(where / "script.json"))
    proc, url = start_server(
        "--model",
        MODEL,
        "--policy",
        args.policy,
        "--api-keys",
        str(keys),
        "--max-model-len",
        "65536",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--logits-processors",
        "justitia.engine.scripted:ScriptedAnswers",
        quiet=True,
    )
    try:
        start = time.monotonic()
        deadline = start + args.duration
        turns = {tenant: [] for tenant in TENANTS}
        errors: list[str] = []
        threads = [
            threading.Thread(
                target=worker, args=(url, key, where / tenant, deadline, turns[tenant], errors, i), daemon=True
            )
            for tenant, key in TENANTS.items()
            for i in range(args.sessions)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
    finally:
        stop(proc)
    tenants = {tenant: summary(t, start, deadline) for tenant, t in turns.items()}
    total = sum(s["tokens"] for s in tenants.values()) or 1
    for s in tenants.values():
        s["share"] = s["tokens"] / total
    a, b = (tenants[t]["tokens"] for t in TENANTS)
    doc = {
        "policy": args.policy,
        "sessions_per_tenant": args.sessions,
        "duration_s": args.duration,
        "elapsed_s": elapsed,
        "errors": errors,
        "tenants": tenants,
        "service_ratio": min(a, b) / max(a, b) if max(a, b) else None,
    }
    print(f"{args.policy}: {args.sessions} harness sessions at once per tenant, {args.duration:.0f} s")
    print("tenant     turns   mean turn s   p50 turn s   p90 turn s   tokens served   share")
    for tenant, s in tenants.items():
        print(
            f"{tenant:9s} {s['turns']:6d} {s['mean_turn_s'] or float('nan'):13.2f} "
            f"{s['p50_turn_s'] or float('nan'):12.2f} "
            f"{s['p90_turn_s'] or float('nan'):12.2f} {s['tokens']:15,d} {s['share']:7.1%}"
        )
    print(f"service, the smaller tenant's over the larger's: {doc['service_ratio']:.3f}; errors: {len(errors)}")
    if args.out:
        write_doc(args.out, doc)
    if errors:
        print(json.dumps(errors[:5], indent=1))
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
