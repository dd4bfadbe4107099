"""Servers in subprocesses for the tests: start one, wait until it answers, stop it and check that
none of its processes (vLLM spawns several) outlives it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from justitia.engine.reaper import descendants  # noqa: F401  (the tests use it from here too)
from justitia.lab.live.servers import metric, samples, wait_agent  # noqa: F401  (the tests use them from here)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A command serving HTTP on ``port``, its output in ``log``."""

    def __init__(self, cmd: list[str], port: int, log: Path, env: dict | None = None):
        self.port, self.log = port, log
        self.url = f"http://127.0.0.1:{port}"
        self._out = open(log, "w")
        self.proc = subprocess.Popen(
            cmd, env=dict(os.environ, **(env or {})), stdout=self._out, stderr=subprocess.STDOUT, text=True
        )
        self.children: list[int] = []

    def wait_ready(self, path: str, timeout_s: float = 300) -> None:
        deadline = time.time() + timeout_s
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    self.stop(check=False)
                    pytest.fail(f"{self.proc.args[:4]} exited:\n" + self.log.read_text()[-3000:])
                try:
                    if client.get(path).status_code == 200:
                        self.children = descendants(self.proc.pid)
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        self.stop(check=False)
        pytest.fail(f"{self.proc.args[:4]} did not answer {path} within {timeout_s:.0f} s")

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, check: bool = True, spawns: bool = True) -> None:
        """SIGTERM, then check that no process it started is left (they are killed if so); ``spawns``:
        it must have started some (vLLM does)."""
        children = self.children or descendants(self.proc.pid)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._out.close()
        deadline = time.time() + 15  # vLLM's children stop on their own once it has: on a busy machine, seconds later
        while (left := [p for p in children if running(p)]) and time.time() < deadline:
            time.sleep(0.2)
        for p in left:
            try:
                os.kill(p, 9)
            except ProcessLookupError:  # it stopped after all
                pass
        if check:
            assert (children or not spawns) and not left, f"processes outlived {self.proc.args[:4]}: {left}"


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sigkill(server: Server, timeout_s: float = 30) -> list[int]:
    """Kill the server with SIGKILL, as the OOM killer or ``kill -9`` would; return the processes
    it started that still run ``timeout_s`` later (they are killed then)."""
    children = descendants(server.proc.pid)
    server.proc.kill()
    server.proc.wait()
    server._out.close()
    deadline = time.time() + timeout_s
    while any(running(p) for p in children) and time.time() < deadline:
        time.sleep(0.2)
    left = [p for p in children if running(p)]
    for p in left:
        os.kill(p, 9)
    return left


def metric_sum(client: httpx.Client, name: str) -> float:
    """The sum of a metric's samples over all their labels (vLLM labels its own by engine and model)."""
    values = [value for _, _, value in samples(client.get("/metrics").text, name)]
    assert values, f"no metric {name}"
    return sum(values)
