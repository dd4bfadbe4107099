"""``justitia bench``: run policies over one workload and report JCTs, fairness and the delay bound.

A run is one (policy, predictor, cost model) triple under a label; the default label is the
policy name. Every run of a bench sees the same workload and engine, so results pair by agent id.
With ``replicas`` > 1 the engine is a cluster of that many (``sim.Cluster``): each run names its
router and, for justitia, where its clock is kept; the GPS reference and the delay bound then use
the cluster's total M (N engines as one GPS server of N x M).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from justitia.agent import BURSTS, PRICINGS, SUBAGENTS, AgentResult, RunResult
from justitia.core import KV, ROUTER_NAMES, Policy, cost_model, has_clock, make_policy
from justitia.lab.metrics import delay_bound_s, fairness, gps_finish_times, jct_stats, turn_prediction, turn_stats
from justitia.lab.progress import progress_bar
from justitia.lab.studies.tenants import tenant_report
from justitia.predictors import make_predictor
from justitia.predictors.base import OraclePredictor
from justitia.sim import CLOCKS, Cluster, EngineConfig, Simulator
from justitia.sim.config import KV_EVICTIONS
from justitia.workload import Agent

RESULTS_SCHEMA = "justitia.results/1"
SIM_DEFAULT_PROFILE = "llama7b-a100-40gb"


@dataclass(frozen=True)
class RunSpec:
    """One line of a bench: a policy with its predictor and cost model, under a label."""

    label: str
    policy: str
    predictor: str = "oracle"
    cost: str = "kv"
    capacity: str = "measured"  # the clock's M: measured from what the engine delivers, or the formula's
    retag: bool = True  # an agent that reveals more work than predicted moves back (AgentScheduler)
    pricing: str = "first-stage"  # or all-stages: an agent submitted whole (AgentProcess)
    router: str | None = None  # a cluster's router (None: least-load); ignored on one engine
    cluster_clock: str | None = None  # a cluster's justitia clock: global (None) or replica
    per_agent: bool = False  # the agents' tenants left out: every agent is a root entry of its own
    burst: str = "turn"  # what a session is priced and tagged by: a user turn, or the calls between two pauses
    subagents: str = "share"  # a session's subagents share its flow, or are flows of their own
    kv_eviction: str | None = None  # the prefix cache's eviction rule for this run (None: the engine config's)
    guard_scale: float = 0.0  # justitia's lag guard starts from this largest burst seen before (0: cold)
    hold: bool = True  # an agent keeps its place across a hand-off (AgentScheduler.advance); False: a
    # run without it, to measure what it buys
    history: tuple = field(default=(), compare=False, repr=False)  # agents an online predictor learns before
    # the run (a deployment's kept state; lab.studies.tau2.warm_predictor)

    def __post_init__(self) -> None:
        if self.capacity not in CAPACITIES:
            raise ValueError(f"--capacity must be one of {', '.join(CAPACITIES)}, got '{self.capacity}'.")
        if self.pricing not in PRICINGS:
            raise ValueError(f"--pricing must be one of {', '.join(PRICINGS)}, got '{self.pricing}'.")
        if self.burst not in BURSTS:
            raise ValueError(f"--burst must be one of {', '.join(BURSTS)}, got '{self.burst}'.")
        if self.subagents not in SUBAGENTS:
            raise ValueError(f"--subagents must be one of {', '.join(SUBAGENTS)}, got '{self.subagents}'.")
        if self.router is not None and self.router not in ROUTER_NAMES:
            raise ValueError(f"--router must be one of {', '.join(ROUTER_NAMES)}, got '{self.router}'.")
        if self.cluster_clock is not None and self.cluster_clock not in CLOCKS:
            raise ValueError(f"--cluster-clock must be one of {', '.join(CLOCKS)}, got '{self.cluster_clock}'.")
        if self.kv_eviction is not None and self.kv_eviction not in KV_EVICTIONS:
            raise ValueError(f"kv_eviction must be one of {', '.join(KV_EVICTIONS)}, got '{self.kv_eviction}'.")

    def to_json(self) -> dict:
        """The run's settings as a results-file document."""
        doc = {
            "policy": self.policy,
            "predictor": self.predictor,
            "cost": self.cost,
            "capacity": self.capacity,
            "retag": self.retag,
            "pricing": self.pricing,
        }
        if self.burst != "turn":
            doc["burst"] = self.burst
        if self.subagents != "share":
            doc["subagents"] = self.subagents
        if self.kv_eviction is not None:
            doc["kv_eviction"] = self.kv_eviction
        if self.guard_scale:
            doc["guard_scale"] = self.guard_scale
        if not self.hold:
            doc["hold"] = False
        if self.history:
            doc["warm_from_agents"] = len(self.history)
        return doc | {"per_agent": True} if self.per_agent else doc

    def workload(self, agents: list[Agent]) -> list[Agent]:
        """The agents as this run sees them (without their tenants, under ``per_agent``)."""
        return [replace(a, tenant=None) for a in agents] if self.per_agent else agents


