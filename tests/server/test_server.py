"""`justitia serve` on the tiny model: the agent API over real HTTP, bad input, cancel, events."""

import asyncio
import json
import re
import socket
import sqlite3
import sys
import time

import httpx
import pytest
from inprocess import RecordingBackend, WordTokenizer
from servers import Server, free_port, metric, metric_sum, samples, sigkill, wait_agent

from justitia.core import Registration
from justitia.lab.costs import abuse
from justitia.predictors import make_predictor
from justitia.server.agents import AgentManager, Settings
from justitia.server.metrics import prometheus_text
from justitia.server.schema import AgentSpec, SpecError, check_agent, render


# ------------------------------------------------------------------------- placeholders (no server)
def test_placeholders_render_earlier_outputs_and_bad_ones_are_refused():
    outputs = [["a0", "a1"], ["b0"]]
    assert render("x {{prev}} y", 1, outputs[:1]) == "x a0\n\na1 y"
    assert render("{{prev[0]}}|{{stage[0][1]}}|{{ stage[1] }}", 2, outputs) == "b0|a1|b0"
    assert render("{not} {{other}}", 1, outputs[:1]) == "{not} {{other}}"

    def spec(*stages):
        return AgentSpec(stages=[[{"prompt": p} for p in st] for st in stages])

    check_agent(spec(["a", "b"], ["{{prev[1]}} {{stage[0]}}"]), 10, 1000)
    with pytest.raises(SpecError, match=r"stages\[0\]\[0\].prompt.*earlier stage"):
        check_agent(spec(["{{prev}}"]), 10, 1000)
    with pytest.raises(SpecError, match=r"stages\[1\]\[0\].prompt.*names task 2"):
        check_agent(spec(["a", "b"], ["{{prev[2]}}"]), 10, 1000)
    with pytest.raises(SpecError, match=r"stages\[1\]\[0\].prompt.*earlier stage"):
        check_agent(spec(["a"], ["{{stage[1]}}"]), 10, 1000)
    with pytest.raises(SpecError, match="limit of 2"):
        check_agent(spec(["a", "b", "c"]), 2, 1000)


@pytest.mark.parametrize("policy", ["justitia", "vtc"])
def test_metrics_report_the_clock_of_the_policy_that_orders_the_engine_or_say_there_is_none(policy):
    backend = RecordingBackend(policy, capacity=100.0, state_at=1.0)  # its clock (if any): M = 100/s, read at t=1
    manager = AgentManager(backend, None, Settings(policy=policy), make_predictor("oracle"))
    tag = asyncio.run(backend.register(Registration("a", "t", 50.0)))
    text = prometheus_text(manager, asyncio.run(backend.state()))
    values = {name: value for name, labels, value in samples(text) if labels == {"model_name": manager.watch.model}}
    assert values["justitia_policy_agents"] == 1
    if policy == "justitia":  # tag 50 at t=0; at t=1 the clock (M = 100/s, one agent) has reached V = 50
        assert tag == 50.0 and values["justitia_virtual_time"] == 50.0
        assert values["justitia_clock_capacity"] == 100
    else:
        assert tag is None and "justitia_virtual_time" not in values
        assert "# justitia_virtual_time: none, policy 'vtc' keeps no GPS virtual clock" in text


class FirstStagePredictor(type(make_predictor("oracle"))):
    """Reads only the first stage, as the paper's predictors do."""

    def agent_cost(self, agent, model):
        return sum(model.request_cost(t.prompt_tokens, t.output_tokens) for t in agent.stages[0])


def test_an_agent_submitted_whole_is_priced_on_every_stage_so_a_cheap_first_stage_hides_nothing():
    backend = RecordingBackend(capacity=100.0)
    manager = AgentManager(backend, WordTokenizer(), Settings(), FirstStagePredictor())
    task = {"prompt": "one two three four", "max_tokens": 8}
    trojan = AgentSpec.model_validate({"stages": [[task], [task] * 19]})

    async def submit():
        run = await manager.submit(trojan)
        run.task.cancel()
        return run

    run = asyncio.run(submit())
    one = 4 * 8 + 8 * 8 / 2  # what the first stage's request costs, at its max_tokens
    assert run.process.predicted_cost == pytest.approx(20 * one)  # not the predictor's 1 x
    assert backend.book.virtual_finish(run.agent_id) == pytest.approx(20 * one)


