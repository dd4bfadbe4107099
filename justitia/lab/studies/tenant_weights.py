"""Two tenants, identical streams of one-request agents, weights 2:1: how the engine's service splits.

    python -m justitia.lab.studies.tenant_weights [--load 0.75]

Each tenant's agents arrive (Poisson) for 60 s at ``--load`` times the engine's formula M; every
agent of tenant A has weight 2, of tenant B weight 1. The service each tenant received between
15 s and 45 s (KV token-time charged to its requests, plain stepping) is printed per policy, with
each tenant's mean JCT: justitia with the agents' ``tenant`` set (hierarchical GPS: the tenants
share the engine by weight, each tenant's agents share its part), the rule before it (a tenant's
agents chained in arrival order), justitia with weights per agent only (no tenant: each agent is
owed w / Σw over agents, so a tenant with more agents in flight gets more), and VTC with a counter
per tenant and per agent. See docs/design.md, "Tenants".
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from justitia.core import COMPUTE, KV, POLICIES
from justitia.predictors import make_predictor
from justitia.sim import EngineConfig, LatencyProfile, Simulator
from justitia.workload import Agent, Task

# a small engine whose every iteration takes 10 ms
ENGINE = EngineConfig(
    profile=LatencyProfile("const-10ms", 10.0, 0.0, 0.0, 0.0, 1.0, 64, "every iteration 10 ms"),
    kv_blocks=60,
    max_num_batched_tokens=512,
    max_num_seqs=64,
)


def recording(base):
    """``base`` that adds up the KV token-time (and compute tokens) charged to each tenant and notes
    them at every arrival."""

    class Recording(base):
        reads_service = True  # it reads what is charged: the engine charges it

        def __init__(self, *args):
            super().__init__(*args)
            self.served, self.compute, self.notes = {"A": 0, "B": 0}, {"A": 0, "B": 0}, []

        def charge(self, req, service):
            super().charge(req, service)
            self.served[req.agent_id[0]] += service.kv_token_iters
            self.compute[req.agent_id[0]] += COMPUTE.service(service)  # VTC's own unit, p + 2d

        def agent_arrived(self, info, now_s):
            super().agent_arrived(info, now_s)
            self.notes.append((now_s, dict(self.served), dict(self.compute)))

    return Recording


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=float, default=0.75, help="each tenant's demand over the formula's M")
    args = ap.parse_args()
    cfg = ENGINE
    m = cfg.capacity_per_s(KV)
    rate = args.load * m / KV.request_cost(100, 60)
    rng = np.random.default_rng(0)
    agents = []
    for tenant, weight in (("A", 2.0), ("B", 1.0)):
        times = np.cumsum(rng.exponential(1 / rate, size=int(rate * 80)))
        agents += [
            Agent(
                f"{tenant}{i:05d}",
                tenant,
                round(float(t), 4),
                ((Task(f"{tenant}{i:05d} task", 100, 60),),),
                weight=weight,
                tenant=tenant,
            )
            for i, t in enumerate(times[times < 60])
        ]
    agents.sort(key=lambda a: a.arrival_s)
    untenanted = [replace(a, tenant=None) for a in agents]
    Justitia, VTC = POLICIES["justitia"].cls, POLICIES["vtc"].cls
    for name, policy, workload in (
        ("justitia (tenants)", recording(Justitia)(m), agents),
        ("justitia (chained)", recording(Justitia)(m, True), agents),
        ("justitia (per agent)", recording(Justitia)(m), untenanted),
        ("vtc (per tenant)", recording(VTC)(), agents),
        ("vtc (per agent)", recording(VTC)(), untenanted),
    ):
        res = Simulator(cfg, policy, make_predictor("oracle"), event_skipping=False).run(workload)
        at = {t: next(n for n in policy.notes if n[0] >= t) for t in (15, 45)}
        share, compute = ((at[45][i]["A"] - at[15][i]["A"]) / (at[45][i]["B"] - at[15][i]["B"]) for i in (1, 2))
        jct = {t: np.mean([a.jct_s for a in res.agents if a.agent_id[0] == t]) for t in "AB"}
        print(
            f"{name:21s} service A:B in 15-45 s = {share:.2f} (compute tokens {compute:.2f}); "
            f"mean JCT A {jct['A']:.1f} s, B {jct['B']:.1f} s"
        )


if __name__ == "__main__":
    main()
