"""An agent keeps its place across a hand-off (``AgentScheduler.advance``): when its last open
request finishes, the engine's next admission pass admits nothing ordered after it, so that its
next call, sent on the answer, finds its place (and its cached blocks) still there."""

from justitia.core import AgentScheduler, Registration

PRICES = (("a", 10.0), ("x", 50.0), ("b", 1000.0))  # "a" served first, "b" last; "x" keeps the engine busy


def core_with(policy: str = "justitia", prices=PRICES, hold_passes: int = 1) -> AgentScheduler:
    core = AgentScheduler.for_policy(policy, 100.0, hold_passes=hold_passes)
    for agent, price in prices:
        core.agent_arrived(Registration(agent, "t", price), 0.0)
    return core


def running(core: AgentScheduler, request_id: str, agent: str):
    req = core.request_arrived(request_id, agent, 10, 10.0, 0.0)
    assert core.peek() is req
    core.dequeue(req)
    return req


def test_the_agent_whose_call_ended_keeps_its_place_for_one_pass():
    core = core_with()
    a0, _ = running(core, "a0", "a"), running(core, "x0", "x")
    b0 = core.request_arrived("b0", "b", 10, 10.0, 0.0)
    core.request_finished(a0)  # a has nothing open now: its next call is on its way
    core.advance(1.0)
    assert core.lookahead.holding and core.peek() is None  # b comes after a: not admitted in this pass
    core.advance(1.0)  # the same moment: no new pass
    assert core.peek() is None
    core.advance(2.0)
    assert not core.lookahead.holding and core.peek() is b0  # the pass after, a's place is given up


def test_its_next_call_and_anything_ahead_of_it_go_in():
    core = core_with()
    a0, _ = running(core, "a0", "a"), running(core, "x0", "x")
    core.request_arrived("b0", "b", 10, 10.0, 0.0)
    core.request_finished(a0)
    core.advance(3.0)
    a1 = core.request_arrived("a1", "a", 10, 10.0, 0.0)  # a's next call comes
    assert core.peek() is a1
    core.dequeue(a1)
    assert core.peek().request_id == "b0"  # a's call is in: b need not wait for it any more
    early = core_with(prices=(("z", 1.0), *PRICES))
    a0, _ = running(early, "a0", "a"), running(early, "x0", "x")
    z0 = early.request_arrived("z0", "z", 10, 10.0, 0.0)
    early.request_finished(a0)
    early.advance(4.0)
    assert early.peek() is z0  # z is ordered before a: a's place does not hold it back


def test_no_place_is_kept_for_an_agent_that_ended_or_paused_nor_on_an_idle_engine():
    for end in ("finished", "paused"):
        core = core_with()
        a0, _ = running(core, "a0", "a"), running(core, "x0", "x")
        b0 = core.request_arrived("b0", "b", 10, 10.0, 0.0)
        core.request_finished(a0)
        core.agent_finished("a", 1.0, pause=end == "paused")
        core.advance(5.0)
        assert core.peek() is b0, end
    core = core_with()
    a0 = running(core, "a0", "a")
    b0 = core.request_arrived("b0", "b", 10, 10.0, 0.0)
    core.request_finished(a0)  # nothing else runs: holding b would leave the engine idle
    core.advance(6.0)
    assert core.peek() is b0


def test_under_async_scheduling_the_place_is_kept_for_two_passes():
    core = core_with(hold_passes=2)
    a0, _ = running(core, "a0", "a"), running(core, "x0", "x")
    b0 = core.request_arrived("b0", "b", 10, 10.0, 0.0)
    core.request_finished(a0)
    core.advance(1.0)
    assert core.peek() is None
    core.advance(2.0)
    assert core.peek() is None
    core.advance(3.0)
    assert core.peek() is b0


def test_the_baselines_keep_no_place():
    for policy in ("fcfs", "las", "srjf", "vtc"):
        core = core_with(policy)
        a0, _ = running(core, "a0", "a"), running(core, "x0", "x")
        b0 = core.request_arrived("b0", "b", 10, 10.0, 0.0)
        core.request_finished(a0)
        core.advance(7.0)
        assert core.peek() is b0, policy
