"""Prices that are distributions: the Gittins index (core.gittins), its place inside the GPS clock,
the ``online`` predictor that learns them from the run's own traffic, and the baselines a user
would pick instead (las-turn, las-decay)."""

import json
import math
import threading
import time
import zlib

import numpy as np
import pytest
from helpers import agent, engine, task_parallel_agents
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.core import KV, AgentScheduler, Charge, CostDist, Registration, make_policy
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.predictors import OnlinePredictor, make_predictor
from justitia.predictors.base import OraclePredictor
from justitia.sim import Simulator
from justitia.workload import Agent, Task

Z = [-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341]


def lognormal(center: float, sd: float) -> CostDist:
    return CostDist.from_samples([center * math.exp(sd * z) for z in Z])


# ------------------------------------------------------------------------------- the index
def test_a_known_cost_is_the_papers_tag_whatever_was_attained():
    d = CostDist.known(1000.0)
    assert [d.index(a) for a in (0, 1, 500, 999)] == [1000.0] * 4


def test_a_heavy_tail_moves_back_as_service_is_attained_without_finishing():
    d = lognormal(1000.0, 2.0)
    levels = [0.0] + list(d.values[:-1])
    indices = [d.index(a) for a in levels]
    assert indices[0] < d.mean  # a wide price starts low: most bursts are short
    assert all(b > a for a, b in zip(indices, indices[1:]))  # LAS-like: the longer it runs, the further back
    assert d.index(d.top * 3) == d.top * 3  # past its distribution: its attained service, GPS's pace


def test_the_index_never_runs_more_than_its_arrival_price_past_what_was_attained():
    d = lognormal(1000.0, 2.5)
    for a in np.linspace(0, d.top, 50):
        assert a <= d.index(a) <= a + d.index(0) + 1e-9


@pytest.mark.parametrize(
    "values, probs",
    [
        ((), ()),
        ((1.0, 2.0), (1.0,)),
        ((2.0, 1.0), (0.5, 0.5)),
        ((1.0, math.inf), (0.5, 0.5)),
        ((1.0,), (0.5,)),
        ((-1.0,), (1.0,)),
    ],
)
def test_a_malformed_distribution_is_refused(values, probs):
    with pytest.raises(ValueError):
        CostDist(values, probs)


# ----------------------------------------------------------------------- inside the clock
def test_a_known_distribution_stamps_the_tag_a_point_price_does():
    a, b = (AgentScheduler.for_policy("justitia", 1000.0) for _ in range(2))
    a.agent_arrived(Registration("x", "t", 5000.0), 0.0)
    b.agent_arrived(Registration("x", "t", 0.0, dist=CostDist.known(5000.0)), 0.0)
    assert a.agent("x").virtual_finish == b.agent("x").virtual_finish == 5000.0


def test_service_past_an_atom_reprices_the_tag_anchored_at_its_start():
    core = AgentScheduler.for_policy("justitia", 1000.0)
    d = CostDist((100.0, 10_000.0), (0.5, 0.5))
    core.agent_arrived(Registration("x", "t", 0.0, dist=d), 0.0)
    first = core.agent("x").virtual_finish
    req = core.request_arrived("x/0", "x", 10, 1.0, 0.0)
    core.charge(req, Charge(10, 0, 150), 50.0)  # past the first atom, long after it arrived
    tag = core.agent("x").virtual_finish
    assert first == d.index(0) and tag == pytest.approx(d.index(150))  # S + index, S = 0: not V(now) + ...
    assert tag > first


def test_repricing_needs_retagging():
    core = AgentScheduler.for_policy("justitia", 1000.0, retag=False)
    d = CostDist((100.0, 10_000.0), (0.5, 0.5))
    core.agent_arrived(Registration("x", "t", 0.0, dist=d), 0.0)
    req = core.request_arrived("x/0", "x", 10, 1.0, 0.0)
    core.charge(req, Charge(10, 0, 150), 5.0)
    assert core.agent("x").virtual_finish == d.index(0)


class NoisyDistributions(OraclePredictor):
    """Each agent's price: a wide lognormal around its true cost times a seeded factor of up to 4x."""

    name = "noisy-dist"

    def agent_dist(self, a, model):
        rng = np.random.default_rng(zlib.crc32(a.agent_id.encode()))
        return lognormal(a.cost(model) * math.exp(rng.uniform(-math.log(4), math.log(4))), 1.5)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), blocks=st.integers(90, 200), n=st.integers(2, 40))
