"""Costs, each policy's ordering, the waiting queue and the predictors."""

import math

import numpy as np
import pytest
from helpers import agent
from hypothesis import given, settings
from hypothesis import strategies as st

from justitia.core import (
    COMPUTE,
    KV,
    POLICY_NAMES,
    AgentBook,
    AgentScheduler,
    Charge,
    Registration,
    RequestInfo,
    RequestMeta,
    cost_model,
    kv_token_iters,
    make_policy,
)
from justitia.core.cost import compute_tokens
from justitia.core.queue import WaitingQueue
from justitia.predictors import make_predictor


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_kv_cost_is_the_tokens_held_over_the_decode(p, d):
    assert kv_token_iters(p, d) == p * d + d * d / 2
    # Holding p + i tokens in decode step i = 1..d sums to p*d + d(d+1)/2: the same up to d/2.
    assert abs(sum(p + i for i in range(1, d + 1)) - kv_token_iters(p, d)) == pytest.approx(d / 2)


def test_compute_cost_and_agent_cost():
    assert compute_tokens(100, 50) == 200
    a = agent("a", 0.0, [(100, 10), (200, 20)], [(50, 5)])
    assert a.cost(KV) == kv_token_iters(100, 10) + kv_token_iters(200, 20) + kv_token_iters(50, 5)
    assert a.cost(cost_model("compute")) == 120 + 240 + 60
    # one step's service in each model's unit, and what a saturated step delivers (the clock's M)
    step = Charge(prefill_tokens=30, decode_tokens=2, kv_token_iters=700)
    assert (KV.service(step), COMPUTE.service(step)) == (700, 34)
    assert (KV.per_iteration(4096, 512), COMPUTE.per_iteration(4096, 512)) == (4096, 512)
    with pytest.raises(ValueError, match="unknown cost model"):
        cost_model("flops")


def scheduler(name, capacity=100.0):
    return AgentScheduler(make_policy(name, capacity))


def order(core):
    out = []
    while len(core):
        req = core.peek()
        core.dequeue(req)
        out.append(req.request_id)
    return out


@pytest.mark.parametrize(
    "policy, served",
    [
        ("fcfs", ["x1", "y1", "x2"]),  # requests in arrival order across agents
        ("parrot", ["x1", "x2", "y1"]),  # an agent's requests kept together, in agent order
    ],
)
def test_fcfs_serves_requests_in_arrival_order_and_parrot_keeps_an_agents_requests_together(policy, served):
    core = scheduler(policy)
    core.agent_arrived(Registration("x", "t", 500), 0.0)  # x first but dearer: neither policy looks at the cost
    core.agent_arrived(Registration("y", "t", 5), 0.0)
    for rid, a in [("x1", "x"), ("y1", "y"), ("x2", "x")]:
        core.request_arrived(rid, a, 10, 1.0)
    assert order(core) == served


def test_sjf_serves_the_cheapest_request_first():
    core = scheduler("sjf")
    core.agent_arrived(Registration("x", "t", 0), 0.0)
    for rid, cost in [("big", 90.0), ("small", 5.0), ("mid", 40.0)]:
        core.request_arrived(rid, "x", 10, cost)
    assert order(core) == ["small", "mid", "big"]


@pytest.mark.parametrize(
    "policy, costs, first, service, then",
    [
        ("srjf", (100, 60), "y", 50, "x"),  # least remaining first: y (60); x served 50 has 50 left, y 60
        (
            "las",
            (0, 0),
            "x",
            1,
            "y",
        ),  # least attained service first: a tie goes to the earlier agent, x; served, x waits
    ],
)
def test_srjf_prefers_least_remaining_and_las_least_attained_service_and_both_update_with_service(
    policy, costs, first, service, then
):
    core = scheduler(policy)
    core.agent_arrived(Registration("x", "t", costs[0]), 0.0)
    core.agent_arrived(Registration("y", "t", costs[1]), 0.0)
    rx = core.request_arrived("x1", "x", 10, 1.0)
    core.request_arrived("y1", "y", 10, 1.0)
    assert core.peek().agent_id == first
    core.charge(rx, Charge(kv_token_iters=service))
    assert core.peek().agent_id == then


