"""Fairness you can see (docs/design.md, "What the server shows"): the engine's per-tenant ledger,
the server's window over it (``server.observe.Watch``), ``/metrics``' tenant series with a bounded
cardinality, and the live page's state with what each key may see."""

from __future__ import annotations

import asyncio
import math

import pytest
from inprocess import RecordingBackend, app_opener, auth, settle

from justitia.core import AgentBook, AgentScheduler, Charge, PolicyState, RequestMeta
from justitia.core.ledger import MAX_TYPES
from justitia.server.observe import Watch


def test_a_tenants_service_settles_across_turns_and_each_burst_lands_in_its_own_histogram():
    core = AgentScheduler.for_policy("justitia", 100.0)
    book = AgentBook(core)
    info, _ = book.arrive(
        "r1", RequestMeta("s", agent_type="chat", tenant="t", agent_cost=50.0, session=True), 10, 10, 0.0
    )
    core.charge(info, Charge(10, 10, 200))
    book.finish("r1", 3.0)
    assert book.pause("s", 3.0)  # the turn ends: its service settles, its time is a turn's
    info, _ = book.arrive(
        "r2", RequestMeta("a", agent_type="batch", tenant="t", agent_cost=10.0, agent_done=True), 10, 10, 4.0
    )
    core.charge(info, Charge(10, 10, 40))
    state = book.state(5.0, detail=True)
    t = state.tenants["t"]
    assert t["service"] == 240  # 200 settled by the turn, 40 of the agent still in flight
    assert t["bursts"] == {"turn": 1, "agent": 0} and t["burst_sum_s"]["turn"] == 3.0
    assert t["sessions"] == 1 and t["agents"] == 1 and t["requests"] == 1
    assert [a["agent_id"] for a in state.head] == ["a"]  # the paused session holds no place in the queue
    book.finish("r2", 6.0)  # its last request: released
    t = book.state(7.0, detail=True).tenants["t"]
    assert t["service"] == 240 and t["bursts"] == {"turn": 1, "agent": 1} and t["burst_sum_s"]["agent"] == 2.0
    errors = book.state(7.0, detail=True).errors  # log2(attained / predicted): 200/50 and 40/10, two whole steps
    assert errors["chat"][1] == 2.0 and errors["batch"][1] == 2.0


def test_a_burst_past_the_bound_counts_only_once_a_bound_is_given_and_types_are_bounded():
    core = AgentScheduler.for_policy("justitia", 10.0)
    book = AgentBook(core)
    for k, (agent, bound) in enumerate((("early", None), ("judged", 1.0))):
        if bound is not None:
            book.state(100.0 * k, detail=True, bound_s=bound)
        info, _ = book.arrive(f"r{k}", RequestMeta(agent, tenant="t", agent_cost=1.0, agent_done=True), 1, 1, 100.0 * k)
        core.charge(info, Charge(1, 1, 1))
        book.state(100.0 * k + 10.0, detail=True)  # a reading finds GPS done with it (a cost of 1 at M=10: 0.1 s)
        book.finish(f"r{k}", 100.0 * k + 50.0)  # 50 s after its arrival: 40 s past it as read, far past the bound
    assert book.state(160.0, detail=True).tenants["t"]["violations"] == 1  # the first ended before any bound
    for k in range(MAX_TYPES + 5):  # a type is a client's word: the histograms stop at MAX_TYPES, then "other"
        info, _ = book.arrive(
            f"x{k}", RequestMeta(f"x{k}", agent_type=f"type-{k}", agent_cost=1.0, agent_done=True), 1, 1, 200.0 + 2 * k
        )
        core.charge(info, Charge(1, 1, 1))
        book.finish(f"x{k}", 201.0 + 2 * k)
    errors = book.state(400.0, detail=True).errors
    assert len(errors) == MAX_TYPES + 1 and "other" in errors  # MAX_TYPES named, the rest as one


class Readings:
    """A backend whose state is a script of readings: tenant -> (service so far, requests, weight)."""

    def __init__(self, script):
        self.script, self.calls, self.bounds = list(script), 0, []

    async def state(self, detail=False, bound_s=None):
        self.bounds.append(bound_s)
        rows = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return PolicyState(
            "justitia",
            len(rows),
            1.0,
            len(rows),
            100.0,
            None,
            {
                n: {"service": s, "requests": r, "weight": w, "price_max": 300.0, "late_s": 1.0, "violations": 0}
                for n, (s, r, w) in rows.items()
            },
            [],
            {},
        )


