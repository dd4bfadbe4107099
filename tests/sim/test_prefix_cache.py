"""The simulator's prefix cache follows vLLM 0.32's rules, and both stepping modes agree with it on."""

from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from helpers import engine, random_agents
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import justitia.sim.simulator as simulator
from justitia.agent import AgentProcess
from justitia.core import AgentScheduler, Registration
from justitia.core.policies import POLICY_NAMES, make_policy
from justitia.predictors import make_predictor
from justitia.sim import LatencyProfile, Simulator
from justitia.sim.prefix import PrefixCache
from justitia.sim.stepping import PlainRun, SimRequest
from justitia.workload import Agent, Task

BS = 16
LINEAR = LatencyProfile("lin", 1.0, 0.5, 0.01, 0.001, 1.3, 64, "tests: load-dependent latency")


def req(rid: str, runs: tuple, output: int, prompt: int | None = None) -> SimRequest:
    """A request whose prompt is ``runs`` and whose output is one run of its own."""
    prompt = sum(t for _, t in runs) if prompt is None else prompt
    return SimRequest(rid, "a", 1.0, prompt, output, runs=tuple(runs) + (((rid, "out"), output),))


# ------------------------------------------------------------------------------------ the cache
def cached(cache: PrefixCache, r: SimRequest, tokens: int) -> None:
    """``r`` holds and caches the blocks ``tokens`` fill, as a running request does."""
    cache.hold(r, [])
    cache.cache_upto(r, tokens)


def test_a_hit_needs_the_whole_block_and_everything_before_it():
    cache = PrefixCache(BS)
    a = req("a", (("sys", 48), ("q1", 20)), 5)
    cached(cache, a, 68)  # 4 full blocks
    assert len(cache.lookup(req("b", (("sys", 48), ("q1", 20)), 5))) == 4
    assert len(cache.lookup(req("c", (("sys", 40), ("q2", 28)), 5))) == 2  # block 2 differs at token 40
    assert len(cache.lookup(req("d", (("other", 16), ("sys", 32), ("q1", 20)), 5))) == 0  # same later text, other start
    assert len(cache.lookup(req("e", (("sys", 16), ("sys", 32), ("q1", 20)), 5))) == 1  # the same tokens, as other text
    assert len(cache.lookup(SimRequest("f", "a", 1.0, 68, 5))) == 0  # no runs: unique text


def test_a_hit_stops_one_token_short_of_the_sequence():
    cache = PrefixCache(BS)
    cached(cache, req("a", (("p", 64),), 5), 64)  # 4 full blocks
    assert len(cache.lookup(req("b", (("p", 48),), 5))) == 2  # (48 - 1) // 16: the last block is computed
    assert len(cache.lookup(req("c", (("p", 49),), 5))) == 3
    assert len(cache.lookup(req("d", (("p", 64), ("x", 1)), 5))) == 4


def test_keys_are_exact_and_do_not_depend_on_the_hash_seed():
    cache = PrefixCache(BS)
    r = req("a", (("x", 10), ("y", 30)), 3)
    c = cache.content(r)
    assert [cache.key(c, k) for k in range(2)] == [0, 1]
    assert cache._names == {(-1, (("x", 0, 10), ("y", 0, 6))): 0, (0, (("y", 6, 22),)): 1}
    with pytest.raises(ValueError):
        cache.content(SimRequest("b", "a", 1.0, 10, 3, runs=(("x", 10),)))  # no output run


def test_freed_blocks_stay_cached_and_the_least_recent_go_first_tail_first():
    cache = PrefixCache(BS)
    a, b = req("a", (("A", 48),), 4), req("b", (("B", 32),), 4)
    cached(cache, a, 48)
    cached(cache, b, 32)
    assert cache.release(a) == 3 and cache.release(b) == 2
    # freed in reverse: a's last block first, then b's
    assert [blk.key for blk in cache.lru] == [c for k in (2, 1, 0) for c in [cache.key(cache.content(a), k)]] + [
        cache.key(cache.content(b), 1),
        cache.key(cache.content(b), 0),
    ]
    assert len(cache.lookup(req("a2", (("A", 48), ("z", 1)), 1))) == 3
    cache.evict_for(2, free=5 + 3)  # three unkeyed free blocks are taken first: nothing evicted
    assert len(cache.lru) == 5
    cache.evict_for(4, free=5 + 3)  # one evicted: a's tail block
    assert len(cache.lookup(req("a2", (("A", 48), ("z", 1)), 1))) == 2
    cache.evict_for(2, free=4)  # a's middle block, then a's first
    assert len(cache.lookup(req("a2", (("A", 48), ("z", 1)), 1))) == 0
    assert len(cache.lookup(req("b2", (("B", 32), ("z", 1)), 1))) == 2