# ---------------------------------------------------------------------------- a crash mid-run
def test_a_server_killed_mid_run_loses_no_accepted_agent_and_leaves_no_engine_behind(tmp_path):
    journal = tmp_path / "journal.sqlite"

    def start(name):
        port = free_port()
        srv = Server(
            [
                sys.executable,
                "-m",
                "justitia",
                "serve",
                "--port",
                str(port),
                "--predictor",
                "mean",
                "--kv-blocks",
                "16",
                "--max-model-len",
                "1024",
                "--journal",
                str(journal),
            ],
            port,
            tmp_path / f"{name}.log",
        )
        srv.wait_ready("/health")
        return srv

    def agent(k):
        return {
            "type": "mrs",
            "stages": [
                [{"prompt": f"Part {k}.{i}.", "max_tokens": 64, "ignore_eos": True} for i in range(2)],
                [{"prompt": "Combine: {{prev}}", "max_tokens": 64, "ignore_eos": True}],
                [{"prompt": "Shorter: {{prev[0]}}", "max_tokens": 16, "ignore_eos": True}],
            ],
        }

    first = start("first")
    with httpx.Client(base_url=first.url, timeout=30) as client:
        ids = [client.post("/v1/agents", json=agent(k)).json()["agent_id"] for k in range(8)]
    db = sqlite3.connect(journal)
    deadline = time.time() + 120
    while db.execute("SELECT COUNT(*) FROM outputs").fetchone()[0] < 2:  # some tasks answered, and journaled
        assert time.time() < deadline, "no task finished"
        time.sleep(0.05)
    assert sigkill(first) == []  # vLLM's engine processes died with the server
    unfinished = db.execute("SELECT COUNT(*) FROM agents WHERE status != 'done'").fetchone()[0]
    assert db.execute("SELECT COUNT(*) FROM agents").fetchone()[0] == 8 and unfinished >= 1  # killed mid-run
    db.close()
    second = start("second")
    try:
        assert f'"finished": {8 - unfinished}, "unfinished": {unfinished}' in second.output()  # journal_reloaded
        with httpx.Client(base_url=second.url, timeout=30) as client:
            for agent_id in ids:  # every accepted agent finishes, with every output
                doc = wait_agent(client, agent_id)
                assert doc["status"] == "done", doc
                assert [[t["output_tokens"] for t in stage] for stage in doc["stages"]] == [[64, 64], [64], [16]]
    finally:
        second.stop()


# ------------------------------------------------------------------------------------ the server
KEY, OTHER_KEY, ADMIN_KEY = "sk-test-owner-1", "sk-test-other-2", "sk-test-admin-3"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    where = tmp_path_factory.mktemp("serve")
    keys = where / "keys.txt"
    keys.write_text(f"{KEY} team-a 1\n{OTHER_KEY} team-b 2\n{ADMIN_KEY} ops 1 admin\n")
    # the abuse list's server (justitia/lab/costs/abuse.py: its limits are what its cases test)
    srv = Server(
        [
            sys.executable,
            "-m",
            "justitia",
            "serve",
            "--port",
            str(port),
            *abuse.FLAGS,
            "--api-keys",
            str(keys),
            "--journal",
            str(where / "journal.sqlite"),
        ],
        port,
        where / "serve.log",
        env=abuse.ENV | {"JUSTITIA_LOG_AGENTS": "1"},
    )
    srv.wait_ready("/health")
    with httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as client:
        client.server = srv
        yield client
    srv.stop()


