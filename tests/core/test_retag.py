"""Tags that follow the truth: an agent whose stages reveal more work than it was priced at moves
back (justitia: ``f = max(f, V(now) + remaining / w)``, as if it arrived now with the work it still
has; srjf: its predicted total grows), and a leaving agent counts in the clock's N_t no longer than its
real work would have kept it."""

import pytest
from helpers import agent, engine

from justitia.agent import AgentProcess
from justitia.core import KV, AgentScheduler, Charge, Registration, make_policy
from justitia.predictors import OraclePredictor
from justitia.sim import Simulator


def core(policy="justitia", retag=True):
    return AgentScheduler.for_policy(policy, 100.0, retag=retag)


def test_an_agent_that_reveals_more_work_moves_back_to_v_now_plus_what_remains():
    c = core()
    c.agent_arrived(Registration("T", "t", 10.0), 0.0)  # priced at 10: its tag is 10
    c.agent_arrived(Registration("H", "t", 100.0), 0.0)
    first = c.request_arrived("T/0", "T", 1, 10.0, 0.0)
    assert c.agent("T").virtual_finish == pytest.approx(10.0)
    c.dequeue(first)
    c.request_finished(first)
    # at 0.1 s (V = 5: two agents share 100/s) the second stage reveals 190 more
    second = c.request_arrived("T/1", "T", 1, 190.0, 0.1)
    assert c.agent("T").virtual_finish == pytest.approx(5.0 + 190.0)  # max(10, V + remaining)
    h = c.request_arrived("H/0", "H", 1, 100.0, 0.1)
    assert c.peek() is h and c.priority(h) < c.priority(second)  # the honest agent goes first now


def test_without_retagging_the_first_tag_stays():
    c = core(retag=False)
    c.agent_arrived(Registration("T", "t", 10.0), 0.0)
    c.request_arrived("T/0", "T", 1, 10.0, 0.0)
    c.request_arrived("T/1", "T", 1, 190.0, 0.1)
    assert c.agent("T").virtual_finish == pytest.approx(10.0)


def test_work_within_the_prediction_never_moves_a_tag():
    c = core()
    c.agent_arrived(Registration("A", "t", 100.0), 0.0)
    for i in range(4):  # 4 x 25 = the predicted 100 exactly
        c.request_arrived(f"A/{i}", "A", 1, 25.0, 0.1 * i)
    assert c.agent("A").virtual_finish == pytest.approx(100.0)


def test_a_tag_only_moves_back():
    c = core()
    c.agent_arrived(Registration("A", "t", 100.0), 0.0)
    c.agent_arrived(Registration("B", "t", 1000.0), 0.0)
    r = c.request_arrived("A/0", "A", 1, 90.0, 0.0)
    c.dequeue(r)
    c.request_finished(r)  # 90 done
    c.request_arrived("A/1", "A", 1, 20.0, 0.2)  # 110 revealed, but V(0.2) + 20 = 30 is below its 100
    assert c.agent("A").virtual_finish == pytest.approx(100.0)


def test_an_agent_gps_had_finished_counts_again_when_it_reveals_more():
    c = core()
    c.agent_arrived(Registration("A", "t", 10.0), 0.0)
    r = c.request_arrived("A/0", "A", 1, 10.0, 0.0)
    c.dequeue(r)
    assert c.clock().active == 1 and c.clock(0.5).virtual_time == pytest.approx(10.0) and c.clock().active == 0
    c.request_finished(r)
    c.request_arrived("A/1", "A", 1, 50.0, 0.5)  # V stopped at 10 when GPS finished A
    assert c.agent("A").virtual_finish == pytest.approx(60.0) and c.clock().active == 1  # V + 50
    c.agent_arrived(Registration("B", "t", 50.0), 0.5)
    assert c.clock(0.6).virtual_time == pytest.approx(10.0 + 0.1 * 100 / 2)  # two agents share the clock again


def test_srjf_does_not_keep_an_underpriced_agent_first_for_good():
    c = core("srjf")
    c.agent_arrived(Registration("T", "t", 10.0), 0.0)
    c.agent_arrived(Registration("H", "t", 100.0), 0.0)
    t0 = c.request_arrived("T/0", "T", 1, 10.0, 0.0)
    c.dequeue(t0)
    c.charge(t0, Charge(kv_token_iters=50))  # served past its price
    c.request_finished(t0)
    h = c.request_arrived("H/0", "H", 1, 100.0, 0.1)
    t1 = c.request_arrived("T/1", "T", 1, 190.0, 0.1)
    assert c.peek() is h, "T's remaining cost would be max(10 - served, 0) = 0 without the revision"
    assert c.priority(t1) > c.priority(h)


class StageZeroPredictor(OraclePredictor):
    """Prices an agent by its first stage only, as a predictor that reads stage 0 would price a
    trojan; each request at its true cost when it is submitted."""

    name = "stage0"

    def agent_cost(self, agent, model):
        return sum(model.request_cost(t.prompt_tokens, t.output_tokens) for t in agent.stages[0])


