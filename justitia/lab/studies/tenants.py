"""What each tenant got in a run: its service, its share while backlogged, its JCT, and both levels
of the hierarchical delay bound (docs/design.md, "Tenants: hierarchical GPS").

- **Service** is the KV token-time of the tenant's requests, counted when each finishes
  (``RunResult.served``; the simulator records it).
- **Share while backlogged.** The run is cut into windows; in each, the tenants with an agent
  arrived and not finished throughout the window are backlogged, and each is owed its weight's
  part of what those tenants were served in it. A tenant's ratio is what it got over what it was
  owed, summed over the windows in which it was backlogged (1.0: exactly its weighted share).
- **Agent level:** an agent finishes no later than its hierarchical GPS finish plus the bound.
- **Tenant level:** a tenant's work is done no later than hierarchical GPS does it plus the bound:
  for every amount of its agents' work H-GPS has finished by ``t``, the engine has finished as much
  of the tenant's agents' work by ``t + bound``. Its lag is the largest such delay.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np

from justitia.agent import RunResult
from justitia.core import KV
from justitia.workload import Agent

SERVICE_POINTS = 200  # points of each tenant's cumulative service kept in results.json (for the plot)


def tenant_of(agents: list[Agent]) -> dict[str, str]:
    """Each agent's tenant (an agent without one is its own, under its id)."""
    return {a.agent_id: a.tenant if a.tenant is not None else a.agent_id for a in agents}


def tenant_weights(agents: list[Agent]) -> dict[str, float]:
    """Each tenant's weight: its newest agent's (as the clock takes it)."""
    out: dict[str, float] = {}
    for a in sorted(agents, key=lambda a: a.arrival_s):
        if a.tenant is not None:
            out[a.tenant] = a.weight
    return out


def backlog_shares(agents: list[Agent], run: RunResult, windows: int = 40) -> dict[str, float]:
    """Each tenant's service over its weighted share while backlogged (the module's docstring), in
    ``windows`` equal windows from the first arrival to the last agent's finish."""
    tenant = tenant_of(agents)
    weights = tenant_weights(agents)
    finish = {a.agent_id: a.finish_s for a in run.agents}
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a in agents:
        if a.tenant is not None:
            spans[a.tenant].append((a.arrival_s, finish[a.agent_id]))
    start, end = min(a.arrival_s for a in agents), max(finish.values())
    edges = np.linspace(start, end, windows + 1)
    served = np.zeros((len(weights), windows))
    index = {t: i for i, t in enumerate(weights)}
    for t_s, agent_id, kv in run.served or []:
        k = index.get(tenant[agent_id])
        if k is not None:
            served[k, min(int(np.searchsorted(edges, t_s, side="right")) - 1, windows - 1)] += kv
    backlogged = np.zeros((len(weights), windows), dtype=bool)
    for t, i in index.items():
        # backlogged throughout a window: some agent covers every moment of it (union of its spans)
        merged: list[list[float]] = []
        for a, f in sorted(spans[t]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], f)
            else:
                merged.append([a, f])
        for w in range(windows):
            backlogged[i, w] = any(a <= edges[w] and f >= edges[w + 1] for a, f in merged)
    w_arr = np.array([weights[t] for t in weights])
    got = {t: 0.0 for t in weights}
    owed = {t: 0.0 for t in weights}
    for w in range(windows):
        on = backlogged[:, w]
        if on.sum() < 1:
            continue
        total = served[on, w].sum()
        for t, i in index.items():
            if on[i]:
                got[t] += served[i, w]
                owed[t] += total * w_arr[i] / w_arr[on].sum()
    return {t: got[t] / owed[t] if owed[t] > 0 else float("nan") for t in weights}


def tenant_lags(agents: list[Agent], run: RunResult, gps_finish_s: dict[str, float]) -> dict[str, float]:
    """Each tenant's largest delay, in seconds, of the engine finishing an amount of its agents' work
    after hierarchical GPS finished as much (the tenant level of the bound)."""
    cost = {a.agent_id: a.cost(KV) for a in agents}
    finish = {a.agent_id: a.finish_s for a in run.agents}
    by_tenant: dict[str, list[str]] = defaultdict(list)
    for a in agents:
        if a.tenant is not None:
            by_tenant[a.tenant].append(a.agent_id)
    lags = {}
    for t, ids in by_tenant.items():
        engine = sorted((finish[i], cost[i]) for i in ids)
        done_at = [f for f, _ in engine]
        done = np.cumsum([c for _, c in engine])
        lag, gps_done = -float("inf"), 0.0
        for g, c in sorted((gps_finish_s[i], cost[i]) for i in ids):
            gps_done += c
            k = bisect.bisect_left(done, gps_done * (1 - 1e-12))  # the engine's first moment with as much done
            lag = max(lag, done_at[min(k, len(done_at) - 1)] - g)
        lags[t] = lag
    return lags


def service_curves(agents: list[Agent], run: RunResult, points: int = SERVICE_POINTS) -> dict:
    """Each tenant's cumulative service at ``points`` moments over the run (for the plot)."""
    tenant = tenant_of(agents)
    weights = tenant_weights(agents)
    end = run.makespan_s
    times = np.linspace(0.0, end, points)
    curves = {}
    for t in weights:
        events = sorted((s, kv) for s, a, kv in run.served or [] if tenant[a] == t)
        at = np.array([s for s, _ in events])
        cum = np.cumsum([kv for _, kv in events]) if events else np.array([])
        idx = np.searchsorted(at, times, side="right")
        curves[t] = [float(cum[i - 1]) if i > 0 else 0.0 for i in idx]
    return {"t_s": [float(x) for x in times], "service_token_iters": curves}


def tenant_report(
    agents: list[Agent], run: RunResult, gps_finish_s: dict[str, float] | None, bound_s: float | None
) -> dict:
    """The run's ``tenants`` section: per tenant, its weight, agents, mean JCT, service and share of
    it, its share while backlogged, and (given the H-GPS reference and the bound) its agents past the
    bound and its lag; and the service curves."""
    tenant = tenant_of(agents)
    weights = tenant_weights(agents)
    jcts: dict[str, list[float]] = defaultdict(list)
    for r in run.agents:
        jcts[tenant[r.agent_id]].append(r.jct_s)
    served: dict[str, float] = defaultdict(float)
    for _, a, kv in run.served or []:
        served[tenant[a]] += kv
    total = sum(served[t] for t in weights) or 1.0
    shares = backlog_shares(agents, run)
    lags = tenant_lags(agents, run, gps_finish_s) if gps_finish_s is not None else {}
    out = {}
    for t in weights:
        entry = {
            "weight": weights[t],
            "agents": len(jcts[t]),
            "mean_jct_s": float(np.mean(jcts[t])),
            "service_token_iters": served[t],
            "service_share": served[t] / total,
            "backlogged_share_ratio": shares[t],
        }
        if gps_finish_s is not None and bound_s is not None:
            late = [
                r for r in run.agents if tenant[r.agent_id] == t and r.finish_s - gps_finish_s[r.agent_id] > bound_s
            ]
            entry |= {
                "agent_bound_violations": len(late),
                "tenant_lag_s": lags[t],
                "tenant_bound_violation": bool(lags[t] > bound_s),
            }
        out[t] = entry
    return {"per_tenant": out, "service_curves": service_curves(agents, run)}