def test_a_map_reduce_agent_runs_its_stages_in_order_and_quotes_earlier_outputs(server):
    body = {
        "type": "mrs",
        "stages": [
            [{"prompt": f"Summarize part {i} of the report.", "max_tokens": 12} for i in range(3)],
            [{"prompt": "Combine these summaries:\n{{prev}}", "max_tokens": 8}],
        ],
    }
    r = server.post("/v1/agents", json=body)
    assert r.status_code == 202, r.text
    agent_id = r.json()["agent_id"]
    doc = wait_agent(server, agent_id)
    assert doc["status"] == "done", doc
    assert doc["predicted_cost"] > 0 and doc["virtual_finish"] > 0 and doc["jct_s"] > 0
    # the tag the server reports is the one the plug-in's clock stamped inside the engine
    stamped = re.search(
        rf"justitia: agent {agent_id} arrived: type='mrs' predicted_cost=\S+ virtual_finish=(\S+)",
        server.server.output(),
    )
    assert stamped and float(stamped.group(1)) == doc["virtual_finish"]
    first, second = doc["stages"]
    assert all(1 <= t["output_tokens"] <= 12 and t["output"] for t in first)
    # the reduce prompt holds the three summaries: longer than its template by their tokens
    assert second[0]["prompt_tokens"] > sum(t["output_tokens"] for t in first)
    events = [
        line for line in server.get(f"/v1/agents/{agent_id}/events").text.splitlines() if line.startswith("event:")
    ]
    assert events[0] == "event: queued" and events[-1] == "event: done"
    assert events.count("event: task_done") == 4


def test_a_session_over_the_agent_api_is_registered_turn_by_turn_in_the_engine(server):
    """Its first turn arrives in the plug-in's book as a session; paused while it waits, its next
    turn, registered ahead, returns it there at its own price: the tags the server reports are the
    ones the plug-in's clock stamped, and its requests did not open a turn again."""
    r = server.post(
        "/v1/agents", json={"type": "chat", "session": True, "stages": [[{"prompt": "Plan the fix.", "max_tokens": 6}]]}
    )
    assert r.status_code == 202, r.text
    agent_id = r.json()["agent_id"]
    deadline = time.time() + 60
    while (doc := server.get(f"/v1/agents/{agent_id}").json())["status"] != "waiting":
        assert time.time() < deadline and doc["status"] in ("queued", "running"), doc
        time.sleep(0.05)
    first = doc["virtual_finish"]
    r = server.post(
        f"/v1/agents/{agent_id}/turns",
        json={"last": True, "stages": [[{"prompt": "The tool said: {{stage[0]}}", "max_tokens": 6}]]},
    )
    assert r.status_code == 202, r.text
    doc = wait_agent(server, agent_id)
    assert doc["status"] == "done" and [t["stages"] for t in doc["turns"]] == [1, 1]
    out = server.server.output()
    arrived = re.findall(
        rf"justitia: agent {agent_id} arrived: type='chat' predicted_cost=\S+ virtual_finish=(\S+)", out
    )
    returned = re.findall(
        rf"justitia: agent {agent_id} returned after a pause: predicted_cost=(\S+) "
        rf"virtual_finish=(\S+) \(was",
        out,
    )
    assert [float(f) for f in arrived] == [first]
    assert [(float(c), float(f)) for c, f in returned] == [
        (pytest.approx(doc["turns"][1]["predicted_cost"], rel=1e-5), doc["virtual_finish"])
    ]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"type": "x"}, 422, "field 'stages' is missing"),
        ({"stages": []}, 422, "field 'stages'"),
        ({"stages": [[]]}, 422, "field 'stages[0]'"),
        ({"stages": [[{"prompt": 7}]]}, 422, "field 'stages[0][0].prompt'"),
        ({"stages": [[{"prompt": "a", "max_tokens": -1}]]}, 422, "field 'stages[0][0].max_tokens'"),
        ({"stages": [[{"prompt": "a", "max_tokens": "many"}]]}, 422, "field 'stages[0][0].max_tokens'"),
        ({"stages": [[{"prompt": "a", "max_tokens": 10**9}]]}, 400, "max_tokens"),
        ({"stages": [[{"prompt": "a", "colour": "red"}]]}, 422, "field 'stages[0][0].colour' is not a known field"),
        ({"stages": [[{"prompt": "a"}]], "priority": 1}, 422, "field 'priority' is not a known field"),
        ({"stages": [[{"prompt": "word " * 1500, "max_tokens": 8}]]}, 400, "exceed the model's context"),
        ({"stages": [[{"prompt": "{{prev}}"}]]}, 400, "earlier stage"),
        ({"stages": [[{"prompt": "a"}] * 17]}, 400, "limit of 16"),
        ({"stages": [[{"prompt": "x" * 30000}]]}, 413, "limit of 20000"),
        ({"stages": [[{"prompt": "a", "temperature": 5}]]}, 422, "field 'stages[0][0].temperature'"),
        ({"stages": [[{"prompt": "a", "stop": [""]}]]}, 422, "field 'stages[0][0].stop[0]'"),
        ({"stages": [[{"prompt": "a", "seed": 2**64}]]}, 422, "field 'stages[0][0].seed'"),
        ({"stages": [[{"prompt": ""}]]}, 422, "field 'stages[0][0].prompt'"),
    ],
)
def test_bad_input_gets_a_4xx_naming_the_field_and_the_server_keeps_serving(server, body, status, words):
    r = server.post("/v1/agents", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]
    assert server.get("/health").status_code == 200


