"""The abuse list: what a hostile or careless client tries against `justitia serve`, and what must happen.

    python -m justitia.lab.costs.abuse [--out results/abuse.json]             # starts its own server (tiny model)
    python -m justitia.lab.costs.abuse --url URL --key KEY --other-key KEY2   # a running server started with FLAGS

Each case sends what a client could send and checks the answer: a 4xx that names the field, or no
effect on any other client. Before the cases that could disturb it, the other key submits an agent
(the bystander); after the last case that agent must be done with every output and ``/health``
must answer. The table printed at the end (Markdown) has one row per case: what was sent, what
must happen, what the server did. Exit status 1 if any case failed.

Cases that need what one live server cannot give (a dead engine, a kill -9, failing replicas, a
rate limit or a finished-agent store small enough to hit) are covered by the tests named in
``REFERENCES``; the table lists them too. Loopback only. ``make abuse`` runs it
(``justitia/lab/costs/abuse.py`` is the same command), and ``tests/server/test_server.py`` runs every case against its
own server. One file over 400 lines on purpose: it is one list of cases, each a few lines.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import httpx

from justitia.lab.live.servers import metric, start_server, stop, wait_agent
from justitia.lab.report import write_doc

# the server the cases expect (the limits they test are these)
FLAGS = [
    "--predictor",
    "mean",
    "--kv-blocks",
    "16",
    "--max-model-len",
    "1024",
    "--max-tasks-per-agent",
    "16",
    "--max-body-bytes",
    "20000",
    "--max-agents-in-flight",
    "3",
    "--key-requests-in-flight",
    "4",
    "--max-requests-in-flight",
    "6",
    "--max-streams-per-agent",
    "2",
    "--header-timeout",
    "2",
]
ENV = {"JUSTITIA_AGENT_IDLE_S": "600"}  # no release by idleness (the namespace cases count agents)
BODY_LIMIT, AGENTS, KEY_REQUESTS, REQUESTS, STREAMS, HEADER_TIMEOUT, CONTEXT = 20000, 3, 4, 6, 2, 2.0, 1024
MAX_PROMPT_CHARS = 16 * CONTEXT

REFERENCES = [  # (class, case, what must happen, the test that shows it)
    (
        "limits",
        "a key past its rate (--key-rate)",
        "429 with Retry-After; other keys unaffected",
        "tests/server/test_limits.py::test_a_key_over_its_rate_gets_429_with_retry_after",
    ),
    (
        "limits",
        "finished agents past --finished-mib / --finished-hours",
        "dropped oldest first; 410 to the owner, 404 to others",
        "tests/server/test_limits.py::test_finished_agents_are_kept_by_bytes_and_age_then_answer_410_to_their_owner",
    ),
    (
        "metrics",
        "more than 64 agent types",
        "64 JCT series, the rest counted as 'other'",
        "tests/server/test_validation.py::test_agent_types_are_safe_metric_labels_and_their_number_is_capped",
    ),
    (
        "faults",
        "the engine dies",
        "/health 503; the server exits; its agents resume at the next start",
        "tests/server/test_journal.py::test_health_says_when_the_engine_is_dead_and_a_draining_server_takes_no_agents",
    ),
    (
        "faults",
        "kill -9 mid-run, restart on the journal",
        "every accepted agent finishes with all its outputs",
        "tests/server/test_server.py::test_a_server_killed_mid_run_loses_no_accepted_agent_and_leaves_no_engine_behind",
    ),
    (
        "faults",
        "SIGTERM with agents in flight",
        "drains; unfinished agents resume at the next start",
        "tests/server/test_journal.py::test_a_server_that_stops_leaves_its_unfinished_agents_to_be_resumed",
    ),
    (
        "upstream",
        "a replica refuses, times out or answers 5xx before any token",
        "the request goes to another replica",
        "tests/backends/test_upstream.py::test_a_request_that_fails_before_any_token_is_retried_on_the_next_replica",
    ),
    (
        "upstream",
        "a replica fails midway through an agent's task",
        "the task runs once more; the agent finishes",
        "tests/server/test_journal.py::test_a_task_whose_replica_fails_midway_runs_once_more_and_a_second_failure_fails_the_agent",
    ),
]


@dataclass
class Ctx:
    url: str
    a: httpx.Client  # key A: the attacker
    b: httpx.Client  # key B: the other client
    anon: httpx.Client  # no key
    key_a: str


@dataclass
class Case:
    kind: str
    name: str
    expect: str
    run: Callable[[Ctx], str]


CASES: list[Case] = []


def case(kind: str, name: str, expect: str):
    def add(fn):
        CASES.append(Case(kind, name, expect, fn))
        return fn

    return add


def check(r: httpx.Response, status: int, *words: str) -> str:
    """The response has ``status`` and its body names every one of ``words``; what it said."""
    assert r.status_code == status, f"{r.status_code} {r.text[:200]}"
    for w in words:
        assert w.lower() in r.text.lower(), f"{r.status_code} {r.text[:200]} (does not name {w!r})"
    return f"{r.status_code} {message(r)}"


def message(r: httpx.Response) -> str:
    try:
        e = r.json().get("error", r.text)
    except ValueError:
        return r.text[:120]
    return (e.get("message", "") if isinstance(e, dict) else str(e))[:120]


def completion(client: httpx.Client, prompt: str = "Say something.", tokens: int = 4, **extra) -> httpx.Response:
    return client.post("/v1/completions", json={"prompt": prompt, "max_tokens": tokens, **extra})


def agent(client: httpx.Client, tokens: int = 8, stages: int = 1, tasks: int = 1, **headers) -> httpx.Response:
    body = {
        "type": "abuse",
        "stages": [
            [
                {
                    "prompt": f"Stage {s} task {i}." + (" After: {{prev[0]}}" if s else ""),
                    "max_tokens": tokens,
                    "ignore_eos": True,
                }
                for i in range(tasks)
            ]
            for s in range(stages)
        ],
    }
    return client.post("/v1/agents", json=body, headers=headers)


def long_agent(client: httpx.Client) -> str:
    """An agent that stays in flight until cancelled (or a while)."""
    r = agent(client, tokens=900)
    assert r.status_code == 202, r.text
    return r.json()["agent_id"]


def policy_agents(ctx: Ctx) -> float:
    return metric(ctx.a, "justitia_policy_agents")


# ----------------------------------------------------------------------------------- identity
@case("identity", "no key on /v1/agents, /v1/completions, /v1/models", "401 on each")
def _(ctx):
    return "; ".join(
        dict.fromkeys(check(r, 401, "key") for r in (agent(ctx.anon), completion(ctx.anon), ctx.anon.get("/v1/models")))
    )  # each once


@case("identity", "a wrong key, and one that differs from a real key in its last character", "401")
def _(ctx):
    near = ctx.key_a[:-1] + ("x" if ctx.key_a[-1] != "x" else "y")
    return "; ".join(
        dict.fromkeys(check(agent(ctx.anon, Authorization=f"Bearer {k}"), 401, "key") for k in ("sk-guess", near))
    )


@case("identity", "an OpenAI agent id claimed first by another key (X-Agent-Id)", "each key's id names its own agent")
def _(ctx):
    n0 = policy_agents(ctx)
    check(
        ctx.b.post("/v1/completions", json={"prompt": "Plan.", "max_tokens": 2}, headers={"X-Agent-Id": "build-42"}),
        200,
    )
    assert policy_agents(ctx) == n0 + 1, "the other key's agent was not registered"
    # A's request names the same id and ends its agent: it ends A's own, not B's
    check(
        ctx.a.post(
            "/v1/completions",
            json={"prompt": "Plan.", "max_tokens": 2, "vllm_xargs": {"agent_done": True}},
            headers={"X-Agent-Id": "build-42"},
        ),
        200,
    )
    kept = policy_agents(ctx)
    check(
        ctx.b.post(
            "/v1/completions",
            json={"prompt": "Done.", "max_tokens": 2, "vllm_xargs": {"agent_done": True}},
            headers={"X-Agent-Id": "build-42"},
        ),
        200,
    )
    assert kept == n0 + 1 and policy_agents(ctx) == n0, (n0, kept, policy_agents(ctx))
    return f"policy agents {n0:.0f} -> {n0 + 1:.0f} (B's) -> {kept:.0f} after A's agent_done on the same id -> {n0:.0f}"


@case("identity", "another key joins my OpenAI agent and sends its agent_done", "my agent stays registered")
def _(ctx):
    n0 = policy_agents(ctx)
    check(
        ctx.a.post("/v1/completions", json={"prompt": "Step 1.", "max_tokens": 2}, headers={"X-Agent-Id": "mine-7"}),
        200,
    )
    check(
        ctx.b.post(
            "/v1/completions",
            json={"prompt": "Hi.", "max_tokens": 2, "vllm_xargs": {"agent_done": True}},
            headers={"X-Agent-Id": "mine-7"},
        ),
        200,
    )
    after = policy_agents(ctx)
    check(
        ctx.a.post(
            "/v1/completions",
            json={"prompt": "Step 2.", "max_tokens": 2, "vllm_xargs": {"agent_done": True}},
            headers={"X-Agent-Id": "mine-7"},
        ),
        200,
    )
    assert after == n0 + 1 and policy_agents(ctx) == n0, (n0, after, policy_agents(ctx))
    return f"policy agents {n0:.0f} -> {after:.0f} after the stranger's agent_done (mine kept) -> {n0:.0f} after mine"


BYSTANDER: dict = {}
BYSTANDER_STAGES, BYSTANDER_TOKENS = 6, 200  # long enough to be in flight through the cases that follow


@case("bystander", "the other key submits an agent (checked after the last case)", "202")
def _(ctx):
    r = agent(ctx.b, tokens=BYSTANDER_TOKENS, stages=BYSTANDER_STAGES, tasks=2)
    BYSTANDER.update(id=r.json().get("agent_id", ""), t0=time.perf_counter())
    return check(r, 202)


@case("identity", "another key reads, streams and cancels my agent", "404 each; my agent runs on")
def _(ctx):
    mine = long_agent(ctx.a)
    try:
        got = [
            check(ctx.b.get(f"/v1/agents/{mine}"), 404, mine),
            check(ctx.b.get(f"/v1/agents/{mine}/events"), 404),
            check(ctx.b.delete(f"/v1/agents/{mine}"), 404),
        ]
        status = ctx.a.get(f"/v1/agents/{mine}").json()["status"]
        assert status in ("queued", "running"), status
    finally:
        ctx.a.delete(f"/v1/agents/{mine}")
    return f"{got[0]}; then still {status}"


# ------------------------------------------------------------------------------------- prices
for _field, _value in (
    ("agent_cost", 0),
    ("agent_cost", 1e19),
    ("request_cost", 0),
    ("agent_weight", 1000),
    ("tenant", "team-b"),
    ("justitia_control", "state"),
):
    case("prices", f"vllm_xargs.{_field} = {_value!r}", f"400 naming {_field}")(
        lambda ctx, f=_field, v=_value: check(completion(ctx.a, vllm_xargs={f: v}), 400, f)
    )


@case("prices", "a predicted_cost field in an agent", "422 naming predicted_cost")
def _(ctx):
    return check(
        ctx.a.post("/v1/agents", json={"predicted_cost": 0, "stages": [[{"prompt": "x", "max_tokens": 2}]]}),
        422,
        "predicted_cost",
    )


# ------------------------------------------------------------------------------ event loop, memory
@case("limits", "2,000 {{prev}} placeholders in one prompt (16 KB)", "400 naming the prompt and the cap")
def _(ctx):
    body = {"stages": [[{"prompt": "a", "max_tokens": 2}], [{"prompt": "{{prev}}" * 2000, "max_tokens": 2}]]}
    return check(ctx.a.post("/v1/agents", json=body), 400, "stages[1][0].prompt", "placeholders")


@case("limits", f"a body over --max-body-bytes ({BODY_LIMIT}), with Content-Length", "413")
def _(ctx):
    return check(completion(ctx.a, prompt="x" * (BODY_LIMIT + 10)), 413, "bytes")


@case("limits", "a chunked body over --max-body-bytes (no Content-Length)", "413, counted on the bytes received")
def _(ctx):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(BODY_LIMIT // 1000 + 2):
            yield b"x" * 1000
        yield b'", "max_tokens": 2}'

    return check(ctx.a.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}), 413)


@case(
    "limits",
    f"a prompt longer than any that fits the context ({MAX_PROMPT_CHARS + 1} characters)",
    "400 naming the prompt, before tokenizing",
)
def _(ctx):
    body = {"stages": [[{"prompt": "word " * (MAX_PROMPT_CHARS // 5 + 1), "max_tokens": 2}]]}
    return check(ctx.a.post("/v1/agents", json=body), 400, "stages[0][0].prompt", "characters")


@case("limits", "8 clients at once send the longest prompts allowed", "/health answers within 1 s throughout")
def _(ctx):
    slowest, done = [0.0], threading.Event()

    def flood():
        with httpx.Client(base_url=ctx.url, timeout=120, headers=dict(ctx.a.headers)) as c:
            for _ in range(2):
                completion(c, prompt="lorem ipsum " * (MAX_PROMPT_CHARS // 12 - 10))

    def probe():
        with httpx.Client(base_url=ctx.url, timeout=30) as c:
            while not done.is_set():
                t = time.perf_counter()
                c.get("/health").raise_for_status()
                slowest[0] = max(slowest[0], time.perf_counter() - t)
                time.sleep(0.05)

    threads = [threading.Thread(target=flood) for _ in range(8)]
    watcher = threading.Thread(target=probe)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert slowest[0] < 1.0, f"/health took {slowest[0]:.2f} s"
    return f"slowest /health {1000 * slowest[0]:.0f} ms"


@case(
    "limits",
    "a later stage's placeholders render past the prompt cap",
    "that agent fails with the reason; nothing else",
)
def _(ctx):
    body = {
        "stages": [
            [{"prompt": f"Write {i}.", "max_tokens": 250, "ignore_eos": True} for i in range(4)],
            [{"prompt": "{{prev}}" * 60, "max_tokens": 2}],
        ]
    }
    r = ctx.a.post("/v1/agents", json=body)
    check(r, 202)
    doc = wait_agent(ctx.a, r.json()["agent_id"])
    assert doc["status"] == "failed" and "limit" in (doc["error"] or ""), doc["status"]
    return f"failed: {doc['error'][:100]}"


@case(
    "limits", "20 connections that never finish their headers", f"closed after --header-timeout ({HEADER_TIMEOUT:g} s)"
)
def _(ctx):
    u = urlparse(ctx.url)
    socks = []
    for _ in range(20):
        s = socket.create_connection((u.hostname, u.port), timeout=HEADER_TIMEOUT + 10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    t0 = time.time()
    httpx.get(ctx.url + "/health", timeout=10).raise_for_status()  # the server answers meanwhile
    closed = 0
    for s in socks:
        try:
            while s.recv(1024):  # an error answer, if any, then the end of the stream: closed
                pass
            closed += 1
        except (TimeoutError, OSError):  # still open when the socket's own timeout passed
            pass
        s.close()
    waited = time.time() - t0
    assert closed == 20 and waited < HEADER_TIMEOUT + 10, (closed, waited)
    return f"all 20 closed within {waited:.1f} s"


@case("limits", f"{STREAMS + 1} event streams on one agent", "the last one gets 429")
def _(ctx):
    mine = long_agent(ctx.a)
    opened = []
    try:
        for _ in range(STREAMS):
            s = ctx.a.stream("GET", f"/v1/agents/{mine}/events")
            r = s.__enter__()
            opened.append(s)
            assert r.status_code == 200
        return check(ctx.a.get(f"/v1/agents/{mine}/events"), 429, "streams")
    finally:
        ctx.a.delete(f"/v1/agents/{mine}")
        for s in opened:
            s.__exit__(None, None, None)


@case("limits", f"agents past --max-agents-in-flight ({AGENTS})", "429 with Retry-After")
def _(ctx):
    mine, last = [], None
    try:
        for _ in range(AGENTS + 1):
            last = agent(ctx.a, tokens=900)
            if last.status_code != 202:
                break
            mine.append(last.json()["agent_id"])
        out = check(last, 429, "in flight")
        assert "retry-after" in last.headers and len(mine) <= AGENTS
    finally:
        for m in mine:
            ctx.a.delete(f"/v1/agents/{m}")
    return f"{len(mine)} accepted, then {out}; Retry-After {last.headers['retry-after']}"


def _streams(client: httpx.Client, n: int) -> tuple[list, list[httpx.Response]]:
    opened, answers = [], []
    for _ in range(n):
        s = client.stream(
            "POST", "/v1/completions", json={"prompt": "Go on.", "max_tokens": 900, "ignore_eos": True, "stream": True}
        )
        answers.append(s.__enter__())
        opened.append(s)
    return opened, answers


@case(
    "limits",
    f"OpenAI requests past --key-requests-in-flight ({KEY_REQUESTS}) and --max-requests-in-flight ({REQUESTS})",
    "429 with Retry-After for the key; then 503 for all; the other key served meanwhile",
)
def _(ctx):
    opened = []
    try:
        mine, answers = _streams(ctx.a, KEY_REQUESTS)
        opened += mine
        assert all(r.status_code == 200 for r in answers), [r.status_code for r in answers]
        over = check(completion(ctx.a), 429, "in flight")
        assert "retry-after" in ctx.a.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).headers
        check(completion(ctx.b), 200)  # the other key is not held back by this one's limit
        theirs, answers = _streams(ctx.b, REQUESTS - KEY_REQUESTS)
        opened += theirs
        assert all(r.status_code == 200 for r in answers), [r.status_code for r in answers]
        full = check(completion(ctx.b), 503)
    finally:
        for s in opened:
            s.__exit__(None, None, None)
    return f"{over}; {full}"


# --------------------------------------------------------------------------------- validation
for _name, _body, _status, _word in (
    (
        "temperature 5 in an agent's task",
        {"stages": [[{"prompt": "x", "max_tokens": 2, "temperature": 5}]]},
        422,
        "temperature",
    ),
    ("an empty prompt", {"stages": [[{"prompt": "", "max_tokens": 2}]]}, 422, "prompt"),
    ("max_tokens 0", {"stages": [[{"prompt": "x", "max_tokens": 0}]]}, 422, "max_tokens"),
    ("17 tasks (over --max-tasks-per-agent 16)", {"stages": [[{"prompt": "x", "max_tokens": 2}] * 17]}, 400, "tasks"),
    (
        "a placeholder naming a later stage",
        {"stages": [[{"prompt": "{{stage[1]}}", "max_tokens": 2}], [{"prompt": "y", "max_tokens": 2}]]},
        400,
        "stage",
    ),
    (
        "an agent type with a quote and a newline",
        {"type": 'a"\nb', "stages": [[{"prompt": "x", "max_tokens": 2}]]},
        422,
        "type",
    ),
):
    case("validation", _name, f"{_status} naming {_word}")(
        lambda ctx, b=_body, s=_status, w=_word: check(ctx.a.post("/v1/agents", json=b), s, w)
    )

for _name, _extra, _status, _word in (
    # vLLM's own validation, with vLLM's own messages
    ('stop [""]', {"stop": [""]}, 400, "stop"),
    ("seed 2^64", {"seed": 2**64}, 400, "seed"),
    ("top_p 0", {"top_p": 0}, 400, "top_p"),
    ("presence_penalty 3", {"presence_penalty": 3}, 400, "presence_penalty"),
    ("vllm_xargs integer 2^64", {"vllm_xargs": {"agent_type": 2**64}}, 400, "vllm_xargs"),
    ("vllm_xargs nested 50 deep", {"vllm_xargs": {"agent_type": json.loads("[" * 50 + "]" * 50)}}, 400, "vllm_xargs"),
    ("vllm_xargs unknown key", {"vllm_xargs": {"priority": -100}}, 400, "priority"),
    ("model that is not served", {"model": "gpt-4"}, 404, "gpt-4"),
):
    case("validation", f"completion: {_name}", f"{_status} naming {_word}")(
        lambda ctx, e=_extra, s=_status, w=_word: check(completion(ctx.a, **e), s, w)
    )


@case("validation", "a lone surrogate in a prompt (raw JSON \\ud800)", "400 naming the surrogate")
def _(ctx):
    return check(
        ctx.a.post(
            "/v1/completions",
            content=b'{"prompt": "a\\ud800b", "max_tokens": 2}',
            headers={"Content-Type": "application/json"},
        ),
        400,
        "surrogate",
    )


@case(
    "validation", "a JSON body nested 9,000 deep, on the agent API, chat and messages", "400 naming the limit on each"
)
def _(ctx):
    deep = b"[" * 9_000 + b"]" * 9_000  # past Python's recursion, within the list's body limit
    said = [
        check(ctx.a.post(path, content=deep, headers={"Content-Type": "application/json"}), 400, "nested deeper")
        for path in ("/v1/agents", "/v1/chat/completions", "/v1/messages")
    ]
    return said[-1]


@case("validation", "a chat that fills the context, no max_tokens", "vLLM's 400 naming the context length")
def _(ctx):
    body = {"messages": [{"role": "user", "content": "go " * 1300}]}
    return check(ctx.a.post("/v1/chat/completions", json=body), 400, "context length")


@case("validation", "invalid JSON, and a JSON array for a body", "422 each")
def _(ctx):
    bad = [
        ctx.a.post("/v1/agents", content=b"{not json", headers={"Content-Type": "application/json"}),
        ctx.a.post("/v1/agents", json=[1, 2]),
    ]
    return "; ".join(check(r, 422) for r in bad)


@case("metrics", "after the cases above", "/metrics is valid Prometheus text (every sample line parses)")
def _(ctx):
    text = ctx.a.get("/metrics").text
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? \S+$')
    bad = [line for line in text.splitlines() if line and not line.startswith("#") and not sample.match(line)]
    assert not bad, bad[:3]
    return f"{sum(1 for line in text.splitlines() if line and not line.startswith('#'))} samples, all valid"


# ------------------------------------------------------------------------------------- faults
@case("faults", "a POST retried with the same Idempotency-Key", "the first agent, not a second one")
def _(ctx):
    ids = {agent(ctx.a, **{"Idempotency-Key": "order-17"}).json()["agent_id"] for _ in range(3)}
    assert len(ids) == 1, ids
    doc = wait_agent(ctx.a, ids.pop())
    return f"one agent ({doc['agent_id']}), {doc['status']}"


@case("faults", "a client leaves a plain (non-streaming) completion", "the request is aborted in the engine")
def _(ctx):
    # the engine-wide gauge below must count this request alone: let the bystander (and anything an
    # earlier case left) finish first; the bystander has been in flight through every case before this
    if BYSTANDER.get("id"):
        wait_agent(ctx.b, BYSTANDER["id"])
    quiet = time.perf_counter() + 60
    while metric(ctx.a, "justitia_engine_requests_unfinished") > 0:
        assert time.perf_counter() < quiet, "the engine still holds requests of earlier cases after 60 s"
        time.sleep(0.05)
    t = time.perf_counter()
    check(completion(ctx.a, tokens=50, ignore_eos=True), 200)
    per_token = (time.perf_counter() - t) / 50
    try:  # 900 tokens would take ~900 x per_token; the client gives up after a tenth of that
        ctx.a.post(
            "/v1/completions", json={"prompt": "Go.", "max_tokens": 900, "ignore_eos": True}, timeout=90 * per_token
        )
        raise AssertionError("the completion finished before the client left")
    except httpx.TimeoutException:
        left = time.perf_counter()
    while metric(ctx.a, "justitia_engine_requests_unfinished") > 0:
        assert time.perf_counter() - left < 300 * per_token, "the abandoned request is still in the engine"
        time.sleep(0.05)
    gone = time.perf_counter() - left
    return f"gone from the engine {gone:.2f} s after the client left (the whole answer: ~{900 * per_token:.1f} s)"


@case("bystander", "the other key's agent, after all the cases", "done, every output there; /health ok")
def _(ctx):
    cases_s = time.perf_counter() - BYSTANDER["t0"]  # how long the cases ran beside it
    doc = wait_agent(ctx.b, BYSTANDER["id"])
    assert doc["status"] == "done", doc
    outs = [t for stage in doc["stages"] for t in stage]
    assert len(outs) == 2 * BYSTANDER_STAGES and all(t and t["output_tokens"] == BYSTANDER_TOKENS for t in outs), outs
    check(ctx.a.get("/health"), 200)
    return (
        f"done with all {len(outs)} outputs; in flight {min(doc['jct_s'], cases_s):.1f} s of the "
        f"{cases_s:.1f} s of cases after it; /health 200"
    )


def run(url: str, key: str, other_key: str, progress: bool = True) -> list[dict]:
    """Run every case against the server at ``url`` (started with ``FLAGS`` and the two keys); one
    row per case."""
    rows = []
    with (
        httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as a,
        httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {other_key}"}) as b,
        httpx.Client(base_url=url, timeout=120) as anon,
    ):
        ctx = Ctx(url, a, b, anon, key)
        for n, c in enumerate(CASES, 1):
            t = time.perf_counter()
            try:
                got, ok = c.run(ctx), True
            except Exception as exc:  # noqa: BLE001  (a failed case is a row of the table, not the end)
                got, ok = f"{type(exc).__name__}: {exc}"[:300], False
            rows.append(
                {
                    "n": n,
                    "class": c.kind,
                    "case": c.name,
                    "expect": c.expect,
                    "got": got,
                    "ok": ok,
                    "seconds": round(time.perf_counter() - t, 2),
                }
            )
            if progress:
                print(f"{n:2d} {'ok  ' if ok else 'FAIL'} {c.kind}: {c.name}: {got}", file=sys.stderr, flush=True)
        alive = anon.get("/health").status_code == 200
    rows.append(
        {
            "n": len(rows) + 1,
            "class": "server",
            "case": "after every case",
            "expect": "/health 200",
            "got": "200" if alive else "not answering",
            "ok": alive,
            "seconds": 0.0,
        }
    )
    return rows


def table(rows: list[dict]) -> str:
    out = ["| # | class | case | must | got |", "|---|---|---|---|---|"]
    for r in rows:
        got = r["got"].replace("|", "/").replace("\n", " ")
        got = ("" if r["ok"] else "**FAILED** ") + (got if len(got) <= 160 else got[:157] + "...")
        out.append(f"| {r['n']} | {r['class']} | {r['case'].replace('|', '/')} | {r['expect']} | {got} |")
    for kind, name, expect, test in REFERENCES:
        out.append(f"| - | {kind} | {name} | {expect} | `{test}` |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (loopback), started with FLAGS and --api-keys holding both keys")
    ap.add_argument("--key", default="sk-abuse-a")
    ap.add_argument("--other-key", default="sk-abuse-b")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    proc = None
    if args.url is None:
        import os

        keys = Path(tempfile.mkdtemp(prefix="justitia-abuse-")) / "keys.txt"
        keys.write_text(f"{args.key} team-a 1\n{args.other_key} team-b 1\n")
        os.environ.update(ENV)
        proc, url = start_server(*FLAGS, "--api-keys", str(keys), quiet=True)
    else:
        url = args.url
        if urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("the abuse list sends traffic to loopback only")
    try:
        rows = run(url, args.key, args.other_key)
    finally:
        if proc is not None:
            stop(proc)
    print(table(rows))
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} cases handled; {len(REFERENCES)} more in the tests named.")
    if args.out:
        write_doc(args.out, {"flags": FLAGS, "rows": rows, "references": REFERENCES})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
