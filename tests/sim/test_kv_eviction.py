"""KV kept across tool pauses (tried in the simulator): the prefix cache's ``tag`` eviction rule
evicts first the free cached blocks of the sessions whose next tag comes last; both stepping modes
agree with it (docs/sessions.md, "KV kept across tool pauses")."""

from dataclasses import replace

import numpy as np
import pytest
from helpers import engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.core import AgentScheduler, Registration
from justitia.core.policies import POLICY_NAMES, make_policy
from justitia.lab.bench import RunSpec
from justitia.lab.studies.sessions import TAG_EVICTION_LABEL, sessions_specs
from justitia.predictors import make_predictor
from justitia.sim import EngineConfig, LatencyProfile, Simulator
from justitia.sim.prefix import PrefixCache
from justitia.sim.stepping import PlainRun, SimRequest
from justitia.workload import scale_tokens
from justitia.workload.sessions import build_sessions

BS = 16
LINEAR = LatencyProfile("lin", 1.0, 0.5, 0.01, 0.001, 1.3, 64, "tests: load-dependent latency")


def req(agent: str, text: str, blocks: int) -> SimRequest:
    """A request of ``agent`` whose prompt is ``blocks`` full blocks of its own text (one output token)."""
    return SimRequest(
        f"{agent}/{text}", agent, 1.0, blocks * BS, 1, runs=((text, blocks * BS), ((agent, text, "out"), 1))
    )


def freed(cache: PrefixCache, *reqs: SimRequest) -> None:
    """Each request caches its prompt's blocks and frees them, in this order."""
    for r in reqs:
        cache.hold(r, [])
        cache.cache_upto(r, r.prompt_tokens)
    for r in reqs:
        cache.release(r)


def left(cache: PrefixCache, r: SimRequest) -> int:
    """How many of ``r``'s prompt blocks are still cached."""
    return len(
        cache.lookup(SimRequest("probe", "probe", 1.0, r.prompt_tokens + 1, 1, runs=r.runs[:1] + (("probe", 2),)))
    )


def order(cache: PrefixCache, blocks: int) -> list[tuple]:
    """Evict one block at a time from a free queue holding only cached blocks; return (agent, key) of each."""
    out = []
    for _ in range(blocks):
        before = {id(b): b for b in cache.lru}
        cache.evict_for(1, free=len(cache.lru))
        (gone,) = [b for i, b in before.items() if i not in {id(x) for x in cache.lru}]
        out.append((gone.owner, gone.key))
    return out


