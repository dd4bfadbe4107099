"""``justitia serve --ray``: two engine replicas (tiny model, the plug-in in each) on a local Ray
Serve instance behind one clock, over real HTTP; a replica killed mid-run; nothing outlives the
server, even by SIGKILL. One server for the module: Ray and two engines take a minute or two."""

from __future__ import annotations

import os
import signal
import sys
import time

import httpx
import pytest
from servers import Server, free_port, metric, samples, sigkill, wait_agent

pytest.importorskip("ray.serve")


def _answers(client: httpx.Client) -> dict[int, int]:
    """Requests each replica answered, by its process id (from /metrics)."""
    return {
        int(labels["replica_pid"]): int(value)
        for _, labels, value in samples(client.get("/metrics").text, "justitia_ray_replica_answers_total")
    }


def _wait_until(ready, timeout_s: float, failure: str) -> None:
    deadline = time.time() + timeout_s
    while not ready():
        assert time.time() < deadline, f"{failure} within {timeout_s:.0f} s"
        time.sleep(0.1)


def _wait_agents(client: httpx.Client, ids: list[str], stall_s: float = 180) -> list[dict]:
    """The agents' final documents, waiting as long as the replicas make progress: it fails once no
    replica has answered a request for ``stall_s`` while some agent is unfinished (how long the whole
    run takes depends on this machine's speed; a stall does not)."""
    docs: dict[str, dict] = {}
    answered, last = _answers(client), time.time()
    while True:
        for a in ids:
            if a not in docs and (doc := client.get(f"/v1/agents/{a}").json())["status"] in (
                "done",
                "failed",
                "cancelled",
            ):
                docs[a] = doc
        if len(docs) == len(ids):
            return [docs[a] for a in ids]
        if (now := _answers(client)) != answered:
            answered, last = now, time.time()
        assert time.time() - last < stall_s, (
            f"no replica answered for {stall_s:.0f} s; unfinished: "
            f"{[a for a in ids if a not in docs]}, answers: {answered}"
        )
        time.sleep(0.2)


def _agent(n_tasks: int, tokens: int, tag: str) -> dict:
    first = [
        {"prompt": f"{tag}: part {i} of the report.", "max_tokens": tokens, "ignore_eos": True} for i in range(n_tasks)
    ]
    return {"type": "mrs", "stages": [first, [{"prompt": "Combine:\n{{prev}}", "max_tokens": 8, "ignore_eos": True}]]}


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "justitia",
        "serve",
        "--ray",
        "--replicas",
        "2",
        "--port",
        str(port),
        "--kv-blocks",
        "24",
        "--journal",
        str(tmp / "journal.sqlite"),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]  # vLLM's own options, for each replica
    server = Server(cmd, port, tmp / "server.log")
    server.wait_ready("/health", timeout_s=420)
    yield server
    left = sigkill(server)  # Ray's processes and every engine die with the server, even by SIGKILL
    assert server.children and not left, f"processes outlived the server: {left}\n{server.output()[-2000:]}"


def test_agents_run_on_two_ray_replicas_in_the_order_of_one_clock(ray_server):
    """An elephant of 24 long tasks (more than both replicas' KV caches hold at once), then four
    mice: the one clock tags the mice ahead of it, each replica's plug-in admits them before the
    elephant's waiting tasks, and every mouse finishes before the elephant (in arrival order, they
    would wait for its second wave)."""
    with httpx.Client(base_url=ray_server.url, timeout=60) as client:
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["virtual_clock"] is True
        before = sum(_answers(client).values())
        elephant = _agent(24, 384, "elephant")
        elephant["stages"][1][0]["prompt"] = "Combine, starting from:\n{{prev[0]}}"  # all 24 answers would not fit
        ids = [client.post("/v1/agents", json=elephant).json()["agent_id"]]
        # the mice come once all 24 of the elephant's first-stage requests are with the replicas
        _wait_until(
            lambda: metric(client, "justitia_engine_requests_unfinished") >= 24,
            120,
            "the elephant's 24 requests never were all in flight",
        )
        ids += [client.post("/v1/agents", json=_agent(1, 8, f"mouse{i}")).json()["agent_id"] for i in range(4)]
        docs = _wait_agents(client, ids)
        assert [d["status"] for d in docs] == ["done"] * 5, [d.get("error") for d in docs]
        for d, tokens in zip(docs, [384] + [8] * 4):
            assert all(t is not None and t["output_tokens"] == tokens for t in d["stages"][0])
            assert d["stages"][1][0]["output_tokens"] == 8
            assert d["virtual_finish"] is not None and d["virtual_finish"] >= d["predicted_cost"]
        elephant, mice = docs[0], docs[1:]
        assert max(m["virtual_finish"] for m in mice) < elephant["virtual_finish"]
        assert max(m["finish_s"] for m in mice) < elephant["finish_s"], [(d["agent_id"], d["finish_s"]) for d in docs]
        answers = _answers(client)
        assert len(answers) == 2 and sum(answers.values()) - before == 25 + 4 * 2, answers  # both replicas served
        # the one clock runs at the replicas' measured M together
        assert metric(client, "justitia_clock_capacity") > 0
        assert metric(client, "justitia_ray_replicas") == 2
        r = client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 5, "ignore_eos": True}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_every_body_vllm_takes_is_served_by_a_replicas_own_vllm_app(ray_server):
    from twelve import TWELVE

    with httpx.Client(base_url=ray_server.url, timeout=120) as client:
        before = sum(_answers(client).values())
        for name, body in TWELVE.items():
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, (name, r.text)
        hi = [{"role": "user", "content": "hi"}]
        r = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 3, "messages": hi})
        assert r.status_code == 200 and r.json()["type"] == "message"
        r = client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 3})
        assert r.status_code == 200 and r.json()["object"] == "response"
        with client.stream(
            "POST", "/v1/chat/completions", json={"model": "tiny", "messages": hi, "max_tokens": 3, "stream": True}
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert sum(_answers(client).values()) - before == len(TWELVE) + 3  # each answered by a replica


def test_a_replica_killed_mid_run_is_restarted_and_no_agent_is_lost(ray_server):
    with httpx.Client(base_url=ray_server.url, timeout=60) as client:
        before = _answers(client)
        victim = max(before, key=before.get)
        ids = [client.post("/v1/agents", json=_agent(4, 384, f"k{i}")).json()["agent_id"] for i in range(8)]
        # kill once the replicas are answering this batch: requests are in flight
        _wait_until(
            lambda: sum(_answers(client).values()) > sum(before.values()),
            120,
            "the replicas answered none of the batch",
        )
        os.kill(victim, signal.SIGKILL)
        docs = _wait_agents(client, ids)
        assert [d["status"] for d in docs] == ["done"] * 8, [d.get("error") for d in docs]
        for d in docs:
            assert all(t is not None and t["output_tokens"] == 384 for t in d["stages"][0])
            assert d["stages"][1][0] is not None
        # the kill hit requests in flight: sent again (no token yet) or their task run once more
        assert metric(client, "justitia_ray_retries_total") + metric(client, "justitia_ray_interrupted_total") >= 1
        # Ray starts a new replica in the dead one's place: a process id not seen before answers
        deadline = time.time() + 300
        while time.time() < deadline:
            a = client.post("/v1/agents", json=_agent(2, 8, "after")).json()["agent_id"]
            assert wait_agent(client, a, timeout_s=120)["status"] == "done"
            fresh = set(_answers(client)) - set(before)
            if fresh:
                break
            time.sleep(2)
        assert fresh, f"no restarted replica answered within 300 s: {_answers(client)}"
        assert client.get("/health").status_code == 200
