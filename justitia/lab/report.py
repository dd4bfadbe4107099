"""The table ``justitia bench`` prints, in the shape of the paper's main table."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from justitia.core import LAG_FACTOR


def results_table(doc: dict, title: str = "") -> Table:
    """Mean/p50/p90/p99 JCT, improvement against VTC and finish-time fairness per run."""
    table = Table(title=title or None)
    for col in (
        "run",
        "mean JCT s",
        "p50 s",
        "p90 s",
        "p99 s",
        "makespan s",
        "vs VTC",
        "not delayed",
        "mean delay (delayed)",
        "delay p90",
        "delay p99",
        "max delay",
    ):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=col == "run")
    for label, e in doc["policies"].items():
        fair = doc["fairness"].get(f"{label}_vs_vtc")
        imp = e.get("improvement_vs_vtc")
        table.add_row(
            label,
            f"{e['mean_jct_s']:.1f}",
            f"{e['p50_jct_s']:.1f}",
            f"{e['p90_jct_s']:.1f}",
            f"{e['p99_jct_s']:.1f}",
            f"{e['makespan_s']:.1f}",
            "-" if imp is None or label == "vtc" else f"{imp:+.1%}",
            f"{fair['not_delayed_frac']:.1%}" if fair else "-",
            f"{fair['mean_delay_of_delayed']:.1%}" if fair else "-",
            f"{fair['delay_p90']:+.1%}" if fair else "-",
            f"{fair['delay_p99']:+.1%}" if fair else "-",
            f"{fair['max_delay']:.1%}" if fair else "-",
        )
    return table


def engine_table(doc: dict) -> Table:
    """vLLM runs: the simulator's mean JCT on the same workload against the engine's."""
    cal = doc.get("calibration")
    title = f"simulator ({doc['profile']['name']}) against the engine ({doc['bench_wall_s']:.0f} s for the whole bench)"
    if cal:
        title += f"; profile fitted to {cal['steps']} steps, R^2 {cal['r2']:.2f}"
    table = Table(title=title)
    probed = any("speed_scale_per_repeat" in e for e in doc["policies"].values())
    cols = ["run", "mode", "engine mean JCT s", "per repeat", "sim mean JCT s", "sim error"]
    if probed:  # each probe's speed (from its steps, or its mean JCT); the simulator at the probes' mean JCT
        # speeds, at the calibration's profile alone, and at the run's own speed
        cols += ["probe speed", "by probe JCT", "one profile", "at run speed"]
    for col in (*cols, "requests waited", "preemptions", "run wall s"):
        table.add_column(col, justify="left" if col in ("run", "mode") else "right", no_wrap=True)
    for label, e in doc["policies"].items():
        repeats = " / ".join(f"{x:.2f}" for x in e.get("mean_jct_s_per_repeat", []))
        waited = f"{e['backlogged_share']:.0%}" if "backlogged_share" in e else "-"
        cells = [
            label,
            e["mode"],
            f"{e['mean_jct_s']:.2f}",
            repeats,
            f"{e['sim_mean_jct_s']:.2f}",
            f"{e['sim_error']:+.1%}",
        ]
        if probed:
            speeds = " / ".join(f"{x:.2f}" for x in e.get("speed_scale_per_repeat", []))
            cells += [
                f"{speeds} ({e['speed_probe']})" if speeds else "-",
                f"{e['sim_error_probe_jct']:+.1%}" if "sim_error_probe_jct" in e else "-",
                f"{e['sim_error_one_profile']:+.1%}",
                f"{e['sim_error_at_run_speed']:+.1%}" if "sim_error_at_run_speed" in e else "-",
            ]
        table.add_row(*cells, waited, str(e["preemptions"]) if e["mode"] == "plugin" else "-", f"{e['run_wall_s']:.1f}")
    return table


def comparison_table(doc: dict) -> Table:
    """Ratios of mean JCTs with their 95 % intervals (paired bootstrap over agents and repeats)."""
    table = Table(title="mean JCT ratios, 95 % interval by a paired bootstrap over agents and repeats")
    for col in ("comparison", "ratio", "95 % interval", "repeats", "separated"):
        table.add_column(col, justify="left" if col == "comparison" else "right", no_wrap=True)
    for name, c in doc["comparisons"].items():
        lo, hi = c["ci95"]
        table.add_row(
            name.replace("_vs_", " / "),
            f"{c['ratio']:.3f}",
            f"{lo:.3f} - {hi:.3f}",
            str(c["repeats"]),
            "below 1" if hi < 1 else "above 1" if lo > 1 else "no",
        )
    return table


def cluster_table(doc: dict) -> Table:
    """A cluster's runs: router, where justitia's clock is kept, mean JCT, the delay bound against the
    cluster's GPS (one server of the engines' total M), and how evenly requests were spread."""
    table = Table(title=f"{doc['replicas']} engines: routers, clocks and the delay bound (GPS at the engines' total M)")
    for col in (
        "run",
        "router",
        "clock",
        "mean JCT s",
        "vs VTC",
        "bound s",
        "max finish - GPS s",
        "over bound",
        "requests per engine",
    ):
        table.add_column(col, justify="left" if col in ("run", "router", "clock") else "right", no_wrap=True)
    for label, e in doc["policies"].items():
        imp = e.get("improvement_vs_vtc")
        per = e["requests_per_replica"]
        has_bound = "delay_bound_s" in e
        table.add_row(
            label,
            e["router"],
            e["cluster_clock"],
            f"{e['mean_jct_s']:.1f}",
            "-" if imp is None or label == "vtc" else f"{imp:+.1%}",
            f"{e['delay_bound_s']:.1f}" if has_bound else "-",
            f"{e['max_delay_vs_gps_s']:.1f}" if has_bound else "-",
            f"{e['bound_violations']} of {len(e['agents'])}" if has_bound else "-",
            f"{min(per):,}-{max(per):,}",
        )
    return table


TENANT_ROWS = 12  # tenants shown per run (the results file has them all)


def tenant_table(doc: dict) -> Table:
    """Per run and tenant: weight, agents, mean JCT, share of the service, the service over its
    weighted share while backlogged, its agents past the hierarchical bound and its lag."""
    ref = doc.get("tenant_reference", {})
    table = Table(
        title=f"tenants (against hierarchical GPS at {ref.get('capacity_from', '?')}'s M; "
        f"bound {ref.get('delay_bound_s', float('nan')):.1f} s)"
    )
    for col in (
        "run",
        "tenant",
        "weight",
        "agents",
        "mean JCT s",
        "service share",
        "got / owed (backlogged)",
        "agents past bound",
        "tenant lag s",
    ):
        table.add_column(col, justify="left" if col in ("run", "tenant") else "right", no_wrap=True)
    for label, e in doc["policies"].items():
        rows = sorted(e.get("tenants", {}).get("per_tenant", {}).items())
        for i, (t, x) in enumerate(rows[:TENANT_ROWS]):
            table.add_row(
                label if i == 0 else "",
                t,
                f"{x['weight']:g}",
                str(x["agents"]),
                f"{x['mean_jct_s']:.1f}",
                f"{x['service_share']:.3f}",
                f"{x['backlogged_share_ratio']:.2f}",
                str(x.get("agent_bound_violations", "-")),
                f"{x.get('tenant_lag_s', float('nan')):.1f}",
            )
        if len(rows) > TENANT_ROWS:
            table.add_row("", f"... {len(rows) - TENANT_ROWS} more", *[""] * 7)
    return table


def print_results(doc: dict, title: str = "", console: Console | None = None) -> None:
    """Print the table, and the delay-bound check when Justitia ran."""
    if console is None:
        console = Console(emoji=False)  # a label such as "justitia@noisy:100" is text, not an emoji code
        if not console.is_terminal:
            console = Console(width=150, emoji=False)  # files and pipes get the whole table unwrapped
    console.print(results_table(doc, title))
    if doc.get("engine") == "vllm":
        console.print(engine_table(doc))
        if doc.get("comparisons"):
            console.print(comparison_table(doc))
    if doc.get("replicas", 1) > 1:
        console.print(cluster_table(doc))
    if any("tenants" in e for e in doc["policies"].values()):
        console.print(tenant_table(doc))
    j = doc["policies"].get("justitia")
    if j and "delay_bound_s" in j:
        console.print(
            f"Justitia delay bound 2c_max + C_max/M (GPS at the M the engine delivered) = {j['delay_bound_s']:.1f} s; "
            f"largest finish - GPS finish = {j['max_delay_vs_gps_s']:.1f} s; "
            f"agents over the bound: {j['bound_violations']} of {len(j['agents'])}."
        )
    for label, e in doc["policies"].items():  # the lag guard's rows: judged by the bound B it keeps
        if e.get("guard_lag_s") is not None and "delay_bound_s" in e:
            console.print(
                f"{label}: bound B = 2c_max + max(L, {LAG_FACTOR:g} C_max/M) = {e['delay_bound_s']:.1f} s (L up to "
                f"{e['guard_lag_s']:.1f} s); largest finish - GPS finish = {e['max_delay_vs_gps_s']:.1f} s; "
                f"past B: {e['bound_violations']} of {len(e['agents'])}."
            )


def write_doc(path, doc: dict) -> None:
    """Write a benchmark's JSON document to ``path`` (its folder made if need be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
