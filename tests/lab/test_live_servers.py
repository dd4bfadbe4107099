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