def test_touching_a_free_cached_block_takes_it_out_of_the_free_queue():
    cache = PrefixCache(BS)
    a = req("a", (("A", 32),), 4)
    cached(cache, a, 32)
    cache.release(a)
    hits = cache.lookup(req("b", (("A", 32), ("q", 3)), 2))
    assert cache.touch(hits) == 2 and not cache.lru
    assert cache.touch(hits) == 0  # already held: shared, not taken again
    assert [blk.ref for blk in hits] == [2, 2]


# ------------------------------------------------------------------------------------ the engine
def make_engine(blocks=64, budget=256, seqs=64, caching=True, policy="fcfs") -> PlainRun:
    cfg = replace(engine(blocks=blocks, budget=budget, seqs=seqs), prefix_caching=caching)
    core = AgentScheduler(make_policy(policy, cfg.capacity_per_s("kv"), "kv"))
    core.agent_arrived(Registration("a", "t", 1.0), 0.0)
    return PlainRun(cfg, core, lambda r: None)


def run_until(e: PlainRun, cond) -> None:
    while e.busy and not cond():
        e.advance()


def test_a_request_sharing_a_three_block_prefix_starts_with_it_computed_and_shares_its_blocks():
    e = make_engine(blocks=20, budget=32)
    a = req("a", (("sys", 48), ("qa", 10)), 100)
    e.submit([a])
    run_until(e, lambda: a.generated >= 2)
    b = req("b", (("sys", 48), ("qb", 20)), 5)
    free = e.free
    e.submit([b])
    e.advance()
    # admitted with 48 tokens computed: its 20 new tokens fit one step's budget of 32 (with a's decode)
    assert (b.computed, b.generated) == (68, 1)
    assert b.blocks == 5 and free - e.free == 2  # 3 of its 5 blocks are a's
    assert e.config.blocks - e.free == a.blocks + b.blocks - 3
    assert (e.prefix_queries, e.prefix_hits) == (58 + 68, 48)  # vLLM's PrefixCacheStats, in tokens


def test_without_the_cache_the_same_request_computes_its_whole_prompt():
    e = make_engine(blocks=20, budget=32, caching=False)
    a = req("a", (("sys", 48), ("qa", 10)), 100)
    e.submit([a])
    run_until(e, lambda: a.generated >= 2)
    b = req("b", (("sys", 48), ("qb", 20)), 5)
    e.submit([b])
    e.advance()
    assert (b.computed, b.generated) == (31, 0)
    assert (e.prefix_queries, e.prefix_hits) == (0, 0)


def test_a_hit_in_the_free_queue_counts_against_the_free_blocks():
    e = make_engine(blocks=8, budget=256)
    a = req("a", (("sys", 64),), 2)  # 4 blocks, cached, then freed
    e.submit([a])
    run_until(e, lambda: False)
    assert e.free == 8 and len(e.cache.lru) == 4
    b = req("b", (("sys", 64), ("qb", 64)), 2)  # 8 blocks: 4 hit, free ones, so it needs all 8
    e.submit([b])
    e.advance()
    assert b.computed == 128 and e.free == 0 and e.prefix_hits == 64


def test_a_preempted_request_hits_its_own_blocks_when_it_comes_back():
    e = make_engine(blocks=10, budget=256)
    a = req("a", (("A", 64),), 40)
    b = req("b", (("B", 64),), 40)
    e.submit([a, b])
    run_until(e, lambda: e.preemptions > 0)
    assert not b.running and b.generated > 0  # the later one is the victim
    # b held 5 full blocks (80 tokens); a's next two blocks evicted b's last two (freed tail first)
    assert b.num_tokens == 81 and len(e.cache.lru) == 4 and e.cache.evictions == 1  # a took one at once
    run_until(e, lambda: b.running)
    assert e.cache.evictions == 4  # b's last two; then, for b's 3 new blocks, a's one unkeyed and two of a's last
    assert (e.prefix_preempted_queries, e.prefix_preempted_hits) == (81, 48)
    assert (e.prefix_queries, e.prefix_hits) == (128, 0)
    run_until(e, lambda: False)
    assert a.generated == b.generated == 40


# ------------------------------------------------------------------------- whole simulations
RUNS: dict[str, tuple] = {}
COPY = 0.1