def _read_all(watch: Watch, n: int) -> None:
    async def go():
        for _ in range(n):
            await watch.read()

    asyncio.run(go())


def test_the_window_gives_each_tenant_its_share_against_its_weighted_share_while_backlogged():
    script = [{"a": (300 * k, 1, 3.0), "b": (100 * k, 1, 1.0), "idle": (50, 0, 1.0)} for k in range(5)]
    young = Watch(Readings(script), "tiny", max_model_len=100, every_s=0.0)
    _read_all(young, 5)  # readings that do not cover the window yet: shares since the engine started
    assert {r["tenant"]: r["share"] for r in young.tenants()} == pytest.approx(
        {"a": 1200 / 1650, "b": 400 / 1650, "idle": 50 / 1650}
    )
    watch = Watch(Readings(script), "tiny", max_model_len=100, window_s=0.0, every_s=0.0)
    _read_all(watch, 5)  # a window the readings cover: what was attained between them
    rows = {r["tenant"]: r for r in watch.tenants()}
    assert rows["a"]["share"] == pytest.approx(0.75) and rows["a"]["fair_share"] == pytest.approx(0.75)
    assert rows["b"]["share"] == pytest.approx(0.25) and rows["b"]["fair_share"] == pytest.approx(0.25)
    assert rows["idle"]["share"] == 0 and rows["idle"]["fair_share"] is None  # never backlogged
    bound = 2 * 100 * 0.02 + 300.0 / 100.0  # 2 c_max + C_max / M
    assert watch.doc()["bound_s"] == pytest.approx(bound) and rows["a"]["margin_s"] == pytest.approx(bound - 1.0)
    assert watch.backend.bounds[-1] == pytest.approx(bound)  # the engine judges bursts by it


def test_metrics_name_only_the_busiest_tenants_and_escape_their_names():
    script = [
        {f"t{k}": (10.0 * k * i, 1, 1.0) for k in range(30)} | {'we"ird\\name': (1e6 * i, 1, 1.0)} for i in range(3)
    ]
    watch = Watch(Readings(script), "tiny", max_model_len=100, top=3, every_s=0.0)
    _read_all(watch, 3)
    text = "\n".join(watch.metric_lines())
    named = {
        line.split('tenant="')[1].split('"}')[0]
        for line in text.splitlines()
        if line.startswith("justitia_tenant_service_total{")
    }
    assert named == {'we\\"ird\\\\name', "t29", "t28", "other"}
    other = next(
        line
        for line in text.splitlines()
        if line.startswith('justitia_tenant_service_total{model_name="tiny",tenant="other"')
    )
    assert float(other.split()[-1]) == pytest.approx(sum(10.0 * k * 2 for k in range(28)))  # the other 27 (t0 has 0)
    assert 'justitia_bound_seconds{model_name="tiny"}' in text


KEYS = "sk-alpha-00000001 alpha 3\nsk-beta-000000002 beta 1\nsk-ops-0000000003 ops 1 admin\n"


@pytest.fixture
def keyed(tmp_path):
    from justitia.server.agents import Settings

    with app_opener(tmp_path, KEYS) as opener:
        yield opener(RecordingBackend(), Settings())


def _agent(client, key: str) -> None:
    body = {"type": "t", "stages": [{"tasks": [{"prompt": "one two three", "max_tokens": 4}]}]}
    doc = client.post("/v1/agents", json=body, headers=auth(key)).json()
    settle(client, doc["agent_id"], key)


def test_the_live_state_shows_a_key_its_own_tenant_and_an_admin_every_tenant(keyed):
    _agent(keyed, "sk-alpha-00000001")
    _agent(keyed, "sk-beta-000000002")
    assert keyed.get("/justitia/state").status_code == 401  # a keyed server: the state needs a key
    mine = keyed.get("/justitia/state", headers=auth("sk-alpha-00000001")).json()
    assert [t["tenant"] for t in mine["tenants"]] == ["alpha"] and mine["tenants"][0]["weight"] == 3.0
    every = keyed.get("/justitia/state", headers=auth("sk-ops-0000000003")).json()
    assert {t["tenant"] for t in every["tenants"]} == {"alpha", "beta"}
    assert every["clock"]["capacity_per_s"] == 1000.0 and every["policy"] == "justitia"
    page = keyed.get("/justitia")  # the page itself is open: it asks for a key
    assert page.status_code == 200 and "/justitia/state" in page.text
    metrics = keyed.get("/metrics").text
    assert 'justitia_tenant_agent_seconds_count{model_name="tiny",tenant="alpha"} 1' in metrics
    assert 'justitia_tenant_weight{model_name="tiny",tenant="beta"} 1' in metrics
    assert math.isfinite(
        float(
            next(line for line in metrics.splitlines() if line.startswith("justitia_bound_violations_total")).split()[
                -1
            ]
        )
    )


