"""``kv-prefix``'s charge: a full KV block that ``n`` requests hold at once is charged
``1/n`` to each, across agents too (``core.cost.shared_kv_charge``, ``vllm.accounting.prefix_step_charges``); the
plug-in charges it under ``kv-prefix`` and nothing else changes. The rule's tests need no vLLM; the
plug-in's build vLLM's scheduler without an engine (``tests/vllm_scheduler.py``)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from justitia.core.cost import shared_kv_charge, shared_kv_savings
from justitia.vllm.accounting import prefix_step_charges, step_charges

BS = 16


def _request(held: int, prompt: int, n: int) -> SimpleNamespace:
    """A running request as vLLM holds it after a step scheduled ``n`` tokens: ``held`` tokens
    computed (this step's included), ``prompt`` of them the prompt."""
    return SimpleNamespace(
        num_computed_tokens=held,
        num_tokens=max(held, prompt),
        num_prompt_tokens=prompt,
        num_output_placeholders=0,
        is_prefill_chunk=held < prompt,
    )


def _step(rows):
    """rows: (request id, agent, held, prompt, scheduled tokens) -> step_charges' arguments."""
    requests = {r: _request(held, prompt, n) for r, _, held, prompt, n in rows}
    scheduled = {r: n for r, _, _, _, n in rows}
    infos = {r: SimpleNamespace(agent_id=a, request_id=r) for r, a, _, _, _ in rows}
    return requests, scheduled, infos.get


def _ids(first: int, count: int) -> list[int]:
    return list(range(first, first + count))


def test_with_nothing_shared_the_charge_is_kvs_to_the_bit():
    """Every request alone in its blocks: ``prefix_step_charges`` is ``step_charges``, ints and all,
    and ``shared_kv_charge`` is the tokens held."""
    rows = [("r1", "a", 100, 90, 1), ("r2", "a", 37, 37, 37), ("r3", "b", 64, 80, 64), ("r4", "c", 17, 10, 1)]
    requests, scheduled, info_of = _step(rows)
    lists = {"r1": _ids(0, 8), "r2": _ids(100, 3), "r3": _ids(200, 5), "r4": _ids(300, 2)}
    today = step_charges(requests, scheduled, info_of)
    charged, saved = prefix_step_charges(requests, scheduled, info_of, lists.get, BS)
    assert charged == today and saved == 0 and type(saved) is int
    assert all(type(row[3]) is int for row in charged.values())
    held = {r: requests[r].num_computed_tokens for r in requests}
    assert shared_kv_charge(lists, held, BS) == held
    assert all(type(v) is int for v in shared_kv_charge(lists, held, BS).values())
    assert shared_kv_savings(lists, held, BS) == {}


def test_two_agents_sharing_k_full_blocks_each_pay_half_of_them():
    """Requests of two agents whose first ``k`` full blocks are the same (a prefix-cache hit): each
    is charged its tokens less half of those blocks; a third agent sharing nothing pays as today."""
    k = 3
    shared = _ids(0, k)
    rows = [("x", "a", 100, 90, 1), ("y", "b", 70, 60, 1), ("z", "c", 50, 40, 1)]
    requests, scheduled, info_of = _step(rows)
    lists = {"x": shared + _ids(10, 4), "y": shared + _ids(20, 2), "z": _ids(30, 4)}
    today = step_charges(requests, scheduled, info_of)
    charged, saved = prefix_step_charges(requests, scheduled, info_of, lists.get, BS)
    assert charged["a"][3] == today["a"][3] - k * BS / 2 == 100 - 24
    assert charged["b"][3] == today["b"][3] - k * BS / 2 == 70 - 24
    assert charged["c"] == today["c"]
    assert saved == k * BS
    assert [row[1:3] for row in charged.values()] == [row[1:3] for row in today.values()]  # tokens computed: as today


def test_the_meter_reads_the_shares_of_the_requests_that_sample():
    """``step_delivered`` reads the KV tokens of the requests that sample in a step; what
    ``prefix_step_charges`` returns beside the charges is what the split takes off those: a request
    mid-prefill shares in the split but is not read by the meter."""
    from justitia.vllm.accounting import step_delivered

    rows = [("x", "a", 100, 90, 1), ("y", "b", 70, 60, 1), ("w", "c", 48, 90, 48)]  # w: a prefill chunk
    requests, scheduled, info_of = _step(rows)
    shared = _ids(0, 3)
    lists = {"x": shared + _ids(10, 4), "y": shared + _ids(20, 2), "w": shared}
    charged, metered = prefix_step_charges(requests, scheduled, info_of, lists.get, BS)
    assert [charged[a][3] for a in "abc"] == pytest.approx([100 - 32, 70 - 32, 48 - 32], rel=1e-12)
    assert metered == pytest.approx(64, rel=1e-12)  # x's and y's 32 each; w's is not read
    assert step_delivered(requests, scheduled).kv_tokens == 100 + 70


def test_a_system_prompt_ten_sessions_hold_at_once_costs_each_a_tenth():
    prompt = _ids(0, 8)  # 128 tokens of system prompt
    lists = {f"s{i}": prompt + _ids(100 + 10 * i, 3) for i in range(10)}
    held = {f"s{i}": 128 + 40 for i in range(10)}  # two more full blocks and 8 tokens of a third
    charge = shared_kv_charge(lists, held, BS)
    for r in held:
        assert charge[r] == pytest.approx(40 + 128 / 10, rel=1e-12)


def test_a_requests_leading_shared_blocks_are_enough():
    """Given only the first blocks of each list (the run a prefix cache may share, as the plug-in
    gives them), the charges are those of the whole lists."""
    lists = {"x": [1, 2, 3, 10, 11], "y": [1, 2, 20], "z": [1, 2, 3, 30, 31, 32]}
    held = {"x": 75, "y": 40, "z": 90}
    whole = shared_kv_charge(lists, held, BS)
    third = 2 * (16 - 16 / 3)  # blocks 1 and 2, held by three: each pays a third
    assert whole == pytest.approx({"x": 75 - third - 8, "y": 40 - third, "z": 90 - third - 8}, rel=1e-12)
    assert shared_kv_charge({"x": [1, 2, 3], "y": [1, 2], "z": [1, 2, 3]}, held, BS) == whole
    assert shared_kv_charge({"x": [1, 2, 3], "z": [1, 2, 3]}, held, BS)["y"] == 40


def test_a_partial_last_block_is_never_shared():
    """A block id some request holds only partly is its own: no one's charge splits it, not even a
    request for which the same id is a full block (vLLM shares only full, cached blocks)."""
    lists = {"x": [1, 2, 3], "y": [1, 2, 3]}
    charge = shared_kv_charge(lists, {"x": 40, "y": 40}, BS)  # 2 full blocks, 8 tokens in block 3
    assert charge == {"x": 40 - 16, "y": 40 - 16}  # blocks 1 and 2 split, block 3 paid whole by each
    charge = shared_kv_charge(lists, {"x": 48, "y": 40}, BS)  # block 3: full for x, partial for y
    assert charge == {"x": 48 - 16, "y": 40 - 16}
    # blocks allocated ahead (past the tokens held) hold nothing and share nothing
    assert shared_kv_charge({"x": [1, 2, 5], "y": [1, 2, 5]}, {"x": 32, "y": 32}, BS) == {"x": 16, "y": 16}
    # vLLM's null block (a sliding window's dropped blocks) is never shared
    assert shared_kv_charge({"x": [0, 0, 7], "y": [0, 8]}, {"x": 48, "y": 32}, BS, never_shared=0) == {"x": 48, "y": 32}


def test_the_charges_add_up_to_the_tokens_held_counted_once():
    """Random prefix trees: the holders' charges sum to ``BS`` per distinct full block plus every
    partial block's tokens; each request's charge is between its share floor and its tokens."""
    rng = random.Random(34)
    for _ in range(300):
        lists, held, next_id = {}, {}, 1000
        trunk = list(range(rng.randint(0, 12)))
        for i in range(rng.randint(1, 8)):
            ids = trunk[: rng.randint(0, len(trunk))]
            ids += list(range(next_id, next_id + rng.randint(0, 6)))
            next_id += 10
            full = len(ids)
            ids.append(next_id)  # the partial (or empty) last block, and one allocated ahead
            ids.append(next_id + 1)
            next_id += 10
            lists[f"r{i}"] = ids
            held[f"r{i}"] = full * BS + rng.randint(0, BS - 1)
        charge = shared_kv_charge(lists, held, BS)
        distinct = {b for r, ids in lists.items() for b in ids[: held[r] // BS]}
        once = BS * len(distinct) + sum(t % BS for t in held.values())
        assert sum(charge.values()) == pytest.approx(once, rel=1e-12)
        for r, c in charge.items():
            assert held[r] % BS <= c <= held[r]


# ----------------------------------------------------------------------------------- the plug-in
SIZES = [(80, 5), (80, 5), (50, 4)]  # (prompt tokens, output tokens) of agents a, b, c


def _run(cost: str, shared: bool, async_scheduling: bool, monkeypatch):
    """Three agents' requests through the plug-in under ``cost``: a and b's prompts begin with the
    same 64 tokens (four blocks) if ``shared``, c's with its own. Returns each charge made, in
    order, (agent, prefill, decode, kv), each agent's total, and the scheduler."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    from vllm_scheduler import _HASHER, Driver, count_charges, make_scheduler

    from justitia.vllm.plugin import JustitiaScheduler

    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    monkeypatch.setenv("JUSTITIA_COST", cost)
    scheduler = make_scheduler(JustitiaScheduler, async_scheduling)
    calls, totals = count_charges(scheduler)
    for i, ((p, d), agent) in enumerate(zip(SIZES, "abc")):
        prompt = [(100 * i + j) % 1000 + 3 for j in range(p)]
        if shared and agent == "b":  # a's first 64 tokens, then its own
            prompt[:64] = [j % 1000 + 3 for j in range(64)]
        params = SamplingParams(max_tokens=d, ignore_eos=True, extra_args={"agent_id": agent, "agent_done": True})
        scheduler.add_request(Request(f"r{i}", prompt, params, None, block_hasher=_HASHER))
    driver = Driver(scheduler, 2 if async_scheduling else 1)
    driver.run()
    assert scheduler.book.open_count == 0
    return calls, dict(totals), scheduler


def test_the_plugin_reads_blocks_only_under_kv_prefix(monkeypatch):
    """kv and compute keep today's path (no block lists read); kv-prefix reads vLLM's first KV
    cache group's per-request lists; a reset picks the cost's path again."""
    from vllm_scheduler import make_scheduler

    from justitia.core import RESET, ControlCall
    from justitia.vllm.plugin import JustitiaScheduler

    for cost in ("kv", "compute"):
        monkeypatch.setenv("JUSTITIA_COST", cost)
        assert make_scheduler(JustitiaScheduler, False)._kv_blocks is None
    monkeypatch.setenv("JUSTITIA_COST", "kv-prefix")
    scheduler = make_scheduler(JustitiaScheduler, False)
    lists, block_size = scheduler._kv_blocks
    group = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
    assert lists is group.req_to_blocks and block_size == 16
    assert scheduler.control(ControlCall(RESET, {"policy": "justitia", "cost": "kv", "capacity_per_s": 1e5}))
    assert scheduler._kv_blocks is None


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_plugin_with_nothing_shared_charges_kv_prefix_as_kv(async_scheduling, monkeypatch):
    """Prompts that share no block: every charge the plug-in makes under kv-prefix is kv's, call by call."""
    calls_kv, _, _ = _run("kv", False, async_scheduling, monkeypatch)
    calls_prefix, _, _ = _run("kv-prefix", False, async_scheduling, monkeypatch)
    assert calls_prefix == calls_kv
    assert all(type(kv) is int for *_, kv in calls_prefix)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_plugin_splits_a_prefix_two_agents_hold_at_once(async_scheduling, monkeypatch):
    """a and b begin with the same four blocks; b hits a's (vLLM's prefix cache, same step) and both
    hold them for all five steps: each is charged 4 * 16 / 2 = 32 token-iterations less per step
    than under kv; c, sharing nothing, is charged as under kv; prefill and decode tokens too."""
    _, kv, _ = _run("kv", True, async_scheduling, monkeypatch)
    calls, prefix, scheduler = _run("kv-prefix", True, async_scheduling, monkeypatch)
    hits = scheduler.kv_cache_manager.prefix_cache_stats
    steps_together = 5  # a and b are admitted in the first step and each decodes 5 tokens
    for agent in "ab":
        assert prefix[agent][:2] == kv[agent][:2]
        assert prefix[agent][2] == kv[agent][2] - steps_together * 4 * 16 / 2
    assert prefix["c"] == kv["c"]
    assert kv["b"][0] == 80 - 64  # b computed only what it did not hit
    assert hits is None or hits.hits >= 64


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_plugin_reports_each_requests_prefix_cache_hit_at_its_first_schedule(async_scheduling, monkeypatch):
    """b's first four blocks are a's: the book's tenant figures (``/metrics``' prefix-cache
    counters) have every prompt token looked up once and b's 64 held by the cache; nothing is
    kept once the requests are freed."""
    _, _, scheduler = _run("kv", True, async_scheduling, monkeypatch)
    tenant = scheduler.book.state(scheduler._now(), detail=True).tenants["-"]
    assert tenant["prompt_tokens"] == sum(p for p, _ in SIZES)
    assert tenant["cached_tokens"] == 64
    assert scheduler._cache_hits == {}
