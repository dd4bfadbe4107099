"""A cluster in the simulator: N engines behind one router (core.routing) and one clock.

Both stepping modes agree on every cluster; one engine is the single-engine simulator to the bit;
routing places requests as its rule says; one clock in front of the engines keeps every agent
within its GPS finish (one server of the engines' total M) plus the bound; the command line runs a
cluster end to end."""

import json

import numpy as np
import pytest
from helpers import agent, engine, random_agents, task_parallel_agents
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.cli import main
from justitia.core import make_policy
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.predictors import make_predictor
from justitia.sim import Cluster, LatencyProfile, Simulator

LINEAR = LatencyProfile("lin", 1.0, 0.5, 0.01, 0.001, 1.3, 64, "tests: load-dependent latency")
RUNS = [
    ("justitia", "global"),
    ("justitia", "replica"),
    ("fcfs", "replica"),
    ("sjf", "replica"),
    ("vtc", "replica"),
    ("srjf", "replica"),
    ("las", "replica"),
]


def finish(result):
    return {a.agent_id: a.finish_s for a in result.agents}


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    run=st.sampled_from(RUNS),
    replicas=st.integers(2, 4),
    router=st.sampled_from(["least-load", "affinity", "round-robin"]),
    blocks=st.integers(40, 120),
    budget=st.sampled_from([64, 256, 1024]),
    seqs=st.sampled_from([4, 16, 256]),
    measure=st.booleans(),
)
def test_event_skipping_matches_per_iteration_stepping_on_a_cluster(
    seed, run, replicas, router, blocks, budget, seqs, measure
):
    # Engines hand each other work (a later stage routed elsewhere): a span of skipped steps must stop
    # wherever another engine could hand it a request, or an agent arrive.
    agents = random_agents(np.random.default_rng(seed), 24, max_prompt=400, max_output=200, mean_gap_s=0.05)
    cfg = engine(blocks=blocks, budget=budget, seqs=seqs, profile=LINEAR)
    policy, clock = run
    fast, slow = (
        Cluster(
            cfg,
            policy,
            make_predictor("noisy:2", 7),
            replicas=replicas,
            router=router,
            clock=clock,
            event_skipping=skip,
            measure_capacity=measure,
        ).run(agents)
        for skip in (True, False)
    )
    assert finish(fast) == finish(slow)  # exactly: latencies are integer picoseconds
    assert (fast.iterations, fast.preemptions, fast.requests_per_replica) == (
        slow.iterations,
        slow.preemptions,
        slow.requests_per_replica,
    )
    assert fast.capacity_schedule == slow.capacity_schedule  # the meters see the same service at every arrival
    assert fast.steps <= slow.steps


@pytest.mark.parametrize(
    "policy,clock",
    [("justitia", "global"), ("justitia", "replica"), ("vtc", "replica"), ("srjf", "replica"), ("fcfs", "replica")],
)
def test_one_engine_is_the_single_engine_simulator_to_the_bit(policy, clock):
    # With one engine the front end's clock sees every agent at the moments the engine's own would,
    # at the M the engine measured: the same tags, the same order, the same finish times. (With
    # retagging, a preempted request of a retagged agent would keep its stamped tag under the front
    # end, and take its new one on the engine: the oracle never retags.)
    agents = random_agents(np.random.default_rng(11), 40, max_prompt=400, max_output=200, mean_gap_s=0.1)
    cfg = engine(blocks=60, budget=256, seqs=64, profile=LINEAR)
    single = Simulator(
        cfg, make_policy(policy, cfg.capacity_per_s("kv")), make_predictor("oracle"), measure_capacity=True
    ).run(agents)
    one = Cluster(cfg, policy, make_predictor("oracle"), replicas=1, clock=clock, measure_capacity=True).run(agents)
    assert finish(one) == finish(single)
    assert (one.iterations, one.preemptions, one.makespan_s) == (
        single.iterations,
        single.preemptions,
        single.makespan_s,
    )
    if policy == "justitia":
        assert len(single.capacity_schedule) > 2  # M moved during the run, and moved the same way
        assert one.capacity_schedule == single.capacity_schedule


