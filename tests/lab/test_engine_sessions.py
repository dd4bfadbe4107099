"""Sessions on a real engine's path, without one: what ``drive`` tells the engine's book (session,
turn_start, the burst's cost, the pauses between bursts), and the token ids the bench runner sends
(``SessionPrompts``: the sharing the simulator's prefix cache models, as ids vLLM's cache hashes)."""

import asyncio

import pytest
from helpers import session

from justitia.agent import AgentProcess, Answer, drive
from justitia.core import AgentBook, Registration
from justitia.lab.live.runner import SessionPrompts
from justitia.predictors import OraclePredictor
from justitia.workload import Agent, Stage, Task

SCALE = 0.01  # the session's pauses, shrunk to keep the tests short


def fast(s: Agent) -> Agent:
    return Agent(
        s.agent_id,
        s.type,
        0.0,
        tuple(
            Stage(
                st, st.pause_s * SCALE, [tuple(Stage(b, b.pause_s * SCALE) for b in ch) for ch in st.branches], st.turn
            )
            for st in s.stages
        ),
    )


def run(agent: Agent, book: AgentBook | None = None):
    """Drive ``agent`` against a book as the plug-in keeps it: every call's metadata, and each pause."""
    proc = AgentProcess(agent, OraclePredictor())
    seen, events = [], []
    loop_t0 = []

    async def serve(call):
        now = asyncio.get_running_loop().time() - loop_t0[0]
        seen.append(call)
        if book is not None:
            book.arrive(call.request_id, call.meta, call.task.prompt_tokens, call.task.output_tokens, now)
            events.append(("arrive", call.task.id, book.agent(agent.agent_id).paused))
        await asyncio.sleep(0.001)
        if book is not None:
            book.finish(call.request_id, asyncio.get_running_loop().time() - loop_t0[0], call.task.output_tokens)
        return Answer("", call.task.prompt_tokens, call.task.output_tokens)

    async def paused():
        events.append(("pause",))
        if book is not None:
            assert book.pause(agent.agent_id, asyncio.get_running_loop().time() - loop_t0[0])

    async def main():
        loop_t0.append(asyncio.get_running_loop().time())
        await drive(proc, serve, on_pause=paused)

    asyncio.run(main())
    return proc, seen, events


def test_a_sessions_calls_say_so_and_each_turn_opens_with_its_price():
    proc, seen, events = run(fast(session()))
    assert all(c.meta.session for c in seen)
    starts = [c for c in seen if c.meta.turn_start]
    assert [c.task.id for c in starts] == ["t0", "t3"]  # the two user turns; tool pauses and subagents inside
    assert [c.meta.agent_cost for c in starts] == [
        pytest.approx(proc.turn_predicted[0]),
        pytest.approx(proc.turn_predicted[1]),
    ]
    assert events == [("pause",)]  # between the turns, once; a tool pause inside a turn is none


def test_a_plain_agent_s_calls_carry_no_session_and_never_pause():
    plain = Agent("p", "x", 0.0, (Stage([Task("a", 10, 2), Task("b", 10, 2)]), Stage([Task("c", 10, 2)])))
    _, seen, events = run(plain)
    assert not any(c.meta.session or c.meta.turn_start for c in seen) and events == []


def test_the_book_follows_a_driven_session_paused_between_turns_only():
    book = AgentBook.for_policy("justitia", 100.0)
    proc, _, events = run(fast(session()), book)
    arrivals = {e[1]: e[2] for e in events if e[0] == "arrive"}
    assert not any(arrivals.values())  # every call found its session arrived (a return un-pauses it)
    assert events.index(("pause",)) < [e[:2] for e in events].index(("arrive", "t3"))
    assert book.agent("s") is None  # its last call said agent_done: released


def test_the_runner_registers_a_price_that_is_a_distribution_ahead_of_its_requests():
    """``runner.register_args``: priced by ``online``, each turn of a session (and a plain agent) is
    registered with the plug-in ahead of its first request, with its distribution, as the
    simulator hands it to the core; the request then opens nothing, and the book the plug-in keeps
    holds the distribution, which it reprices as it serves the turn. A point price registers nothing."""
    from dataclasses import replace

    from justitia.lab.live.runner import register_args
    from justitia.predictors import OnlinePredictor

    s = fast(session())
    proc = AgentProcess(s, OnlinePredictor())
    book = AgentBook.for_policy("justitia", 100.0)
    held = {}

    async def serve(call):
        meta, args = call.meta, register_args(proc, call)
        if args is not None:  # as the runner sends it (control REGISTER), as the plug-in reads it
            book.register(Registration.from_json(args), 0.0)
            meta = replace(meta, turn_start=False)
        book.arrive(call.request_id, meta, call.task.prompt_tokens, call.task.output_tokens, 0.0)
        if args is not None:
            held[call.turn] = book.agent(s.agent_id).info.dist
        await asyncio.sleep(0.001)
        book.finish(call.request_id, 0.0)
        return Answer("", call.task.prompt_tokens, call.task.output_tokens)

    async def paused():
        assert book.pause(s.agent_id, 0.0)

    asyncio.run(drive(proc, serve, on_pause=paused))
    assert held == proc.turn_dists and len(held) == 2
    plain = Agent("p", "x", 0.0, (Stage([Task("a", 10, 2), Task("b", 10, 2)]), Stage([Task("c", 10, 2)])))
    priced = AgentProcess(plain, OnlinePredictor())
    calls = priced.start()
    assert all(
        register_args(priced, c)["dist"] == [list(priced.predicted_dist.values), list(priced.predicted_dist.probs)]
        for c in calls
    )
    later = priced.answered(calls[0], Answer("", 10, 2)) + priced.answered(calls[1], Answer("", 10, 2))
    assert [register_args(priced, c) for c in later] == [None]  # its later stages open nothing
    oracle = AgentProcess(fast(session()), OraclePredictor())
    opening = oracle.start()[0]
    assert register_args(oracle, replace(opening, meta=replace(opening.meta, turn_start=True))) is None