def test_invalid_json_and_unknown_agents(server):
    r = server.post("/v1/agents", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in r.json()["error"]
    assert server.get("/v1/agents/nobody").status_code == 404
    assert server.delete("/v1/agents/nobody").status_code == 404


def test_cancel_aborts_the_agent_and_the_server_goes_on(server):
    body = {
        "stages": [
            [{"prompt": f"Write a long story {i}.", "max_tokens": 900} for i in range(4)],
            [{"prompt": "{{prev}}", "max_tokens": 8}],
        ]
    }
    agent_id = server.post("/v1/agents", json=body).json()["agent_id"]
    deadline = time.time() + 120
    while metric_sum(server, "vllm:num_requests_running") < 1:  # the engine reports its queues
        assert time.time() < deadline, "/metrics never showed the agent's requests running"
        time.sleep(0.05)
    doc = server.delete(f"/v1/agents/{agent_id}").json()
    assert doc["status"] == "cancelled" and doc["stages"][1] == [None]
    # its last stage (the requests that say agent_done) never ran, yet the plug-in releases its state
    # (the idle timeout is 600 s here)
    released = re.compile(rf"justitia: agent {agent_id} released$", re.M)
    deadline = time.time() + 120
    while not released.search(server.server.output()):
        assert time.time() < deadline, "the plug-in kept the cancelled agent's state"
        time.sleep(0.1)
    # the engine is free again: a small agent still runs to the end
    small = server.post("/v1/agents", json={"stages": [[{"prompt": "hi", "max_tokens": 4}]]}).json()["agent_id"]
    assert wait_agent(server, small)["status"] == "done"
    assert metric(server, "justitia_agents_in_flight") == 0


def test_only_a_key_reaches_the_api_and_only_its_owner_sees_an_agent(server):
    body = {"stages": [[{"prompt": "hi", "max_tokens": 2}]]}
    assert httpx.post(f"{server.server.url}/v1/agents", json=body).status_code == 401
    assert '"api_keys": 3' in server.server.output()  # the serving event
    agent_id = server.post("/v1/agents", json=body).json()["agent_id"]
    other = {"Authorization": f"Bearer {OTHER_KEY}"}
    assert server.get(f"/v1/agents/{agent_id}", headers=other).status_code == 404
    assert server.delete(f"/v1/agents/{agent_id}", headers=other).status_code == 404
    assert wait_agent(server, agent_id)["status"] == "done"  # the owner's view; the other key's DELETE did nothing
    r = server.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"agent_cost": 0}})
    assert r.status_code == 400 and "vllm_xargs.agent_cost" in r.json()["error"]["message"]
    assert server.post("/v1/completions", json={"model": "gpt-4", "prompt": "hi", "max_tokens": 2}).status_code == 404


