"""Servers in subprocesses for the benchmarks: `justitia serve` or a stock vLLM OpenAI server on a free
loopback port, started and waited for until it answers, what a front end's ``/metrics`` says
about the replicas behind it, and an agent waited for until it is over.

The load test, the abuse list and the server, flags and Ray benchmarks (``justitia.lab``) start their
servers with these; they and the tests (``tests/servers.py``) wait for agents and read metrics with
``wait_agent`` and ``metric`` (``samples``: a whole exposition).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from justitia.defaults import ENV_PRICING_STATE
from justitia.engine.reaper import guard


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(env: dict | None = None) -> dict[str, str]:
    """A server's environment: this one with ``env`` added, less ``JUSTITIA_PRICING_STATE`` unless
    ``env`` names it (a bench run starts from nothing learned, whatever its caller's shell keeps)."""
    # vLLM's CPU backend otherwise reserves most of the machine's memory for each engine's KV cache
    mine = {k: v for k, v in os.environ.items() if k != ENV_PRICING_STATE}
    return {"VLLM_CPU_KVCACHE_SPACE": "1"} | mine | (env or {})


def start(
    cmd: list[str], port: int, ready: str, quiet: bool = False, env: dict | None = None, log: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` serving on loopback ``port`` (in ``child_env(env)``; its output to ``log``, or
    nowhere if ``quiet``); return it once ``ready`` answers (SystemExit if it never does)."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log is not None else out, env=child_env(env))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 400
    while proc.poll() is None and time.time() < deadline:
        try:
            if httpx.get(url + ready, timeout=5).status_code == 200:
                guard()  # it and its engine's processes die with this one, even by SIGKILL
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[:4]} did not start")


def stop(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop a server ``start`` started: SIGTERM, then SIGKILL if it has not ended in ``timeout_s`` (a
    server still draining requests whose client is gone)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def start_server(
    *args: str, quiet: bool = False, journal: bool = True, env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """``justitia serve ARGS`` on a free loopback port, once it answers /health; with a fresh journal
    (nothing to resume), or none, and no saved pricing state unless ``env`` names one (``child_env``)."""
    port = free_port()
    path = Path(tempfile.mkdtemp(prefix="justitia-load-")) / "journal.sqlite"
    where = ["--journal", str(path)] if journal else ["--no-journal"]
    cmd = [sys.executable, "-m", "justitia", "serve", "--port", str(port), *where, *args]
    return start(cmd, port, "/health", quiet, env)


def start_replica(model_dir: str, quiet: bool = True) -> tuple[subprocess.Popen, str]:
    """A stock vLLM OpenAI server (priority policy, 1 GiB of KV cache, contexts up to 2,048 tokens, as
    `justitia serve` starts its own engine) on a free loopback port."""
    port = free_port()
    return start(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_dir,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--scheduling-policy",
            "priority",
            "--enforce-eager",
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
        ],
        port,
        "/v1/models",
        quiet,
    )


def replica_split(url: str) -> dict[str, dict[str, float]]:
    """Requests the front end sent to each replica, and those that failed, from its /metrics."""
    out: dict[str, dict[str, float]] = {}
    text = httpx.get(url + "/metrics", timeout=30).text
    for name in ("requests", "failures"):
        for _, labels, value in samples(text, f"justitia_replica_{name}_total"):
            out.setdefault(labels["replica"], {})[name] = value
    return out


def ray_split(url: str) -> dict[str, float]:
    """Requests each Ray replica answered (by process id), and the retries, from the server's /metrics."""
    out: dict[str, float] = {}
    for name, labels, value in samples(httpx.get(url + "/metrics", timeout=30).text):
        if name == "justitia_ray_replica_answers_total":
            out["pid " + labels["replica_pid"]] = value
        elif name in ("justitia_ray_retries_total", "justitia_ray_interrupted_total"):
            out[name.removeprefix("justitia_ray_")] = value
    return out


TERMINAL = ("done", "failed", "cancelled")  # an agent's statuses once it is over


def wait_agent(
    client: httpx.Client, agent_id: str, timeout_s: float = 300, poll_s: float = 0.2, stuck_ok: bool = False
) -> dict:
    """Poll the server's ``/v1/agents/{agent_id}`` until the agent is over (``TERMINAL``); its
    document. One not over within ``timeout_s`` fails the check (an ``AssertionError``), or with
    ``stuck_ok`` its last document is returned (a status not in ``TERMINAL``)."""
    deadline = time.time() + timeout_s
    while (doc := client.get(f"/v1/agents/{agent_id}").json())["status"] not in TERMINAL:
        if time.time() >= deadline:
            assert stuck_ok, f"agent {agent_id} still {doc['status']} after {timeout_s:.0f} s"
            break
        time.sleep(poll_s)
    return doc


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str | None = None) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition (of metric ``name`` alone, if given): each its
    name, its labels (values unescaped) and its value."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = _SAMPLE.fullmatch(line.strip())
        if match is None or (name is not None and match[1] != name):
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(match[2] or "")
        }
        out.append((match[1], labels, float(match[3])))
    return out


def metric(client: httpx.Client, name: str) -> float:
    """One sample of the Prometheus text at ``/metrics``; ``name`` may include labels (the sample's
    may have more, ``model_name`` say)."""
    ((wanted, labels, _),) = samples(name + " 0")
    for _, have, value in samples(client.get("/metrics").text, wanted):
        if labels.items() <= have.items():
            return value
    raise AssertionError(f"/metrics has no {name}")
