"""Validation at the door: every bad field is a 4xx naming it, at submission, and nothing reaches
the engine (the app in process over a recording backend; a real HTTP client)."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from inprocess import RecordingBackend, WordTokenizer
from pydantic import ValidationError

from justitia.backends.base import Backend
from justitia.gateway.app import Settings, create_app
from justitia.predictors import make_predictor
from justitia.server.metrics import MAX_METRIC_TYPES
from justitia.server.schema import AgentSpec


@pytest.fixture
def app():
    backend = RecordingBackend()
    application = create_app(backend, WordTokenizer(chat=True), Settings(max_model_len=64), make_predictor("oracle"))
    with TestClient(application) as client:
        client.backend = backend
        yield client


def agent(**task):
    return {"stages": [[{"prompt": "hello there", "max_tokens": 4} | task]]}


@pytest.mark.parametrize(
    "body, field",
    [
        (agent(temperature=5), "stages[0][0].temperature"),  # vLLM takes [0, 2]
        (agent(top_p=0), "stages[0][0].top_p"),
        (agent(stop=[""]), "stages[0][0].stop[0]"),  # vLLM refuses an empty stop string
        (agent(stop=["x"] * 17), "stages[0][0].stop"),
        (agent(prompt=""), "stages[0][0].prompt"),
        (agent(seed=2**64), "stages[0][0].seed"),  # would overflow vLLM's seed (and leak a request)
        (agent(seed=-5), "stages[0][0].seed"),
        (agent(max_tokens=64), "stages[0][0].max_tokens"),  # the whole context
        ({"type": 'bad"type\nx', "stages": [[{"prompt": "hi"}]]}, "type"),  # it labels metrics
    ],
)
def test_a_bad_agent_field_is_refused_naming_it(app, body, field):
    r = app.post("/v1/agents", json=body)
    assert 400 <= r.status_code < 500 and f"'{field}'" in r.json()["error"], r.text
    assert app.backend.registered == [] and app.backend.metas == []


def test_a_lone_surrogate_is_refused_not_tokenized(app):
    raw = '{"stages": [[{"prompt": "hi \\ud800 there"}]]}'  # valid JSON, not valid UTF-8 text
    r = app.post("/v1/agents", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "'stages[0][0].prompt'" in r.json()["error"]
    with pytest.raises(ValidationError, match="unicode"):  # the same from Python
        AgentSpec.model_validate({"stages": [[{"prompt": "hi \ud800"}]]})
    raw = '{"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"agent_id": "a\\ud800"}}'
    r = app.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]  # free-form: checked by hand
    assert app.backend.metas == []
    raw = '{"prompt": "\\udfff", "max_tokens": 2}'
    r = app.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]
    assert app.backend.metas == []


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"stop": 5}, "stop"),
        ({"seed": 2**64}, "seed"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"prompt": {"a": 1}}, "prompt"),
    ],
)
def test_a_front_end_refuses_a_bad_body_with_vllms_own_model_and_message(app, extra, field):
    """--upstream and --ray validate a body with vLLM's own request model (its 400, its words), before
    any replica sees it."""
    r = app.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2} | extra)
    assert r.status_code == 400 and field in r.json()["error"]["param"], r.text
    assert app.backend.metas == []


def test_a_front_end_forwards_what_vllm_takes_and_answers_501_where_its_backend_cannot():
    from twelve import TWELVE

    backend = RecordingBackend()
    with TestClient(
        create_app(backend, WordTokenizer(chat=True), Settings(max_model_len=64), make_predictor("oracle"))
    ) as client:
        for name, body in TWELVE.items():
            assert client.post("/v1/chat/completions", json=body).status_code == 200, name
        assert len(backend.metas) == len(TWELVE)
        backend.forward = lambda *a: Backend.forward(backend, *a)  # a backend that serves no endpoint by itself
        r = client.post(
            "/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 501 and r.json()["error"]["type"] == "api_error"


def test_agent_types_are_safe_metric_labels_and_their_number_is_capped(app):
    r = app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"agent_type": 'a"}\n'}})
    assert r.status_code == 400 and "vllm_xargs.agent_type" in r.json()["error"]["message"]
    for k in range(MAX_METRIC_TYPES + 5):
        assert (
            app.post("/v1/agents", json={"type": f"t{k}", "stages": [[{"prompt": "hi", "max_tokens": 2}]]}).status_code
            == 202
        )
    deadline = time.time() + 60
    while app.get("/health").json()["agents_in_flight"]:
        assert time.time() < deadline
        time.sleep(0.01)
    text = app.get("/metrics").text
    labels = {line.split('type="')[1].split('"')[0] for line in text.splitlines() if "jct_seconds_count{" in line}
    assert len(labels) == MAX_METRIC_TYPES + 1 and "other" in labels
    assert all(json.dumps(label) == f'"{label}"' for label in labels)  # nothing to escape


def test_the_body_limit_counts_the_bytes_received_chunked_bodies_included():
    backend = RecordingBackend()
    application = create_app(
        backend, WordTokenizer(), Settings(max_model_len=64, max_body_bytes=1000), make_predictor("oracle")
    )
    body = json.dumps({"stages": [[{"prompt": "x " * 2000, "max_tokens": 2}]]}).encode()

    def chunks():  # no Content-Length: the body arrives in pieces
        for k in range(0, len(body), 256):
            yield body[k : k + 256]

    with TestClient(application) as client:
        r = client.post("/v1/agents", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "more than 1000 bytes" in r.json()["error"]
        r = client.post("/v1/agents", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and f"has {len(body)} bytes" in r.json()["error"]
        small = json.dumps({"stages": [[{"prompt": "hi", "max_tokens": 2}]]}).encode()
        assert (
            client.post(
                "/v1/agents", content=iter([small[:10], small[10:]]), headers={"content-type": "application/json"}
            ).status_code
            == 202
        )
    assert backend.registered and all(len(r) == 3 for r in backend.registered)


def test_placeholders_and_rendered_prompts_are_capped_before_anything_is_tokenized(app):
    many = {"stages": [[{"prompt": "hi", "max_tokens": 2}], [{"prompt": "{{prev}} " * 65, "max_tokens": 2}]]}
    r = app.post("/v1/agents", json=many)
    assert r.status_code == 400 and "'stages[1][0].prompt': 65 placeholders" in r.json()["error"]
    long = "w " * 600  # 1,200 characters: more than 16 per context token of 64
    r = app.post("/v1/agents", json={"stages": [[{"prompt": long, "max_tokens": 2}]]})
    assert r.status_code == 400 and "more than this server's limit of 1024" in r.json()["error"]
    # a later stage whose placeholders fill past the limit fails its task, untokenized, with the reason
    grows = {"stages": [[{"prompt": "hi", "max_tokens": 2}] * 16, [{"prompt": "{{prev}}" * 40, "max_tokens": 2}]]}
    agent_id = app.post("/v1/agents", json=grows).json()["agent_id"]
    deadline = time.time() + 60
    while (doc := app.get(f"/v1/agents/{agent_id}").json())["status"] not in ("done", "failed"):
        assert time.time() < deadline
        time.sleep(0.01)
    assert doc["status"] == "failed" and "stage 1" in doc["error"] and "limit of 1024" in doc["error"], doc
    assert len(app.backend.metas) == 16  # the first stage ran; nothing of stage 1 reached the engine


def test_a_body_over_the_limit_gets_a_413_that_urllib_can_read():
    """Python's urllib sends a whole body before it reads the answer: a server that answered and
    closed at once would reset the connection under it. The server drains the body (within a bound)."""
    import socket
    import threading
    import urllib.error
    import urllib.request

    import uvicorn

    from justitia.server.limits import http_with_header_timeout

    app = create_app(
        RecordingBackend(), WordTokenizer(), Settings(max_model_len=64, max_body_bytes=1000), make_predictor("oracle")
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=http_with_header_timeout(10.0))
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started:
            assert time.time() < deadline
            time.sleep(0.05)
        body = json.dumps({"stages": [[{"prompt": "x" * (4 << 20)}]]}).encode()
        for path in ("/v1/agents", "/v1/chat/completions"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 413 and b"limit of 1000" in refused.value.read()
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_max_tokens_with_ignore_eos_buys_no_early_tag_and_a_later_stage_that_cannot_fit_is_refused():
    """The trojan: a tiny first stage, then 8 tasks of 1,024 forced tokens. The default predictor reads
    the first stage; the price is at least what the forced tokens cost, so it is far above a tiny
    agent's. A later stage whose own text cannot fit the context is a 400 at submission, not a
    failure after the first stage has run."""
    from justitia.cli import _parser

    default = _parser().parse_args(["serve"]).predictor  # what `justitia serve` prices with unless told
    assert default != "oracle"  # the oracle takes max_tokens for the output length: that would prove nothing
    backend = RecordingBackend()
    app = create_app(backend, WordTokenizer(), Settings(max_model_len=2048), make_predictor(default))
    tiny = {"type": "mrs", "stages": [[{"prompt": "Summarize: the river rose.", "max_tokens": 16}]]}
    trojan = {
        "type": "mrs",
        "stages": [tiny["stages"][0], [{"prompt": "Expand {{prev}}", "max_tokens": 1024, "ignore_eos": True}] * 8],
    }
    with TestClient(app) as client:
        prices = []
        for body in (tiny, trojan):
            agent_id = client.post("/v1/agents", json=body).json()["agent_id"]
            prices.append(client.get(f"/v1/agents/{agent_id}").json()["predicted_cost"])
        assert prices[1] >= 2 * prices[0] and prices[1] >= 8 * 1024**2 / 2, prices
        huge = {
            "stages": [[{"prompt": "hi", "max_tokens": 2}], [{"prompt": "word " * 2100 + "{{prev}}", "max_tokens": 2}]]
        }
        r = client.post("/v1/agents", json=huge)
        assert r.status_code == 400 and "'stages[1][0].prompt'" in r.json()["error"], r.text
        assert "before any placeholder" in r.json()["error"]
    assert len(backend.registered) == 2  # the refused agent never reached the engine


def test_no_agent_is_priced_above_what_its_max_tokens_allow():
    """A task's KV token-time is at most ``p*m + m^2/2`` (``m = max_tokens``): an agent of tasks that
    can generate one token each is priced at most that, whatever the predictor says (the default's
    price for this text is far above it)."""
    from justitia.cli import _parser
    from justitia.core import KV

    default = _parser().parse_args(["serve"]).predictor
    backend = RecordingBackend()
    app = create_app(backend, WordTokenizer(), Settings(max_model_len=2048), make_predictor(default))
    prompt = "Write a long essay on the history of the river, in full detail."
    one_token = {"type": "mrs", "stages": [[{"prompt": prompt, "max_tokens": 1}] * 4]}
    many = {"type": "mrs", "stages": [[{"prompt": prompt, "max_tokens": 512}] * 4]}
    with TestClient(app) as client:
        prices = []
        for body in (one_token, many):
            agent_id = client.post("/v1/agents", json=body).json()["agent_id"]
            prices.append(client.get(f"/v1/agents/{agent_id}").json()["predicted_cost"])
    p = len(prompt.split())  # WordTokenizer: a token per word
    assert prices[0] <= 4 * KV.request_cost(p + 2, 1) < prices[1], prices  # (+2: a margin for the tokenizer's extras)


@pytest.mark.parametrize(
    "path", ["/v1/agents", "turns", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
)
def test_a_body_nested_past_the_depth_limit_is_a_400_naming_it_on_every_endpoint_justitia_owns(app, path):
    """A 100,000-deep array once made Python's parser recurse past its stack: a 500."""
    from justitia.server.limits import MAX_JSON_DEPTH

    if path == "turns":  # a session's next turn: the session must exist
        r = app.post(
            "/v1/agents", json={"type": "chat", "session": True, "stages": [[{"prompt": "hi", "max_tokens": 2}]]}
        )
        assert r.status_code == 202, r.text
        path = f"/v1/agents/{r.json()['agent_id']}/turns"
        app.backend.metas.clear()
    for body in (
        "[" * 100_000 + "]" * 100_000,
        '{"stages": ' + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "}",
    ):
        r = app.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in r.text
    assert app.backend.metas == []  # nothing reached the engine


def test_the_depth_limit_counts_containers_not_brackets_in_strings():
    from justitia.server.limits import MAX_JSON_DEPTH, JsonTooDeep, load_json

    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert load_json(deep.encode()) == json.loads(deep)  # at the limit: taken
    assert load_json(json.dumps({"text": "[" * 10_000})) == {"text": "[" * 10_000}  # brackets in a string
    with pytest.raises(JsonTooDeep):
        load_json("[" + deep + "]")
    with pytest.raises(JsonTooDeep):
        load_json(b'{"a": ' * 70_000 + b"1" + b"}" * 70_000)
