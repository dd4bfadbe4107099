"""One clock tagging requests in front of several engines: the part the ``--upstream`` and ``--ray``
backends share.

A ``TaggingBackend`` keeps the policy's book (``AgentBook.tagging``) and its clock here, in front of
engines that order their queues by what this clock stamps on each request: stock vLLM servers read
a request's key as vLLM's ``priority`` (``tag`` gives it); the plug-in in ``tagged`` mode reads the
stamp (``agent_tag``, ``agent_rank``) written into the request's metadata (``tag`` writes it into
``xargs``). Each engine serves what it is sent in that order; this clock decides the order for all.

Agents are released at once (``release``: a cancelled or failed agent, or one the agent API says is
done): a front end holds none of their requests, so there is nothing to wait for. A backend that
moves the clock's M before an agent arrives (the Ray backend: the replicas' measured M) overrides
``_arriving``.
"""

from __future__ import annotations

import logging
import time

from justitia.core import KV, AgentBook, CostDist, PolicyState, RequestInfo, RequestMeta
from justitia.backends.base import Backend
from justitia.defaults import policy_settings

log = logging.getLogger("justitia.server")


class TaggingBackend(Backend):
    """A backend whose engines are ordered by one clock kept here (see the module's docstring)."""

    def _start_clock(self, policy: str, capacity: float, idle_release_s: float, retag: bool,
                     measure_every_s: float | None = None, kv_tokens: int | None = None) -> None:
        """The book and the clock's time origin (``AgentBook.tagging``'s arguments; sessions are kept
        for ``JUSTITIA_SESSION_KEEP_S``, as in the plug-in)."""
        self.book = AgentBook.tagging(policy, capacity, KV, idle_release_s, log, retag, measure_every_s, kv_tokens)
        self.book.session_keep_s = policy_settings().session_keep_s
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since the clock started."""
        return time.monotonic() - self.t0

    def _arriving(self, agent_id: str, now_s: float) -> None:
        """An agent is about to be registered (or tagged for the first time) at ``now_s``."""

    async def register(self, agent_id: str, agent_type: str, predicted_cost: float, weight: float = 1.0,
                       tenant: str | None = None, resume_cost: float | None = None,
                       session: bool = False, dist: CostDist | None = None) -> float | None:
        """Register the agent with the clock here; its tag."""
        now = self.now()
        self._arriving(agent_id, now)
        self.book.register(agent_id, agent_type, predicted_cost, now, weight, tenant, resume_cost, session, dist)
        return self.book.virtual_finish(agent_id)

    async def retire(self, agent_id: str, pause: bool = False) -> None:
        """The agent leaves the clock once none of its requests is out at an engine (``AgentBook.retire``;
        ``pause``: ``AgentBook.pause``)."""
        if pause:
            self.book.pause(agent_id, self.now())
        else:
            self.book.retire(agent_id, self.now())

    async def state(self) -> PolicyState:
        """The clock here, which orders every engine behind it."""
        return self.book.state(self.now())

    def tag(self, request_id: str, xargs: dict | None, prompt_tokens: int, max_tokens: int,
            stamp: bool = False) -> tuple[RequestInfo, int]:
        """Tag a request on its way to an engine: its info (``finish`` it when the engine is done with
        it) and its key as vLLM's int ``priority``. With ``stamp``, the clock's stamp is also written
        into ``xargs`` (``agent_tag``, and ``agent_rank`` in a tenant) for engines that run ``tagged``."""
        now = self.now()
        self.book.sweep(now)
        meta = RequestMeta.parse(xargs, request_id, log)
        self._arriving(meta.agent_id or request_id, now)  # an agent known only by its requests
        info, priority = self.book.tag(request_id, meta, prompt_tokens, max_tokens, now)
        if stamp:
            xargs["agent_tag"], rank = self.book.stamp(info)
            if rank is not None:
                xargs["agent_rank"] = rank
        return info, priority

    def finish(self, request_id: str, produced: int | None = None) -> None:
        """The engine is done with a tagged request (having produced ``produced`` tokens)."""
        self.book.finish(request_id, self.now(), produced)