def test_agents_priced_by_uncertain_distributions_stay_within_the_bound_of_their_true_work(seed, blocks, n):
    # the same workloads as test_bound's (requests under a quarter of the cache), each agent priced
    # by a distribution whose center is off by up to 4x; the GPS reference runs on the true work
    # (docs/design.md, "Prices that are distributions": B plus the time GPS takes to serve the price
    # at arrival P_j beyond j's true work, at most P_j N_max / M)
    agents = task_parallel_agents(np.random.default_rng(seed), n)
    cfg = engine(blocks=blocks, budget=512, seqs=256)
    m = cfg.capacity_per_s("kv")
    res = Simulator(cfg, make_policy("justitia", m), NoisyDistributions()).run(agents)
    gps = gps_finish_times(agents, m)
    bound = delay_bound_s(agents, cfg)
    spans = [(a.arrival_s, gps[a.agent_id]) for a in agents]
    n_max = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    late = {
        a.agent_id: a.finish_s - gps[a.agent_id] - bound - a.predicted_cost * n_max / m
        for a in res.agents
        if a.finish_s > gps[a.agent_id] + bound + a.predicted_cost * n_max / m
    }
    assert not late, f"agents over the {bound:.2f} s bound (+ P N_max / M) by: {late}"


def test_uncertain_prices_still_pamper_the_small_agents():
    # ten large agents and ten small ones at once, every price off by up to 4x and wide: the small
    # ones still finish first on average (FCFS would serve them in arrival order, interleaved)
    agents = []
    for i in range(20):
        big = i % 2 == 0
        agents.append(agent(f"a{i:02d}", 0.001 * i, [(150, 120)] * (10 if big else 1)))
    cfg = engine(blocks=60, budget=512)
    res = Simulator(cfg, make_policy("justitia", cfg.capacity_per_s("kv")), NoisyDistributions()).run(agents)
    small = np.mean([a.finish_s for a in res.agents if int(a.agent_id[1:]) % 2])
    large = np.mean([a.finish_s for a in res.agents if not int(a.agent_id[1:]) % 2])
    assert small < 0.5 * large


# ---------------------------------------------------------------------------- online
def typed(agent_id, kind, prompt, tasks, output, tenant=None, arrival=0.0):
    return Agent(agent_id, kind, arrival, ((Task(f"{kind} task {agent_id}", prompt, output),) * tasks,), tenant=tenant)