def test_vtc_counts_input_once_and_output_twice_and_lifts_returning_agents():
    core = scheduler("vtc")
    for a in "xyz":
        core.agent_arrived(Registration(a, "t", 0), 0.0)
    rx = core.request_arrived("x1", "x", 10, 1.0)
    ry = core.request_arrived("y1", "y", 10, 1.0)
    core.dequeue(rx)  # x admitted: 100 prompt tokens, then 10 output tokens
    core.charge(rx, Charge(prefill_tokens=100, decode_tokens=10))
    assert core.lookahead.agent_key("x")[0] == 100 + 2 * 10
    core.dequeue(ry)
    core.charge(ry, Charge(prefill_tokens=30))
    core.request_arrived("y2", "y", 10, 1.0)  # y backlogged again: nothing else waits, no lift
    assert core.lookahead.agent_key("y")[0] == 30
    # z has been idle at 0; when it queues while y (30) waits, it is lifted to 30, not left at 0.
    core.request_arrived("z1", "z", 10, 1.0)
    assert core.lookahead.agent_key("z")[0] == 30
    assert core.peek().agent_id == "y"  # tie at 30: earlier agent first


def test_advance_names_the_agents_whose_keys_moved_and_no_others():
    core = scheduler("vtc")
    for a in "xyz":
        core.agent_arrived(Registration(a, "t", 0), 0.0)
    rx, ry = core.request_arrived("x1", "x", 10, 1.0), core.request_arrived("y1", "y", 10, 1.0)
    core.dequeue(rx)
    core.dequeue(ry)
    core.advance(1.0)  # a fresh start
    before = {a: core.lookahead.agent_key(a) for a in "xyz"}
    core.charge(rx, Charge(prefill_tokens=100))
    core.request_arrived("z1", "z", 10, 1.0)  # z becomes backlogged: vtc lifts it
    moved = core.advance(1.0)
    assert moved == {"x", "z"} and core.advance(1.0) == set()
    assert [a for a in "xyz" if core.lookahead.agent_key(a) != before[a]] == [
        "x"
    ]  # z's lift: to 0, nothing else waited
    assert scheduler("justitia", capacity=100).advance(0.0) == set()


def test_justitia_orders_by_finish_tag_not_arrival():
    core = scheduler("justitia", capacity=100)
    core.agent_arrived(Registration("A", "t", 200), 0.0)
    core.request_arrived("a1", "A", 10, 20.0)
    core.agent_arrived(Registration("B", "t", 30), 1.0)
    core.request_arrived("b1", "B", 10, 15.0)
    assert core.agent("A").virtual_finish == 200 and core.agent("B").virtual_finish == pytest.approx(130)
    assert order(core) == ["b1", "a1"]


def test_justitia_eligible_holds_back_an_agent_ahead_of_gps_until_v_catches_up():
    core = scheduler("justitia-eligible", capacity=100)
    assert core.traits.timed and core.traits.keys_move
    core.agent_arrived(Registration("A", "t", 100), 0.0)  # tag 100
    core.agent_arrived(Registration("B", "t", 300), 0.0)  # tag 300: plain justitia serves A first, whatever A got
    a1 = core.request_arrived("a1", "A", 10, 50.0)
    core.request_arrived("b1", "B", 10, 50.0)
    core.advance(0.0)
    assert core.peek().request_id == "a1"
    core.dequeue(a1)
    core.charge(a1, Charge(10, 1, 120))  # A got 120 at once; GPS gives each 50 a second (V grows at 50/s)
    core.request_arrived("a2", "A", 10, 50.0)
    core.advance(1.0)  # V = 50: A is ahead of GPS (its next start, 0 + 120, is past V), B is not
    assert core.peek().request_id == "b1"
    core.advance(2.5)  # V = 125 > 120: A is eligible again and its smaller tag wins
    assert core.peek().request_id == "a2"
    plain = scheduler("justitia", capacity=100)
    assert not plain.traits.timed


# x arrived first with a small agent cost but an expensive request, and has been served a lot;
# y arrived later, costs more in all, and its request is cheap: each policy preempts by its own key.
LOWEST_PRIORITY = {"fcfs": "y1", "sjf": "x1", "parrot": "y1", "vtc": "x1", "srjf": "y1", "justitia": "y1", "las": "x1"}


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_victim_is_the_lowest_priority_and_finished_agents_leave_no_state(name):
    policy = make_policy(name, 100.0)
    core = AgentScheduler(policy)
    core.agent_arrived(Registration("x", "t", 10), 0.0)
    core.agent_arrived(Registration("y", "t", 1000), 0.5)
    rx = core.request_arrived("x1", "x", 10, 50.0)
    ry = core.request_arrived("y1", "y", 10, 5.0)
    for req in (rx, ry):
        core.dequeue(req)  # both running
    core.charge(rx, Charge(prefill_tokens=500, decode_tokens=10, kv_token_iters=5000))
    # the engine preempts the running request with the largest key
    assert (
        max([rx, ry], key=core.priority).request_id
        == max([ry, rx], key=core.priority).request_id
        == LOWEST_PRIORITY[name]
    )
    core.request_arrived("x2", "x", 10, 1.0)
    core.agent_finished("x", 1.0)  # cancelled with a request still waiting
    assert len(core) == 0 and core.agent("y") is not None and core.agent("x") is None
    state = [v for v in vars(policy).values() if isinstance(v, dict)]
    assert all("x" not in d for d in state)