def test_round_robin_takes_turns_while_least_load_steers_small_agents_around_a_big_one():
    # A big request nearly fills engine 0's cache; six small agents follow. Round-robin sends every
    # other one behind it, where none fits until it is done; least-load sends them all to engine 1.
    big = agent("big", 0.0, [(900, 100)])
    small = [agent(f"s{i}", 0.001 * (i + 1), [(50, 20)]) for i in range(6)]
    cfg = engine(blocks=64, budget=1024)  # 1,024 tokens
    runs = {
        router: Cluster(cfg, "fcfs", make_predictor("oracle"), replicas=2, router=router).run([big, *small])
        for router in ("round-robin", "least-load")
    }
    assert runs["round-robin"].requests_per_replica == [4, 3]
    assert runs["least-load"].requests_per_replica == [1, 6]
    jct = {router: max(a.jct_s for a in r.agents if a.agent_id != "big") for router, r in runs.items()}
    assert jct["least-load"] < 0.25 < 1.0 < jct["round-robin"]  # 20 steps of 10 ms, against waiting out big's 100


def cluster_late(agents, cfg, replicas, router="least-load", clock="global"):
    res = Cluster(cfg, "justitia", make_predictor("oracle"), replicas=replicas, router=router, clock=clock).run(agents)
    gps = gps_finish_times(agents, replicas * cfg.capacity_per_s("kv"))  # one GPS server of the cluster's M
    bound = delay_bound_s(agents, cfg, replicas=replicas)
    late = {
        a.agent_id: a.finish_s - gps[a.agent_id] - bound for a in res.agents if a.finish_s > gps[a.agent_id] + bound
    }
    return late, bound


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 100_000),
    blocks=st.integers(90, 200),
    n=st.integers(2, 40),
    replicas=st.integers(2, 4),
    router=st.sampled_from(["least-load", "round-robin"]),
)
def test_one_clock_keeps_every_task_parallel_agent_within_the_cluster_bound(seed, blocks, n, replicas, router):
    # test_bound's workloads, N times as many agents on N engines: each engine serves in the one
    # clock's tag order, and no agent finishes past its GPS finish (at N x M) + 2 c_max + C_max / NM.
    agents = task_parallel_agents(np.random.default_rng(seed), n * replicas)
    late, bound = cluster_late(agents, engine(blocks=blocks, budget=512, seqs=256), replicas, router)
    assert not late, f"agents over the {bound:.2f} s bound by: {late}"


def test_a_clock_per_engine_can_break_the_bound_that_one_clock_keeps():
    # Each engine's clock stamps an agent with its whole cost at the engine's M, and ranks it among
    # that engine's agents only: against the cluster's GPS some agents finish past the bound.
    rng = np.random.default_rng(25)
    replicas, blocks, n = int(rng.integers(2, 5)), int(rng.integers(90, 200)), int(rng.integers(2, 40))
    agents = task_parallel_agents(rng, n * replicas // 2 + 2)
    cfg = engine(blocks=blocks, budget=512, seqs=256)
    assert cluster_late(agents, cfg, replicas, clock="replica")[0]
    assert not cluster_late(agents, cfg, replicas, clock="global")[0]


def test_bench_runs_a_cluster_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "--engine",
            "sim",
            "--replicas",
            "3",
            "--router",
            "round-robin",
            "--agents",
            "30",
            "--density",
            "3",
            "--policies",
            "justitia,vtc",
            "--out",
            str(out),
            "--no-plots",
            "--no-progress",
        ]
    )
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["replicas"] == 3
    j, v = doc["policies"]["justitia"], doc["policies"]["vtc"]
    assert (j["router"], j["cluster_clock"], v["cluster_clock"]) == ("round-robin", "global", "replica")
    assert sum(j["requests_per_replica"]) == sum(v["requests_per_replica"]) > 30
    assert max(j["requests_per_replica"]) - min(j["requests_per_replica"]) <= 1  # round-robin: turn by turn
    formula = doc["config"]["capacity_token_iters_per_s"]
    assert j["capacity_schedule"][0] == [0.0, pytest.approx(3 * formula)]  # the three engines' M together
    assert j["delay_bound_s"] > 0 and "gps_finish_s" in j["agents"][0]
    assert "3 engines" in capsys.readouterr().out
    assert main(["bench", "--engine", "vllm", "--replicas", "2", "--agents", "3", "--out", str(tmp_path / "v")]) == 2
    assert "--replicas simulates a cluster" in capsys.readouterr().err
    assert main(["bench", "--preset", "cluster-16", "--router", "affinity", "--out", str(tmp_path / "p")]) == 2
    assert "sets its own replicas" in capsys.readouterr().err
