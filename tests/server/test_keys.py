"""Keys and ownership, and prices that are the server's: the app in process over a recording
backend (no engine), with a real HTTP client (Starlette's TestClient)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from inprocess import RecordingBackend, WordTokenizer, auth, settle

from justitia.core import RequestMeta
from justitia.gateway.app import Settings, create_app
from justitia.predictors import make_predictor
from justitia.server.keys import ANONYMOUS, KeyFileError, KeyRing

A, B, FRONT = "sk-alpha-0001", "sk-bravo-0002", "sk-front-0003"
SOLO, HEAVY, EDGE, ALSO_A = "sk-solo-0004", "sk-heavy-0005", "sk-edge-0006", "sk-alpha-0007"


@pytest.fixture
def keyfile(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(
        f"# key tenant weight [trusted]\n{A} team-a 2\n\n{B} team-b 1\n{FRONT} edge 1 trusted\n"
        f"{SOLO}\n{HEAVY} - 3\n{EDGE} trusted\n{ALSO_A} team-a 2\n"
    )
    return path


@pytest.fixture
def app(keyfile):
    backend = RecordingBackend()
    application = create_app(
        backend, WordTokenizer(), Settings(max_model_len=512), make_predictor("oracle"), KeyRing.load(path=keyfile)
    )
    with TestClient(application) as client:
        client.backend = backend
        yield client


def test_key_files_are_read_line_by_line_and_a_bad_line_is_named(tmp_path, keyfile):
    ring = KeyRing.load(["sk-single-key", "sk-other-key"], keyfile)
    assert len(ring) == 9 and not ring.open
    alpha = ring.authenticate(f"Bearer {A}")
    assert (alpha.tenant, alpha.weight, alpha.trusted) == ("team-a", 2.0, False) and A not in alpha.owner
    assert ring.authenticate(f"Bearer {FRONT}").trusted
    # each key a tenant of its own (two --api-key keys: two tenants of weight 1), unless the file names one
    one, other = ring.authenticate("Bearer sk-single-key"), ring.authenticate("Bearer sk-other-key")
    assert one.tenant == one.owner and other.tenant == other.owner and one.tenant != other.tenant
    assert one.weight == other.weight == 1.0
    solo, heavy, edge = (ring.authenticate(f"Bearer {k}") for k in (SOLO, HEAVY, EDGE))
    assert (solo.tenant, solo.weight, solo.trusted) == (solo.owner, 1.0, False)
    assert (heavy.tenant, heavy.weight) == (heavy.owner, 3.0) and edge.trusted and edge.tenant == edge.owner
    also = ring.authenticate(f"Bearer {ALSO_A}")
    assert also.tenant == "team-a" and also.owner != alpha.owner  # two keys, one tenant, two owners
    for header in (None, "", "Bearer", f"Basic {A}", f"Bearer {A}x", f"Bearer {A[:-1]}"):
        assert ring.authenticate(header) is None
    assert KeyRing.load().authenticate(None) is ANONYMOUS  # no keys: an open server
    flagged = tmp_path / "flagged.txt"  # admin sees every tenant on the live page; it may come with trusted
    flagged.write_text(f"{A} ops 1 admin\n{FRONT} admin trusted\n{SOLO}\n")
    ops, both, plain = (KeyRing.load(path=flagged).authenticate(f"Bearer {k}") for k in (A, FRONT, SOLO))
    assert (ops.tenant, ops.admin, ops.trusted) == ("ops", True, False)
    assert both.admin and both.trusted and both.tenant == both.owner and not plain.admin
    for line, words in (
        (f"{A} t 1 trusted x", "expected 'KEY [TENANT WEIGHT] [trusted] [admin]'"),
        (f"{A} t 0", "finite number > 0"),
        (f"{A} t heavy", "finite number > 0"),
        (f"{A} t 1 root", "expected"),
        (f"{A} t 1 admin admin", "expected"),
        ("short t 1", "at least 8"),
        (f"{A} t 1\n{A} u 2", "listed twice"),
    ):
        bad = tmp_path / "bad.txt"
        bad.write_text("# header\n" + line + "\n")
        with pytest.raises(KeyFileError, match=r"bad.txt:[23]: .*" + re.escape(words)):
            KeyRing.load(path=bad)
    with pytest.raises(KeyFileError, match="cannot read"):
        KeyRing.load(path=tmp_path / "missing.txt")


def test_without_a_valid_key_every_v1_route_is_401_and_health_stays_open(app):
    for method, path in (
        ("post", "/v1/agents"),
        ("get", "/v1/agents/x"),
        ("delete", "/v1/agents/x"),
        ("post", "/v1/completions"),
        ("get", "/v1/models"),
    ):
        for headers in ({}, auth("sk-nobody-999"), {"Authorization": A}):
            r = getattr(app, method)(path, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path, headers)
    assert app.get("/health").status_code == 200 and app.get("/metrics").status_code == 200


def test_anthropics_x_api_key_header_is_a_key_too_and_authorization_comes_first(app):
    """Claude Code sends ``ANTHROPIC_API_KEY`` as ``x-api-key``; ``Authorization`` wins when both come."""
    body = {"model": "tiny", "prompt": "hi there", "max_tokens": 2}
    assert app.post("/v1/completions", headers={"x-api-key": A}, json=body).status_code == 200
    assert app.post("/v1/completions", headers={"x-api-key": "sk-nobody-999"}, json=body).status_code == 401
    r = app.post("/v1/completions", headers=auth("sk-nobody-999") | {"x-api-key": A}, json=body)
    assert r.status_code == 401 and "x-api-key" in r.json()["error"]["message"]


def test_an_agent_belongs_to_its_key_and_runs_in_its_tenants_flow(app):
    body = {
        "type": "mrs",
        "stages": [[{"prompt": "one two", "max_tokens": 4}], [{"prompt": "{{prev}}", "max_tokens": 2}]],
    }
    agent_id = app.post("/v1/agents", json=body, headers=auth(A)).json()["agent_id"]
    assert settle(app, agent_id, A)["stages"][1][0]["output"] == "ok"
    for method in ("get", "delete"):  # another key sees nothing there: the same 404 as an unknown id
        r = getattr(app, method)(f"/v1/agents/{agent_id}", headers=auth(B))
        assert r.status_code == 404 and r.json() == {"error": f"no agent '{agent_id}'."}
    assert app.get(f"/v1/agents/{agent_id}/events", headers=auth(B)).status_code == 404
    assert app.backend.registered[-1] == (agent_id, 2.0, "team-a")  # the key's tenant and weight
    assert {(m.agent_weight, m.tenant) for m in app.backend.metas} == {(2.0, "team-a")}


def test_openai_agent_ids_live_in_each_keys_namespace(app):
    for key in (A, B):
        r = app.post(
            "/v1/completions",
            headers=auth(key),
            json={"model": "tiny", "prompt": "hi there", "max_tokens": 3, "vllm_xargs": {"agent_id": "story"}},
        )
        assert r.status_code == 200, r.text
    r = app.post("/v1/completions", headers=auth(A) | {"X-Agent-Id": "story"}, json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    ids = [m.agent_id for m in app.backend.metas]
    assert len(set(ids)) == 2 and ids[0] == ids[2] != ids[1]  # A's "story" twice, B's is another agent
    assert all(i.endswith("/story") and A not in i and B not in i for i in ids)


@pytest.mark.parametrize(
    "field, value", [("agent_cost", 0), ("request_cost", 1), ("agent_weight", 100), ("tenant", "team-b")]
)
def test_only_a_trusted_key_may_set_prices_and_shares(app, field, value):
    body = {"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"agent_id": "x", field: value}}
    r = app.post("/v1/completions", json=body, headers=auth(A))
    assert r.status_code == 400 and f"'vllm_xargs.{field}'" in r.json()["error"]["message"]
    assert app.backend.metas == []  # refused at the door: nothing reached the engine
    assert app.post("/v1/completions", json=body, headers=auth(FRONT)).status_code == 200
    meta = app.backend.metas[-1]
    assert {
        "agent_cost": meta.agent_cost,
        "request_cost": meta.request_cost,
        "agent_weight": meta.agent_weight,
        "tenant": meta.tenant,
    }[field] == value


def test_only_a_trusted_key_may_send_a_benchs_answer_length(app):
    """``justitia_answer_tokens`` ends an answer on an engine with the scripted logits processor
    (benches only); any other key is refused it, naming the field."""
    body = {"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"justitia_answer_tokens": 1}}
    r = app.post("/v1/completions", json=body, headers=auth(A))
    assert r.status_code == 400 and "'vllm_xargs.justitia_answer_tokens': unknown key" in r.json()["error"]["message"]
    assert app.post("/v1/completions", json=body, headers=auth(FRONT)).status_code == 200


@pytest.mark.parametrize(
    "xargs, words",
    [
        ({"justitia_control": "reset"}, "unknown key"),
        ({"agent_id": {"deep": {"er": 1}}}, "must be a string, number or boolean"),
        ({"agent_type": ["a"]}, "must be a string, number or boolean"),
        ({"agent_done": 2**64}, "integer out of range"),
        ({"agent_type": "t" * 300}, "longer than 256"),
    ],
)
def test_vllm_xargs_takes_only_known_scalar_keys(app, xargs, words):
    r = app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "vllm_xargs": xargs}, headers=auth(FRONT))
    assert r.status_code == 400 and words in r.json()["error"]["message"]
    assert app.backend.metas == []


def test_an_open_server_is_one_anonymous_untrusted_owner():
    backend = RecordingBackend()
    application = create_app(backend, WordTokenizer(), Settings(max_model_len=512), make_predictor("oracle"))
    with TestClient(application) as client:
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"agent_cost": 0}})
        assert r.status_code == 400  # no key, no trust: prices stay the server's
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        assert backend.metas[-1].agent_cost is None and backend.metas[-1].tenant is None  # priced where it is served


def test_the_plug_in_can_ignore_client_prices():
    meta = RequestMeta("a", "t", 0.0, 0.0, True, 50.0, "vip")
    assert meta.without_prices() == RequestMeta("a", "t", None, None, True)


@pytest.mark.parametrize("client_prices", [None, "0", "1"])
def test_the_plug_ins_scheduler_prices_a_request_by_the_setting(client_prices, monkeypatch):
    """The scheduler itself (vLLM's, built without an engine): in a server with a door token, a
    request's ``agent_cost`` and ``tenant`` are read only with the token (by default), never (0), or
    always (1); an agent not priced by its client is priced by the engine: here by its prompt and
    ``max_tokens`` (``JUSTITIA_PRICING=max-tokens``; online pricing: tests/vllm/test_engine_pricing.py)."""
    from vllm_scheduler import make_scheduler, request

    from justitia.defaults import DOOR_KEY, ENV_CLIENT_PRICES, ENV_DOOR_TOKEN
    from justitia.vllm.plugin import JustitiaScheduler

    monkeypatch.setenv(ENV_DOOR_TOKEN, "s3cret")
    monkeypatch.setenv("JUSTITIA_POLICY", "justitia")
    monkeypatch.setenv("JUSTITIA_PRICING", "max-tokens")
    if client_prices is None:
        monkeypatch.delenv(ENV_CLIENT_PRICES, raising=False)
    else:
        monkeypatch.setenv(ENV_CLIENT_PRICES, client_prices)
    scheduler = make_scheduler(JustitiaScheduler, False)
    claims = {"agent_cost": 1.0, "tenant": "vip"}
    scheduler.add_request(request("r0", 32, 64, agent_id="plain", **claims))
    scheduler.add_request(request("r1", 32, 64, first_token=500, agent_id="door", **claims, **{DOOR_KEY: "s3cret"}))
    scheduler.add_request(request("r2", 32, 64, first_token=900, agent_id="guess", **claims, **{DOOR_KEY: "guess"}))
    agents = {a: scheduler.core.agent(a).info for a in ("plain", "door", "guess")}
    read = {a: agents[a].predicted_cost == 1.0 and agents[a].tenant == "vip" for a in ("plain", "door", "guess")}
    expected = {
        None: {"plain": False, "door": True, "guess": False},
        "0": {"plain": False, "door": False, "guess": False},
        "1": {"plain": True, "door": True, "guess": True},
    }[client_prices]
    assert read == expected
    for agent in (a for a, was_read in read.items() if not was_read):  # priced by prompt and max_tokens
        # as a distribution of its answer's length up to max_tokens (core.book.unpriced)
        assert agents[agent].dist is not None and agents[agent].dist.top == 32 * 64 + 64 * 64 / 2
        assert 32 < agents[agent].predicted_cost < 32 * 64 and agents[agent].tenant is None


def test_the_plug_in_reads_prices_only_from_requests_the_door_checked(monkeypatch):
    """In vLLM's OpenAI server (which has a door token) the plug-in reads a request's prices, weight
    and tenant only if it carries the token; an engine in a program's own process (no token) trusts
    its caller; JUSTITIA_CLIENT_PRICES forces either way; a wrong or missing token is not trusted."""
    import os
    import sys

    from justitia.defaults import DOOR_KEY, ENV_DOOR_TOKEN, policy_settings
    from justitia.vllm import general
    from justitia.vllm.plugin import trusted

    priced = {"agent_id": "a", "agent_cost": 1.0, "tenant": "vip"}
    assert trusted(priced, None, None)  # LLM / AsyncLLM in a program: no HTTP client
    assert not trusted(priced, None, "s3cret") and not trusted(priced | {DOOR_KEY: "guess"}, None, "s3cret")
    assert not trusted(priced | {DOOR_KEY: 7}, None, "s3cret")
    assert trusted(priced | {DOOR_KEY: "s3cret"}, None, "s3cret")
    assert trusted(priced, True, "s3cret") and not trusted(priced | {DOOR_KEY: "s3cret"}, False, "s3cret")
    assert policy_settings({"JUSTITIA_CLIENT_PRICES": "1"}).client_prices is True
    with pytest.raises(ValueError, match="JUSTITIA_CLIENT_PRICES='yes'"):
        policy_settings({"JUSTITIA_CLIENT_PRICES": "yes"})
    # the token exists only in vLLM's OpenAI server, and one per server (kept once set)
    monkeypatch.setenv(ENV_DOOR_TOKEN, "")  # none (and none left behind for the tests after this one)
    for name in [m for m in sys.modules if m.startswith(general.SERVER_MODULES)]:
        monkeypatch.delitem(sys.modules, name)
    general.register()
    assert os.environ[ENV_DOOR_TOKEN] == ""
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.launchers.api_server", sys)
    general.register()
    token = os.environ[ENV_DOOR_TOKEN]
    general.register()
    assert len(token) == 32 and os.environ[ENV_DOOR_TOKEN] == token