def test_connections_whose_headers_never_finish_are_closed(server):
    host, port = server.server.url.removeprefix("http://").split(":")
    slow = []
    for _ in range(20):  # half-requests: uvicorn alone would hold each connection forever
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/agents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        slow.append(sock)
    assert server.get("/health").status_code == 200  # the server serves meanwhile
    deadline = time.time() + 60  # a bound on waiting, far past the 2 s the server allows
    for k, sock in enumerate(slow):  # closed by the server (--header-timeout 2): recv sees the end of the stream
        sock.settimeout(max(deadline - time.time(), 0.1))
        try:
            assert sock.recv(1024) == b""
        except TimeoutError:
            pytest.fail(f"half-request {k} still open after 60 s: the server never closed it")
        sock.close()
    with socket.create_connection((host, int(port))) as sock:  # a whole request on a raw socket is served
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(30)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_openapi_document_describes_the_agent_api(server):
    doc = server.get("/openapi.json").json()
    assert "/v1/agents" in doc["paths"] and "/v1/agents/{agent_id}/events" in doc["paths"]
    assert json.dumps(doc).count("max_tokens") >= 1


def test_openai_endpoints_join_agents_by_vllm_xargs_or_header(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=str(server.base_url) + "/v1", api_key=KEY)
    done = client.completions.create(
        model="tiny",
        prompt="Once upon a time",
        max_tokens=5,
        extra_body={"vllm_xargs": {"agent_id": "story-1", "agent_type": "mrs"}},
    )
    assert done.choices[0].text and done.usage.completion_tokens <= 5 and done.usage.prompt_tokens > 0
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_headers={"X-Agent-Id": "story-1"},
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 4
    alone = client.completions.create(model="tiny", prompt="x", max_tokens=3)
    assert alone.usage.completion_tokens <= 3
    forced = client.completions.create(model="tiny", prompt="x", max_tokens=6, extra_body={"ignore_eos": True})
    assert forced.usage.completion_tokens == 6  # vLLM's ignore_eos extension
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="word " * 1500, max_tokens=8)


