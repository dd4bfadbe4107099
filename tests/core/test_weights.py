"""Weighted GPS: an agent of weight w is owed w / Σw of the engine; its tag is V(a) + C / w; VTC
advances its counter by service / w. All weights 1 is the unweighted scheduler."""

import json
from dataclasses import replace

import pytest
from helpers import agent, engine

from justitia.core import AgentBook, RequestMeta, VirtualClock, make_policy
from justitia.lab.metrics import gps_finish_times
from justitia.predictors import make_predictor
from justitia.sim import Simulator
from justitia.workload import WorkloadError, load_workload, save_workload


def test_the_weighted_clock_shares_the_engine_by_weight():
    clock = VirtualClock(100.0)
    assert clock.arrive("A", 100.0, 0.0, weight=2.0) == 50.0  # f = V + C / w
    assert clock.arrive("B", 100.0, 0.0) == 100.0
    finish = clock.drain()  # V grows at 100 / 3: A (owed 2/3) finishes at 1.5 s, then B alone at 2 s
    assert finish == {"A": pytest.approx(1.5), "B": pytest.approx(2.0)}
    with pytest.raises(ValueError, match="weight"):
        clock.arrive("C", 1.0, 3.0, weight=0.0)


def run(agents, policy):
    cfg = engine(blocks=40, budget=512)
    res = Simulator(cfg, make_policy(policy, cfg.capacity_per_s("kv")), make_predictor("oracle")).run(agents)
    return {a.agent_id: a.finish_s for a in res.agents}


def test_a_heavier_weight_moves_an_agent_ahead_in_justitias_order():
    b = agent("B", 0.0, [(100, 60)] * 20)
    a = agent("A", 0.001, [(100, 60)] * 20)  # arrives just after B, same cost: B's tag is smaller
    assert run([b, a], "justitia")["B"] < run([b, a], "justitia")["A"]
    heavy = run([b, replace(a, weight=2.0)], "justitia")  # A's tag is V + C / 2 now
    assert heavy["A"] < heavy["B"]


def test_weighted_vtc_serves_two_backlogged_agents_two_to_one():
    a, b = agent("A", 0.0, [(100, 60)] * 40), agent("B", 0.0, [(100, 60)] * 40)
    even = run([a, b], "vtc")
    assert even["A"] / even["B"] == pytest.approx(1.0, abs=0.05)
    weighted = run([replace(a, weight=2.0), b], "vtc")
    # served 2:1 while both wait, A's equal work is done at 3/4 of the time both take together
    assert weighted["A"] / weighted["B"] == pytest.approx(0.75, rel=0.1)


def test_the_gps_reference_is_weighted_too():
    agents = [replace(agent("A", 0.0, [(100, 100)]), weight=3.0), agent("B", 0.0, [(100, 100)])]
    cost = 100 * 100 + 100 * 100 / 2
    gps = gps_finish_times(agents, cost)  # M = one agent's cost per second: A owed 3/4 of it
    assert gps == {"A": pytest.approx(4 / 3), "B": pytest.approx(2.0)}


def estimate(prompt_tokens: int, max_tokens: int) -> float:
    """The tag an unpriced request of weight 1 gets on its own: its own estimate (by its prompt and
    ``max_tokens``, as a distribution of its answer's length: ``core.book``)."""
    book = AgentBook.for_policy("justitia", 100.0)
    book.arrive("r", RequestMeta("x"), prompt_tokens, max_tokens, now_s=0.0)
    return book.virtual_finish("x")


def test_weights_travel_in_workload_files_and_request_metadata(tmp_path, caplog):
    path = save_workload(
        [replace(agent("A", 0.0, [(10, 5)]), weight=2.5), agent("B", 0.0, [(10, 5)])], tmp_path / "w.jsonl"
    )
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert docs[0]["weight"] == 2.5 and "weight" not in docs[1]  # 1 is the default, left out
    assert [a.weight for a in load_workload(path)] == [2.5, 1.0]
    for bad in (0, -1, "heavy", True):
        docs[0]["weight"] = bad
        path.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
        with pytest.raises(WorkloadError, match=r"w.jsonl:1: field 'weight' must be a finite number > 0"):
            load_workload(path)
    meta = RequestMeta("a", agent_weight=2.0)
    assert RequestMeta.parse(meta.to_extra_args()).agent_weight == 2.0
    with caplog.at_level("WARNING"):
        assert RequestMeta.parse({"agent_id": "a", "agent_weight": 0}, "r1").agent_weight is None
    assert "agent_weight=0 is not a finite number > 0" in caplog.text
    book = AgentBook.for_policy("justitia", 100.0)
    book.arrive("r1", meta, 10, 10, now_s=0.0)
    assert book.virtual_finish("a") == pytest.approx(estimate(10, 10) / 2)  # C / w: the request's estimate


