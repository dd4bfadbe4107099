"""What several commands share: the workload options (``workload generate``, ``bench``, ``calibrate``)
and the engine options (``bench``, ``calibrate``), and what they build from them."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_workload_args(p: argparse.ArgumentParser, agents: int = 300, density: float = 1.0) -> None:
    p.add_argument("--agents", type=int, default=agents, help=f"number of agents (default {agents})")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace to take arrival times from")
    p.add_argument(
        "--density",
        type=float,
        default=density,
        help=f"arrival density: 2 packs arrivals twice as tight (default {density:.3g})",
    )
    p.add_argument("--rate", type=float, help="synthetic arrivals per second before density (no --trace)")
    p.add_argument(
        "--cv", type=float, default=1.0, help="synthetic inter-arrival coefficient of variation (1 = Poisson)"
    )
    p.add_argument("--tenant", help="put every agent in this tenant (default: the workload's own tenants, or none)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    from justitia.engine.launch import EngineSpec

    d = EngineSpec()
    p.add_argument("--model", help=f"vllm: tiny, tiny-long, smollm2 or a model directory (default {d.model})")
    p.add_argument(
        "--kv-blocks", type=int, help=f"KV cache size in blocks (sim default: the profile's; vllm {d.kv_blocks})"
    )
    p.add_argument(
        "--max-num-batched-tokens", type=int, help=f"token budget per step (default {d.max_num_batched_tokens})"
    )
    p.add_argument("--max-num-seqs", type=int, help=f"cap on running requests (sim default 256; vllm {d.max_num_seqs})")
    p.add_argument("--max-model-len", type=int, help=f"vllm: longest prompt + output (default {d.max_model_len})")


def engine_spec(args, preset_options: dict | None = None):
    """The vLLM engine to start: command-line flags, then the preset's settings, then EngineSpec's defaults."""
    from justitia.engine.launch import EngineSpec

    options = dict(preset_options or {})
    for name in ("model", "kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if getattr(args, "prefix_caching", False):  # --prefix-caching: vLLM's default, on
        options["prefix_caching"] = None
    return EngineSpec(**options)


def workload_from_args(args) -> tuple[list, dict]:
    from justitia.workload import DEFAULT_RATE_PER_S, build_workload

    if args.trace is not None and args.rate is not None:
        raise ValueError("--rate applies to synthetic arrivals; it cannot be combined with --trace.")
    return in_tenant(
        args,
        *build_workload(
            args.agents,
            args.seed,
            args.trace,
            args.density,
            DEFAULT_RATE_PER_S if args.rate is None else args.rate,
            args.cv,
        ),
    )


def in_tenant(args, agents: list, info: dict) -> tuple[list, dict]:
    """``--tenant``: every agent in that tenant."""
    if args.tenant is None:
        return agents, info
    if not 1 <= len(args.tenant) <= 128:
        raise ValueError(f"--tenant must be 1-128 characters, got {len(args.tenant)}.")
    from dataclasses import replace

    return [replace(a, tenant=args.tenant) for a in agents], info | {"tenant": args.tenant}
