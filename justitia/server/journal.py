"""The server's journal: every accepted agent and every finished task, in SQLite (WAL), so that a
restart, or a ``kill -9``, loses nothing that was accepted.

``justitia serve`` journals by default to ``~/.local/state/justitia/serve-HOST-PORT.sqlite`` (or
``$JUSTITIA_STATE_DIR``); ``--journal FILE`` picks the file, ``--no-journal`` turns it off. What
is kept, per agent: its spec, owner (the key's owner id, never the key), tenant and weight, the
``Idempotency-Key`` it came with, its predicted cost, status, error and wall-clock arrival and
finish; per finished task, its output document. An agent is written (and committed) before its
202 goes out; a task's output before the agent moves on. On restart the server reloads every
journaled agent: finished ones answer GET as before; unfinished ones start again from the first
stage not fully answered, with the same id and owner.

Writes go through one thread (SQLite connections are not shared across threads here), off the
event loop. WAL with ``synchronous=NORMAL`` survives a killed process (not a lost machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY, owner TEXT NOT NULL, tenant TEXT, weight REAL NOT NULL, spec TEXT NOT NULL,
    idempotency_key TEXT, predicted_cost REAL NOT NULL, status TEXT NOT NULL, error TEXT,
    arrival_wall REAL NOT NULL, finish_wall REAL);
CREATE UNIQUE INDEX IF NOT EXISTS agents_idempotency ON agents (owner, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS outputs (
    agent_id TEXT NOT NULL, stage INTEGER NOT NULL, task INTEGER NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (agent_id, stage, task));
"""


class JournalError(RuntimeError):
    """The journal could not record something (the server answers 503 rather than accept it)."""


def default_path(host: str, port: int) -> Path:
    """Where ``justitia serve`` journals unless told otherwise."""
    base = Path(os.environ.get("JUSTITIA_STATE_DIR") or Path.home() / ".local" / "state" / "justitia")
    return base / f"serve-{host}-{port}.sqlite"


@dataclass
class Record:
    """One journaled agent, as reloaded."""

    agent_id: str
    owner: str
    tenant: str | None
    weight: float
    spec: dict
    idempotency_key: str | None
    predicted_cost: float
    status: str
    error: str | None
    arrival_wall: float
    finish_wall: float | None
    outputs: dict[tuple[int, int], dict] = field(default_factory=dict)


class Journal:
    """Append-mostly agent records in one SQLite file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._db: sqlite3.Connection | None = None
        self._pool.submit(self._open).result()

    def _open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None)  # autocommit: each write commits
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        self._db = db

    async def _run(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc

    # --------------------------------------------------------------------------------- writes
    async def accept(self, r: Record) -> None:
        """An agent accepted (committed before its 202)."""
        await self._run(self._db.execute,
                        "INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (r.agent_id, r.owner, r.tenant, r.weight, json.dumps(r.spec), r.idempotency_key,
                         r.predicted_cost, r.status, r.error, r.arrival_wall, r.finish_wall))

    async def task_done(self, agent_id: str, stage: int, task: int, doc: dict) -> None:
        await self._run(self._db.execute, "INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?)",
                        (agent_id, stage, task, json.dumps(doc)))

    async def ended(self, agent_id: str, status: str, error: str | None, finish_wall: float) -> None:
        await self._run(self._db.execute, "UPDATE agents SET status = ?, error = ?, finish_wall = ? WHERE agent_id = ?",
                        (status, error, finish_wall, agent_id))

    async def forget(self, agent_ids: list[str]) -> None:
        """Drop agents the server no longer keeps (their ids stay known to the server as 410)."""
        def drop():
            with self._db:
                self._db.executemany("DELETE FROM outputs WHERE agent_id = ?", [(a,) for a in agent_ids])
                self._db.executemany("DELETE FROM agents WHERE agent_id = ?", [(a,) for a in agent_ids])
        await self._run(drop)

    # ---------------------------------------------------------------------------------- reads
    def load(self) -> list[Record]:
        """Every journaled agent with its outputs, oldest first (at start-up, before serving)."""
        def read():
            records = {}
            for row in self._db.execute("SELECT * FROM agents ORDER BY arrival_wall"):
                rec = Record(row[0], row[1], row[2], row[3], json.loads(row[4]), *row[5:])
                records[rec.agent_id] = rec
            for agent_id, stage, task, doc in self._db.execute("SELECT * FROM outputs"):
                if agent_id in records:
                    records[agent_id].outputs[(stage, task)] = json.loads(doc)
            return list(records.values())
        return self._pool.submit(read).result()

    def close(self) -> None:
        def shut():
            if self._db is not None:
                self._db.close()
                self._db = None
        self._pool.submit(shut).result()
        self._pool.shutdown()
