"""The server's journal: every accepted agent and every finished task, in SQLite (WAL), so that a
restart, or a ``kill -9``, loses nothing that was accepted.

``justitia serve`` journals by default to ``~/.local/state/justitia/serve-HOST-PORT.sqlite`` (or
``$JUSTITIA_STATE_DIR``); ``--journal FILE`` picks the file, ``--no-journal`` turns it off. What
is kept, per agent: its spec, owner (the key's owner id, never the key), tenant and weight, the
``Idempotency-Key`` it came with, its predicted cost, status, error and wall-clock arrival and
finish, and its place in the scheduler (below); per finished task, its output document. An agent
is written (and committed) before its 202 goes out; a task's output before the agent moves on. On
restart the server reloads every journaled agent: finished ones answer GET as before; unfinished
ones start again from the first stage not fully answered, with the same id and owner.

**Sessions.** A session's first turn is its spec; its later turns, as submitted, are the
``turns`` column (a JSON list of ``{"stages", "last", "predicted_cost"}``), each written before
its 202; its outputs are kept by their stage's number in the session; its status is ``waiting``
(with ``waiting_wall``, when it began to wait, for its keep time) between turns, ``running`` during
one. A restart leaves a waiting session waiting, and resumes a running one's turn.

**A resume that keeps its place.** Each agent's row also keeps the virtual finish tag ``f`` its
registration returned (``virtual_finish``), the clock's ``V`` as last read when it registered
(``virtual_time``; read at most once a second) and the run of the server whose clock stamped them
(``clock_run``: each start is a new run, and its engine's clock starts again). The largest ``V``
a run recorded, ``V_stop``, is a lower bound on its clock when it stopped; under GPS an unfinished
agent of weight ``w`` was then still owed at most ``w (f - V_stop)`` of its work. At the next
start ``resume_order`` gives each unfinished agent ``resume_cost = min(C, w max(f - V_stop, 0))``
(``Backend.register``; ``C``, its whole predicted cost, stays its cost for retagging) and the
order to register them again in, smallest ``resume_cost / w`` first: stamped ``V(restart) +
resume_cost / w``, as if the clock had run on from ``V_stop``, they keep their order, and none
comes after an agent that arrives after the restart with its cost and weight (``V(now) + C / w``).

Writes go through one thread (SQLite connections are not shared across threads here), off the
event loop. WAL with ``synchronous=NORMAL`` survives a killed process (not a lost machine).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from justitia.defaults import state_dir

SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY, owner TEXT NOT NULL, tenant TEXT, weight REAL NOT NULL, spec TEXT NOT NULL,
    idempotency_key TEXT, predicted_cost REAL NOT NULL, status TEXT NOT NULL, error TEXT,
    arrival_wall REAL NOT NULL, finish_wall REAL, clock_run INTEGER, virtual_finish REAL, virtual_time REAL,
    turns TEXT, waiting_wall REAL);
CREATE UNIQUE INDEX IF NOT EXISTS agents_idempotency ON agents (owner, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS outputs (
    agent_id TEXT NOT NULL, stage INTEGER NOT NULL, task INTEGER NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (agent_id, stage, task));
"""
COLUMNS = (
    "agent_id",
    "owner",
    "tenant",
    "weight",
    "spec",
    "idempotency_key",
    "predicted_cost",
    "status",
    "error",
    "arrival_wall",
    "finish_wall",
    "clock_run",
    "virtual_finish",
    "virtual_time",
    "turns",
    "waiting_wall",
)
ADDED = {
    "clock_run": "INTEGER",
    "virtual_finish": "REAL",
    "virtual_time": "REAL",  # to a journal written before them
    "turns": "TEXT",
    "waiting_wall": "REAL",
}
ENDED = ("done", "failed", "cancelled")


class JournalError(RuntimeError):
    """The journal could not record something (the server answers 503 rather than accept it)."""


def default_path(host: str, port: int) -> Path:
    """Where ``justitia serve`` journals unless told otherwise."""
    return state_dir() / f"serve-{host}-{port}.sqlite"


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
    clock_run: int | None = None  # the server run whose clock stamped the two below (None: this run)
    virtual_finish: float | None = None  # its tag f at its registration (None: a policy without a clock)
    virtual_time: float | None = None  # the clock's V as last read when it registered
    turns: list[dict] = field(default_factory=list)  # a session's turns after its first, as submitted
    waiting_wall: float | None = None  # a waiting session: when it began to wait
    outputs: dict[tuple[int, int], dict] = field(default_factory=dict)


