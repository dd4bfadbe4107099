"""Fair across tenants, pampering within: hierarchical GPS (docs/design.md, "Tenants").

Both levels of the delay bound as properties, the tenant that arrives while another is backlogged,
the failure of the rule it replaced (a tenant's agents chained in arrival order), VTC with one
counter per tenant, and the waiting queue's groups against a plain sort by key."""

from dataclasses import replace

import numpy as np
import pytest
from helpers import agent, engine, retained
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.core import KV, AgentScheduler, Charge, Registration
from justitia.core.policies import make_policy
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.lab.studies.tenants import backlog_shares, tenant_lags
from justitia.predictors import make_predictor
from justitia.sim import Simulator


def run(agents, cfg, policy="justitia"):
    """The simulator, the clock's M measured from what the engine delivers (as the bench runs it)."""
    return Simulator(
        cfg, make_policy(policy, cfg.capacity_per_s("kv")), make_predictor("oracle"), measure_capacity=True
    ).run(agents)


def both_levels(agents, cfg, policy="justitia"):
    """Agents past their H-GPS finish + bound, and tenants whose work lags H-GPS's by more than it
    (the reference at the M the clock ran at; the bound at its smallest, as ``justitia bench``)."""
    res = run(agents, cfg, policy)
    schedule = res.capacity_schedule
    gps = gps_finish_times(agents, cfg.capacity_per_s("kv"), schedule)
    bound = delay_bound_s(agents, cfg, min(m for _, m in schedule))
    late = {a.agent_id: a.finish_s - gps[a.agent_id] for a in res.agents if a.finish_s > gps[a.agent_id] + bound}
    lagging = {t: lag for t, lag in tenant_lags(agents, res, gps).items() if lag > bound}
    return late, lagging, bound, res


def tenanted_agents(rng, n, tenants, late_tenant_s):
    """Single-stage agents spread over ``tenants`` (name -> weight), a fifth of them with no tenant;
    the last tenant starts only at ``late_tenant_s``, when the others are backlogged."""
    names = list(tenants)
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.1))
        name = names[int(rng.integers(len(names)))]
        if name == names[-1]:
            t_i = late_tenant_s + t / 4
        else:
            t_i = t
        tasks = [(int(rng.integers(1, 200)), int(rng.integers(1, 150))) for _ in range(rng.integers(1, 10))]
        a = agent(f"a{i:03d}", round(t_i, 3), tasks)
        if rng.random() >= 0.2:
            a = replace(a, tenant=name, weight=tenants[name])
        out.append(a)
    return sorted(out, key=lambda a: a.arrival_s)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 100_000),
    blocks=st.integers(90, 200),
    n=st.integers(4, 40),
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=2, max_size=3),
    late_s=st.floats(0.0, 2.0),
)
def test_hierarchical_justitia_keeps_every_agent_and_every_tenant_within_the_bound(seed, blocks, n, weights, late_s):
    # Requests small next to M, as in test_bound (the theorem's assumption, one level down).
    tenants = {f"T{i}": w for i, w in enumerate(weights)}
    agents = tenanted_agents(np.random.default_rng(seed), n, tenants, late_s)
    late, lagging, bound, _ = both_levels(agents, engine(blocks=blocks, budget=512, seqs=256))
    assert not late, f"agents over the {bound:.2f} s bound by: {late}"
    assert not lagging, f"tenants lagging H-GPS by more than {bound:.2f} s: {lagging}"


def elephant_tenant_and_a_stream(tenant_of_mice="S"):
    """Tenant E: a big agent, then a small one; tenant S (or the mice without one): a stream of mice."""
    big = replace(agent("E-big", 0.0, [(100, 120)] * 20), tenant="E")
    small = replace(agent("E-small", 0.05, [(60, 20)]), tenant="E")
    mice = [replace(agent(f"m{i:03d}", 0.1 * (i + 1), [(60, 40)] * 2), tenant=tenant_of_mice) for i in range(150)]
    return [big, small, *mice]


def test_a_tenants_small_agent_is_served_before_its_big_one_not_behind_it():
    cfg = engine(blocks=40, budget=512)
    agents = elephant_tenant_and_a_stream()
    late, lagging, _, res = both_levels(agents, cfg)
    finish = {a.agent_id: a.finish_s for a in res.agents}
    assert not late and not lagging
    assert finish["E-small"] < finish["E-big"] / 10  # pampered inside its tenant
    # the rule it replaced: a tenant's agents queue in arrival order, the small one behind the big
    late, _, _, res = both_levels(agents, cfg, "justitia-chained")
    chained = {a.agent_id: a.finish_s for a in res.agents}
    assert chained["E-small"] > chained["E-big"] - 0.5 and "E-small" in late


