"""``justitia predictor train`` and ``justitia predictor eval``: fit the learned cost predictor to a profile
file, and compare the predictors on held-out agents."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    from justitia.predictors.registry import KINDS

    pr = sub.add_parser("predictor", help="train and evaluate the learned cost predictor")
    pr_sub = pr.add_subparsers(dest="predictor_command", required=True)
    tr = pr_sub.add_parser("train", help="fit per-type TF-IDF + MLP models (or the lm baseline) to a profile file")
    tr.add_argument("--profile", type=Path, required=True, help="JSONL profile or workload file")
    saved = [k for k, kind in KINDS.items() if kind.load]  # the kinds saved as a directory
    tr.add_argument(
        "--kind",
        choices=saved,
        default=saved[0],
        help="; ".join(f"{k}: {KINDS[k].description}" for k in saved) + f" (default {saved[0]})",
    )
    tr.add_argument("--out", type=Path, required=True, help="predictor directory to write")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--alpha", type=float, help="L2 penalty of the MLP (default: mlp 10, lm 1e-3)")
    ev = pr_sub.add_parser("eval", help="hold out agents per type; compare the predictors on them")
    ev.add_argument(
        "--predictors", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)} (default all of them)"
    )
    ev.add_argument("--profile", type=Path, required=True, help="JSONL profile or workload file")
    ev.add_argument("--test-frac", type=float, default=0.2, help="share of each type held out (default 0.2)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument(
        "--cold-start",
        action="store_true",
        help="also measure how fast an unseen type's error drops (trains one model per type)",
    )
    ev.add_argument("--out", type=Path, help="also write the evaluation as JSON here")


def run(args) -> int:
    import json

    from justitia.core import KV
    from justitia.lab.studies.evaluate import evaluate
    from justitia.predictors.mlp import DEFAULT_ALPHA, LearnedPredictor
    from justitia.workload import load_workload

    agents = load_workload(args.profile)
    if args.predictor_command == "eval" and not 0 < args.test_frac < 1:
        raise ValueError(f"--test-frac must be between 0 and 1, got {args.test_frac}.")
    kv = KV
    if args.predictor_command == "train":
        import time

        t = time.perf_counter()
        if args.kind == "lm":
            from justitia.predictors.lm import LmPredictor

            LmPredictor.train(agents, kv, args.seed, 1e-3 if args.alpha is None else args.alpha).save(args.out)
            what = "the embedding (all-MiniLM-L6-v2) + MLP model over all types"
        else:
            pred = LearnedPredictor.train(agents, kv, args.seed, DEFAULT_ALPHA if args.alpha is None else args.alpha)
            pred.save(args.out)
            kinds = sorted(k for k in pred.models if k != "*")
            what = f"{len(kinds)} per-type models ({', '.join(kinds)}) and an all-types one"
        print(
            f"trained {what} on {len(agents)} agents in {time.perf_counter() - t:.1f} s: {args.out}  "
            f"(use: --predictor {args.kind}:{args.out})"
        )
        return 0
    doc = evaluate(agents, kv, args.test_frac, args.seed, tuple(n for n in args.predictors.split(",") if n))
    from rich.console import Console
    from rich.table import Table

    names = list(doc["predictors"])
    types = sorted(doc["predictors"][names[0]]["per_type_mean_rel_error"])
    table = Table(
        title=f"mean relative error of the agent cost, {doc['test_agents']} held-out agents "
        f"({doc['train_agents']} trained on)"
    )
    table.add_column("type")
    for n in names:
        table.add_column(n, justify="right")
    for t in types:
        table.add_row(t, *(f"{doc['predictors'][n]['per_type_mean_rel_error'][t]:.0%}" for n in names))
    table.add_row("all", *(f"{doc['predictors'][n]['mean_rel_error']:.0%}" for n in names))
    table.add_row("p50 latency ms", *(f"{doc['predictors'][n]['latency_ms_p50']:.3f}" for n in names))
    table.add_row("p99 latency ms", *(f"{doc['predictors'][n]['latency_ms_p99']:.3f}" for n in names))
    table.add_row("training s", *(f"{doc['predictors'][n]['train_s']:.1f}" for n in names))
    Console(width=120).print(table)
    if args.cold_start:
        from justitia.lab.studies.evaluate import cold_start

        doc["cold_start"] = cold_start(agents, kv, args.seed)
        cs = doc["cold_start"]["mean"]
        print(
            "unseen type (all-types model trained without it, then corrected by each finished agent): mean "
            "relative error of "
            + ", ".join(
                f"agents {max(1, k - 4)}-{k}: {e:.0%}" if k > 1 else f"the first: {e:.0%}" for k, e in cs.items()
            )
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
    return 0
