"""PNG plots of a results document: the JCT CDF per run, and Justitia against VTC per agent."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_results(doc: dict, out_dir: Path) -> list[Path]:
    """Draw every plot the results allow into ``out_dir``; return the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, entry in doc["policies"].items():
        jcts = np.sort([a["jct_s"] for a in entry["agents"]])
        ax.step(jcts, np.arange(1, len(jcts) + 1) / len(jcts), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("agent JCT (s, log scale)")
    ax.set_ylabel("fraction of agents")
    ax.set_title("JCT CDF per policy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out_dir / "jct_cdf.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    pol = doc["policies"]
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
    return written