def test_a_tenant_that_arrives_while_another_is_backlogged_gets_its_share_at_once():
    cfg = engine(blocks=40, budget=512)
    backlog = [replace(agent(f"A{i:03d}", 0.01 * i, [(80, 60)] * 3), tenant="A") for i in range(120)]
    newcomers = [replace(agent(f"B{i:03d}", 5.0 + 0.05 * i, [(80, 60)]), tenant="B") for i in range(60)]
    agents = backlog + newcomers
    late, lagging, bound, res = both_levels(agents, cfg)
    assert not late and not lagging
    # once B arrives, A and B (weights 1:1) split the engine evenly while both are backlogged
    in_window = [(a, kv) for t, a, kv in res.served if 6.0 <= t <= 10.0]
    a_kv = sum(kv for a, kv in in_window if a.startswith("A"))
    b_kv = sum(kv for a, kv in in_window if a.startswith("B"))
    assert b_kv / a_kv == pytest.approx(1.0, rel=0.25)
    finish = {a.agent_id: a.finish_s for a in res.agents}
    assert finish["B000"] - 5.0 < bound < 5.0  # the first is served at once, not behind A's backlog
    # per agent, B's smaller agents have the smaller tags and take the engine from A's backlog
    per_agent = run([replace(a, tenant=None) for a in agents], cfg)
    in_window = [(a, kv) for t, a, kv in per_agent.served if 6.0 <= t <= 8.0]
    assert sum(kv for a, kv in in_window if a.startswith("A")) < 0.25 * sum(kv for _, kv in in_window)


def test_one_tenant_orders_its_agents_as_if_there_were_no_tenants():
    rng = np.random.default_rng(3)
    agents = tenanted_agents(rng, 30, {"T": 1.0}, 0.0)
    plain = [replace(a, tenant=None) for a in agents]
    one = [replace(a, tenant="T", weight=1.0) for a in agents]
    cfg = engine(blocks=90, budget=512, seqs=256)
    jct = {a.agent_id: a.jct_s for a in run(plain, cfg).agents}
    assert {a.agent_id: a.jct_s for a in run(one, cfg).agents} == pytest.approx(jct)
    chained = {a.agent_id: a.jct_s for a in run(one, cfg, "justitia-chained").agents}
    assert np.mean(list(chained.values())) > np.mean(list(jct.values()))  # arrival order, Parrot's


def test_vtc_counts_per_tenant_so_a_tenant_with_many_agents_gets_no_more_than_one_with_few():
    cfg = engine(blocks=40, budget=512)
    many = [replace(agent(f"M{i:03d}", 0.0, [(80, 60)] * 2), tenant="many") for i in range(40)]
    few = [replace(agent(f"F{i:03d}", 0.0, [(80, 60)] * 40), tenant="few") for i in range(2)]
    agents = many + few
    shares = {}
    for label, workload in (("tenants", agents), ("agents", [replace(a, tenant=None) for a in agents])):
        res = run(workload, cfg, "vtc")
        served = [(a, kv) for t, a, kv in res.served if t <= 8.0]  # both backlogged throughout
        shares[label] = sum(kv for a, kv in served if a.startswith("F")) / sum(kv for _, kv in served)
        if label == "tenants":  # first come first served inside a tenant: M000 before M039
            finish = {a.agent_id: a.finish_s for a in res.agents}
            assert finish["M000"] < finish["M039"]
    assert shares["tenants"] == pytest.approx(0.5, abs=0.1)  # one counter each: half the engine each
    assert shares["agents"] < 0.2  # one counter per agent: 2 of 42 agents


def test_the_tenants_report_reads_service_shares_and_lags():
    cfg = engine(blocks=40, budget=512)
    a = [replace(agent(f"A{i:02d}", 0.0, [(80, 60)] * 3), tenant="A", weight=2.0) for i in range(40)]
    b = [replace(agent(f"B{i:02d}", 0.0, [(80, 60)] * 3), tenant="B") for i in range(40)]
    res = run(a + b, cfg)
    ratio = backlog_shares(a + b, res)
    assert ratio["A"] == pytest.approx(1.0, abs=0.1) and ratio["B"] == pytest.approx(1.0, abs=0.1)
    gps = gps_finish_times(a + b, cfg.capacity_per_s("kv"))
    lags = tenant_lags(a + b, res, gps)
    # a report that reads service wrongly would not see this: half of A's service taken away
    res.served = [(t, x, kv / 2 if x.startswith("A") else kv) for t, x, kv in res.served]
    assert backlog_shares(a + b, res)["A"] < 0.8
    late_gps = {k: v - 10.0 for k, v in gps.items()}  # H-GPS 10 s sooner: every tenant lags 10 s more
    assert tenant_lags(a + b, res, late_gps) == pytest.approx({t: lag + 10.0 for t, lag in lags.items()})


