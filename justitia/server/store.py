"""Every agent a server knows, by id (``AgentStore``), and what it keeps of the finished ones: their
documents, for GET, by bytes and by age (``Settings.finished_bytes``, ``finished_s``: a server runs
for days), the oldest dropped first; a dropped agent's id remembered, bounded, to answer its owner
410 rather than 404, and forgotten by the journal too.

The agent manager (``agents.AgentManager.store``) adds the agents it starts and those a restart
reloads (``recovery``), and hands each finished one to ``keep``; the agent API looks agents up
through ``owned`` and ``was_owned``.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Callable

from justitia.server.journal import Journal
from justitia.server.keys import Client
from justitia.server.runs import AgentRun, Settings

MAX_EXPIRED = 100_000  # dropped agents' ids remembered (410), the oldest forgotten first


class AgentStore:
    """The runs by id, finished ones kept by bytes and age (the module's docstring). ``now`` is the
    server's clock (``AgentManager.now``)."""

    def __init__(self, settings: Settings, journal: Journal | None, now: Callable[[], float]):
        self.settings, self.journal, self.now = settings, journal, now
        self.agents: dict[str, AgentRun] = {}
        self.ended: collections.deque[tuple[str, float, int]] = collections.deque()  # (id, when, bytes), oldest first
        self.ended_bytes = 0
        self._expired: collections.OrderedDict[str, str] = collections.OrderedDict()  # dropped agents -> owner (410)
        self._background: set[asyncio.Task] = set()

    def add(self, run: AgentRun) -> None:
        self.agents[run.agent_id] = run

    def owned(self, agent_id: str, client: Client) -> AgentRun | None:
        """The agent if ``client`` owns it; None if it is unknown or another key's (both 404)."""
        self.forget_old()
        run = self.agents.get(agent_id)
        return run if run is not None and run.owner == client.owner else None

    def was_owned(self, agent_id: str, client: Client) -> bool:
        """Whether ``client``'s agent of that id finished and was dropped since (410, not 404)."""
        return self._expired.get(agent_id) == client.owner

    def keep(self, run: AgentRun) -> None:
        """A finished agent joins those kept (by bytes and age)."""
        size = len(json.dumps(run.doc())) + sum(len(json.dumps(e)) for e in run.events)
        self.ended.append((run.agent_id, run.finish_s, size))
        self.ended_bytes += size
        self.forget_old()

    def forget_old(self) -> None:
        """Drop finished agents past the bytes and age kept; their ids are remembered, bounded, to
        answer 410."""
        limit_s = self.now() - self.settings.finished_s
        dropped = []
        while self.ended and (self.ended_bytes > self.settings.finished_bytes or self.ended[0][1] < limit_s):
            agent_id, _, size = self.ended.popleft()
            self.ended_bytes -= size
            run = self.agents.pop(agent_id, None)
            if run is not None:
                dropped.append(agent_id)
                self._expired[agent_id] = run.owner
                while len(self._expired) > MAX_EXPIRED:
                    self._expired.popitem(last=False)
        if dropped and self.journal is not None:  # kept referenced until done (asyncio holds tasks weakly)
            task = asyncio.get_running_loop().create_task(self.journal.forget(dropped))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
