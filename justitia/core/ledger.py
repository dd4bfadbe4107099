"""``Ledger``: what an engine's book saw of each tenant, for the server's figures (docs/design.md,
"What the server shows").

The book (``AgentBook``) tells it when a burst (an agent, or a session's burst: its turn) starts,
when its requests finish, and when it ends (released, or paused between turns) with the service
the core charged it. Per tenant (an agent without one is its own, ``-``) it keeps the service
settled by bursts that ended, how many bursts ended and how long each took (its first request's
arrival to its last one's finish, in ``BURST_BUCKETS``; a session's burst is a turn, an agent's its
run), and how many ended past the bound the server last gave (``bound_s``) by ``lateness``: how
far the burst is past its GPS finish. While GPS still serves it that is ``(V(now) - f) * N_t / M``
seconds (negative); once a reading finds ``V >= f``, GPS finished it at about ``now - (V - f) *
N_t / M``, and that time is kept: from then on the lateness is the time since (so it grows while
GPS is idle, when V stands still). The server's readings (``state(..., detail=True)``, at most once
a second while ``/metrics`` or the live page is read) are what find it, so a burst that ends
unread between its GPS finish and its own finish is judged by the first formula alone. Per tenant
it also keeps the prefix cache as the engine showed it: the prompt tokens of its finished requests
whose cache lookup the engine reported, and how many of those the cache held (``cached``). Per
agent type (``MAX_TYPES`` of them, then ``other``: a type is a client's word) it keeps how far each
price was off, ``log2(attained / predicted)``, in ``ERROR_BUCKETS``.

Nothing here orders anything: it is read, never consulted by a policy. Memory is one entry per
tenant, and the tenants are the key file's (or each agent alone on a server without keys: then
``MAX_TENANTS`` bound it, the rest counted as ``other``).
"""

from __future__ import annotations

import math

BURST_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, float("inf"))  # seconds
MAX_TENANTS = 1024  # tenants with entries of their own; later ones are counted as "other"
MAX_TYPES = 64  # agent types with a price-error histogram of their own; later ones are "other"
ERROR_BUCKETS = (-4, -3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, 4, float("inf"))  # log2(attained / predicted)
KINDS = ("turn", "agent")
NO_TENANT = "-"
OTHER = "other"


def lateness_s(
    virtual_finish: float | None, virtual_time: float | None, active: int | None, capacity_per_s: float | None
) -> float | None:
    """How far past its GPS finish the clock puts an agent with tag ``virtual_finish`` now, in
    seconds (negative: GPS would still serve it); None without a clock."""
    if virtual_finish is None or virtual_time is None or not capacity_per_s:
        return None
    return (virtual_time - virtual_finish) * max(active or 0, 1) / capacity_per_s


def _bucket(bounds: tuple, value: float) -> int:
    return next(k for k, b in enumerate(bounds) if value <= b)


class _Tenant:
    __slots__ = (
        "service",
        "bursts",
        "burst_s",
        "burst_sum_s",
        "violations",
        "weight",
        "prompt_tokens",
        "cached_tokens",
    )

    def __init__(self):
        self.service = 0.0  # settled by bursts that ended
        self.bursts = {kind: 0 for kind in KINDS}
        self.burst_s = {kind: [0] * len(BURST_BUCKETS) for kind in KINDS}
        self.burst_sum_s = {kind: 0.0 for kind in KINDS}
        self.violations = 0
        self.weight = 1.0  # the weight its last burst had
        self.prompt_tokens = 0  # prompt tokens of finished requests whose prefix-cache lookup was reported
        self.cached_tokens = 0  # of which the prefix cache held


