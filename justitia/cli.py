"""The ``justitia`` command line: generate workloads, benchmark policies, calibrate the simulator, train
predictors, profile a real model, serve agents. It sits over both the product and the lab (``justitia.lab``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from justitia.workload import WorkloadError


def _add_workload_args(p: argparse.ArgumentParser, agents: int = 300, density: float = 1.0) -> None:
    p.add_argument("--agents", type=int, default=agents, help=f"number of agents (default {agents})")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace to take arrival times from")
    p.add_argument("--density", type=float, default=density,
                   help=f"arrival density: 2 packs arrivals twice as tight (default {density:.3g})")
    p.add_argument("--rate", type=float, help="synthetic arrivals per second before density (no --trace)")
    p.add_argument("--cv", type=float, default=1.0, help="synthetic inter-arrival coefficient of variation (1 = Poisson)")
    p.add_argument("--tenant", help="put every agent in this tenant (default: the workload's own tenants, or none)")


def _parser() -> argparse.ArgumentParser:
    from justitia.core import POLICY_NAMES
    from justitia.lab.presets import PRESET_NAMES
    from justitia.predictors import SPEC_HELP
    from justitia.predictors.registry import KINDS
    from justitia.core import ROUTER_NAMES
    from justitia.sim import CLOCKS
    from justitia.sim.config import PROFILES

    ap = argparse.ArgumentParser(prog="justitia", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    wl = sub.add_parser("workload", help="workload files")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    gen = wl_sub.add_parser("generate", help="generate agents of the nine workflows into a JSONL file")
    _add_workload_args(gen)
    gen.add_argument("--out", type=Path, required=True, help="output JSONL file")

    b = sub.add_parser("bench", help="run policies over a workload and report JCT and fairness")
    b.add_argument("--engine", choices=["sim", "vllm"], help="engine to run on (default sim; the cpu preset: vllm)")
    b.add_argument("--preset", choices=PRESET_NAMES, help="one of the paper's experiments, or cpu and engine (real vLLM)")
    b.add_argument("--workload", type=Path, help="JSONL workload file (instead of generating one)")
    _add_workload_args(b)
    b.add_argument("--scale", type=float, default=1.0, help="divide every token length by this (small engines)")
    b.add_argument("--policies", default=",".join(POLICY_NAMES),
                   help="comma-separated policies (also: justitia-eligible, an option for the tail; docs/design.md)")
    b.add_argument("--predictor", default="oracle", help=f"{SPEC_HELP} (default oracle)")
    b.add_argument("--cost", choices=["kv", "compute"], default="kv", help="cost model (default kv)")
    b.add_argument("--capacity", choices=["measured", "formula"], default="measured",
                   help="the clock's M: measured from what the engine delivers (default), or the formula's "
                        "(KV tokens / nominal step, the paper's rule)")
    b.add_argument("--no-retag", action="store_true",
                   help="keep each agent's first tag even when its stages reveal more work than predicted")
    b.add_argument("--pricing", choices=["first-stage", "all-stages"], default="first-stage",
                   help="price an agent on arrival from its first stage (the predictor's, default) or at least "
                        "the sum of every stage's predicted requests (an agent submitted whole)")
    b.add_argument("--latency", help=f"simulator latency profile: {', '.join(sorted(PROFILES))} (sim default) "
                   "or a file from 'justitia calibrate' (vllm default: calibrate first)")
    _add_engine_args(b)
    b.add_argument("--replicas", type=int,
                   help="sim: simulate a cluster of this many engines behind one router (default 1; the cluster "
                        "presets set their own)")
    b.add_argument("--router", choices=ROUTER_NAMES,
                   help="sim, --replicas > 1: least-load (default), affinity or round-robin (docs/design.md, Clusters)")
    b.add_argument("--cluster-clock", choices=CLOCKS,
                   help="sim, --replicas > 1: justitia's clock, one in front of every engine (global, default) or "
                        "one per engine (replica); other policies keep their state per engine")
    b.add_argument("--tagging", action="store_true", help="vllm: also run justitia by front-end tagging on stock vLLM")
    b.add_argument("--calibration-agents", type=int, default=20, help="vllm: agents in the calibration run (default 20)")
    b.add_argument("--repeats", type=int, help="vllm: runs per policy, JCTs averaged per agent (default 1; cpu preset 2)")
    b.add_argument("--speed-probes", action="store_true",
                   help="vllm: run the calibration agents again before and after every run and simulate each run "
                        "at the engine's mean speed over the two (the engine preset does)")
    b.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory")
    b.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    b.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    pr = sub.add_parser("predictor", help="train and evaluate the learned cost predictor")
    pr_sub = pr.add_subparsers(dest="predictor_command", required=True)
    tr = pr_sub.add_parser("train", help="fit per-type TF-IDF + MLP models (or the lm baseline) to a profile file")
    tr.add_argument("--profile", type=Path, required=True, help="JSONL profile or workload file")
    saved = [k for k, kind in KINDS.items() if kind.load]  # the kinds saved as a directory
    tr.add_argument("--kind", choices=saved, default=saved[0],
                    help="; ".join(f"{k}: {KINDS[k].description}" for k in saved) + f" (default {saved[0]})")
    tr.add_argument("--out", type=Path, required=True, help="predictor directory to write")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--alpha", type=float, help="L2 penalty of the MLP (default: mlp 10, lm 1e-3)")
    ev = pr_sub.add_parser("eval", help="hold out agents per type; compare the predictors on them")
    ev.add_argument("--predictors", default=",".join(KINDS),
                    help=f"comma-separated, of {', '.join(KINDS)} (default all of them)")
    ev.add_argument("--profile", type=Path, required=True, help="JSONL profile or workload file")
    ev.add_argument("--test-frac", type=float, default=0.2, help="share of each type held out (default 0.2)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--cold-start", action="store_true",
                    help="also measure how fast an unseen type's error drops (trains one model per type)")
    ev.add_argument("--out", type=Path, help="also write the evaluation as JSON here")

    pf = sub.add_parser("profile", help="run generated agents through a real model (vLLM) and record their costs")
    pf.add_argument("--model", default="smollm2", help="tiny, smollm2 or a model directory (default smollm2)")
    pf.add_argument("--agents-per-type", type=int, default=30, help="agents of each workflow (default 30)")
    pf.add_argument("--types", help="comma-separated workflows (default all nine)")
    pf.add_argument("--size", choices=["small", "medium", "large"], default="small", help="size class (default small)")
    pf.add_argument("--scale", type=float, default=8.0, help="divide every drawn length by this (default 8)")
    pf.add_argument("--max-tokens", type=int, default=128, help="cap on any one answer (default 128)")
    pf.add_argument("--concurrency", type=int, default=32, help="agents in flight (default 32)")
    pf.add_argument("--seed", type=int, default=0)
    pf.add_argument("--out", type=Path, required=True, help="profile file (.jsonl or .jsonl.gz); resumed if it exists")
    pf.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    sv = sub.add_parser("serve", allow_abbrev=False,
                        help="serve agents over HTTP on vLLM with the Justitia scheduler",
                        description="vLLM's own OpenAI server with Justitia's scheduler and endpoint plugin; "
                                    "any other option is vLLM's (vllm serve --help), passed through, e.g. "
                                    "--enable-auto-tool-choice --tool-call-parser hermes (docs/server.md)")
    sv.add_argument("--model", help="tiny, smollm2 or a model directory (default tiny; with --upstream: the "
                                    "tokenizer, by default the replicas' model directory)")
    sv.add_argument("--policy", default="justitia", help="scheduling policy (default justitia)")
    sv.add_argument("--predictor", default="mlp", help=f"cost predictor: {SPEC_HELP} (default mlp)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--kv-blocks", type=int, help="cap the KV cache at this many blocks (default: what memory allows)")
    sv.add_argument("--calibration", type=Path, metavar="FILE",
                    help="a `justitia calibrate` file of this engine: the clock's M starts at what it measured "
                         "(default: the formula's guess until the first measured window, about 2 s of busy time)")
    sv.add_argument("--max-num-seqs", type=int, default=256)
    sv.add_argument("--max-model-len", type=int, default=2048)
    sv.add_argument("--max-tasks-per-agent", type=int, default=256)
    sv.add_argument("--max-agents-in-flight", type=int, default=2048)
    sv.add_argument("--max-body-bytes", type=int, default=1_000_000)
    sv.add_argument("--api-key", action="append", metavar="KEY",
                    help="a client key (repeatable; tenant 'default', weight 1); clients send 'Authorization: Bearer KEY'")
    sv.add_argument("--api-keys", type=Path, metavar="FILE",
                    help="client keys, one a line: KEY TENANT WEIGHT [trusted] (docs/server.md)")
    sv.add_argument("--key-agents-in-flight", type=int, help="agents in flight per key (default: --max-agents-in-flight)")
    sv.add_argument("--key-requests-in-flight", type=int, default=256, help="inference requests (chat, completions, responses, messages) in flight per key (default 256)")
    sv.add_argument("--key-rate", type=float, default=0.0,
                    help="requests (agents and completions) per second per key, 0: no limit (default 0)")
    sv.add_argument("--key-burst", type=int, default=0, help="the rate limit's burst (default: one second's worth)")
    sv.add_argument("--max-requests-in-flight", type=int, default=1024,
                    help="inference requests in flight in all; beyond: 503 (default 1024)")
    sv.add_argument("--max-streams-per-agent", type=int, default=8, help="open event streams per agent (default 8)")
    sv.add_argument("--finished-mib", type=int, default=64, help="finished agents kept, in MiB of documents (default 64)")
    sv.add_argument("--finished-hours", type=float, default=24.0, help="finished agents kept this long (default 24)")
    sv.add_argument("--journal", type=Path, metavar="FILE",
                    help="SQLite journal of accepted agents and their outputs (default "
                         "~/.local/state/justitia/serve-HOST-PORT.sqlite, or $JUSTITIA_STATE_DIR)")
    sv.add_argument("--no-journal", action="store_true", help="keep agents in memory only (a restart loses them)")
    sv.add_argument("--upstream-timeout", type=float, default=600.0, metavar="S",
                    help="--upstream: seconds a replica may take to send the next bytes of an answer (default 600)")
    sv.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                    help="close a connection whose request headers take longer than this (default 10)")
    sv.add_argument("--drain-s", type=float, default=30.0,
                    help="--upstream, --ray: on SIGTERM, wait this long for agents in flight before stopping (default 30; "
                         "vLLM's own server stops at once, and the journal resumes its agents)")
    sv.add_argument("--upstream", nargs="+", metavar="URL",
                    help="front stock vLLM OpenAI servers (started with --scheduling-policy priority) instead of "
                         "running an engine here; one clock over all of them, least-loaded routing")
    sv.add_argument("--upstream-kv-tokens", type=int,
                    help="KV cache of each replica in tokens (default: read from the replica's /metrics)")
    sv.add_argument("--ray", action="store_true",
                    help="run --replicas engines (each with the plug-in) as a Ray Serve deployment behind one clock "
                         "here (pip install justitia[ray]; docs/server.md)")
    sv.add_argument("--replicas", type=int, default=2, help="--ray: engine replicas (default 2)")
    sv.add_argument("--ray-address", metavar="ADDR",
                    help="--ray: join this Ray cluster ('auto', 'ray://HOST:10001') instead of starting a local one")
    sv.add_argument("--router", default="least-load",
                    help="--ray: least-load (default), affinity (a prompt's first block goes back to the replica "
                         "that served it, within a load slack) or round-robin")
    sv.add_argument("--ray-replica-cpus", type=float, default=0.5, help="--ray: CPUs Ray reserves per replica (default 0.5)")
    sv.add_argument("--ray-replica-gpus", type=float, default=0.0, help="--ray: GPUs per replica (default 0; 1 on GPUs)")

    c = sub.add_parser("calibrate", help="fit the simulator's latency profile to a real vLLM engine")
    _add_workload_args(c, agents=20, density=1 / 3)
    c.add_argument("--scale", type=float, default=8.0, help="divide every token length by this (default 8)")
    _add_engine_args(c)
    c.add_argument("--repeats", type=int, default=1, help="runs of the workload to fit (default 1)")
    c.add_argument("--out", type=Path, default=Path("results/latency.json"), help="latency profile file to write")
    return ap


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    from justitia.vllm.engine import EngineSpec

    d = EngineSpec()
    p.add_argument("--model", help=f"vllm: tiny, smollm2 or a model directory (default {d.model})")
    p.add_argument("--kv-blocks", type=int, help=f"KV cache size in blocks (sim default: the profile's; vllm {d.kv_blocks})")
    p.add_argument("--max-num-batched-tokens", type=int, help=f"token budget per step (default {d.max_num_batched_tokens})")
    p.add_argument("--max-num-seqs", type=int, help=f"cap on running requests (sim default 256; vllm {d.max_num_seqs})")
    p.add_argument("--max-model-len", type=int, help=f"vllm: longest prompt + output (default {d.max_model_len})")


def _engine_spec(args, preset_options: dict | None = None):
    """The vLLM engine to start: command-line flags, then the preset's settings, then EngineSpec's defaults."""
    from justitia.vllm.engine import EngineSpec

    options = dict(preset_options or {})
    for name in ("model", "kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return EngineSpec(**options)


def _workload_from_args(args) -> tuple[list, dict]:
    from justitia.lab.presets import DEFAULT_RATE_PER_S, build_workload

    if args.trace is not None and args.rate is not None:
        raise ValueError("--rate applies to synthetic arrivals; it cannot be combined with --trace.")
    return _in_tenant(args, *build_workload(
        args.agents, args.seed, args.trace, args.density,
        DEFAULT_RATE_PER_S if args.rate is None else args.rate, args.cv,
    ))


def _in_tenant(args, agents: list, info: dict) -> tuple[list, dict]:
    """``--tenant``: every agent in that tenant."""
    if args.tenant is None:
        return agents, info
    if not 1 <= len(args.tenant) <= 128:
        raise ValueError(f"--tenant must be 1-128 characters, got {len(args.tenant)}.")
    from dataclasses import replace

    return [replace(a, tenant=args.tenant) for a in agents], info | {"tenant": args.tenant}


def _cmd_generate(args) -> int:
    from justitia.workload import save_workload

    agents, info = _workload_from_args(args)
    save_workload(agents, args.out)
    print(f"wrote {len(agents)} agents to {args.out} ({info['arrivals']} arrivals, seed {args.seed})")
    return 0


def _cmd_bench(args) -> int:
    from justitia.core import OPTION_NAMES, POLICY_NAMES
    from justitia.lab.bench import RunSpec, run_bench, write_results
    from justitia.lab.presets import make_preset
    from justitia.lab.report import print_results
    from justitia.predictors import make_predictor
    from justitia.workload import load_workload, scale_tokens

    title = ""
    preset = None
    if args.preset:
        preset = make_preset(args.preset, args.seed)
        agents, info = _in_tenant(args, preset.agents, preset.workload_info)
        specs = preset.specs
        title = f"preset '{preset.name}': {preset.description}"
        for note in preset.notes:
            print(f"note: {note}", file=sys.stderr)
        if args.workload:
            raise ValueError("--preset builds its own workload; drop --workload.")
        if args.router or args.cluster_clock or args.replicas not in (None, preset.replicas):
            raise ValueError(f"preset '{preset.name}' sets its own replicas, routers and clocks; "
                             "drop --replicas, --router and --cluster-clock.")
    else:
        if args.workload:
            agents = load_workload(args.workload)
            agents, info = _in_tenant(args, agents, {"arrivals": "file", "file": str(args.workload), "agents": len(agents)})
        else:
            agents, info = _workload_from_args(args)
        if args.scale != 1:
            agents = scale_tokens(agents, args.scale)
            info |= {"token_scale": args.scale}
        names = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in names if p not in POLICY_NAMES + OPTION_NAMES]
        if unknown or not names:
            raise ValueError(f"--policies: unknown policy '{(unknown or [''])[0]}'; expected some of: "
                             f"{', '.join(POLICY_NAMES + OPTION_NAMES)}.")
        make_predictor(args.predictor)  # validate before running anything
        specs = [RunSpec(p, p, args.predictor, args.cost, args.capacity, not args.no_retag, args.pricing, args.router,
                         args.cluster_clock) for p in names]
    engine = args.engine or (preset.engine if preset else "sim")
    replicas = preset.replicas if preset else (1 if args.replicas is None else args.replicas)
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}.")
    if replicas > 1 and engine == "vllm":
        raise ValueError("--replicas simulates a cluster; the vLLM bench runs one engine (use --engine sim).")
    if engine == "vllm":
        doc = _bench_vllm(args, agents, specs, info, preset)
    else:
        doc = run_bench(agents, specs, _sim_config(args, preset.sim_options if preset else {}), info, args.seed,
                        progress=not args.no_progress, replicas=replicas)
    if args.preset:
        doc["preset"] = args.preset
        if preset.notes:
            doc["notes"] = preset.notes
    path = write_results(doc, args.out, plots=not args.no_plots)
    print_results(doc, title)
    if any(a["agent_id"] == "elephant" for a in next(iter(doc["policies"].values()))["agents"]):
        _print_elephant(doc)
    if any(a["agent_id"].startswith("trojan-") for a in next(iter(doc["policies"].values()))["agents"]):
        _print_trojans(doc)
    print(f"results: {path}")
    return 0


def _sim_config(args, preset_options: dict | None = None):
    """The simulated engine: command-line flags, then the preset's settings, then defaults."""
    from justitia.lab.presets import SIM_DEFAULT_PROFILE
    from justitia.sim import EngineConfig
    from justitia.sim.config import load_profile

    options = {"kv_blocks": None, "max_num_batched_tokens": 2048, "max_num_seqs": 256} | (preset_options or {})
    for name in list(options):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return EngineConfig(profile=load_profile(args.latency or SIM_DEFAULT_PROFILE), **options)