def test_a_paused_session_with_a_late_tag_loses_its_blocks_before_one_with_an_early_tag():
    tags = {"early": 1.0, "late": 5.0}
    cache = PrefixCache(BS, "tag", tags.get)
    late, early = req("late", "L", 3), req("early", "E", 2)
    freed(cache, early, late)  # under LRU early's blocks would go first
    keys = {r.agent_id: [cache.key(cache.content(r), k) for k in range(r.prompt_tokens // BS)] for r in (late, early)}
    # late's first, then early's; within a session vLLM's order: the tail block first
    assert order(cache, 5) == [("late", k) for k in keys["late"][::-1]] + [("early", k) for k in keys["early"][::-1]]
    lru = PrefixCache(BS, "lru")
    late, early = req("late", "L", 3), req("early", "E", 2)
    freed(lru, early, late)
    lru.evict_for(2, free=5)
    assert left(lru, late) == 3 and left(lru, early) == 0


def test_the_tags_are_read_at_eviction_time():
    tags = {"a": 1.0, "b": 5.0}
    cache = PrefixCache(BS, "tag", tags.get)
    a, b = req("a", "A", 2), req("b", "B", 2)
    freed(cache, a, b)
    tags["a"] = 9.0  # a returned from its pause behind its earlier work: its next tag now comes last
    cache.evict_for(2, free=4)
    assert left(cache, a) == 0 and left(cache, b) == 2


def test_unknown_agents_blocks_go_first_then_unkeyed_before_any_cached():
    tags = {"late": 5.0}  # "gone" has finished: the core no longer knows it
    cache = PrefixCache(BS, "tag", tags.get)
    gone, late = req("gone", "G", 2), req("late", "L", 2)
    freed(cache, late, gone)
    cache.evict_for(3, free=4 + 3)  # three unkeyed free blocks go first: nothing evicted
    assert cache.evictions == 0
    cache.evict_for(5, free=4 + 3)  # two evicted: the unknown agent's, though freed last
    assert left(cache, gone) == 0 and left(cache, late) == 2
    assert cache.free_by_agent.keys() == {"late"}


def test_without_a_clock_the_rule_is_lru():
    """Every tag None (a policy without a clock): exactly vLLM's order, also after touches."""
    caches = [PrefixCache(BS, "lru"), PrefixCache(BS, "tag", lambda _a: None)]
    logs = [[], []]
    for cache, log in zip(caches, logs):
        rng = np.random.default_rng(0)
        reqs = [req(f"s{i % 4}", f"T{i}", int(rng.integers(1, 4))) for i in range(12)]
        freed(cache, *reqs[:8])
        hits = cache.lookup(
            SimRequest("x", "s9", 1.0, reqs[2].prompt_tokens + 1, 1, runs=reqs[2].runs[:1] + (("x", 2),))
        )
        cache.touch(hits)  # taken out of the free queue (and out of its agent's blocks)
        freed(cache, *reqs[8:])
        log += [(owner, key) for owner, key in order(cache, len(cache.lru))] if cache.eviction == "tag" else []
        if cache.eviction == "lru":
            log += [b.key for b in cache.lru]
    assert [k for _, k in logs[1]] == logs[0]


def test_the_session_is_the_agent_that_freed_the_block_last():
    tags = {"a": 1.0, "b": 5.0, "c": 3.0}
    cache = PrefixCache(BS, "tag", tags.get)
    a, c = req("a", "S", 2), req("c", "C", 2)
    freed(cache, a, c)
    b = SimRequest("b/S", "b", 1.0, 2 * BS + 1, 1, runs=(("S", 2 * BS), ("q", 1), (("b", "out"), 1)))
    hits = cache.lookup(b)  # b shares a's prompt: it holds a's two blocks, then frees them
    assert len(hits) == 2 and all(blk.owner == "a" for blk in hits)
    cache.touch(hits)
    cache.hold(b, hits)
    assert cache.free_by_agent.keys() == {"c"}
    cache.release(b)  # b freed them last: they are b's now (tag 5), evicted before c's (tag 3)
    assert all(blk.owner == "b" for blk in hits)
    cache.evict_for(2, free=4)
    assert left(cache, a) == 0 and left(cache, c) == 2


def test_a_finished_session_is_unknown_and_a_paused_one_keeps_its_tag_in_the_engine():
    cfg = replace(engine(blocks=8, budget=256), prefix_caching=True, kv_eviction="tag")
    core = AgentScheduler(make_policy("justitia", cfg.capacity_per_s("kv"), "kv"))
    e = PlainRun(cfg, core, lambda r: None)
    core.agent_arrived(Registration("early", "t", 100.0), 0.0)
    core.agent_arrived(Registration("late", "t", 10_000.0), 0.0)
    core.agent_arrived(Registration("next", "t", 10.0), 0.0)
    early, late = req("early", "E", 3), req("late", "L", 3)
    e.submit([late, early])
    while e.busy:
        e.advance()
    for agent in ("early", "late"):
        core.agent_finished(agent, e.now_ps / 1e12, pause=True)
    assert e.cache.next_tag("late") > e.cache.next_tag("early") is not None
    assert len(e.cache.lru) == 6 and e.free == 8
    nxt = req("next", "N", 4)  # 4 new blocks: 2 unkeyed free ones, then 2 evicted, late's
    e.submit([nxt])
    e.advance()
    assert left(e.cache, late) == 1 and left(e.cache, early) == 3
    core.agent_finished("early", e.now_ps / 1e12)  # done: its blocks are nobody's now, and go first
    assert e.cache.next_tag("early") is None


@pytest.mark.parametrize("rule", ["lru", "tag"])
def test_an_unknown_rule_is_refused(rule):
    with pytest.raises(ValueError):
        EngineConfig(kv_eviction=rule.upper())
    with pytest.raises(ValueError):
        RunSpec("x", "justitia", kv_eviction="mru")
    assert EngineConfig(kv_eviction=rule).kv_eviction == rule


def test_the_config_and_the_run_report_the_rule_only_when_not_vllms():
    cfg = engine()
    assert "kv_eviction" not in cfg.to_json() and "kv_eviction" not in RunSpec("j", "justitia").to_json()
    assert replace(cfg, kv_eviction="tag").to_json()["kv_eviction"] == "tag"
    assert RunSpec("j", "justitia", kv_eviction="tag").to_json()["kv_eviction"] == "tag"
    spec = {s.label: s for s in sessions_specs(choices=True)}[TAG_EVICTION_LABEL]
    assert (spec.policy, spec.kv_eviction) == ("justitia", "tag")


# ------------------------------------------------------------------------- whole simulations
def sessions(seed: int, n: int):
    """Sessions with turns, tool pauses and shared prompts, shortened for a small engine."""
    agents, _ = build_sessions(n, seed, rate_per_s=20.0)
    return scale_tokens(agents, 16)


def outcome(res):
    return (
        {a.agent_id: (a.finish_s, a.to_json()) for a in res.agents},
        res.iterations,
        res.preemptions,
        res.prefix_cache,
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(POLICY_NAMES),
    extra=st.integers(2, 60),
    budget=st.sampled_from([64, 256, 2048]),
    seqs=st.sampled_from([4, 16, 256]),
)
def test_event_skipping_matches_per_iteration_stepping_with_tag_eviction(seed, policy, extra, budget, seqs):
    agents = sessions(seed, 12)
    need = max(-(-(t.prompt_tokens + t.output_tokens) // BS) for a in agents for t in a.tasks)
    cfg = replace(
        engine(blocks=need + extra, budget=budget, seqs=seqs, profile=LINEAR), prefix_caching=True, kv_eviction="tag"
    )
    runs = [
        Simulator(
            cfg, make_policy(policy, cfg.capacity_per_s("kv"), "kv"), make_predictor("noisy:2", 7), "kv", skip
        ).run(agents)
        for skip in (True, False)
    ]
    assert outcome(runs[0]) == outcome(runs[1])
    assert runs[0].steps <= runs[1].steps


def test_tag_eviction_changes_what_justitia_keeps_and_skipping_still_agrees():
    agents = sessions(2, 40)
    need = max(-(-(t.prompt_tokens + t.output_tokens) // BS) for a in agents for t in a.tasks)
    cfg = replace(engine(blocks=need + 5, budget=2048, seqs=256, profile=LINEAR), prefix_caching=True)
    out = {}
    for rule in ("lru", "tag"):
        for skip in (True, False):
            out[rule, skip] = Simulator(
                replace(cfg, kv_eviction=rule), "justitia", make_predictor("oracle", 0), "kv", skip
            ).run(agents)
    for rule in ("lru", "tag"):
        assert outcome(out[rule, True]) == outcome(out[rule, False])
        assert out[rule, True].steps < out[rule, False].steps
    assert out["lru", True].prefix_cache != out["tag", True].prefix_cache
    # a policy without a clock: every tag None, the rule is LRU's, bit for bit
    fcfs = [
        Simulator(replace(cfg, kv_eviction=rule), "fcfs", make_predictor("oracle", 0), "kv").run(agents)
        for rule in ("lru", "tag")
    ]
    assert outcome(fcfs[0]) == outcome(fcfs[1])