class Ledger:
    """Per-tenant service, burst times and bound violations (the module's docstring)."""

    def __init__(self):
        self._tenants: dict[str, _Tenant] = {}
        self._errors: dict[str, list] = {}  # agent type -> [counts per ERROR_BUCKETS, sum]
        self._started: dict[str, float] = {}  # agent id -> its burst's first arrival
        self._last: dict[str, float] = {}  # agent id -> its burst's last finish
        self._reached: dict[str, float] = {}  # agent id -> when GPS finished its burst, as first read
        self._credit: dict[str, float] = {}  # agent id -> service of its finished requests, where no engine charges it
        self.bound_s = math.inf  # the bound the server last gave: bursts past it are violations

    def tenant(self, name: str | None) -> str:
        """The entry a tenant's figures go to."""
        name = name or NO_TENANT
        return name if name in self._tenants or len(self._tenants) < MAX_TENANTS else OTHER

    def _entry(self, name: str | None) -> _Tenant:
        key = self.tenant(name)
        entry = self._tenants.get(key)
        if entry is None:
            entry = self._tenants[key] = _Tenant()
        return entry

    def started(self, agent_id: str, now_s: float) -> None:
        """A burst begins (an agent arrives, a session returns)."""
        self._started[agent_id] = now_s
        self._last.pop(agent_id, None)
        self._reached.pop(agent_id, None)
        self._credit.pop(agent_id, None)

    def credit(self, agent_id: str, service: float) -> None:
        """A finished request's service, for a book whose engine charges none (a front end that tags
        requests for engines elsewhere: it sees each request's tokens when it comes back)."""
        self._credit[agent_id] = self._credit.get(agent_id, 0.0) + service

    def credited(self, agent_id: str) -> float:
        """What ``credit`` gave the agent's burst so far."""
        return self._credit.get(agent_id, 0.0)

    def lateness(
        self,
        agent_id: str,
        virtual_finish: float | None,
        virtual_time: float | None,
        active: int | None,
        capacity_per_s: float | None,
        now_s: float,
    ) -> float | None:
        """How far past its GPS finish the burst is now, in seconds (the module's docstring); None
        without a clock."""
        estimate = lateness_s(virtual_finish, virtual_time, active, capacity_per_s)
        if estimate is None:
            return None
        reached = self._reached.get(agent_id)
        if reached is None and estimate >= 0:
            reached = self._reached[agent_id] = now_s - estimate
        return estimate if reached is None else now_s - reached

    def finished(self, agent_id: str, now_s: float) -> None:
        """One of the burst's requests finished."""
        self._last[agent_id] = now_s

    def cached(self, tenant: str | None, prompt_tokens: int, cached_tokens: int) -> None:
        """A finished request of ``tenant`` whose first ``cached_tokens`` of ``prompt_tokens`` the
        prefix cache held when the engine first scheduled it."""
        entry = self._entry(tenant)
        prompt = max(0, int(prompt_tokens))
        entry.prompt_tokens += prompt
        entry.cached_tokens += min(max(0, int(cached_tokens)), prompt)

    def ended(
        self,
        agent_id: str,
        tenant: str | None,
        attained: float,
        late_s: float | None,
        now_s: float,
        session: bool = False,
        agent_type: str = "",
        predicted: float = 0.0,
        weight: float = 1.0,
    ) -> None:
        """The burst ended (released or paused) with ``attained`` service and the clock's
        ``late_s`` estimate; a session's (a turn) or an agent's, of ``agent_type``, priced
        ``predicted``."""
        attained += self._credit.pop(agent_id, 0.0)
        entry = self._entry(tenant)
        entry.service += attained
        entry.weight = weight
        start = self._started.pop(agent_id, None)
        last = self._last.pop(agent_id, None)
        self._reached.pop(agent_id, None)
        if start is None or last is None:  # registered ahead and never sent a request: nothing ran
            return
        kind = KINDS[0] if session else KINDS[1]
        took = max(0.0, last - start)
        entry.bursts[kind] += 1
        entry.burst_s[kind][_bucket(BURST_BUCKETS, took)] += 1
        entry.burst_sum_s[kind] += took
        if late_s is not None and late_s > self.bound_s:
            entry.violations += 1
        if attained > 0 and predicted > 0:
            label = agent_type if agent_type in self._errors or len(self._errors) < MAX_TYPES else OTHER
            errors = self._errors.setdefault(label, [[0] * len(ERROR_BUCKETS), 0.0])
            error = math.log2(attained / predicted)
            errors[0][_bucket(ERROR_BUCKETS, error)] += 1
            errors[1] += error

    def doc(self) -> dict[str, dict]:
        """Every tenant's settled figures, as plain JSON."""
        return {
            name: {
                "service": t.service,
                "bursts": dict(t.bursts),
                "burst_buckets": {k: list(v) for k, v in t.burst_s.items()},
                "burst_sum_s": dict(t.burst_sum_s),
                "violations": t.violations,
                "weight": t.weight,
                "prompt_tokens": t.prompt_tokens,
                "cached_tokens": t.cached_tokens,
            }
            for name, t in self._tenants.items()
        }

    def errors(self) -> dict[str, list]:
        """Per agent type: ``[counts per ERROR_BUCKETS, sum of log2(attained / predicted)]``."""
        return {name: [list(counts), total] for name, (counts, total) in self._errors.items()}