CAPACITIES = ("measured", "formula")


def simulate(
    agents: list[Agent],
    spec: RunSpec,
    config: EngineConfig,
    seed: int = 0,
    event_skipping: bool = True,
    on_agent_finish: Callable[[AgentResult], None] | None = None,
    replicas: int = 1,
    policy: Policy | None = None,
) -> RunResult:
    """Run one spec over ``agents`` on the simulator (a cluster of ``replicas`` engines if > 1).
    ``policy``: a policy built by the caller, run in place of the spec's (one engine; a study's
    what-if, such as ``lab.studies.guard_watch``)."""
    predictor = make_predictor(spec.predictor, seed)
    if spec.history:  # started warm: what a disjoint history taught it
        warm_predictor(predictor, list(spec.history))
    agents = spec.workload(agents)
    if spec.kv_eviction is not None:
        config = replace(config, kv_eviction=spec.kv_eviction)
    if replicas > 1:
        return Cluster(
            config,
            spec.policy,
            predictor,
            spec.cost,
            replicas,
            spec.router or "least-load",
            spec.cluster_clock or "global",
            event_skipping,
            on_agent_finish,
            measure_capacity=spec.capacity == "measured",
            retag=spec.retag,
            pricing=spec.pricing,
        ).run(agents)
    policy = spec.policy if policy is None else policy
    if spec.guard_scale and policy == "justitia-guarded":  # the guard warm from an earlier history's largest burst
        cost = cost_model(spec.cost)
        policy = make_policy(policy, config.capacity_per_s(cost), cost, spec.guard_scale)
    sim = Simulator(
        config,
        policy,
        predictor,
        spec.cost,
        event_skipping,
        on_agent_finish,
        measure_capacity=spec.capacity == "measured",
        retag=spec.retag,
        pricing=spec.pricing,
        burst=spec.burst,
        subagents=spec.subagents,
        hold=spec.hold,
    )
    return sim.run(agents)


def warm_predictor(predictor, history: list[Agent]) -> None:
    """Teach ``predictor`` (``online``) what ``history`` cost, in arrival order: each agent's total,
    each session's turns with what its earlier turns cost, as a deployment's saved state holds."""
    truth = OraclePredictor()  # what each finished turn cost
    for a in sorted(history, key=lambda a: a.arrival_s):
        if not a.is_session:
            predictor.learn(a, a.cost(KV))
            continue
        costs: list[float] = []
        for turn in range(a.turn_count):
            cost = truth.turn_cost(a, turn, costs, KV)
            predictor.learn(a, cost, turn, list(costs))
            costs.append(cost)


