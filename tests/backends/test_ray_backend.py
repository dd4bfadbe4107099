"""``RayBackend`` against a fake deployment handle (no Ray started): the one clock's tags on every
request, M from the replicas' reports, and what happens when a replica fails before or after its
first token, or refuses a request."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("ray")
from ray.exceptions import ActorDiedError, RayTaskError  # noqa: E402

from justitia.backends.base import DEADLINE, BackendError, BackendInterrupted, Completion, Sampling  # noqa: E402
from justitia.backends.ray.backend import RayBackend  # noqa: E402
from justitia.backends.ray.replica import EngineDead, ReplicaOutput  # noqa: E402
from justitia.core import Registration


class FakeHandle:
    """Stands in for the deployment handle: each call runs ``script`` (a list of behaviours, one per send)."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = []

    def options(self, stream: bool):
        assert stream
        return self

    @property
    def generate(self):
        return self

    def remote(self, ids, params, request_id, route):
        self.calls.append(
            {
                "ids": ids,
                "xargs": dict(params.extra_args),
                "request_id": request_id,
                "route": route,
                "at": time.monotonic(),
            }
        )
        return FakeStream(self.script.pop(0), request_id, params.max_tokens)


class FakeStream:
    def __init__(self, behaviour, request_id, n):
        self.behaviour, self.request_id, self.n = behaviour, request_id, n
        self.cancelled = False

    def cancel(self):
        self.cancelled = True

    def __aiter__(self):
        return self._run()

    async def _run(self):
        if self.behaviour.startswith("dies") and self.behaviour != "dies-midway":  # "dies" or "dies:<actor id>"
            exc = ActorDiedError()
            exc.actor_id = self.behaviour.partition(":")[2] or None
            raise exc
        if self.behaviour.startswith("engine-dead:"):  # the replica's engine core died (its pid)
            raise RayTaskError(
                "generate",
                "traceback",
                EngineDead("its vLLM engine core has died.", int(self.behaviour.partition(":")[2])),
            )
        if self.behaviour == "refuses":
            raise RayTaskError("generate", "traceback", ValueError("the prompt is longer than the context"))
        yield ReplicaOutput(self.request_id, [Completion("a", [1], None)], False)
        if self.behaviour == "dies-midway":
            raise ActorDiedError()
        pid = int(self.behaviour.partition(":")[2] or (11 if self.behaviour == "ok" else 12))  # "ok:<pid>"
        yield ReplicaOutput(
            self.request_id,
            [Completion("b", [2] * (self.n - 1), "length")],
            True,
            {"pid": pid, "actor": f"actor-{pid}", "capacity_per_s": 400.0 if pid != 13 else 600.0},
        )


def _backend(script, replicas=2):
    info = {"model": "tiny", "tokenizer_dir": "/tmp", "kv_tokens": 1000, "max_model_len": 2048, "block_size": 4}
    return RayBackend(FakeHandle(script), info, replicas, "justitia", 1000.0, 60.0, True, local=True)


async def _run(backend, agent_id="a", ids=(1, 2, 3, 4, 5, 6), done=True):
    params = Sampling(max_tokens=3, extra_args={"agent_id": agent_id, "agent_done": done})
    return [o async for o in backend.generate({"prompt_token_ids": list(ids)}, params, "req-1")]


def test_every_request_carries_its_agents_tag_and_the_router_reads_its_cost_and_first_block():
    backend = _backend(["ok"])
    tag = asyncio.run(backend.register(Registration("a", "mrs", 500.0)))
    outs = asyncio.run(_run(backend))
    call = backend.handle.calls[0]
    assert call["xargs"]["agent_tag"] == tag == 500.0  # V(0) + C
    assert call["route"]["cost"] > 0 and call["route"]["prefix"] == backend.prefix([1, 2, 3, 4, 5, 6])
    assert backend.prefix([1, 2, 3]) is None  # no full block: no affinity
    assert [o.request_id for o in outs] == ["req-1", "req-1"] and outs[-1].finished
    assert backend.unfinished() == 0 and backend.book.agent("a") is None  # its last request: released


def test_the_clock_runs_at_the_replicas_measured_m_from_the_next_arrival():
    backend = _backend(["ok"])
    asyncio.run(_run(backend, "a"))  # replica 11 reports 400 per second
    assert backend.capacity() == 800.0  # the mean of the reports x 2 replicas
    asyncio.run(backend.register(Registration("b", "mrs", 100.0)))
    assert backend.book.clock().capacity_per_s == 800.0