def test_online_learns_a_types_cost_from_the_agents_that_finished():
    pred = make_predictor("online")
    probe = typed("probe", "long", 200, 4, 400)
    before = pred.agent_dist(probe, KV)
    for i in range(30):
        a = typed(f"a{i}", "long", 200, 4, 400)
        pred.learn(a, a.cost(KV))
    after = pred.agent_dist(probe, KV)
    true = probe.cost(KV)
    median = lambda d: d.values[len(d.values) // 2]  # noqa: E731
    assert abs(math.log(median(after) / true)) < 0.2 < abs(math.log(median(before) / true))
    assert after.top / after.values[0] < before.top / before.values[0]  # and it is surer of it


def test_one_tenants_traffic_does_not_move_another_tenants_prices():
    pred = make_predictor("online")
    mine = typed("m", "t", 100, 2, 50, tenant="me")
    before = pred.agent_dist(mine, KV)
    for i in range(40):  # another tenant's agents of the same type report a thousand times more
        a = typed(f"x{i}", "t", 100, 2, 50, tenant="other")
        pred.learn(a, a.cost(KV) * 1000)
    assert pred.agent_dist(mine, KV) == before
    assert pred.agent_dist(typed("o", "t", 100, 2, 50, tenant="other"), KV).values[0] > before.top


def test_running_agents_past_their_price_raise_the_next_ones():
    pred = make_predictor("online")
    first = [typed(f"r{i}", "slow", 100, 1, 20) for i in range(5)]
    base = pred.agent_dist(typed("n0", "slow", 100, 1, 20), KV)
    for a in first:
        d = pred.agent_dist(a, KV)
        pred.progress(a, d.top * 5)  # still running, already 5x its top
    raised = pred.agent_dist(typed("n1", "slow", 100, 1, 20), KV)
    assert raised.top > base.top and raised.values[0] == base.values[0]  # the upper half moves, not the lower
    assert pred._running[("agent", "", "slow")].lift() > 0
    for a in first:
        pred.learn(a, a.cost(KV))  # they finish: the lift goes with them (what they cost is learned instead)
    assert pred._running[("agent", "", "slow")].lift() == 0


def test_online_memory_is_bounded(monkeypatch):
    from justitia.predictors import online

    monkeypatch.setattr(online, "MAX_MODELS", 8)
    pred = make_predictor("online")
    for i in range(200):  # 200 types: a client controls the type name
        a = typed(f"a{i}", f"type-{i}", 50, 1, 10)
        pred.agent_dist(a, KV)
        pred.learn(a, a.cost(KV))
    assert len(pred._models) <= 8 and len(pred._running) <= 8
    for m in pred._models.values():
        assert len(m.ys) <= online.WINDOW


def test_a_tenant_inventing_type_names_evicts_only_its_own_models(tmp_path):
    """Tenant a's client invents thousands of type names: a keeps at most its share, tenant b's
    model (learned first, the least recently used of all) stays, and so it does after a restart."""
    from justitia.predictors import online

    pred = make_predictor("online")
    for i in range(10):
        b = typed(f"b{i}", "t", 100, 2, 50, tenant="b")
        pred.agent_dist(b, KV)
        pred.learn(b, b.cost(KV))
    learned = pred._models[("agent", "b", "t")]
    for i in range(online.MAX_MODELS + 500):
        a = typed(f"a{i}", f"type-{i}", 50, 1, 10, tenant="a")
        pred.agent_dist(a, KV)
        pred.learn(a, a.cost(KV))
    assert pred._models.get(("agent", "b", "t")) is learned and ("agent", "b", "t") in dict(pred._running.items())
    for store in (pred._models, pred._running):
        assert sum(1 for key, _ in store.items() if key[1] == "a") == online.MAX_MODELS_PER_TENANT
    pred.save(tmp_path / "online.json")
    again = make_predictor("online")
    again.load(tmp_path / "online.json")
    assert list(again._models[("agent", "b", "t")].ys) == list(learned.ys)


def test_what_online_learned_survives_a_restart(tmp_path):
    pred = make_predictor("online")
    for i in range(20):
        a = typed(f"a{i}", "t", 120, 3, 90 + i)
        pred.learn(a, a.cost(KV))
    probe = typed("p", "t", 120, 3, 100)
    path = tmp_path / "online.json"
    pred.save(path)
    again = make_predictor("online")
    assert again.load(path) and again.observations_loaded == 20
    assert again.agent_dist(probe, KV) == pred.agent_dist(probe, KV)
    assert make_predictor("online").agent_dist(probe, KV) != pred.agent_dist(probe, KV)


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"schema": "x"},
        {"schema": "justitia.online/1", "models": [], "offsets": [{}]},
        {
            "schema": "justitia.online/1",
            "offsets": [],
            "models": [{"kind": "agent", "tenant": "", "type": "t", "xs": [[1, 2]], "ys": [1, 2]}],
        },
        {
            "schema": "justitia.online/1",
            "offsets": [],
            "models": [{"kind": "agent", "tenant": "", "type": "t", "xs": [[1]], "ys": ["nan"]}],
        },
    ],
)
def test_a_damaged_state_is_refused(doc):
    with pytest.raises(ValueError):
        make_predictor("online").load_state(json.loads(json.dumps(doc)))


def test_a_damaged_state_file_is_set_aside_and_the_server_starts_cold(tmp_path):
    from justitia.server.learning import server_predictor

    path = tmp_path / "state.online.json"
    path.write_text("{not json")
    pred = server_predictor("online", path)
    try:
        assert isinstance(pred, OnlinePredictor) and pred.observations == 0
        assert (tmp_path / "state.online.json.bad").exists()
    finally:
        pred.close()


