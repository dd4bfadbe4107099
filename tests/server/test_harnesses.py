"""The harnesses themselves as clients: Claude Code and Codex CLI (npm, pinned in
``tests/harnesses/package.json``; ``make harnesses``) against ``justitia serve`` and against the
flags on vLLM's own server, headless, on ``tiny-long`` (the tiny model with a 65,536-token context).

Each runs one session of two user turns: a tool round trip in the first, and a subagent (Claude
Code's ``Agent`` tool) or a plain answer (Codex) in the second. The engine answers from a script
(``justitia.engine.scripted``) that pricing never reads; the requests are the harnesses' own. Every
request must get a 200, each harness session must be one session of the door with its turns
counted exactly, and the plug-in must log each later turn's return with that turn's own price.

One server at a time (module-scoped, parametrized), loopback only, bounded in time."""

from __future__ import annotations

import json
import re
import sys

import httpx
import pytest
from servers import Server, free_port

from justitia.lab.live.harnesses import BIN, HARNESSES, SESSION, write_script

MODEL = "tiny-long"
KEYS = {"claude-code": "sk-harness-team-a", "codex": "sk-harness-team-b"}
TENANTS = {"claude-code": "team-a", "codex": "team-b"}
SUBAGENTS = {"claude-code": 1, "codex": 0}  # Codex CLI has no subagent tool
BENCH_KEY = "sk-harness-bench"  # trusted: may send a bench's answer length


@pytest.fixture(scope="module", params=["justitia-serve", "vllm-serve-flags"])
def server(request, tmp_path_factory):
    from justitia.engine.models import resolve_model

    if not (BIN / "claude").exists() or not (BIN / "codex").exists():
        pytest.fail(f"the harnesses are not installed in {BIN}: run `make harnesses` (npm ci in tests/harnesses)")
    where = tmp_path_factory.mktemp(request.param)
    keys = where / "keys.txt"
    keys.write_text("".join(f"{KEYS[h]} {TENANTS[h]} 1\n" for h in KEYS) + f"{BENCH_KEY} bench 1 trusted\n")
    port = free_port()
    engine = [
        "--max-model-len",
        "65536",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--logits-processors",
        "justitia.engine.scripted:ScriptedAnswers",
    ]
    env = {
        "JUSTITIA_SCRIPT": str(write_script(where / "script.json")),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "JUSTITIA_LOG_AGENTS": "1",
        "JUSTITIA_SESSION_KEEP_S": "3600",
    }
    if request.param == "justitia-serve":
        cmd = [
            sys.executable,
            "-m",
            "justitia",
            "serve",
            "--model",
            MODEL,
            "--port",
            str(port),
            "--api-keys",
            str(keys),
            "--journal",
            str(where / "journal.sqlite"),
            *engine,
        ]
    else:
        serve = {
            "api_keys_file": str(keys),
            "journal": str(where / "journal.sqlite"),
            "predictor_state": str(where / "online.json"),
        }
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(resolve_model(MODEL)),
            "--served-model-name",
            MODEL,
            "--port",
            str(port),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--scheduler-cls",
            "justitia.vllm.plugin.JustitiaScheduler",
            "--scheduling-policy",
            "priority",
            *engine,
        ]
        env |= {"VLLM_PLUGINS": "justitia", "JUSTITIA_SERVE": json.dumps(serve)}
    srv = Server(cmd, port, where / "server.log", env=env)
    srv.wait_ready("/health")
    srv.where = where
    yield srv
    srv.stop()


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_a_harness_session_of_two_turns_with_a_tool_is_one_session_with_its_turns_counted(server, harness):
    run = HARNESSES[harness](server.url, KEYS[harness], MODEL, server.where / harness)
    assert run.answers == [answer for _, answer in SESSION[harness]], run.outputs  # the script was followed
    docs = httpx.get(f"{server.url}/v1/sessions", headers={"Authorization": f"Bearer {KEYS[harness]}"}).json()["data"]
    assert [d["session_id"] for d in docs] == [run.session_id], docs  # one session, the harness's own id
    session = docs[0]
    assert session["turns"] == len(SESSION[harness]), session  # exactly the user's turns
    assert len(session["subagents"]) == SUBAGENTS[harness], session
    endpoint = {"claude-code": "messages", "codex": "responses"}[harness]
    assert session["by_endpoint"] == {endpoint: session["requests"]} and session["in_flight"] == 0
    # every request the harness sent got a 200 (the access log: this harness alone used its endpoint)
    path = {"messages": r"/v1/messages(?:\?beta=true)?", "responses": "/v1/responses"}[endpoint]
    statuses = re.findall(rf'"POST {path} HTTP/1\.1" (\d+)', server.output())
    assert statuses == ["200"] * session["requests"] and len(statuses) > len(SESSION[harness]), (
        statuses
    )  # a tool round trip: two requests in a turn
    # the plug-in saw one agent of the key's tenant: it arrived with turn 1, and returned with turn 2 at its own price
    lines = [
        line for line in server.output().splitlines() if f"/{run.session_id} " in line and "justitia: agent" in line
    ]
    arrived = [line for line in lines if " arrived: " in line]
    returned = [line for line in lines if " returned after a pause: " in line]
    assert len(arrived) == 1 and len(returned) == len(SESSION[harness]) - 1, lines
    assert all(line.endswith(f"tenant={TENANTS[harness]}") for line in arrived + returned)
    assert all(float(re.search(r"predicted_cost=([\d.]+)", line)[1]) > 0 for line in arrived + returned)


def test_a_bench_only_key_ends_the_answer_at_its_length_whatever_max_tokens_allows(server):
    """``vllm_xargs.justitia_answer_tokens`` (read by the scripted logits processor, never by pricing)
    ends the answer at that many tokens, the end-of-sequence token last; a bad value is a 400, and so
    is the key from a client's key that is not trusted."""
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 500}
    for n in (1, 7, 40):
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            headers=headers,
            timeout=60,
            json=body | {"vllm_xargs": {"justitia_answer_tokens": n}},
        )
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["usage"]["completion_tokens"] == n and doc["choices"][0]["finish_reason"] == "stop", doc
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers=headers,
        timeout=60,
        json=body | {"vllm_xargs": {"justitia_answer_tokens": 0}},
    )
    assert r.status_code == 400 and "justitia_answer_tokens" in r.text, r.text
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEYS['codex']}"},
        timeout=60,
        json=body | {"vllm_xargs": {"justitia_answer_tokens": 7}},
    )
    assert r.status_code == 400 and "'vllm_xargs.justitia_answer_tokens': unknown key" in r.text, r.text