def test_waiting_queue_requeues_and_rejects_duplicates():
    pol = make_policy("fcfs")
    q = WaitingQueue(pol)
    r = RequestInfo("r", "a", 3, 10, 1.0)
    q.add(r)
    with pytest.raises(ValueError, match="already waiting"):
        q.add(r)
    assert q.pop() is r and len(q) == 0
    q.add(r)  # preempted: back in the queue
    assert q.peek() is r
    with pytest.raises(KeyError):
        q.remove(RequestInfo("other", "a", 4, 10, 1.0))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["vtc", "las", "srjf"]), seed=st.integers(0, 10_000), weighted=st.booleans())
def test_dynamic_queue_order_and_vtc_lift_match_the_plain_computation(name, seed, weighted):
    """``backlogged_agents`` walks the agent heap (stale entries, rebuilds) without popping it, and
    VTC lifts a returning agent to the counter of the first agent of that walk: both must agree
    with sorting every backlogged agent by its key and taking the smallest counter among them."""
    rng = np.random.default_rng(seed)
    core = scheduler(name)
    agents = [f"a{i}" for i in range(int(rng.integers(2, 24)))]
    for i, a in enumerate(agents):
        core.agent_arrived(
            Registration(
                a, "t", float(rng.integers(1, 5000)), weight=float(rng.choice([0.5, 1.0, 3.0])) if weighted else 1.0
            ),
            0.0,
        )
    waiting, running, n = [], [], 0
    for _ in range(int(rng.integers(20, 600))):
        op = rng.random()
        if op < 0.35:  # a request arrives; VTC lifts its agent if it had none waiting
            a = agents[int(rng.integers(len(agents)))]
            others = {w.agent_id for w in waiting} - {a}
            lift = None
            if name == "vtc" and a not in {w.agent_id for w in waiting} and others:
                lift = max(core.lookahead.agent_key(a)[0], min(core.lookahead.agent_key(o)[0] for o in others))
            waiting.append(core.request_arrived(f"r{n}", a, 10, 1.0))
            n += 1
            if lift is not None:
                assert core.lookahead.agent_key(a)[0] == lift
        elif op < 0.55 and waiting:  # the front request is admitted
            req = core.peek()
            core.dequeue(req)
            waiting.remove(req)
            running.append(req)
        elif op < 0.65 and running:  # a running request is preempted
            req = running.pop(int(rng.integers(len(running))))
            core.requeue(req)
            waiting.append(req)
        elif running:  # service is charged, to a running request or (through it) its agent
            req = running[int(rng.integers(len(running)))]
            core.charge(req, Charge(int(rng.integers(0, 50)), int(rng.integers(0, 4)), int(rng.integers(0, 3000))))
        if rng.random() < 0.7:
            continue  # not read at every change: stale heap entries pile up
        backlogged = {w.agent_id for w in waiting}
        expected = sorted(backlogged, key=core.lookahead.agent_key)
        assert list(core.lookahead.backlogged_agents()) == expected
        assert core.lookahead.best_agent() == (expected[0] if expected else None)
        if waiting:
            assert core.peek() == min((w for w in waiting if w.agent_id == expected[0]), key=lambda w: w.seq)


def test_noisy_predictor_is_bounded_seeded_and_order_free():
    a = agent("a", 0.0, [(100, 50)] * 3)
    b = agent("b", 0.0, [(10, 5)])
    kv = cost_model("kv")
    p1, p2 = make_predictor("noisy:3", 1), make_predictor("noisy:3", 1)
    x = p1.agent_cost(a, kv)
    assert p1.agent_cost(b, kv) == p2.agent_cost(b, kv) and p2.agent_cost(a, kv) == x
    assert a.cost(kv) / 3 <= x <= a.cost(kv) * 3
    assert make_predictor("noisy:1").agent_cost(a, kv) == pytest.approx(a.cost(kv))
    assert make_predictor("oracle").request_cost(a, 0, 1, kv) == kv_token_iters(100, 50)
    factors = [math.log(make_predictor("noisy:3", s).agent_cost(a, kv) / a.cost(kv)) for s in range(400)]
    assert max(factors) > 0.8 * math.log(3) and min(factors) < -0.8 * math.log(3)
    with pytest.raises(ValueError, match="noisy"):
        make_predictor("noisy:0.5")