def summarize(
    agents: list[Agent],
    specs: list[RunSpec],
    runs: dict[str, RunResult],
    config: EngineConfig,
    workload_info: dict,
    engine: str = "sim",
    replicas: int = 1,
) -> dict:
    """Build the results document from finished runs. One yardstick for every run with a clock, and
    for the tenants' report: GPS at the capacity the engine delivered, one M for the whole run (the
    time-weighted mean of the M the first justitia run that measured it ran at, from its first
    measurement on; a cluster's: its engines' together), the bound at that M; the formula's M when
    no run measured it (``gps_reference`` says which). A run whose clock ran at another M (the
    formula's) is judged against the same GPS, not against its own clock."""
    formula_m = replicas * config.capacity_per_s("kv")  # the whole engine's, or cluster's
    doc: dict = {
        "schema": RESULTS_SCHEMA,
        "engine": engine,
        "config": config.to_json() | {"capacity_token_iters_per_s": config.capacity_per_s("kv")},
        "workload": workload_info,
        **({"replicas": replicas} if replicas > 1 else {}),
        "policies": {},
        "fairness": {},
    }
    jcts = {label: {a.agent_id: a.jct_s for a in run.agents} for label, run in runs.items()}
    measured = next(
        (
            s.label
            for s in specs
            if has_clock(s.policy) and runs[s.label].capacity_schedule and len(runs[s.label].capacity_schedule) > 1
        ),
        None,
    )
    delivered = (
        delivered_capacity(runs[measured].capacity_schedule, runs[measured].makespan_s) if measured else formula_m
    )
    gps_schedule = [(0.0, delivered)]
    doc["gps_reference"] = {
        "capacity_from": measured or "formula",
        "capacity_per_s": delivered,
        "formula_capacity_per_s": formula_m,
        "delay_bound_s": None,
    }
    tenanted = any(a.tenant is not None for a in agents)
    if tenanted:  # every run's tenants are judged against hierarchical GPS at the same delivered M
        ref_gps = gps_finish_times(agents, formula_m, gps_schedule)
        ref_bound = delay_bound_s(agents, config, min(m for _, m in gps_schedule))
        doc["tenant_reference"] = {"capacity_from": measured or "formula", "delay_bound_s": ref_bound}
    for spec in specs:
        run = runs[spec.label]
        entry = spec.to_json() | jct_stats([a.jct_s for a in run.agents])
        entry |= {
            "makespan_s": run.makespan_s,
            "iterations": run.iterations,
            "steps": run.steps,
            "preemptions": run.preemptions,
            "wall_s": run.wall_s,
        }
        if replicas > 1:
            entry |= {
                "router": run.router,
                "cluster_clock": run.clock,
                "requests_per_replica": run.requests_per_replica,
            }
        agent_docs = [a.to_json() for a in run.agents]
        bursts = {a.agent_id: a.bursts for a in run.agents if a.bursts}  # sessions: the run's own bursts
        if bursts:
            entry |= turn_stats(run.agents)
            entry["turn_prediction"] = turn_prediction(run.agents)
        if run.prefix_cache is not None:
            entry["prefix_cache"] = run.prefix_cache
        if has_clock(spec.policy):  # policies with a clock
            schedule = run.capacity_schedule or [(0.0, formula_m)]
            gps = gps_finish_times(spec.workload(agents), formula_m, gps_schedule, bursts)  # the one yardstick
            m_ref = min(m for _, m in gps_schedule)
            doc["gps_reference"]["delay_bound_s"] = delay_bound_s(agents, config, m_ref, bursts=bursts)
            bound_s = delay_bound_s(
                agents, config, m_ref, bursts=bursts, guard=run.guard_lag_s is not None, guard_lag_s=run.guard_lag_s
            )  # justitia-guarded: B, whatever the prices
            late = 0
            for d in agent_docs:
                d["gps_finish_s"] = gps[d["agent_id"]]
                d["delay_vs_gps_s"] = d["finish_s"] - d["gps_finish_s"]
                late += d["delay_vs_gps_s"] > bound_s
            entry["capacity_schedule"] = [[t, m] for t, m in schedule]
            entry["delay_bound_s"] = bound_s
            if run.guard_lag_s is not None:
                entry["guard_lag_s"] = run.guard_lag_s
            entry["bound_violations"] = late
            entry["max_delay_vs_gps_s"] = max(d["delay_vs_gps_s"] for d in agent_docs)
        if tenanted and run.served is not None:
            entry["tenants"] = tenant_report(agents, run, ref_gps, ref_bound)
        entry["agents"] = agent_docs
        doc["policies"][spec.label] = entry
    if "vtc" in runs:
        vtc_mean = doc["policies"]["vtc"]["mean_jct_s"]
        for label, entry in doc["policies"].items():
            entry["improvement_vs_vtc"] = 1 - entry["mean_jct_s"] / vtc_mean
            if label != "vtc":
                doc["fairness"][f"{label}_vs_vtc"] = fairness(jcts["vtc"], jcts[label])
    return doc


def delivered_capacity(schedule, end_s: float) -> float:
    """The M a measured clock ran at on average: its schedule's M weighted by how long each held,
    from the first measurement (the second entry; the first is the starting guess) to ``end_s``."""
    points = [(float(t), float(m)) for t, m in schedule[1:]]
    if not points:
        return float(schedule[0][1])
    ends = [t for t, _ in points[1:]] + [max(end_s, points[-1][0])]
    span = ends[-1] - points[0][0]
    if span <= 0:
        return points[-1][1]
    return sum((end - t) * m for (t, m), end in zip(points, ends)) / span


def check_labels(specs: list[RunSpec]) -> None:
    """Every run of a bench needs its own label: results are keyed by it."""
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run labels must be unique, got {labels}.")


def run_bench(
    agents: list[Agent],
    specs: list[RunSpec],
    config: EngineConfig,
    workload_info: dict,
    seed: int = 0,
    progress: bool = True,
    replicas: int = 1,
) -> dict:
    """Run every spec on the simulator (a cluster of ``replicas`` engines if > 1) and return the
    results document."""
    check_labels(specs)
    runs: dict[str, RunResult] = {}
    with progress_bar(len(agents) * len(specs), progress, "simulating") as advance:
        for spec in specs:
            runs[spec.label] = simulate(
                agents, spec, config, seed, on_agent_finish=lambda _r, s=spec: advance(s.label), replicas=replicas
            )
    return summarize(agents, specs, runs, config, workload_info, replicas=replicas)


def write_results(doc: dict, out_dir: str | Path, plots: bool = True) -> Path:
    """Write ``results.json`` (and the plots) into ``out_dir``; return the results path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(doc, indent=1))
    if plots:
        from justitia.lab.plots import plot_results

        plot_results(doc, out)
    return path