def test_retagging_stops_a_trojan_from_jumping_the_honest_agents():
    trojan = agent("trojan", 0.0, [(100, 20)] * 2, [(100, 20)] * 38)  # first stage 1/20 of its cost
    honest = [agent(f"h{i}", 0.05 + 0.01 * i, [(100, 20)] * 6) for i in range(8)]
    cfg = engine(blocks=16, budget=256, seqs=8)

    def honest_mean(retag):
        sim = Simulator(cfg, make_policy("justitia", cfg.capacity_per_s("kv")), StageZeroPredictor(), retag=retag)
        res = {a.agent_id: a.jct_s for a in sim.run([trojan, *honest]).agents}
        return sum(res[a.agent_id] for a in honest) / len(honest), res["trojan"]

    (fooled, trojan_fooled), (retagged, trojan_retagged) = honest_mean(False), honest_mean(True)
    assert retagged < 0.8 * fooled, (retagged, fooled)  # the honest agents no longer wait behind its 38 requests
    assert trojan_retagged > trojan_fooled


def test_an_agent_submitted_whole_is_priced_on_every_stage():
    trojan = agent("trojan", 0.0, [(100, 20)] * 2, [(100, 20)] * 38)
    first = AgentProcess(trojan, StageZeroPredictor(), KV).predict()
    whole = AgentProcess(trojan, StageZeroPredictor(), KV, pricing="all-stages").predict()
    assert first == pytest.approx(trojan.cost(KV) / 20) and whole == pytest.approx(trojan.cost(KV))
    with pytest.raises(ValueError, match="pricing"):
        AgentProcess(trojan, StageZeroPredictor(), KV, pricing="guess")


def test_an_agent_charged_beyond_its_price_moves_back_whatever_its_requests_said():
    """Retagging on attained service (an engine that charges each step with its time): an agent
    priced at 10 whose requests claim 5 each but are charged 300 moves to about ``V(now) + 290``, its
    waiting request with it, behind an honest agent that arrived later."""
    c = core()
    c.agent_arrived(Registration("T", "t", 10.0), 0.0)
    running = c.request_arrived("T/0", "T", 1, 5.0, 0.0)
    waiting = c.request_arrived("T/1", "T", 1, 5.0, 0.0)
    c.dequeue(running)
    c.agent_arrived(Registration("H", "t", 100.0), 0.1)  # V(0.1) = 10 (T alone until then): H's tag is 110
    honest = c.request_arrived("H/0", "H", 1, 100.0, 0.1)
    assert c.peek() is waiting  # T's 10 is ahead of H's 110
    for step in range(30):  # 30 steps of 10 KV token-time each, at 0.2 s
        c.charge(running, Charge(0, 1, 10), 0.2)
    v = c.clock(0.2).virtual_time
    from justitia.core.scheduler import RETAG_STEP

    # V(now) + attained - price, as of the last retag (one per RETAG_STEP of growth)
    assert c.agent("T").virtual_finish >= v + 300.0 / RETAG_STEP - 10.0
    assert c.peek() is honest and c.priority(honest) < c.priority(waiting)


def test_charges_without_a_time_or_within_the_price_never_retag():
    """Charges without ``now_s`` (an engine that charges lazily), or within the price, leave the
    tag; without retagging, even attained service beyond it does."""
    for retag, now, total in ((True, None, 300), (True, 0.2, 10), (False, 0.2, 300)):
        c = core(retag=retag)
        c.agent_arrived(Registration("T", "t", 10.0), 0.0)
        r = c.request_arrived("T/0", "T", 1, 5.0, 0.0)
        c.dequeue(r)
        c.charge(r, Charge(0, 1, total), now)
        assert c.agent("T").virtual_finish == pytest.approx(10.0)


def test_retagging_on_attained_service_is_geometric():
    """One revise per ``RETAG_STEP`` growth of attained service, not one per step."""
    from justitia.core.scheduler import RETAG_STEP

    policy = make_policy("justitia", 100.0)
    revisions = []
    revise = policy.revise
    policy.revise = lambda *a: (revisions.append(a[1]), revise(*a))
    c = AgentScheduler(policy)
    c.agent_arrived(Registration("T", "t", 10.0), 0.0)
    r = c.request_arrived("T/0", "T", 1, 10.0, 0.0)
    c.dequeue(r)
    for _ in range(1000):
        c.charge(r, Charge(0, 1, 10), 0.5)
    assert 10 < len(revisions) < 40
    assert all(b >= a * RETAG_STEP for a, b in zip(revisions, revisions[1:]))


def test_a_resumed_agent_is_stamped_with_what_gps_still_owed_it_and_keeps_its_whole_cost():
    """``resume_cost`` places an agent resumed after a restart at ``V(now) + owed / w``; its requests,
    which add up to its whole predicted cost, do not retag it (the core keeps the whole cost)."""
    c = core()
    c.agent_arrived(Registration("R", "t", 100.0, resume_cost=20.0), 0.0)
    c.agent_arrived(Registration("N", "t", 100.0), 0.0)  # a newcomer of the same cost
    assert c.agent("R").virtual_finish == pytest.approx(20.0) and c.agent("N").virtual_finish == pytest.approx(100.0)
    r = [c.request_arrived(f"R/{i}", "R", 1, 50.0, 0.0) for i in range(2)]  # 100 revealed: its whole cost
    n = c.request_arrived("N/0", "N", 1, 100.0, 0.0)
    assert c.agent("R").virtual_finish == pytest.approx(20.0)  # not retagged
    assert c.peek() is r[0] and c.priority(r[1]) < c.priority(n)
    with pytest.raises(ValueError, match="resume_cost"):
        c.agent_arrived(Registration("X", "t", 100.0, resume_cost=float("nan")), 0.0)
    c.agent_arrived(Registration("Y", "t", 100.0, resume_cost=500.0), 0.0)  # never more than its cost
    assert c.agent("Y").virtual_finish <= c.clock(0.0).virtual_time + 100.0 + 1e-9