# ---------------------------------------------------------------- agents known from request metadata
def test_agent_book_registers_on_first_request_and_releases_on_done_cancel_or_idle():
    core = AgentScheduler.for_policy("justitia", 100.0)
    book = AgentBook(core, idle_release_s=5.0)
    info, agent = book.arrive("r1", RequestMeta("a", agent_cost=50.0), 10, 4, now_s=0.0)
    assert agent is not None and agent.predicted_cost == 50.0 and info.predicted_cost == 10 * 4 + 8
    assert book.arrive("r2", RequestMeta("a", agent_done=True), 10, 4, now_s=0.0)[1] is None
    book.finish("r1", 1.0)
    assert book.agent("a") is not None  # r2 (the last stage) is still open
    book.finish("r2", 2.0)
    assert book.agent("a") is None and book.open_count == 0

    # no agent_done: idle between stages, released by the sweep only after idle_release_s
    book.arrive("s1", RequestMeta("b"), 10, 4, now_s=3.0)
    book.finish("s1", 3.0)
    assert book.sweep(7.9) == [] and book.agent("b") is not None
    book.arrive("s2", RequestMeta("b"), 10, 4, now_s=8.0)  # the next stage: no longer idle
    book.finish("s2", 8.0)
    assert book.sweep(12.0) == [] and book.sweep(13.0) == ["b"] and book.agent("b") is None

    # cancel: released at once, its open request finishes later without error
    book.register(Registration("c", "t", 30.0), 14.0)
    book.arrive("c1", RequestMeta("c"), 10, 4, now_s=14.0)
    assert book.release("c", 14.5) and not book.release("c", 14.6)
    assert book.finish("c1", 15.0) is not None and book.agent("c") is None

    # retire: an engine that still holds the agent's requests serves them first, then lets it go
    book.arrive("d1", RequestMeta("d"), 10, 4, now_s=15.0)
    assert not book.retire("d", 15.5) and book.agent("d") is not None and len(core) == 1
    book.finish("d1", 16.0)
    assert book.agent("d") is None and book.retire("d", 16.5) is False

    # a request without agent_id is an agent of its own, released when it finishes; bad costs are replaced
    info, agent = book.arrive("solo", RequestMeta.parse({"agent_cost": "nan"}, "solo"), 8, 2, now_s=16.0)
    # its own estimate: the request at its prompt and max_tokens; the agent, by the plug-in's book, as a
    # distribution of its answer's length up to max_tokens (core.book.unpriced), whose top is that
    assert agent.agent_id == "solo" and agent.dist.top == info.predicted_cost == 8 * 2 + 2
    assert 0 < agent.predicted_cost < info.predicted_cost
    book.finish("solo", 17.0)
    assert book.agent("solo") is None and len(core) == 0


def test_request_metadata_round_trips_and_bad_costs_are_logged_and_dropped(caplog):
    meta = RequestMeta("a", "fv", 3.5e5, 120.0, True)
    assert meta.to_extra_args() == {
        "agent_id": "a",
        "agent_type": "fv",
        "agent_cost": 3.5e5,
        "request_cost": 120.0,
        "agent_done": True,
    }
    assert RequestMeta.parse(meta.to_extra_args()) == meta
    assert RequestMeta.parse(None) == RequestMeta() and RequestMeta().to_extra_args() == {}
    with caplog.at_level("WARNING"):
        bad = RequestMeta.parse({"agent_id": 7, "agent_cost": -1, "request_cost": "x", "other": 1}, "r9")
    assert bad == RequestMeta("7")
    assert "r9: agent_cost=-1" in caplog.text and "r9: request_cost='x'" in caplog.text


def test_front_end_tagging_takes_only_policies_with_static_keys():
    core = AgentScheduler.for_policy("justitia", 100.0)
    book = AgentBook(core)
    info, priority = book.tag("r1", RequestMeta("a", agent_cost=250.0), 10, 4, now_s=0.0)
    assert priority == 250 and len(core) == 0  # the engine queues it, not the book
    assert book.agent("a").open_requests == 1 and book.request("r1") is info
    for dynamic in ("vtc", "srjf", "las"):
        with pytest.raises(ValueError, match="front-end tagging supports only fcfs, sjf, parrot, justitia"):
            AgentBook.tagging(dynamic, 100.0)
    with pytest.raises(ValueError, match="unknown policy"):
        AgentBook.tagging("magic", 100.0)