def test_background_refits_never_hold_up_pricing(monkeypatch):
    from justitia.predictors import online

    entered, release = threading.Event(), threading.Event()
    real = online._fit

    def slow_fit(*args):
        entered.set()
        release.wait(5)
        return real(*args)

    monkeypatch.setattr(online, "_fit", slow_fit)
    pred = online.OnlinePredictor(background=True)
    try:
        for i in range(online.MIN_FIT + online.REFIT_EVERY):
            a = typed(f"a{i}", "t", 100, 2, 40)
            pred.learn(a, a.cost(KV))  # returns at once: the worker learns
        assert entered.wait(5)  # a refit is running, and stays blocked...
        t0 = time.perf_counter()
        for i in range(100):  # ...while prices keep coming from the last fit
            pred.agent_dist(typed(f"p{i}", "t", 100, 2, 40), KV)
        assert time.perf_counter() - t0 < 1.0
    finally:
        release.set()
        assert pred.flush()
        pred.close()
    assert pred.refits >= 1


def test_the_bench_learns_only_from_what_finished_earlier_in_the_run():
    # agents arrive every 5 s and each takes well under that: every later one is priced with all
    # the earlier ones learned, and none with its own
    agents = [typed(f"a{i:02d}", "t", 100, 2, 30, arrival=5.0 * i) for i in range(12)]
    pred = make_predictor("online")
    seen = []
    real = pred.agent_dist

    def spy(a, model):
        seen.append((a.agent_id, pred.observations))
        return real(a, model)

    pred.agent_dist = spy
    cfg = engine(blocks=64, budget=512)
    Simulator(cfg, make_policy("justitia", cfg.capacity_per_s("kv")), pred).run(agents)
    assert seen == [(f"a{i:02d}", i) for i in range(12)]


# ------------------------------------------------------------------------- baselines
def test_las_turn_starts_each_turn_afresh_where_las_remembers_the_session():
    for name, fresh in (("las-turn", True), ("las", False)):
        core = AgentScheduler.for_policy(name)
        core.agent_arrived(Registration("s", "t", 1.0, session=True), 0.0)
        core.agent_arrived(Registration("o", "t", 1.0), 0.0)
        req = core.request_arrived("s/0", "s", 10, 1.0, 0.0)
        core.charge(req, Charge(10, 5, 500))
        core.request_finished(req)
        core.agent_finished("s", 1.0, pause=True)
        core.agent_arrived(Registration("s", "t", 1.0), 2.0)  # its next turn
        other = core.request_arrived("o/0", "o", 10, 1.0, 2.0)
        core.charge(other, Charge(10, 1, 100))
        core.request_arrived("s/1", "s", 10, 1.0, 2.0)
        assert (core.peek().agent_id == "s") is fresh


def test_las_decay_forgets_service_long_past_as_llm_d_does():
    core = AgentScheduler.for_policy("las-decay")
    core.agent_arrived(Registration("old", "t", 1.0), 0.0)
    r = core.request_arrived("old/0", "old", 10, 1.0, 0.0)
    core.charge(r, Charge(1000, 0, 0))  # 1,000 weighted tokens at t = 0
    core.request_finished(r)
    core.agent_arrived(Registration("new", "t", 1.0), 600.0)  # ten half-lives later
    r2 = core.request_arrived("new/0", "new", 10, 1.0, 600.0)
    core.charge(r2, Charge(10, 0, 0))  # 10 tokens now: more than what is left of the 1,000
    core.request_arrived("old/1", "old", 10, 1.0, 600.0)
    assert core.peek().agent_id == "old"
    # under plain LAS the old agent's 1,000 tokens count in full
    las = AgentScheduler.for_policy("las", cost="compute")
    for a, t in (("old", 0.0), ("new", 600.0)):
        las.agent_arrived(Registration(a, "t", 1.0), t)
    las.charge(las.request_arrived("old/0", "old", 10, 1.0, 0.0), Charge(1000, 0, 0))
    las.charge(las.request_arrived("new/0", "new", 10, 1.0, 600.0), Charge(10, 0, 0))
    las.request_arrived("old/1", "old", 10, 1.0, 600.0)
    assert las.peek().agent_id == "new"


