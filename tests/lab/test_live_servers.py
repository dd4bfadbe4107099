"""The lab's server processes (``lab.live.servers``): a server that does not end on SIGTERM is killed."""

from __future__ import annotations

import subprocess
import sys
import time

from justitia.lab.live.servers import stop


def test_stop_kills_a_server_that_ignores_sigterm():
    """``stop``: SIGTERM first; a process still running after the timeout (a server draining requests
    whose client is gone) gets SIGKILL, and ``stop`` returns once it has ended."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"  # its handler is set
    t = time.monotonic()
    stop(proc, timeout_s=0.5)
    assert proc.returncode == -9 and time.monotonic() - t < 10
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop(polite, timeout_s=10)
    assert polite.returncode == -15


def test_a_server_the_lab_started_dies_with_the_lab_even_by_sigkill():
    """``start`` guards what it started (``engine.reaper.guard``): a bench killed with SIGKILL leaves
    no server behind (a ``justitia serve`` and its engine would hold the cores and the port)."""
    import os
    import signal

    from servers import running

    lab = (
        "import sys, time\n"
        "from justitia.lab.live.servers import free_port, start\n"
        "port = free_port()\n"
        "cmd = [sys.executable, '-m', 'http.server', str(port), '--bind', '127.0.0.1']\n"
        "proc, _ = start(cmd, port, '/', quiet=True)\n"
        "print(proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", lab], stdout=subprocess.PIPE, text=True)
    try:
        server = int(parent.stdout.readline())
        assert running(server)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while running(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(server)
    finally:
        parent.kill()