def test_fairness_reports_the_distribution_of_delays_against_the_reference():
    from justitia.lab.metrics import fairness

    reference = {f"a{i}": 10.0 for i in range(100)}
    other = {f"a{i}": 10.0 * (1 + (i - 49) / 100) for i in range(100)}  # -49 % ... +50 %
    f = fairness(reference, other)
    assert f["not_delayed_frac"] == 0.5 and f["max_delay"] == pytest.approx(0.5)
    assert f["delay_p50"] == pytest.approx(0.005) and f["delay_p90"] == pytest.approx(0.401)
    assert f["delay_p99"] == pytest.approx(0.4901)


def _step_requests(draw_rows):
    """Fake vLLM requests after a step was scheduled (vLLM has added the step's tokens already)."""
    from types import SimpleNamespace

    requests, scheduled, infos = {}, {}, {}
    for i, (prompt, out, computed_before, n, owner) in enumerate(draw_rows):
        seq = prompt + out
        computed_before, n = min(computed_before, seq - 1), max(1, min(n, seq - min(computed_before, seq - 1)))
        rid = f"r{i}"
        requests[rid] = SimpleNamespace(
            num_computed_tokens=computed_before + n, num_tokens=seq, num_output_tokens=out, num_prompt_tokens=prompt
        )
        scheduled[rid] = n
        if owner is not None:
            infos[rid] = SimpleNamespace(agent_id=f"a{owner}")
    return requests, scheduled, infos


_rows = st.lists(
    st.tuples(
        st.integers(1, 300),
        st.integers(0, 40),
        st.integers(0, 340),
        st.integers(1, 300),
        st.one_of(st.none(), st.integers(0, 3)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_rows)
def test_a_steps_sums_are_charge_step_tokens_added_up(rows):
    """The per-step loops an engine runs (the clock's meter, the dynamic policies' charges) give
    what ``Charge.step_tokens`` gives request by request, added up: one rule for a step's service."""
    from justitia.vllm.accounting import StepDelivered, prefill_attention, step_charges, step_delivered

    requests, scheduled, infos = _step_requests(rows)
    p = d = kv = prefills = ctx = 0
    per_agent: dict[str, list[int]] = {}
    for rid, n in scheduled.items():
        r = requests[rid]
        tp, td, tkv = Charge.step_tokens(r.num_computed_tokens - n, n, r.num_tokens, r.num_output_tokens)
        p += tp
        if td:
            d, kv = d + 1, kv + tkv
        prefills, ctx = (prefills + 1, ctx) if tp else (prefills, ctx + tkv)
        if rid in infos:
            total = per_agent.setdefault(infos[rid].agent_id, [0, 0, 0])
            total[0], total[1], total[2] = total[0] + tp, total[1] + td, total[2] + tkv
    assert step_delivered(requests, scheduled) == StepDelivered(p, d, kv, prefills, ctx)
    # a step log's attention pairs: each prefill token attends to the tokens before it and itself
    pairs = sum(
        sum(range(r.num_computed_tokens - n + 1, r.num_computed_tokens + 1))
        for rid, n in scheduled.items()
        if Charge.step_tokens((r := requests[rid]).num_computed_tokens - n, n, r.num_tokens, r.num_output_tokens)[0]
    )
    assert prefill_attention(requests, scheduled) == pairs
    charged = step_charges(requests, scheduled, infos.get)
    assert {a: row[1:] for a, row in charged.items()} == per_agent
    assert all(row[0].agent_id == a for a, row in charged.items())


def test_the_registry_builds_each_name_and_declares_the_events_each_class_reads():
    # one registry (core.policies.POLICIES): each name builds its class; the traits an engine reads
    # are declared, and each declaration matches what the class defines
    from justitia.core import POLICIES, Policy, make_policy

    for name, entry in POLICIES.items():
        pol = make_policy(name, 1000.0)
        assert type(pol) is entry.cls and pol.name == name or name == "justitia-chained"
        for trait, method in (("reads_service", "charge"), ("revises", "revise"), ("lifts_on_backlog", "backlogged")):
            defined = getattr(entry.cls, method) is not getattr(Policy, method)
            assert getattr(entry.cls, trait) == defined, (name, trait)


def test_the_design_doc_and_the_command_line_list_every_policy(monkeypatch):
    import re
    from pathlib import Path

    from justitia.cli import main
    from justitia.core import POLICIES

    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    table = set(re.findall(r"^\| ([a-z-]+) \| (?:request|agent) \|", design, re.M))
    assert table == set(POLICIES), table ^ set(POLICIES)
    import contextlib
    import io

    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width: one line each
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["bench", "--help"])
    text = out.getvalue()
    assert all(name in text for name in POLICIES), [n for n in POLICIES if n not in text]
