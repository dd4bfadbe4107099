"""The plug-in's own prices for bursts that reach the engine without one (``vllm/pricer.py``): a
harness's turns through the door carry a session and a turn start, never a cost. At the scheduler
level, no engine (``tests/vllm_scheduler.py``)."""

from __future__ import annotations

import math

from vllm_scheduler import Driver, count_charges, make_scheduler, request

from justitia.core import KV, RETIRE, ControlCall
from justitia.core.book import unpriced
from justitia.vllm.plugin import JustitiaScheduler

PROMPT, ANSWER = 60, 8  # every turn's one request


def turns(scheduler, sessions: int, per_session: int, tenant: str | None = None) -> list[tuple[float, float]]:
    """Sessions taking turns of one request each, without a price: (price at arrival, service
    charged) per turn, in order."""
    _, charged = count_charges(scheduler)
    driver = Driver(scheduler, 2)
    out = []
    for t in range(per_session):
        for s in range(sessions):
            agent_id = f"s{s}"
            before = charged.get(agent_id, [0, 0, 0])[2]
            extra = {"agent_id": agent_id, "session": True, "turn_start": True} | ({"tenant": tenant} if tenant else {})
            scheduler.add_request(request(f"s{s}-t{t}", PROMPT, ANSWER, first_token=7 * s + t, **extra))
            price = scheduler.core.agent(agent_id).info.predicted_cost
            driver.run()
            out.append((price, charged[agent_id][2] - before))
        if scheduler.pricer is not None:
            scheduler.pricer.predictor.flush()  # the background refits caught up (pricing never waits for them)
    return out


def test_a_sessions_turns_without_a_price_are_priced_from_the_engines_own_bursts(monkeypatch):
    """The first turns are priced from their prompts alone (a short answer assumed); as bursts end,
    the engine learns what such turns cost, and later turns are priced within 25 % of it."""
    monkeypatch.delenv("JUSTITIA_PRICING", raising=False)
    scheduler = make_scheduler(JustitiaScheduler, True)
    seen = turns(scheduler, sessions=4, per_session=6)
    errors = [abs(math.log(price / actual)) for price, actual in seen]
    assert all(actual > 0 for _, actual in seen)
    assert errors[0] > math.log(2)  # cold: the prompt with a 32-token answer, a wide spread
    assert max(errors[-4:]) < math.log(1.25), errors  # learned
    assert scheduler.pricer.predictor.observations >= len(seen) - 4  # every ended burst (the last ones are open)


def test_with_max_tokens_pricing_a_turn_is_priced_by_its_max_tokens_alone(monkeypatch):
    monkeypatch.setenv("JUSTITIA_PRICING", "max-tokens")
    scheduler = make_scheduler(JustitiaScheduler, True)
    assert scheduler.pricer is None
    seen = turns(scheduler, sessions=2, per_session=3)
    cold = unpriced(KV, PROMPT, ANSWER).index(0.0)
    assert all(price == cold for price, _ in seen)  # never learns


def test_one_tenants_bursts_do_not_move_anothers_prices(monkeypatch):
    monkeypatch.delenv("JUSTITIA_PRICING", raising=False)
    scheduler = make_scheduler(JustitiaScheduler, True)
    cold = turns(scheduler, sessions=1, per_session=1, tenant="team-b")[0][0]
    scheduler = make_scheduler(JustitiaScheduler, True)
    learned = turns(scheduler, sessions=4, per_session=5, tenant="team-a")[-1][0]
    scheduler.add_request(request("b-0", PROMPT, ANSWER, agent_id="b", session=True, turn_start=True, tenant="team-b"))
    assert scheduler.core.agent("b").info.predicted_cost == cold != learned  # team-a's moved, team-b's did not


def test_a_turn_is_learned_when_the_door_sees_it_end_and_only_once(monkeypatch):
    """``retire`` with ``turn_end`` (the door saw an answer that calls no tool): the burst is learned
    then, a session of one turn too; not while a request of it is open, and not again when the
    session's next turn opens. Its release learns the turn the door did not see end."""
    monkeypatch.delenv("JUSTITIA_PRICING", raising=False)
    scheduler = make_scheduler(JustitiaScheduler, True)
    pred, driver = scheduler.pricer.predictor, Driver(scheduler, 2)
    ended = ControlCall(RETIRE, {"agent_id": "s", "turn_end": True})
    scheduler.add_request(request("s-t0", PROMPT, ANSWER, agent_id="s", session=True, turn_start=True))
    assert scheduler.control(ended) is False  # its request is open
    driver.run()
    assert scheduler.control(ended) is True and scheduler.control(ended) is False
    assert pred.flush() and pred.observations == 1
    scheduler.add_request(request("s-t1", PROMPT, ANSWER, first_token=9, agent_id="s", session=True, turn_start=True))
    driver.run()
    assert pred.flush() and pred.observations == 1  # turn 0 was not learned again as turn 1 opened
    assert scheduler.core.agent("s") is not None  # the door's word released nothing
    scheduler.control(ControlCall(RETIRE, {"agent_id": "s"}))
    assert pred.flush() and pred.observations == 2


def test_what_the_engine_learned_is_kept_across_a_restart(monkeypatch, tmp_path):
    """``JUSTITIA_PRICING_STATE``: saved at shutdown, reloaded by the next engine, which prices the
    next turn as the first one left off; a damaged file is set aside and the engine starts cold."""
    state = tmp_path / "pricing.json"
    monkeypatch.delenv("JUSTITIA_PRICING", raising=False)
    monkeypatch.setenv("JUSTITIA_PRICING_STATE", str(state))
    first = make_scheduler(JustitiaScheduler, True)
    turns(first, sessions=4, per_session=5)
    first.add_request(request("probe-1", PROMPT, ANSWER, agent_id="probe", session=True, turn_start=True))
    learned = first.core.agent("probe").info.predicted_cost
    assert learned < turns(make_scheduler(JustitiaScheduler, True), 1, 1)[0][0] / 2  # it learned (cold: far above)
    first.shutdown()
    assert state.is_file()
    second = make_scheduler(JustitiaScheduler, True)
    second.add_request(request("probe-2", PROMPT, ANSWER, agent_id="probe", session=True, turn_start=True))
    assert second.core.agent("probe").info.predicted_cost == learned
    state.write_text("{not json")
    third = make_scheduler(JustitiaScheduler, True)
    assert (tmp_path / "pricing.json.bad").is_file() and third.pricer.predictor.observations == 0
