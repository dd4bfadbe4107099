"""Sessions known only through their requests' metadata (``AgentBook``: the plug-in, tagging front
ends, the server): a session is priced burst by burst, leaves the engine between bursts and is
kept across its pauses (docs/sessions.md)."""

import pytest

from justitia.core import AgentBook, AgentScheduler, Charge, RequestMeta

M = 100.0  # cost units a second


def book(policy="justitia", **kw):
    return AgentBook.for_policy(policy, M, **kw)


def meta(agent_id="s", cost=None, **kw):
    return RequestMeta(agent_id, "chat", agent_cost=cost, request_cost=cost, **kw)


def test_session_and_turn_start_ride_on_extra_args_and_survive_losing_prices():
    m = RequestMeta("s", agent_cost=5.0, session=True, turn_start=True)
    assert RequestMeta.parse(m.to_extra_args()) == m
    assert m.without_prices().session and m.without_prices().turn_start
    assert "session" not in RequestMeta("a").to_extra_args()


def test_a_turn_start_settles_the_burst_and_returns_behind_gps_s_earlier_work():
    b = book()
    b.arrive("r1", meta(cost=1000.0, session=True), 10, 10, 0.0)
    assert b.virtual_finish("s") == pytest.approx(1000.0)
    b.finish("r1", 1.0)  # asked for 1000 in all; GPS has served 100 of it by t=1
    assert not b.agent("s").paused  # a pause inside a turn keeps its place
    b.arrive("r2", meta(cost=50.0, session=True, turn_start=True), 10, 10, 1.0)
    # settled at what it asked (1000, unchanged), then S = max(V(1)=100, f_before=1000) + 50
    assert b.virtual_finish("s") == pytest.approx(1050.0)


def test_a_session_back_after_gps_finished_its_work_starts_at_v_now():
    b = book()
    b.arrive("r1", meta(cost=100.0, session=True), 10, 10, 0.0)
    b.finish("r1", 0.5)
    assert b.pause("s", 0.5) and b.agent("s").paused
    b.arrive("r2", meta(cost=100.0, session=True), 10, 10, 5.0)  # V(5) = 100 + idle: V stops at 100
    assert not b.agent("s").paused
    v = b.clock(5.0).virtual_time
    assert b.virtual_finish("s") == pytest.approx(v + 100.0)


def test_without_session_a_turn_start_changes_nothing():
    b = book()
    b.arrive("r1", meta(cost=1000.0), 10, 10, 0.0)
    b.finish("r1", 1.0)
    b.arrive("r2", meta(cost=50.0, turn_start=True), 10, 10, 1.0)
    assert b.virtual_finish("s") == pytest.approx(1000.0) and not b.pause("s", 1.0)


def test_a_pause_asked_while_requests_are_open_waits_for_the_last():
    b = book()
    b.arrive("r1", meta(cost=10.0, session=True), 10, 10, 0.0)
    b.arrive("r2", meta(cost=10.0, session=True), 10, 10, 0.0)
    assert not b.pause("s", 0.1) and not b.agent("s").paused
    b.finish("r1", 0.2)
    assert not b.agent("s").paused
    b.finish("r2", 0.3)
    assert b.agent("s").paused


def test_las_keeps_a_sessions_service_across_a_pause():
    core = AgentScheduler.for_policy("las", M)
    b = AgentBook(core)
    info, _ = b.arrive("r1", meta(session=True), 100, 10, 0.0)
    core.charge(info, Charge(100, 10, 1050))
    b.finish("r1", 1.0)
    b.pause("s", 1.0)
    b.arrive("r2", meta(session=True, turn_start=True), 10, 10, 2.0)
    other, _ = b.arrive("r3", meta("t"), 10, 10, 2.0)
    mine = b.request("r2")
    assert core.priority(mine) > core.priority(other)  # LAS: the session's earlier service counts


def test_a_session_is_kept_across_pauses_until_its_keep_time_then_released():
    b = book(idle_release_s=5.0, session_keep_s=50.0)
    b.arrive("r1", meta(cost=10.0, session=True), 10, 10, 0.0)
    b.arrive("q1", meta("plain", cost=10.0), 10, 10, 0.0)
    b.finish("r1", 1.0)
    b.finish("q1", 1.0)
    b.pause("s", 1.0)
    assert b.sweep(10.0) == ["plain"]  # a plain agent goes after its idle time
    assert b.agent("s") is not None and b.sweep(40.0) == []
    assert b.sweep(51.0) == ["s"] and b.agent("s") is None


def test_a_front_end_clock_keeps_sessions_as_long_as_the_plug_in_is_told(monkeypatch):
    from justitia.backends.tagging import TaggingBackend

    class Front(TaggingBackend):  # the clock alone: --upstream's and --ray's, without their engines
        generate = unfinished = None

    monkeypatch.setenv("JUSTITIA_SESSION_KEEP_S", "42")
    front = Front()
    front._start_clock("justitia", M, 60.0, True)
    front.book.arrive("r1", meta(cost=10.0, session=True), 10, 10, 0.0)
    front.book.finish("r1", 1.0)
    assert front.book.sweep(42.0) == [] and front.book.sweep(43.5) == ["s"]  # kept 42 s, not the default 600
    monkeypatch.setenv("JUSTITIA_SESSION_KEEP_S", "soon")
    with pytest.raises(ValueError, match="JUSTITIA_SESSION_KEEP_S"):
        Front()._start_clock("justitia", M, 60.0, True)