class Journal:
    """Append-mostly agent records in one SQLite file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._db: sqlite3.Connection | None = None
        self.run = 1  # this run of the server (its clock's stamps are told apart from earlier runs')
        self._pool.submit(self._open).result()

    def _open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None)  # autocommit: each write commits
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        have = {row[1] for row in db.execute("PRAGMA table_info(agents)")}
        for name, kind in ADDED.items():
            if name not in have:
                db.execute(f"ALTER TABLE agents ADD COLUMN {name} {kind}")
        self.run = 1 + (db.execute("SELECT MAX(clock_run) FROM agents").fetchone()[0] or 0)
        self._db = db

    async def _run(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc

    # --------------------------------------------------------------------------------- writes
    async def accept(self, r: Record) -> None:
        """An agent accepted (committed before its 202), its stamps of this run unless it names another."""
        await self._run(
            self._db.execute,
            f"INSERT INTO agents ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
            (
                r.agent_id,
                r.owner,
                r.tenant,
                r.weight,
                json.dumps(r.spec),
                r.idempotency_key,
                r.predicted_cost,
                r.status,
                r.error,
                r.arrival_wall,
                r.finish_wall,
                self.run if r.clock_run is None else r.clock_run,
                r.virtual_finish,
                r.virtual_time,
                json.dumps(r.turns) if r.turns else None,
                r.waiting_wall,
            ),
        )

    async def stamped(self, agent_id: str, virtual_finish: float | None, virtual_time: float | None) -> None:
        """A resumed agent registered again: its tag and ``V`` in this run's clock."""
        await self._run(
            self._db.execute,
            "UPDATE agents SET clock_run = ?, virtual_finish = ?, virtual_time = ? WHERE agent_id = ?",
            (self.run, virtual_finish, virtual_time, agent_id),
        )

    async def task_done(self, agent_id: str, stage: int, task: int, doc: dict) -> None:
        await self._run(
            self._db.execute,
            "INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?)",
            (agent_id, stage, task, json.dumps(doc)),
        )

    async def turned(self, agent_id: str, turns: list[dict]) -> None:
        """A session took a turn (committed before its 202): its turns after the first, and it runs."""
        await self._run(
            self._db.execute,
            "UPDATE agents SET turns = ?, status = 'running', waiting_wall = NULL WHERE agent_id = ?",
            (json.dumps(turns), agent_id),
        )

    async def waiting(self, agent_id: str, since_wall: float) -> None:
        """A session's turn is answered: it waits for its client's next, since ``since_wall``."""
        await self._run(
            self._db.execute,
            "UPDATE agents SET status = 'waiting', waiting_wall = ? WHERE agent_id = ?",
            (since_wall, agent_id),
        )

    async def ended(self, agent_id: str, status: str, error: str | None, finish_wall: float) -> None:
        await self._run(
            self._db.execute,
            "UPDATE agents SET status = ?, error = ?, finish_wall = ? WHERE agent_id = ?",
            (status, error, finish_wall, agent_id),
        )

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
            for row in self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM agents ORDER BY arrival_wall"):
                rec = Record(
                    row[0],
                    row[1],
                    row[2],
                    row[3],
                    json.loads(row[4]),
                    *row[5:14],
                    json.loads(row[14]) if row[14] else [],
                    row[15],
                )
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


def resume_order(records: list[Record]) -> list[tuple[Record, float | None]]:
    """The unfinished agents among ``records`` (all those reloaded: each run's readings of its
    clock count), in the order to register them again, each with its ``resume_cost``: what GPS
    still owed it when its run stopped, ``min(C, w max(f - V_stop, 0))``, ``V_stop`` the largest
    ``V`` its run recorded. ``V_stop`` is a lower bound on that run's clock at the stop, so an agent
    is owed no less than GPS owed it (never moved ahead of its place), and at most ``C``, its whole
    predicted cost (never behind an agent arriving now with its cost). Agents without stamps (a
    journal older than them, a policy without a clock) get None (their whole cost) and come last.
    Smallest ``resume_cost / w`` first, then the old tags' order, then arrival."""
    stop: dict[int, float] = {}  # run -> the largest V it recorded
    for r in records:
        if r.clock_run is not None and r.virtual_time is not None:
            stop[r.clock_run] = max(stop.get(r.clock_run, r.virtual_time), r.virtual_time)
    plan = []
    for r in records:
        if r.status in ENDED:
            continue
        v = stop.get(r.clock_run)
        if r.virtual_finish is None or v is None:
            plan.append(((1, 0.0, 0.0, r.arrival_wall), r, None))
            continue
        left = min(r.predicted_cost, r.weight * max(r.virtual_finish - v, 0.0))
        plan.append(((0, left / r.weight, r.virtual_finish - v, r.arrival_wall), r, left))
    plan.sort(key=lambda p: p[0])
    return [(r, left) for _, r, left in plan]