# ----------------------------------------------------------------------------- the waiting queue
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    ops=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2), st.floats(1.0, 500.0)), min_size=1, max_size=80),
    policy=st.sampled_from(["justitia", "vtc", "justitia-chained"]),
)
def test_the_grouped_queue_always_offers_the_request_with_the_smallest_key(ops, policy):
    # Agents 0-9, some in tenants "x" and "y", some not; each op adds a request, admits the head
    # (charging it), or finishes an agent. After each, peek is the waiting request with the smallest
    # policy key, however tenants' keys moved.
    core = AgentScheduler.for_policy(policy, 1000.0)
    now, seq = 0.0, 0
    waiting = {}
    for agent_no, op, cost in ops:
        now += 0.01
        agent_id = f"a{agent_no}"
        if core.agent(agent_id) is None:
            core.agent_arrived(Registration(agent_id, "t", cost * 3, tenant=(None, "x", "y", "x")[agent_no % 4]), now)
        if op == 0 or not waiting:
            seq += 1
            info = core.request_arrived(f"r{seq}", agent_id, 10, cost, now)
            waiting[info.request_id] = info
        elif op == 1:
            head = core.peek()
            core.dequeue(head)
            del waiting[head.request_id]
            core.charge(head, Charge(10, int(cost) % 7 + 1, int(cost)))
            core.request_finished(head)
        else:
            for rid in [r for r, i in waiting.items() if i.agent_id == agent_id]:
                del waiting[rid]
            core.agent_finished(agent_id, now)
        expected = min(waiting.values(), key=core.priority, default=None)
        got = core.peek()
        assert (got is None) == (expected is None)
        if got is not None:
            assert core.priority(got) == core.priority(expected), policy


def test_an_arrival_in_a_tenant_moves_its_agents_keys_for_the_engine_to_restamp():
    core = AgentScheduler.for_policy("justitia", 100.0)
    core.agent_arrived(Registration("a", "t", 1000.0, tenant="T"), 0.0)
    core.agent_arrived(Registration("b", "t", 10.0), 0.0)  # no tenant: its key never moves
    core.advance(0.1)
    before = core.lookahead.agent_key("a")
    core.agent_arrived(Registration("c", "t", 1.0, tenant="T"), 0.1)  # cuts in ahead of a inside T
    assert core.traits.keys_shift and core.advance(0.1) == {"a", "c"}
    assert core.lookahead.agent_key("a") > before
    assert core.advance(0.1) == set()
    assert not AgentScheduler.for_policy("fcfs").traits.keys_shift
    assert KV.request_cost(10, 10) == 150


def test_a_tagging_front_end_that_never_peeks_keeps_no_stale_queue_entries():
    # the front end queues each request and takes it out at once (AgentBook.tag): the heaps must not
    # keep an entry per request ever sent (a few stale ones may wait for the next clean-up); each
    # agent is done in GPS too before the next arrives, so the clock keeps none of them either
    def held_after(n):
        core = AgentScheduler.for_policy("justitia", 100.0)
        for i in range(n):
            core.agent_arrived(Registration(f"a{i}", "t", 10.0, tenant=("x", None)[i % 2]), i * 1.0)
            info = core.request_arrived(f"r{i}", f"a{i}", 10, 10.0, i * 1.0)
            core.dequeue(info)
            core.request_finished(info)
            core.agent_finished(f"a{i}", i * 1.0)
        return retained(core)

    assert held_after(500) <= held_after(50) + 40


def test_a_long_running_clock_forgets_every_agent_of_its_tenants():
    # agents that leave the engine before their tenant's schedule reaches them (pampering runs ahead
    # of GPS) are dropped once it does: nothing per agent is left after a day of traffic, so the
    # clock holds as much after 300 such agents as after 30
    def held_after(n):
        policy = make_policy("justitia", 100.0)
        core = AgentScheduler(policy)
        for i in range(n):
            now = i * 0.5
            core.agent_arrived(Registration(f"a{i}", "t", 20.0, tenant=f"t{i % 3}"), now)
            info = core.request_arrived(f"r{i}", f"a{i}", 10, 20.0, now)
            core.dequeue(info)
            core.request_finished(info)
            core.agent_finished(f"a{i}", now)  # done at once: far ahead of its tenant's GPS
        core.clock(10_000.0)
        core.agent_arrived(Registration("late", "t", 1.0, tenant="t0"), 10_000.0)  # moves t0's schedule to now
        return retained(policy.clock)

    assert held_after(300) == held_after(30)


def test_a_cluster_front_stamps_ranks_so_every_engine_keeps_a_tenants_order(monkeypatch):
    # One clock in front of three engines stamps each request with its agent's root key and, in a
    # tenant, its rank; each engine (tagged) keeps a tenant's requests in rank order. All agents in
    # one tenant then fare as without tenants; the stamps alone (root keys sent at different times)
    # would put a tenant's requests out of its order.
    from justitia.core.policies.tagged import Tagged
    from justitia.sim import Cluster

    rng = np.random.default_rng(7)
    agents = [a for a in tenanted_agents(rng, 60, {"T": 1.0}, 0.0)]
    plain = [replace(a, tenant=None) for a in agents]
    one = [replace(a, tenant="T", weight=1.0) for a in agents]
    cfg = engine(blocks=60, budget=512, seqs=64)

    def mean_jct(workload):
        res = Cluster(cfg, "justitia", make_predictor("oracle"), "kv", 3, measure_capacity=True).run(workload)
        return np.mean([a.jct_s for a in res.agents])

    assert mean_jct(one) == pytest.approx(mean_jct(plain), rel=0.01)
    monkeypatch.setattr(Tagged, "group_of", lambda self, req: None)  # the engines ignore ranks: stamps alone
    assert mean_jct(one) > 1.02 * mean_jct(plain)