def test_a_replica_that_dies_before_any_token_is_tried_again_and_after_one_fails_retryably(monkeypatch):
    monkeypatch.setattr("justitia.backends.ray.backend.RETRY_S", 0.0)
    backend = _backend(["dies", "ok"])
    outs = asyncio.run(_run(backend))
    assert outs[-1].finished and backend.retried == 1 and len(backend.handle.calls) == 2
    backend = _backend(["dies-midway"])
    with pytest.raises(BackendInterrupted, match="midway"):
        asyncio.run(_run(backend))
    assert backend.interrupted == 1 and len(backend.handle.calls) == 1  # tokens went out: not re-sent silently
    backend = _backend(["dies"] * 12 + ["ok"])  # a replica restart takes tens of seconds: not 4 tries
    assert asyncio.run(_run(backend))[-1].finished and backend.retried == 12


def test_a_request_is_sent_again_till_its_agents_deadline_and_then_fails(monkeypatch):
    """Sends stop at the deadline the agent API sets (``DEADLINE``): not before, not after."""
    monkeypatch.setattr("justitia.backends.ray.backend.RETRY_S", 0.01)
    monkeypatch.setattr("justitia.backends.ray.backend.RETRY_MAX_S", 0.01)
    backend = _backend(["dies"] * 10_000)

    deadline = time.monotonic() + 0.3

    async def within():
        DEADLINE.set(deadline)
        return await _run(backend)

    with pytest.raises(BackendError, match="before its deadline"):
        asyncio.run(within())
    failed = time.monotonic()
    # judged against the deadline itself, not a bound on this machine's speed: every send before it,
    # and no failure until the next wait (0.01 s) would pass it
    sends = [call["at"] for call in backend.handle.calls]
    assert max(sends) <= deadline < failed + 0.01 and backend.retried >= 5 and len(sends) == backend.retried + 1
    assert backend.unfinished() == 0


def test_an_engine_core_that_dies_in_a_live_replica_is_retried_and_its_replica_leaves_m(monkeypatch):
    """``EngineDead`` from a replica (its engine core died; the replica lives on until Ray's health
    check replaces it) is sent again, and the cluster's M drops that replica until a new one answers."""
    monkeypatch.setattr("justitia.backends.ray.backend.RETRY_S", 0.0)
    backend = _backend(["ok:11", "ok:12", "engine-dead:12", "ok:11", "ok:13"])
    asyncio.run(_run(backend, "a"))
    asyncio.run(_run(backend, "b"))
    assert backend.capacity() == 800.0  # two replicas at 400
    outs = asyncio.run(_run(backend, "c"))
    assert outs[-1].finished and backend.retried == 1
    assert backend.capacity() == 400.0  # replica 12 left: one live replica at 400
    asyncio.run(_run(backend, "d"))  # replica 13, Ray's replacement, answers at 600
    assert backend.capacity() == 1000.0  # (400 + 600) / 2 x 2


def test_a_dead_replica_named_by_rays_error_leaves_m(monkeypatch):
    """Ray's ``ActorDiedError`` names the dead actor: that replica's M leaves the cluster's."""
    monkeypatch.setattr("justitia.backends.ray.backend.RETRY_S", 0.0)
    backend = _backend(["ok:11", "ok:12", "dies:actor-12", "ok:11"])
    for agent in "abc":
        asyncio.run(_run(backend, agent))
    assert backend.dead == 1 and backend.capacity() == 400.0 and set(backend.measured) == {11}


def test_a_request_the_engine_refuses_fails_with_its_reason_and_is_not_sent_again():
    backend = _backend(["refuses", "ok"])
    with pytest.raises(BackendError, match="longer than the context"):
        asyncio.run(_run(backend))
    assert len(backend.handle.calls) == 1


def test_dynamic_policies_are_refused_before_any_replica_starts():
    info = {"model": "tiny", "tokenizer_dir": "/tmp", "kv_tokens": 1000, "max_model_len": 2048}
    with pytest.raises(ValueError, match="--ray: policy 'vtc'"):
        RayBackend(FakeHandle([]), info, 2, "vtc", 1000.0, 60.0, True, local=True)