# ------------------------------------------------------------------- --preset --predictor
def test_a_presets_oracle_runs_take_the_predictor_asked_for():
    from justitia.cli.bench import with_predictor
    from justitia.lab.presets import make_preset

    preset = make_preset("starvation")
    specs = with_predictor(preset, "online")
    assert [s.label for s in specs] == [s.label for s in preset.specs]
    assert {s.predictor for s in specs} == {"online"}


@pytest.mark.parametrize("name", ["noise", "sessions-choices"])
def test_a_preset_that_compares_predictors_refuses_another_naming_why(name):
    from justitia.cli.bench import with_predictor
    from justitia.lab.presets import make_preset

    with pytest.raises(ValueError, match=f"preset '{name}' compares predictors itself"):
        with_predictor(make_preset(name), "online")


def test_a_bad_predictor_fails_before_the_preset_runs():
    from justitia.cli.bench import with_predictor
    from justitia.lab.presets import make_preset

    with pytest.raises(ValueError, match="unknown predictor"):
        with_predictor(make_preset("starvation"), "no-such")
    with pytest.raises(ValueError, match="must not read the true cost"):
        with_predictor(make_preset("starvation"), "online:oracle")


def test_a_server_keeps_what_online_learned_and_reloads_it(tmp_path):
    from justitia.server.learning import SAVE_EVERY, server_predictor

    path = tmp_path / "serve.online.json"
    pred = server_predictor("online", path)
    try:
        for i in range(SAVE_EVERY + 1):
            a = typed(f"a{i}", "t", 100, 2, 40 + i % 7)
            pred.learn(a, a.cost(KV))  # the worker learns it, and saves once SAVE_EVERY are in
        assert pred.flush()
    finally:
        pred.close()
    assert path.is_file()
    again = server_predictor("online", path)
    try:
        assert again.observations_loaded >= SAVE_EVERY
        probe = typed("p", "t", 100, 2, 43)
        assert again.agent_dist(probe, KV) != make_predictor("online").agent_dist(probe, KV)
    finally:
        again.close()


def test_a_burst_without_a_price_is_priced_by_what_its_max_tokens_allows_and_moves_back_as_it_runs():
    # the plug-in's book: a harness turn that names a session but no price (Claude Code asks for
    # max_tokens 32,000) was priced as if it would write all of them; now as a distribution of its
    # answer's length up to that, a short answer first, moved back as the engine charges it
    from justitia.core import AgentBook, RequestMeta

    core = AgentScheduler.for_policy("justitia", 1e6)
    book = AgentBook(core)
    meta = RequestMeta("s", "chat", None, None, False, session=True)
    info, new = book.arrive("r0", meta, 20_000, 32_000, 0.0)
    point = KV.request_cost(20_000, 32_000)
    assert new.dist is not None and new.dist.top == point
    first = book.virtual_finish("s")
    assert first < 0.01 * point  # not the whole of max_tokens
    core.charge(info, Charge(20_000, 100, KV.request_cost(20_000, 100)), 1.0)
    assert book.virtual_finish("s") > first  # it wrote more than a short answer: it moves back
    tagging = AgentBook(AgentScheduler.for_policy("justitia", 1e6))
    tagging.tag("r0", meta, 20_000, 32_000, 0.0)  # a front end sees no service: the bound, as before
    assert tagging.agent("s").info.dist is None and tagging.virtual_finish("s") == point


def test_a_turn_is_learned_with_the_features_it_was_priced_with():
    from justitia.workload.sessions import generate_session

    session = generate_session("s", 0.0, np.random.default_rng(1))
    pred = make_predictor("online")
    pred.turn_dist(session, 0, [], KV)  # priced as it starts
    priced = pred._turn_features(session, 0, [], KV)
    for _ in range(3):  # other sessions' first turns finish meanwhile: the heuristic prior moves
        pred.observe_turn(session.type, 0, 1.0, 5e6)
    assert pred._turn_features(session, 0, [], KV) != priced
    pred.learn(session, 2e5, 0, [])
    assert list(pred._models[("turn", "", session.type)].xs)[-1] == priced


def test_a_state_learned_with_another_cold_start_is_refused():
    pred = make_predictor("online")
    a = typed("a", "t", 100, 2, 40)
    pred.learn(a, a.cost(KV))
    with pytest.raises(ValueError, match="cold start 'none'"):
        OnlinePredictor(None, prior_name="linear").load_state(pred.state())