def test_a_front_end_that_tags_requests_credits_each_tenant_with_what_came_back():
    """--upstream and --ray: no engine here charges service, so each request that comes back is
    credited at its tokens (p*d + d^2/2), and its agent's figures settle when it ends."""
    from justitia.backends.tagging import Tagger

    tagger = Tagger("justitia", 1000.0)
    tagger.tag("r1", RequestMeta("a", tenant="x", agent_cost=10.0, agent_done=True), 10, 64, 0.0)
    tagger.tag("r2", RequestMeta("b", tenant="y", agent_cost=10.0), 20, 64, 0.0)
    tagger.finish("r1", 1.0, 4)  # a's last request: released, settled at 10*4 + 4*4/2
    tagger.finish("r2", 1.0, 2)  # b stays until its idle release: in flight at 20*2 + 2*2/2
    tenants = tagger.book.state(2.0, detail=True).tenants
    assert tenants["x"]["service"] == 48 and tenants["x"]["bursts"]["agent"] == 1
    assert tenants["y"]["service"] == 42 and tenants["y"]["agents"] == 1


def test_the_prefix_cache_hits_the_engine_reports_are_counted_per_tenant_and_in_all():
    core = AgentScheduler.for_policy("justitia", 100.0)
    book = AgentBook(core)
    for k, (tenant, prompt, cached) in enumerate((("t", 300, 256), ("t", 100, 0), ("u", 200, 128), ("u", 50, None))):
        book.arrive(f"r{k}", RequestMeta(f"a{k}", tenant=tenant, agent_cost=1.0, agent_done=True), prompt, 1, float(k))
        book.finish(f"r{k}", k + 0.5, cached_tokens=cached)  # None: never scheduled, no lookup to count
    book.arrive("r9", RequestMeta("a9", tenant="u", agent_cost=1.0, agent_done=True), 10, 1, 9.0)
    book.finish("r9", 9.5, cached_tokens=10_000)  # a report above the prompt counts as the whole prompt
    t = book.state(10.0, detail=True).tenants
    assert (t["t"]["prompt_tokens"], t["t"]["cached_tokens"]) == (400, 256)
    assert (t["u"]["prompt_tokens"], t["u"]["cached_tokens"]) == (210, 138)

    class Book:
        async def state(self, detail=False, bound_s=None):
            return book.state(10.0, detail, bound_s)

    watch = Watch(Book(), "tiny", max_model_len=100, every_s=0.0)
    _read_all(watch, 1)
    rows = {r["tenant"]: r for r in watch.doc()["tenants"]}
    assert rows["t"]["cache_hit_rate"] == pytest.approx(256 / 400) and rows["u"]["cache_hit_rate"] == pytest.approx(
        138 / 210
    )
    text = "\n".join(watch.metric_lines())
    assert 'justitia_prefix_cache_queries_total{model_name="tiny"} 610' in text
    assert 'justitia_prefix_cache_hits_total{model_name="tiny"} 394' in text
    assert 'justitia_tenant_prefix_cache_hits_total{model_name="tiny",tenant="u"} 138' in text


def test_the_scrape_bench_judges_the_read_bursts_against_the_unread_ones_of_the_same_round(capsys):
    from justitia.lab.costs.bench_scrape import PHASES, report

    slow = [10.0, 20.0, 10.0, 20.0, 10.0]  # the machine's pace moves from round to round; the ratio does not
    doc = {
        "requests_per_s": {PHASES[0]: [0.9 * r for r in slow], PHASES[1]: slow, PHASES[2]: [1.02 * r for r in slow]},
        "scrape_s": [0.004, 0.002, 0.003],
    }
    report(doc)
    out = capsys.readouterr().out
    assert "median 0.891 (quartiles 0.891-0.891, 5 rounds)" in out  # 0.9 / mean(1, 1.02)
    assert "the bench's own spread): median 1.020" in out and "3 scrapes: p50 3.0 ms" in out
