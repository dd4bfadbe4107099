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


def test_weights_travel_in_workload_files_and_request_metadata(tmp_path, caplog):
    path = save_workload([replace(agent("A", 0.0, [(10, 5)]), weight=2.5), agent("B", 0.0, [(10, 5)])],
                         tmp_path / "w.jsonl")
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
    assert book.core.virtual_finish("a") == pytest.approx((10 * 10 + 50) / 2)  # C / w: the request's estimate
