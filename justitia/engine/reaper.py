"""Engine processes that die with the process that started them, even by SIGKILL.

vLLM runs its engine core in child processes; if the parent is killed (``kill -9``, the OOM
killer) they are orphaned and keep running, holding memory and the port's engine. ``guard``
starts a small watcher process with a pipe from the parent: it holds the children's ids (and
start times, so that a reused id is never hit) and blocks on the pipe. The pipe closes when the
parent ends, however it ends; the watcher then kills whichever of the children still run.
Linux only (``/proc``); elsewhere ``guard`` does nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_WATCHER = r"""
import os, signal, sys
pids = [tuple(map(int, line.split())) for line in sys.stdin.buffer.readline().decode().split(",") if line.strip()]
sys.stdin.buffer.read()  # until the parent ends: its end of the pipe closes
def started(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
for pid, start in pids:
    if started(pid) == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""

_watchers: list[subprocess.Popen] = []  # kept open for the life of this process


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def guard() -> list[int]:
    """Make this process's current descendants die with it; returns their ids."""
    if not Path("/proc/self/stat").exists():
        return []
    kids = [(p, t) for p in descendants(os.getpid()) if (t := _start_time(p)) is not None]
    if not kids:
        return []
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER],
        stdin=subprocess.PIPE,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watcher.stdin.write((",".join(f"{p} {t}" for p, t in kids) + "\n").encode())
    watcher.stdin.flush()
    _watchers.append(watcher)
    return [p for p, _ in kids]