def wait_engine_idle(server, what: str, timeout_s: float = 120) -> None:
    """Until the engine holds no request; fails naming ``what`` if it still does after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while metric(server, "justitia_engine_requests_unfinished") != 0:
        assert time.time() < deadline, f"{what} after {timeout_s:.0f} s"
        time.sleep(0.1)


def generated_tokens(server) -> float:
    """Tokens the engine has generated so far (vLLM's own counter)."""
    return metric_sum(server, "vllm:generation_tokens_total")


# Whether a request a client left was aborted is judged by what the engine generated for it (vLLM's
# own count): with ignore_eos, a request that ran on produced all its tokens, however fast or busy
# this machine is.


def test_a_client_that_leaves_a_stream_has_its_request_aborted(server):
    body = {"prompt": "Tell me everything.", "max_tokens": 1000, "stream": True, "temperature": 0, "ignore_eos": True}
    wait_engine_idle(server, "earlier tests' requests are still in the engine")
    before = generated_tokens(server)
    with server.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        chunks = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
            if len(chunks) == 20:
                break
        assert chunks[0]["object"] == "text_completion"
    wait_engine_idle(server, "the abandoned stream's request is still in the engine")
    # it left at the stream's next write: with a fraction of its 1,000 tokens, not all of them
    assert 20 <= generated_tokens(server) - before < 500, generated_tokens(server) - before
    # a stream read to the end closes with [DONE]
    with server.stream("POST", "/v1/completions", json=body | {"max_tokens": 3}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 2


def test_a_client_that_leaves_a_plain_completion_has_its_request_aborted(server):
    body = json.dumps(
        {"prompt": "Tell me everything.", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
    ).encode()
    wait_engine_idle(server, "earlier tests' requests are still in the engine")
    before = generated_tokens(server)
    host, port = server.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:  # a client that leaves once its request runs
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.time() + 120
        while generated_tokens(server) - before < 20:
            assert time.time() < deadline, "the engine generated no tokens for the completion in 120 s"
            time.sleep(0.02)
    wait_engine_idle(server, "the abandoned completion is still in the engine")
    # the server looks for a gone client every 0.5 s: the request left without its 1,000 tokens
    assert generated_tokens(server) - before < 1000, generated_tokens(server) - before


def test_metrics_in_prometheus_format(server):
    text = server.get("/metrics").text
    for name in (
        "justitia_agents_in_flight",
        "justitia_virtual_time",
        "justitia_predictor_latency_seconds_count",
        "justitia_engine_requests_unfinished",
        'justitia_requests_total{endpoint="agents"}',
    ):
        metric(server, name)
    # the clock that orders the engine: V has moved on with the agents above, at the engine's M
    assert metric(server, "justitia_virtual_time") > 0 and metric(server, "justitia_clock_capacity") > 0
    assert metric(server, 'justitia_agent_jct_seconds_bucket{le="+Inf",type="mrs"}') >= 1  # the map-reduce agent above
    # every series of Justitia's is labelled with the model, as vLLM labels its own
    ours = [labels for name, labels, _ in samples(text) if name.startswith("justitia_")]
    assert len(ours) > 20 and all(labels.get("model_name") == "tiny" for labels in ours)
    # the prefix cache as the plug-in saw each finished request's first schedule
    queries = metric(server, "justitia_prefix_cache_queries_total")
    assert queries > 0 and 0 <= metric(server, "justitia_prefix_cache_hits_total") <= queries
    # beside vLLM's own metrics, its queues among them
    assert "vllm:num_requests_waiting{" in text and "vllm:num_requests_running{" in text
    assert metric(server, "justitia_predictor_latency_seconds_count") >= 1


def test_every_query_of_the_grafana_dashboard_names_a_metric_the_server_exports(server):
    """deploy/grafana-dashboard.json against this live server's /metrics: each name a query reads is a
    family it exports (a histogram's _bucket/_sum/_count, a counter's _total included), and the
    per-tenant series are there once an agent has run."""
    from pathlib import Path

    agent_id = server.post(
        "/v1/agents", json={"type": "dash", "stages": [[{"prompt": "Hi.", "max_tokens": 8}]]}
    ).json()["agent_id"]
    assert wait_agent(server, agent_id)["status"] == "done"
    text = server.get("/metrics").text
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    samples = {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {n for q in queries for n in re.findall(r"\b(?:justitia_|vllm:)[a-zA-Z0-9_:]+", q)}
    assert len(queries) >= 12 and len(named) >= 15
    missing = [
        n
        for n in named
        if n not in samples
        and n not in families
        and not any(n.endswith(s) and n.removesuffix(s) in families for s in ("_bucket", "_sum", "_count", "_total"))
    ]
    assert not missing, missing
    assert (
        'justitia_tenant_agent_seconds_count{model_name="tiny",tenant="team-a"}' in text
    )  # the agent above: its key's tenant


BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def test_the_live_page_and_justitia_top_show_both_tenants_shares_in_a_real_browser(server, tmp_path):
    """Two tenants' agents at once; then the live page in headless Chromium (Debian's, which
    `make browser` installs) shows each tenant's share as /justitia/state gives it, and so does
    `justitia top`. The page's screenshot is kept in artifacts/live-page.png."""
    import shutil
    import subprocess
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: make browser installs it"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    other = httpx.Client(base_url=server.server.url, timeout=30, headers={"Authorization": f"Bearer {OTHER_KEY}"})

    def run(client: httpx.Client) -> str:
        body = {
            "type": "live",
            "stages": [[{"prompt": f"Part {i}.", "max_tokens": 24, "ignore_eos": True} for i in range(3)]],
        }
        return wait_agent(client, client.post("/v1/agents", json=body).json()["agent_id"])["status"]

    with other, ThreadPoolExecutor(2) as pool:  # one agent of each tenant at a time (the server's limit: 3 in flight)
        assert set(pool.map(run, [server, other] * 4)) == {"done"}
    time.sleep(1.1)  # the server reads the engine's tenants at most once a second: the next reading is after the run
    state = server.get("/justitia/state", headers=admin).json()
    shares = {t["tenant"]: t["share"] for t in state["tenants"]}
    assert shares.keys() >= {"team-a", "team-b"} and shares["team-a"] > 0 and shares["team-b"] > 0, json.dumps(state)
    assert server.get("/justitia/state").json()["tenants"][0]["tenant"] == "team-a"  # KEY's own tenant alone
    url = f"{server.server.url}/justitia#key={ADMIN_KEY}"
    profile = tmp_path / "chromium"
    dom = subprocess.run(
        [chromium, *BROWSER_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert 'data-ready="1"' in dom, dom[-2000:]
    for tenant, share in shares.items():
        row = re.search(rf'<tr data-tenant="{re.escape(tenant)}">(.*?)</tr>', dom)
        assert row, (tenant, dom[-2000:])
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
        assert cells[0] == tenant and cells[2] == f"{100 * share:.1f} %", (tenant, cells, share)
    artifacts = Path(__file__).parents[2] / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "live-page.png"
    shot.unlink(missing_ok=True)
    subprocess.run(
        [
            chromium,
            *BROWSER_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            "--window-size=1280,900",
            f"--screenshot={shot}",
            url,
        ],
        capture_output=True,
        timeout=120,
    )
    assert shot.exists() and shot.stat().st_size > 10_000
    top = subprocess.run(
        [sys.executable, "-m", "justitia", "top", "--once", "--url", server.server.url, "--api-key", ADMIN_KEY],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert top.returncode == 0, top.stderr
    for tenant, share in shares.items():
        line = next(line for line in top.stdout.splitlines() if f" {tenant} " in line)
        assert f"{100 * share:.1f} %" in line, (tenant, line)


def test_a_failing_task_fails_its_agent_with_the_reason_and_nothing_leaks(server):
    # stage 1 quotes two 400-token answers: with its own 600 tokens it no longer fits 1,024
    body = {
        "type": "mrs",
        "stages": [
            [{"prompt": f"Part {i}.", "max_tokens": 400, "ignore_eos": True} for i in range(2)],
            [{"prompt": "Combine: {{prev}}", "max_tokens": 600}, {"prompt": "Also: {{prev[0]}}", "max_tokens": 8}],
        ],
    }
    agent_id = server.post("/v1/agents", json=body).json()["agent_id"]
    doc = wait_agent(server, agent_id)
    assert doc["status"] == "failed"
    assert "stage 1 task 0" in doc["error"] and "exceed the model's context of 1024" in doc["error"]
    assert [t["output_tokens"] for t in doc["stages"][0]] == [400, 400]
    assert metric(server, "justitia_tasks_in_flight") == 0
    deadline = time.time() + 60
    while metric(server, "justitia_engine_requests_unfinished") != 0:
        assert time.time() < deadline, "the failed agent left requests in the engine"
        time.sleep(0.1)


def test_beyond_the_agents_in_flight_limit_the_server_answers_429(server):
    long = {"stages": [[{"prompt": "Go on.", "max_tokens": 900, "ignore_eos": True}]]}
    ids = [server.post("/v1/agents", json=long).json()["agent_id"] for _ in range(3)]
    r = server.post("/v1/agents", json=long)
    assert r.status_code == 429 and "limit" in r.json()["error"]
    for agent_id in ids:
        assert server.delete(f"/v1/agents/{agent_id}").json()["status"] == "cancelled"
    assert server.post("/v1/agents", json={"stages": [[{"prompt": "hi", "max_tokens": 2}]]}).status_code == 202


def test_every_case_of_the_abuse_list_is_handled_and_a_bystander_is_untouched(server):
    """justitia/lab/costs/abuse.py's cases (each a 4xx naming the field, or no effect on the other key's agent),
    against this module's server (started with the list's flags)."""
    rows = abuse.run(server.server.url, KEY, OTHER_KEY, progress=False)
    assert len(rows) == len(abuse.CASES) + 1
    failed = [r for r in rows if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
