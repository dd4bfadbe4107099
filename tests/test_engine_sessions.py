"""Sessions on a real engine's path, without one: what ``drive`` tells the engine's book (session,
turn_start, the burst's cost, the pauses between bursts), and the token ids the bench runner sends
(``SessionPrompts``: the sharing the simulator's prefix cache models, as ids vLLM's cache hashes)."""

import asyncio

import pytest

from justitia.agent import AgentProcess, Answer, drive
from justitia.core import AgentBook
from justitia.lab.runner import SessionPrompts
from justitia.predictors import OraclePredictor
from justitia.workload import Agent, Stage, Task
from test_sessions import session

SCALE = 0.01  # the session's pauses, shrunk to keep the tests short


def fast(s: Agent) -> Agent:
    return Agent(s.agent_id, s.type, 0.0, tuple(
        Stage(st, st.pause_s * SCALE, [tuple(Stage(b, b.pause_s * SCALE) for b in ch) for ch in st.branches], st.turn)
        for st in s.stages))


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
    assert [c.meta.agent_cost for c in starts] == [pytest.approx(proc.turn_predicted[0]),
                                                   pytest.approx(proc.turn_predicted[1])]
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
    assert len(ids1) == t1.task.prompt_tokens and ids1[:len(ids0) + len(out0)] == ids0 + out0
    other = SessionPrompts(Tokens(), 4096)
    u0 = other.prompt(AgentProcess(session("u"), OraclePredictor()).start()[0])
    assert u0[:40] == ids0[:40] and u0[40:] != ids0[40:]  # the system prompt alike; each own text apart


def test_a_call_longer_than_the_engine_s_context_is_refused_naming_it():
    with pytest.raises(ValueError, match="max_model_len"):
        SessionPrompts(Tokens(), 32).prompt(AgentProcess(session(), OraclePredictor()).start()[0])