# ------------------------------------------------------------------------------------ tenants
def test_tenants_share_the_engine_by_weight_and_their_agents_share_the_tenant():
    clock = VirtualClock(100.0)
    assert clock.arrive("A1", 400.0, 0.0, weight=2.0, tenant="A") == 200.0  # root key: V + 400 / W
    # B's four agents share B's third in GPS (one inner tag), and B serves them one after another
    assert [clock.arrive(f"B{i}", 100.0, 0.0, tenant="B") for i in range(1, 5)] == [100.0, 200.0, 300.0, 400.0]
    assert [clock.inner_tag(f"B{i}") for i in range(1, 5)] == [100.0] * 4
    assert [clock.root_key(f"B{i}") for i in range(1, 5)] == [100.0, 200.0, 300.0, 400.0]
    assert clock.active == 5 and clock.active_flows == 2  # Σ W = 3: A is owed 2/3 however many agents B has
    finish = clock.drain()
    # A at 200/3 a second is done at 6 s; B's four at 100/12 each have 50 each left, then 25 a second each
    assert finish == {"A1": pytest.approx(6.0), **{f"B{i}": pytest.approx(8.0) for i in range(1, 5)}}
    per_agent = VirtualClock(100.0)  # the same agents, each a root entry of its own: A1 owed only 2/6
    per_agent.arrive("A1", 400.0, 0.0, weight=2.0)
    for i in range(1, 5):
        per_agent.arrive(f"B{i}", 100.0, 0.0)
    assert per_agent.drain()["A1"] == pytest.approx(8.0)


def test_inside_a_tenant_agents_are_ordered_by_their_gps_finish_not_their_arrival():
    clock = VirtualClock(1.0)
    clock.arrive("big", 100.0, 0.0, tenant="T")
    clock.arrive("small", 10.0, 0.0, tenant="T")  # arrived later, finishes first in the tenant's GPS
    clock.arrive("y", 100.0, 0.0)  # an agent without a tenant: a root entry of its own
    # T gets half the engine: served small first, T is done with it at V = 10 (in H-GPS, at V = 20)
    assert clock.root_key("small") == 10.0 and clock.root_key("big") == 110.0 and clock.root_key("y") == 100.0
    clock.arrive("tiny", 1.0, 0.0, tenant="T")  # cuts in ahead of both: their root keys move back by 1
    assert (clock.root_key("tiny"), clock.root_key("small"), clock.root_key("big")) == (1.0, 11.0, 111.0)
    assert clock.drain() == {
        "tiny": pytest.approx(6.0),
        "small": pytest.approx(42.0),
        "y": pytest.approx(200.0),
        "big": pytest.approx(211.0),
    }


def test_a_tenant_that_goes_idle_starts_again_at_v_and_a_settle_moves_its_root_keys():
    clock = VirtualClock(10.0)
    clock.arrive("a", 10.0, 0.0, tenant="T")  # done at 1 s
    assert clock.arrive("b", 10.0, 5.0, tenant="T") == 20.0  # the tenant idled: V(5 s) = 10, not a backlog
    clock.settle("b", 2.0, 5.0)  # b asked for 2: the tenant's GPS keeps it until its inner S + 2
    assert clock.root_key("c") is None
    assert clock.arrive("c", 5.0, 5.0, tenant="T") == pytest.approx(17.0)  # b's 2 and c's 5 after V = 10
    assert clock.drain() == {"a": pytest.approx(1.0), "b": pytest.approx(5.4), "c": pytest.approx(5.7)}


