"""One clock tagging requests in front of several engines: the part the ``--upstream`` and ``--ray``
backends share.

A ``TaggingBackend`` keeps the policy's book (``AgentBook.tagging``, in a ``Tagger``) and its clock here, in front of
engines that order their queues by what this clock stamps on each request: stock vLLM servers read
a request's key as vLLM's ``priority`` (``tag`` gives it); the plug-in in ``tagged`` mode reads the
stamp (``agent_tag``, ``agent_rank``) written into the request's metadata (``tag`` writes it into
``xargs``). Each engine serves what it is sent in that order; this clock decides the order for all.

Agents are released at once (``release``: a cancelled or failed agent, or one the agent API says is
done): a front end holds none of their requests, so there is nothing to wait for. A backend that
moves the clock's M before an agent arrives (the Ray backend: the replicas' measured M) overrides
``_arriving``.

A front end sees no engine steps, only its requests going out and coming back. Given the engine's
``kv_tokens``, a ``Tagger`` measures the clock's M from them: it counts the engine as backlogged
while the open requests' prompts and ``max_tokens`` together exceed the KV cache (then some of them
must wait), and credits each request that finishes in such a stretch with its cost, ``p*d + d^2/2``
at the tokens it produced, to the busy time. The clock's meter (``CapacityMeter``) smooths it,
within its band around the rate measured so far, as the plug-in's does. With ``max_tokens`` far
above what requests produce, the front end counts as busy some time that was not, and measures a
lower M (the band bounds it). The bench's tagging mode (``lab.live.runner``) uses the same ``Tagger``.
"""

from __future__ import annotations

import logging
import time

from justitia.backends.base import Backend
from justitia.core import (
    KV,
    AgentBook,
    Charge,
    CostModel,
    PolicyState,
    Registration,
    RequestInfo,
    RequestMeta,
    kv_token_iters,
)
from justitia.defaults import policy_settings

log = logging.getLogger("justitia.server")


class Tagger:
    """A front end's book (``AgentBook.tagging``): it tags each request it sends to an engine, and
    with the engine's ``kv_tokens`` (and a policy whose M is measured) measures the engine's M from
    the requests' round trips (the module's docstring)."""

    def __init__(
        self,
        policy: str,
        capacity_per_s: float,
        cost: str | CostModel = KV,
        idle_release_s: float | None = None,
        retag: bool = True,
        measure_every_s: float | None = None,
        kv_tokens: int | None = None,
        session_keep_s: float | None = None,
    ):
        keep = {} if idle_release_s is None else {"idle_release_s": idle_release_s}
        if session_keep_s is not None:
            keep["session_keep_s"] = session_keep_s
        self.book = AgentBook.tagging(
            policy, capacity_per_s, cost, retag=retag, measure_every_s=measure_every_s if kv_tokens else None, **keep
        )
        measured = self.book.clock().schedule is not None  # a clock whose M follows what it is told
        self._kv_tokens = int(kv_tokens) if kv_tokens and measured else None
        self._demand: dict[str, tuple[int, int]] = {}  # open requests -> (prompt, prompt + max_tokens)
        self._demand_sum = 0
        self._seen_s = 0.0  # the last time the front end looked

    def tag(
        self, request_id: str, meta: RequestMeta, prompt_tokens: int, max_tokens: int, now_s: float
    ) -> tuple[RequestInfo, int]:
        """``AgentBook.tag``, the engine's M measured up to now first."""
        if self._kv_tokens is None:
            return self.book.tag(request_id, meta, prompt_tokens, max_tokens, now_s)
        self._look(now_s)
        out = self.book.tag(request_id, meta, prompt_tokens, max_tokens, now_s)
        self._demand[request_id] = (prompt_tokens, prompt_tokens + max_tokens)
        self._demand_sum += prompt_tokens + max_tokens
        return out

    def finish(
        self, request_id: str, now_s: float, output_tokens: int | None = None, cached_tokens: int | None = None
    ) -> RequestInfo | None:
        """``AgentBook.finish``; a request that ends while the engine was backlogged is credited with
        its cost at the tokens it produced."""
        if self._kv_tokens is not None and request_id in self._demand:
            prompt, demand = self._demand.pop(request_id)
            served = (
                Charge()
                if not output_tokens
                else Charge(prompt, output_tokens, round(kv_token_iters(prompt, output_tokens)))
            )
            self._look(now_s, served)
            self._demand_sum -= demand
        return self.book.finish(request_id, now_s, output_tokens, cached_tokens)

    def _look(self, now_s: float, served: Charge = Charge()) -> None:
        """The engine up to ``now_s``: busy time while the open requests' demand exceeded the cache,
        and ``served`` if a request finished in it."""
        if self._demand_sum > self._kv_tokens:
            self.book.observe_service(max(0.0, now_s - self._seen_s), served)
        self._seen_s = max(self._seen_s, now_s)