def sessions(rng: np.random.Generator, n: int, gap_s: float = 0.2) -> list[Agent]:
    """Conversations on shared system prompts and documents: turn k+1's first task reads turn k's
    first prompt and its output; a turn's other tasks share its conversation so far; a few
    questions recur across agents (identical prompts), and a few calls are sent again whole (their
    output too: a copy waiting while the first decodes hits the blocks its output fills)."""
    agents, t, earlier = [], 0.0, []
    for i in range(n):
        aid = f"s{i:03d}"
        t += float(rng.exponential(gap_s))
        prefix = [("sys", 40)] if rng.random() < 0.8 else []
        if rng.random() < 0.3:
            prefix.append((("doc", int(rng.integers(3))), 30))
        stages = []
        for k in range(int(rng.integers(1, 4))):
            tasks, first = [], None
            for j in range(int(rng.integers(1, 4))):
                name = f"{aid}/{k}/{j}"
                if earlier and rng.random() < COPY:  # another agent's call again, output and all
                    RUNS[name] = runs = earlier[int(rng.integers(len(earlier)))]
                    tasks.append(Task(name, sum(x for _, x in runs[:-1]), runs[-1][1]))
                    continue
                u, o = int(rng.integers(1, 60)), int(rng.integers(1, 50))
                src = ("q", int(rng.integers(3))) if rng.random() < 0.2 else (aid, k, j, "in")
                prompt = prefix + [(src, u)]
                RUNS[name] = tuple(prompt) + (((aid, k, j, "out"), o),)
                earlier.append(RUNS[name])
                tasks.append(Task(name, sum(x for _, x in prompt), o))
                first = first or RUNS[name]
            stages.append(tuple(tasks))
            if first is not None:
                prefix = list(first)  # the conversation so far: the first task's prompt and its output
        agents.append(Agent(aid, "chat", round(t, 3), tuple(stages)))
    return agents


@contextmanager
def with_runs(engines: list):
    """The agents' calls hold the runs of their task (``RUNS``, by prompt: text copied across agents,
    which the workload format cannot say), and the simulator's engines are kept in ``engines``."""
    loop_run = simulator.EngineLoop.run
    process_runs = AgentProcess.runs

    def runs(self, call):
        return RUNS.get(call.task.prompt) or process_runs(self, call)

    def run(self, agents):
        result = loop_run(self, agents)
        engines.extend(self._engines)
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AgentProcess, "runs", runs)
        mp.setattr(simulator.EngineLoop, "run", run)
        yield


def simulate(agents, policy, cfg, skip):
    engines: list = []
    with with_runs(engines):
        pol = make_policy(policy, cfg.capacity_per_s("kv"), "kv")
        res = Simulator(cfg, pol, make_predictor("noisy:2", 7), "kv", skip).run(agents)
    return res, engines


def outcome(res):
    return ({a.agent_id: a.finish_s for a in res.agents}, res.iterations, res.preemptions)


def counters(engines):
    return [(e.prefix_queries, e.prefix_hits, e.prefix_preempted_queries, e.prefix_preempted_hits) for e in engines]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(POLICY_NAMES),
    blocks=st.integers(30, 120),
    budget=st.sampled_from([32, 64, 256, 1024]),
    seqs=st.sampled_from([4, 16, 256]),
)
def test_event_skipping_matches_per_iteration_stepping_with_the_prefix_cache(seed, policy, blocks, budget, seqs):
    agents = sessions(np.random.default_rng(seed), 20)
    cfg = replace(engine(blocks=blocks, budget=budget, seqs=seqs, profile=LINEAR), prefix_caching=True)
    (fast, fe), (slow, se) = simulate(agents, policy, cfg, True), simulate(agents, policy, cfg, False)
    assert outcome(fast) == outcome(slow)
    assert counters(fe) == counters(se)
    assert fast.steps <= slow.steps


def test_shared_prefixes_hit_and_skipping_still_skips():
    agents = sessions(np.random.default_rng(11), 40, gap_s=0.05)
    cfg = replace(engine(blocks=60, budget=256, seqs=32, profile=LINEAR), prefix_caching=True)
    (fast, fe), (slow, se) = simulate(agents, "justitia", cfg, True), simulate(agents, "justitia", cfg, False)
    assert outcome(fast) == outcome(slow) and counters(fe) == counters(se)
    queries, hits, _, _ = counters(fe)[0]
    assert hits > 0.3 * queries  # the system prompt, documents and conversations hit
    assert slow.preemptions > 0 and fast.steps * 2 < slow.steps
    off, _ = simulate(agents, "justitia", replace(cfg, prefix_caching=False), True)
    assert off.makespan_s > fast.makespan_s  # hits skip prefill work


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("policy", ["fcfs", "justitia", "vtc"])
def test_requests_without_runs_run_exactly_as_with_the_cache_off(skip, policy, monkeypatch):
    monkeypatch.setattr(AgentProcess, "runs", lambda self, call: ())  # content never shared, never cached
    agents = random_agents(np.random.default_rng(4), 30, max_output=300)
    cfg = engine(blocks=70, budget=256, profile=LINEAR)
    on, engines = simulate(agents, policy, replace(cfg, prefix_caching=True), skip)
    off, _ = simulate(agents, policy, cfg, skip)
    assert [r.to_json() for r in on.agents] == [r.to_json() for r in off.agents]
    assert (on.iterations, on.preemptions, on.steps) == (off.iterations, off.preemptions, off.steps)
    assert on.preemptions > 0
    assert engines[0].prefix_hits == 0 and engines[0].prefix_queries > 0


def test_the_config_reports_the_cache_only_when_on():
    cfg = engine()
    assert "prefix_caching" not in cfg.to_json()
    assert replace(cfg, prefix_caching=True).to_json()["prefix_caching"] is True
