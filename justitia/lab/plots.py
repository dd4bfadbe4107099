"""PNG plots of a results document: the JCT CDF per run, Justitia against VTC per agent, the turn
time CDF per run (sessions), and each tenant's cumulative service over time (when agents name
tenants)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def plot_results(doc: dict, out_dir: Path) -> list[Path]:
    """Draw every plot the results allow into ``out_dir``; return the files written (none, and a
    note on stderr, without matplotlib: the ``plots`` extra)."""
    try:
        import matplotlib
    except ImportError:
        print("plots: skipped (matplotlib is not installed: pip install 'justitia[plots]')", file=sys.stderr)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pol = doc["policies"]
    written = [
        plot_cdf(
            {label: [a["jct_s"] for a in e["agents"]] for label, e in pol.items()},
            "agent JCT (s, log scale)",
            "fraction of agents",
            "JCT CDF per policy",
            out_dir / "jct_cdf.png",
            plt,
        )
    ]
    if "justitia" in pol and "vtc" in pol:
        vtc = {a["agent_id"]: a["jct_s"] for a in pol["vtc"]["agents"]}
        just = {a["agent_id"]: a["jct_s"] for a in pol["justitia"]["agents"]}
        ids = sorted(vtc)
        x = np.array([vtc[i] for i in ids])
        y = np.array([just[i] for i in ids])
        fig, ax = plt.subplots(figsize=(5.2, 5.0))
        later = y > x * (1 + 1e-6)
        ax.scatter(x[~later], y[~later], s=10, label="not delayed", color="tab:blue")
        ax.scatter(x[later], y[later], s=12, label="delayed vs VTC", color="tab:red")
        lo, hi = min(x.min(), y.min()), max(x.max(), y.max())
        ax.plot([lo, hi], [lo, hi], color="gray", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("JCT under VTC (s)")
        ax.set_ylabel("JCT under Justitia (s)")
        ax.set_title("Per-agent JCT: Justitia vs VTC")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out_dir / "justitia_vs_vtc.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if any("mean_turn_s" in e for e in pol.values()):  # sessions: the turn-time CDF per run
        written.append(
            plot_cdf(
                {label: [t for a in e["agents"] for t in a.get("turns_s") or ()] for label, e in pol.items()},
                "turn time, first request to last answer (s, log scale)",
                "fraction of turns",
                "Turn time CDF per run",
                out_dir / "turn_cdf.png",
                plt,
            )
        )
    tenanted = [(label, e["tenants"]) for label, e in pol.items() if "tenants" in e]
    if tenanted and len(tenanted[0][1]["per_tenant"]) <= 12:
        written.append(plot_tenant_service(tenanted, out_dir / "tenant_service.png", plt))
    return written


def plot_cdf(values: dict[str, list[float]], xlabel: str, ylabel: str, title: str, path: Path, plt) -> Path:
    """One CDF per run (log x axis) of ``values`` by run label, into ``path``."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, xs in values.items():
        xs = np.sort(xs)
        if len(xs):
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_tenant_service(runs: list[tuple[str, dict]], path: Path, plt) -> Path:
    """One panel per run: each tenant's cumulative service (KV token-time of its finished requests)."""
    cols = min(3, len(runs))
    rows = (len(runs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax, (label, tenants) in zip(axes.flat, runs):
        curves = tenants["service_curves"]
        for t, ys in sorted(curves["service_token_iters"].items()):
            w = tenants["per_tenant"][t]["weight"]
            ax.plot(curves["t_s"], ys, label=f"{t} (w={w:g})")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("service (KV token-time)")
    for ax in list(axes.flat)[len(runs) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("each tenant's cumulative service", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