class TaggingBackend(Backend):
    """A backend whose engines are ordered by one clock kept here (see the module's docstring)."""

    def _start_clock(
        self,
        policy: str,
        capacity: float,
        idle_release_s: float,
        retag: bool,
        measure_every_s: float | None = None,
        kv_tokens: int | None = None,
    ) -> None:
        """The book and the clock's time origin (``AgentBook.tagging``'s arguments; sessions are kept
        for ``JUSTITIA_SESSION_KEEP_S``, as in the plug-in)."""
        self._tagger = Tagger(
            policy, capacity, KV, idle_release_s, retag, measure_every_s, kv_tokens, policy_settings().session_keep_s
        )
        self.book = self._tagger.book
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since the clock started."""
        return time.monotonic() - self.t0

    def _arriving(self, agent_id: str, now_s: float) -> None:
        """An agent is about to be registered (or tagged for the first time) at ``now_s``."""

    async def register(self, reg: Registration) -> float | None:
        """Register the agent with the clock here; its tag."""
        now = self.now()
        self._arriving(reg.agent_id, now)
        self.book.register(reg, now)
        return self.book.virtual_finish(reg.agent_id)

    async def retire(self, agent_id: str, pause: bool = False) -> None:
        """The agent leaves the clock once none of its requests is out at an engine (``AgentBook.retire``;
        ``pause``: ``AgentBook.pause``)."""
        if pause:
            self.book.pause(agent_id, self.now())
        else:
            self.book.retire(agent_id, self.now())

    async def state(self, detail: bool = False, bound_s: float | None = None) -> PolicyState:
        """The clock here, which orders every engine behind it."""
        return self.book.state(self.now(), detail, bound_s)

    def tag(
        self, request_id: str, xargs: dict | None, prompt_tokens: int, max_tokens: int, stamp: bool = False
    ) -> tuple[RequestInfo, int]:
        """Tag a request on its way to an engine: its info (``finish`` it when the engine is done with
        it) and its key as vLLM's int ``priority``. With ``stamp``, the clock's stamp is also written
        into ``xargs`` (``agent_tag``, and ``agent_rank`` in a tenant) for engines that run ``tagged``."""
        now = self.now()
        self.book.sweep(now)
        meta = RequestMeta.parse(xargs, request_id, log)
        self._arriving(meta.agent_id or request_id, now)  # an agent known only by its requests
        info, priority = self._tagger.tag(request_id, meta, prompt_tokens, max_tokens, now)
        if stamp:
            xargs["agent_tag"], rank = self.book.stamp(info)
            if rank is not None:
                xargs["agent_rank"] = rank
        return info, priority

    def finish(self, request_id: str, produced: int | None = None, cached: int | None = None) -> None:
        """The engine is done with a tagged request (having produced ``produced`` tokens, the first
        ``cached`` of its prompt held by the engine's prefix cache where the engine said)."""
        self._tagger.finish(request_id, self.now(), produced, cached)