def _bench_vllm(args, agents, specs, info, preset) -> dict:
    from justitia.lab.presets import CPU_DENSITY, build_workload
    from justitia.lab.vllm_bench import run_bench_vllm
    from justitia.sim.config import load_profile
    from justitia.workload import scale_tokens

    spec = _engine_spec(args, preset.engine_options if preset else None)
    profile = load_profile(args.latency) if args.latency else None
    calibration = preset.calibration_agents if preset else []
    if profile is None and not calibration:
        calibration, _ = build_workload(args.calibration_agents, args.seed + 1, args.trace, CPU_DENSITY)
        calibration = scale_tokens(calibration, args.scale)
    tagging = args.tagging or (preset is not None and preset.tagging)
    repeats = args.repeats or (preset.repeats if preset else 1)
    probes = args.speed_probes or (preset is not None and preset.speed_probes)
    if probes and not calibration:
        raise ValueError("--speed-probes runs the calibration agents again: it cannot go with --latency.")
    return run_bench_vllm(agents, specs, spec, info, args.seed, not args.no_progress, profile, calibration, tagging,
                          repeats, probes)


def _cmd_predictor(args) -> int:
    import json

    from justitia.core import KV
    from justitia.lab.evaluate import evaluate
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
        print(f"trained {what} on {len(agents)} agents in {time.perf_counter() - t:.1f} s: {args.out}  "
              f"(use: --predictor {args.kind}:{args.out})")
        return 0
    doc = evaluate(agents, kv, args.test_frac, args.seed, tuple(n for n in args.predictors.split(",") if n))
    from rich.console import Console
    from rich.table import Table

    names = list(doc["predictors"])
    types = sorted(doc["predictors"][names[0]]["per_type_mean_rel_error"])
    table = Table(title=f"mean relative error of the agent cost, {doc['test_agents']} held-out agents "
                        f"({doc['train_agents']} trained on)")
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
        from justitia.lab.evaluate import cold_start

        doc["cold_start"] = cold_start(agents, kv, args.seed)
        cs = doc["cold_start"]["mean"]
        print("unseen type (all-types model trained without it, then corrected by each finished agent): mean "
              "relative error of " + ", ".join(f"agents {max(1, k - 4)}-{k}: {e:.0%}" if k > 1 else f"the first: {e:.0%}"
                                              for k, e in cs.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


def _cmd_profile(args) -> int:
    from justitia.lab.profile import ProfileSpec, run_profile
    from justitia.workload.workflows import WORKFLOW_TYPES

    types = tuple(args.types.split(",")) if args.types else WORKFLOW_TYPES
    if args.max_tokens < 1 or args.concurrency < 1:
        raise ValueError("--max-tokens and --concurrency must be >= 1.")
    spec = ProfileSpec(args.model, types, args.agents_per_type, args.size, args.scale, args.max_tokens, args.seed,
                       args.concurrency)
    summary = run_profile(spec, args.out, not args.no_progress)
    print(f"profile: {summary['agents']} agents in {args.out} ({summary['new']} new, {summary['wall_s'] / 60:.1f} min)  "
          f"(next: justitia predictor eval --profile {args.out})")
    print(_profile_stats(args.out))
    return 0


def _profile_stats(path) -> str:
    """One line on what a profile file holds (rerunning the command on a complete file prints it)."""
    import statistics

    from justitia.workload import load_workload

    agents = load_workload(path)
    answers = [(t.output_tokens, a.meta.get("max_tokens")) for a in agents for t in a.tasks]
    stopped = sum(cap is not None and n < cap for n, cap in answers)
    prompt = statistics.mean(sum(t.prompt_tokens for t in a.tasks) for a in agents)
    output = statistics.mean(sum(t.output_tokens for t in a.tasks) for a in agents)
    return (f"profile: {len(answers)} answers, {stopped / len(answers):.0%} ended before their cap, median "
            f"{statistics.median(n for n, _ in answers):g} tokens; per agent {prompt:,.0f} prompt and "
            f"{output:,.0f} output tokens on average")


def _cmd_serve(args) -> int:
    import asyncio

    from justitia.core import POLICY_NAMES
    from justitia.predictors import make_predictor
    from justitia.server.keys import KeyRing
    from justitia.server.main import serve

    for name in ("max_num_seqs", "max_model_len", "max_tasks_per_agent", "max_agents_in_flight", "max_body_bytes",
                 "key_requests_in_flight", "max_requests_in_flight", "max_streams_per_agent", "finished_mib"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.key_agents_in_flight is not None and args.key_agents_in_flight < 1:
        raise ValueError(f"--key-agents-in-flight must be >= 1, got {args.key_agents_in_flight}.")
    for name in ("key_rate", "key_burst", "finished_hours"):
        value = getattr(args, name)
        if not (value >= 0 and value < float("inf")):
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}.")
    limits = {"key_agents_in_flight": args.key_agents_in_flight, "key_requests_in_flight": args.key_requests_in_flight,
              "key_rate": args.key_rate, "key_burst": args.key_burst, "max_requests_in_flight": args.max_requests_in_flight,
              "max_streams_per_agent": args.max_streams_per_agent, "finished_bytes": args.finished_mib << 20,
              "finished_s": args.finished_hours * 3600}
    if args.upstream_kv_tokens is not None and args.upstream_kv_tokens < 1:
        raise ValueError(f"--upstream-kv-tokens must be >= 1, got {args.upstream_kv_tokens}.")
    journal = False if args.no_journal else (args.journal or True)
    if args.no_journal and args.journal:
        raise ValueError("--journal and --no-journal contradict each other.")
    if not (args.drain_s >= 0 and args.drain_s < float("inf")):
        raise ValueError(f"--drain-s must be a finite number >= 0, got {args.drain_s}.")
    if not (args.header_timeout > 0 and args.header_timeout < float("inf")):
        raise ValueError(f"--header-timeout must be a finite number > 0, got {args.header_timeout}.")
    if not (args.upstream_timeout > 0 and args.upstream_timeout < float("inf")):
        raise ValueError(f"--upstream-timeout must be a finite number > 0, got {args.upstream_timeout}.")
    ray = None
    if args.ray:
        if args.upstream:
            raise ValueError("--ray and --upstream contradict each other: replicas run on Ray, or upstream.")
        from justitia.ray.deployment import RaySpec

        ray = RaySpec(args.replicas, args.ray_address, args.router, args.ray_replica_cpus, args.ray_replica_gpus)
    if not (args.upstream or ray):  # vLLM's own server, with Justitia's scheduler and endpoint plugin
        from justitia.server.journal import default_path
        from justitia.server.main import serve_vllm, vllm_command, vllm_environment

        make_predictor(args.predictor)  # fail before minutes of start-up
        KeyRing.load(args.api_key, args.api_keys)
        if args.policy not in POLICY_NAMES:
            raise ValueError(f"--policy: unknown policy '{args.policy}'; expected one of: {', '.join(POLICY_NAMES)}.")
        path = None if journal is False else default_path(args.host, args.port) if journal is True else journal
        config = {"predictor": args.predictor, "api_keys": args.api_key or [],
                  "api_keys_file": None if args.api_keys is None else str(args.api_keys),
                  "journal": None if path is None else str(path),
                  "limits": limits | {"max_tasks_per_agent": args.max_tasks_per_agent,
                                      "max_agents_in_flight": args.max_agents_in_flight,
                                      "max_body_bytes": args.max_body_bytes}}
        argv = vllm_command(args.model or "tiny", args.host, args.port, args.kv_blocks, args.max_num_seqs,
                            args.max_model_len, args.vllm_args)
        try:
            return serve_vllm(argv, vllm_environment(args.policy, config, args.calibration), args.header_timeout)
        except KeyboardInterrupt:
            return 0
    if args.calibration is not None and (args.upstream or args.ray):
        raise ValueError("--calibration: for the engine justitia serve runs itself; replicas measure their own M.")
    if args.vllm_args and args.upstream:
        raise ValueError(f"{' '.join(args.vllm_args)}: with --upstream, give vLLM's options to the replicas.")
    try:
        return asyncio.run(serve(args.model, args.policy, args.predictor, args.host, args.port, args.kv_blocks,
                          args.max_num_seqs, args.max_model_len, args.max_tasks_per_agent, args.max_agents_in_flight,
                          args.max_body_bytes, args.upstream, args.upstream_kv_tokens, api_keys=args.api_key,
                          api_keys_file=args.api_keys, limits=limits, journal=journal, drain_s=args.drain_s,
                          upstream_timeout_s=args.upstream_timeout, header_timeout_s=args.header_timeout, ray=ray,
                          vllm_args=args.vllm_args))
    except KeyboardInterrupt:
        return 0


def _cmd_calibrate(args) -> int:
    import json

    from justitia.lab.vllm_bench import calibrate, engine_config
    from justitia.workload import scale_tokens

    spec = _engine_spec(args)
    agents, _ = _workload_from_args(args)
    profile, stats = calibrate(spec, scale_tokens(agents, args.scale), args.seed, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    formula = engine_config(profile, spec, profile.block_size).capacity_per_s("kv")
    stats["formula_capacity_per_s"] = formula
    args.out.write_text(json.dumps(profile.to_json() | {"fit": stats}, indent=1))
    measured = stats["delivered_capacity_per_s"]
    print("the clock's M: " + (f"{measured:,.0f} KV token-iterations/s delivered while requests waited "
                               f"({stats['backlogged_s']:.1f} s), {measured / formula:.2f} of the formula's {formula:,.0f}"
                               if measured else f"no request waited in this run; the formula's {formula:,.0f} /s stands"))
    print(f"fitted over {stats['steps']} steps: step_ms = {profile.base_ms:.3f} + {profile.per_batched_token_ms:.5f} "
          f"* batched_tokens + {profile.per_context_token_ms:.3g} * decode_context_tokens  "
          f"(R^2 {stats['r2']:.2f}, median |error| {stats['median_abs_rel_error']:.0%})")
    print(f"profile: {args.out}  (use: justitia bench --engine vllm --profile {args.out})")
    return 0


def _print_elephant(doc: dict) -> None:
    last_arrival = max(a["arrival_s"] for a in next(iter(doc["policies"].values()))["agents"])
    print(f"the elephant and the small agents per policy (small agents keep arriving until t={last_arrival:.0f} s):")
    for label, entry in doc["policies"].items():
        e = next(a for a in entry["agents"] if a["agent_id"] == "elephant")
        mice = [a["jct_s"] for a in entry["agents"] if a["agent_id"] != "elephant"]
        extra = ""
        if "gps_finish_s" in e:
            extra = f"  (GPS finish {e['gps_finish_s']:.1f} s, bound {entry['delay_bound_s']:.1f} s)"
        print(f"  {label:<10} elephant finishes {e['finish_s']:8.1f} s, small agents' mean JCT "
              f"{sum(mice) / len(mice):7.1f} s{extra}")


def _print_trojans(doc: dict) -> None:
    from justitia.lab.presets import TROJAN_PREFIX

    print("honest agents and trojans (first stage 1/20 of their cost) per run, mean JCT:")
    for label, entry in doc["policies"].items():
        groups = {True: [], False: []}
        for a in entry["agents"]:
            groups[a["agent_id"].startswith(TROJAN_PREFIX)].append(a["jct_s"])
        print(f"  {label:<26} honest {sum(groups[False]) / len(groups[False]):7.1f} s   "
              f"trojans {sum(groups[True]) / len(groups[True]):7.1f} s")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``justitia`` console script."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "serve":
        args.vllm_args = extra  # vLLM's own server options, passed through
    try:
        if args.command == "workload":
            return _cmd_generate(args)
        if args.command == "calibrate":
            return _cmd_calibrate(args)
        if args.command == "predictor":
            return _cmd_predictor(args)
        if args.command == "profile":
            return _cmd_profile(args)
        if args.command == "serve":
            return _cmd_serve(args)
        return _cmd_bench(args)
    except (WorkloadError, ValueError) as exc:
        print(f"justitia: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