class Tokens:
    """A tokenizer of one id per character (enough to check what the runner builds)."""

    vocab_size = 1000

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % self.vocab_size for c in text]


def test_session_prompts_are_the_shared_text_then_the_conversation_as_sent_then_the_new_text():
    prompts = SessionPrompts(Tokens(), 4096)
    proc = AgentProcess(session(), OraclePredictor())
    [t0] = proc.start()
    ids0 = prompts.prompt(t0)
    assert len(ids0) == t0.task.prompt_tokens
    out0 = list(range(t0.task.output_tokens))
    prompts.answered(t0, out0)
    [t1] = proc.answered(t0, Answer("", t0.task.prompt_tokens, t0.task.output_tokens))
    ids1 = prompts.prompt(t1)
    assert len(ids1) == t1.task.prompt_tokens and ids1[: len(ids0) + len(out0)] == ids0 + out0
    other = SessionPrompts(Tokens(), 4096)
    u0 = other.prompt(AgentProcess(session("u"), OraclePredictor()).start()[0])
    assert u0[:40] == ids0[:40] and u0[40:] != ids0[40:]  # the system prompt alike; each own text apart


def test_a_call_longer_than_the_engine_s_context_is_refused_naming_it():
    with pytest.raises(ValueError, match="max_model_len"):
        SessionPrompts(Tokens(), 32).prompt(AgentProcess(session(), OraclePredictor()).start()[0])


def _tries(turns_by_repeat: list[list[list[float]]], hits=(10, 20)):
    """EngineRun-like repeats of one label: each a run whose agents have these turn times."""
    from types import SimpleNamespace

    from justitia.agent import AgentResult, RunResult

    runs = []
    for r, sessions in enumerate(turns_by_repeat):
        # every session's JCT 10 s, pauses included: only the turn times differ between labels
        agents = [AgentResult(f"s{i}", "coding", 0.0, 10.0, 10.0, 1.0, 1.0, list(t)) for i, t in enumerate(sessions)]
        runs.append(
            SimpleNamespace(
                result=RunResult(
                    "x",
                    agents,
                    1.0,
                    1,
                    1,
                    0,
                    1.0,
                    None,
                    prefix_cache={"queried_tokens": 100, "hit_tokens": hits[r], "hit_rate": hits[r] / 100},
                )
            )
        )
    return runs


def test_repeats_merge_turn_by_turn_and_sum_the_cache_counts():
    from justitia.lab.live.vllm_bench import merge_repeats

    merged = merge_repeats(_tries([[[1.0, 3.0], [2.0]], [[3.0, 5.0], [4.0]]]))
    assert [a.turns_s for a in merged.agents] == [[2.0, 4.0], [3.0]]
    assert merged.prefix_cache["hit_rate"] == pytest.approx(30 / 200)
    assert merged.prefix_cache["hit_rate_per_repeat"] == [0.1, 0.2]


def test_turn_comparisons_are_ratios_of_mean_turn_times_not_of_jcts():
    from justitia.lab.live.vllm_bench import comparisons

    a = [[[1.0, 1.0, 1.0, 1.0], [2.0]]] * 2  # 5 turns, 6 s: mean turn 1.2 s
    b = [[[2.0, 2.0, 2.0, 2.0], [1.0]]] * 2  # mean turn 1.8 s
    tries = {"justitia": _tries(a), "vtc": _tries(b)}
    turn = comparisons(tries, metric="turn")["justitia_vs_vtc"]
    assert turn["ratio"] == pytest.approx(6.0 / 9.0)
    assert turn["ci95"][0] <= turn["ratio"] <= turn["ci95"][1] and turn["agents"] == 2 and turn["repeats"] == 2
    assert comparisons(tries)["justitia_vs_vtc"]["ratio"] == pytest.approx(1.0)  # the JCTs are alike


def test_drive_records_a_session_s_bursts_on_the_clock_it_is_given():
    proc = AgentProcess(fast(session()), OraclePredictor())

    async def serve(call):
        await asyncio.sleep(0.001)
        return Answer("", call.task.prompt_tokens, call.task.output_tokens)

    async def main():
        t0 = asyncio.get_running_loop().time() - 100.0  # the run began 100 s ago
        await drive(proc, serve, clock=lambda: asyncio.get_running_loop().time() - t0)

    asyncio.run(main())
    starts = [b[0] for b in proc.bursts]
    assert len(starts) >= 2 and all(100.0 <= s < 101.0 for s in starts)  # seconds into the run, not the loop's