def test_agents_of_their_own_tenant_are_scheduled_exactly_as_agents_without_one():
    agents = [agent(f"a{i}", 0.3 * i, [(100, 40 + 7 * i)] * (1 + i % 3)) for i in range(12)]
    plain = run(agents, "justitia")
    assert run([replace(a, tenant=f"t-{a.agent_id}") for a in agents], "justitia") == plain
    # one tenant: the tenant's inner GPS is the flat GPS, so agents keep their order (not arrival order)
    assert run([replace(a, tenant="one") for a in agents], "justitia") == plain
    assert run([replace(a, tenant="one") for a in agents], "parrot") != plain


def saturating_tenants(seconds=40.0, load=0.75):
    """Tenants A (weight 2) and B (weight 1), identical Poisson streams of one-request agents, each at
    ``load`` times the engine's M: together more than the engine serves."""
    import numpy as np

    cfg = engine(blocks=60, budget=512)
    m = cfg.capacity_per_s("kv")
    rate = load * m / (100 * 60 + 60 * 60 / 2)
    times = np.cumsum(np.random.default_rng(0).exponential(1 / rate, size=int(rate * seconds * 1.5)))
    times = [round(float(t), 4) for t in times[times < seconds]]
    agents = [
        replace(agent(f"{t}{i:05d}", at, [(100, 60)], type=t), weight=w, tenant=t)
        for t, w in (("A", 2.0), ("B", 1.0))
        for i, at in enumerate(times)
    ]
    return cfg, sorted(agents, key=lambda a: a.arrival_s)


def test_two_saturating_tenants_weighted_two_to_one_are_served_two_to_one():
    from justitia.core.policies import Justitia

    cfg, agents = saturating_tenants()

    class Recording(Justitia):  # the KV token-time charged to each tenant, noted at each arrival
        reads_service = True  # it reads charge: the engine charges it

        def __init__(self, m):
            super().__init__(m)
            self.served, self.notes = {"A": 0, "B": 0}, []

        def charge(self, req, service):
            self.served[req.agent_id[0]] += service.kv_token_iters

        def agent_arrived(self, info, now_s):
            super().agent_arrived(info, now_s)
            self.notes.append((now_s, dict(self.served)))

    policy = Recording(cfg.capacity_per_s("kv"))
    res = Simulator(cfg, policy, make_predictor("oracle"), event_skipping=False).run(agents)
    at = {t: next(s for when, s in policy.notes if when >= t) for t in (10.0, 30.0)}  # both backlogged
    share = (at[30.0]["A"] - at[10.0]["A"]) / (at[30.0]["B"] - at[10.0]["B"])
    assert share == pytest.approx(2.0, rel=0.1)
    jct = {t: sum(a.jct_s for a in res.agents if a.agent_id[0] == t) / len(agents) * 2 for t in "AB"}
    assert jct["A"] < 0.7 * jct["B"]


def test_tenants_travel_in_workload_files_and_request_metadata(tmp_path, caplog):
    path = save_workload(
        [replace(agent("A", 0.0, [(10, 5)]), tenant="acme"), agent("B", 0.0, [(10, 5)])], tmp_path / "w.jsonl"
    )
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert docs[0]["tenant"] == "acme" and "tenant" not in docs[1]
    assert [a.tenant for a in load_workload(path)] == ["acme", None]
    for bad in ("", "x" * 129, 7, None):
        docs[0]["tenant"] = bad
        path.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
        with pytest.raises(WorkloadError, match=r"w.jsonl:1: field 'tenant' must be a string of 1-128 characters"):
            load_workload(path)
    meta = RequestMeta("a", tenant="acme")
    assert RequestMeta.parse(meta.to_extra_args()).tenant == "acme"
    with caplog.at_level("WARNING"):
        assert RequestMeta.parse({"agent_id": "a", "tenant": ["x"]}, "r1").tenant is None
    assert "tenant=['x'] is not a string of 1-128 characters" in caplog.text
    book = AgentBook.for_policy("justitia", 100.0)
    book.arrive("r1", RequestMeta("a", tenant="acme"), 10, 10, now_s=0.0)
    book.arrive("r2", RequestMeta("b", tenant="acme"), 10, 10, now_s=0.0)
    assert book.virtual_finish("b") == pytest.approx(2 * estimate(10, 10))  # behind a in acme's flow
