"""``Watch``: the engine's per-tenant state, read at most once a second and kept for a window, for
``/metrics``, the live page (``/justitia``), its JSON (``/justitia/state``) and ``justitia top``
(docs/design.md, "What the server shows").

Each reading is the policy's state with detail (``Backend.state(detail=True)``: the engine's
``AgentBook.state``, its ``core.ledger.Ledger`` included). From the readings of the last
``window_s``:

- a tenant's **share**: its service attained in the window over everyone's (until the readings
  cover a whole window, since the engine started);
- its **fair share**: its weight over the weights of the tenants backlogged (requests open) at a
  reading, averaged over the readings at which it was backlogged;
- the **bound** the engine judges bursts by: ``2 c_max + C_max / M``, ``c_max`` the longest a
  request the server admits can hold memory (``max_model_len`` steps at the nominal iteration
  time, the theorem's constant read as the worst case), ``C_max`` the largest price in flight.

Only the ``top`` tenants with the most service attained have series of their own in ``/metrics``;
the rest add up as ``other``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque

from justitia.backends.base import histogram_samples, label, metric_lines
from justitia.core import BURST_BUCKETS, ERROR_BUCKETS, PolicyState
from justitia.defaults import ITERATION_S

OTHER = "other"


class Watch:
    """The engine's state over a window (the module's docstring)."""

    def __init__(
        self, backend, model: str, max_model_len: int, window_s: float = 300.0, top: int = 10, every_s: float = 1.0
    ):
        self.backend, self.model, self.top = backend, model, top
        self.window_s, self.every_s = window_s, every_s
        self.c_max_s = max_model_len * ITERATION_S
        self._readings: deque[tuple[float, PolicyState]] = deque()
        self._read_at = -math.inf
        self._lock = asyncio.Lock()

    async def read(self) -> PolicyState:
        """The state now, or as read less than ``every_s`` ago."""
        async with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.every_s or not self._readings:
                state = await self.backend.state(detail=True, bound_s=self._bound(self.last))
                self._readings.append((now, state))
                self._read_at = now
                while len(self._readings) > 2 and self._readings[1][0] < now - self.window_s:
                    self._readings.popleft()
            return self._readings[-1][1]

    @property
    def last(self) -> PolicyState | None:
        return self._readings[-1][1] if self._readings else None

    def _bound(self, state: PolicyState | None) -> float | None:
        if state is None or not state.tenants or not state.capacity_per_s:
            return None
        price = max((t.get("price_max", 0.0) for t in state.tenants.values()), default=0.0)
        return 2 * self.c_max_s + price / state.capacity_per_s

    # ---------------------------------------------------------------------------- figures
    def tenants(self) -> list[dict]:
        """Every tenant's figures now and over the window, the most service in the window first."""
        if not self._readings:
            return []
        (t0, first), (t1, last) = self._readings[0], self._readings[-1]
        bound = self._bound(last)
        fair: dict[str, list[float]] = {}
        for _, state in self._readings:
            backlogged = {name: t.get("weight", 1.0) for name, t in (state.tenants or {}).items() if t.get("requests")}
            total = sum(backlogged.values())
            for name, weight in backlogged.items():
                fair.setdefault(name, []).append(weight / total)
        # the window's start: the oldest reading once the readings cover the window; until then (a
        # young server, or one nobody read before), the engine's start, when every total was 0
        before = (first.tenants or {}) if t0 <= t1 - self.window_s else {}
        served = {
            name: max(0.0, t["service"] - before.get(name, {}).get("service", 0.0))
            for name, t in (last.tenants or {}).items()
        }
        everyone = sum(served.values())
        rows = []
        for name, t in (last.tenants or {}).items():
            late = t.get("late_s")
            rows.append(
                {
                    "tenant": name,
                    "weight": t.get("weight"),
                    "service": t["service"],
                    "service_window": served[name],
                    "share": served[name] / everyone if everyone > 0 else None,
                    "fair_share": sum(fair[name]) / len(fair[name]) if name in fair else None,
                    "waiting": t.get("waiting", 0),
                    "requests": t.get("requests", 0),
                    "agents": t.get("agents", 0),
                    "sessions": t.get("sessions", 0),
                    "late_s": late,
                    "margin_s": None if late is None or bound is None else bound - late,
                    "violations": t.get("violations", 0),
                    "bursts": t.get("bursts", {}),
                    "prompt_tokens": t.get("prompt_tokens", 0),
                    "cached_tokens": t.get("cached_tokens", 0),
                    "cache_hit_rate": t["cached_tokens"] / t["prompt_tokens"] if t.get("prompt_tokens") else None,
                    "burst_buckets": t.get("burst_buckets", {}),
                    "burst_sum_s": t.get("burst_sum_s", {}),
                }
            )
        rows.sort(key=lambda r: (-r["service_window"], -r["service"], r["tenant"]))
        return rows

    def doc(self, client=None) -> dict:
        """The live page's JSON: every tenant for an admin key or an open server, else the key's own."""
        state = self.last
        every = self.tenants()
        rows, head = every, list((state.head if state is not None else None) or [])
        if client is not None and not getattr(client, "admin", False) and client.tenant is not None:
            rows = [r for r in rows if r["tenant"] == client.tenant]
            head = [a for a in head if a.get("tenant") == client.tenant]
        return {
            "model": self.model,
            "policy": None if state is None else state.policy,
            "clock": None
            if state is None or not state.has_clock
            else {
                "virtual_time": state.virtual_time,
                "active": state.gps_active,
                "capacity_per_s": state.capacity_per_s,
            },
            "window_s": self.window_s,
            "bound_s": self._bound(state),
            "violations": sum(r["violations"] for r in every),  # everyone's, as /metrics gives them
            "tenants": [{k: v for k, v in r.items() if k not in ("burst_buckets", "burst_sum_s")} for r in rows],
            "head": head,
        }

    # ---------------------------------------------------------------------------- /metrics
    def metric_lines(self) -> list[str]:
        """Per-tenant series (the ``top`` busiest by name, the rest as ``other``), the bound, the
        violations, and the price errors per type."""
        rows = self.tenants()
        named = sorted(rows, key=lambda r: -r["service"])[: self.top]
        names = {r["tenant"] for r in named}
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(r["tenant"] if r["tenant"] in names else OTHER, []).append(r)
        model = label(self.model)
        return [
            *_tenant_series(groups, model),
            *_tenant_histograms(groups, model),
            *_totals(rows, model),
            *self._bound_and_errors(model),
        ]

    def _bound_and_errors(self, model: str) -> list[str]:
        """The bound bursts are judged by (when the policy keeps a clock), and the price errors."""
        state = self.last
        bound = self._bound(state)
        lines = []
        if bound is not None:
            lines += metric_lines(
                "bound_seconds",
                "gauge",
                "The delay bound bursts are judged by: 2 c_max + C_max / M.",
                f'justitia_bound_seconds{{model_name="{model}"}} {bound:.6g}',
            )
        errors = (state.errors if state is not None else None) or {}
        lines += metric_lines(
            "price_error_log2",
            "histogram",
            "How far each burst's price was off: log2(attained / predicted), by agent type.",
        )
        for agent_type, (counts, total) in sorted(errors.items()):
            lines += histogram_samples(
                "justitia_price_error_log2",
                f'model_name="{model}",type="{label(agent_type)}"',
                ERROR_BUCKETS,
                counts,
                total,
            )
        return lines


def _first(values: list) -> float:
    return values[0]


# Each tenant's series, in the order /metrics gives them: (metric, type, help, the row field it
# reads, how a group's rows combine, named tenants only)
TENANT_SERIES = (
    (
        "tenant_service_total",
        "counter",
        "Service attained by the tenant's agents, in the cost model's unit (KV token-iterations under kv).",
        "service",
        sum,
        False,
    ),
    ("tenant_service_share", "gauge", "The tenant's part of all service attained in the window.", "share", sum, False),
    (
        "tenant_fair_share",
        "gauge",
        "The tenant's weighted share while backlogged: its weight over the backlogged tenants', averaged "
        "over the window.",
        "fair_share",
        sum,
        False,
    ),
    ("tenant_weight", "gauge", "The tenant's weight.", "weight", _first, True),
    ("tenant_requests_waiting", "gauge", "The tenant's requests waiting in the engine's queue.", "waiting", sum, False),
    ("tenant_agents_in_flight", "gauge", "The tenant's agents the engine holds.", "agents", sum, False),
    ("tenant_sessions_in_flight", "gauge", "The tenant's sessions the engine holds.", "sessions", sum, False),
    (
        "tenant_lateness_seconds",
        "gauge",
        "The clock's estimate of how far the tenant's latest agent in flight is past its GPS finish (negative: ahead).",
        "late_s",
        max,
        False,
    ),
    (
        "tenant_bound_margin_seconds",
        "gauge",
        "The delay bound less the tenant's lateness: below 0, an agent is past the bound.",
        "margin_s",
        min,
        False,
    ),
    (
        "tenant_bound_violations_total",
        "counter",
        "The tenant's bursts that ended past their GPS finish by more than the bound.",
        "violations",
        sum,
        False,
    ),
    (
        "tenant_prefix_cache_queries_total",
        "counter",
        "Prompt tokens of the tenant's finished requests whose prefix-cache lookup the engine reported.",
        "prompt_tokens",
        sum,
        False,
    ),
    (
        "tenant_prefix_cache_hits_total",
        "counter",
        "Of those, the tokens vLLM's prefix cache held when the request was first scheduled.",
        "cached_tokens",
        sum,
        False,
    ),
)
TENANT_HISTOGRAMS = (
    ("turn", "Completion time of sessions' turns, by tenant."),
    ("agent", "Completion time of agents (not sessions), by tenant."),
)


def _tag(model: str, name: str) -> str:
    return f'model_name="{model}",tenant="{label(name)}"'


def _tenant_series(groups: dict[str, list[dict]], model: str) -> list[str]:
    """``TENANT_SERIES``, one sample a tenant group (a group's rows combined)."""
    lines = []
    for metric, kind, help_text, field, combine, named_only in TENANT_SERIES:
        samples = []
        for name, group in sorted(groups.items()):
            values = [r[field] for r in group if r[field] is not None]
            if values and not (named_only and name == OTHER):
                samples.append(f"justitia_{metric}{{{_tag(model, name)}}} {combine(values):.6g}")
        lines += metric_lines(metric, kind, help_text, *samples)
    return lines


def _tenant_histograms(groups: dict[str, list[dict]], model: str) -> list[str]:
    """Turn and agent completion times, a histogram per tenant group."""
    lines = []
    for kind, help_text in TENANT_HISTOGRAMS:
        samples = []
        for name, group in sorted(groups.items()):
            counts = [
                sum(r["burst_buckets"].get(kind, [0] * len(BURST_BUCKETS))[k] for r in group)
                for k in range(len(BURST_BUCKETS))
            ]
            total = sum(r["burst_sum_s"].get(kind, 0.0) for r in group)
            samples += histogram_samples(
                f"justitia_tenant_{kind}_seconds", _tag(model, name), BURST_BUCKETS, counts, total
            )
        lines += metric_lines(f"tenant_{kind}_seconds", "histogram", help_text, *samples)
    return lines


def _totals(rows: list[dict], model: str) -> list[str]:
    """The bound's violations and the prefix cache's queries and hits over every tenant."""
    tag = f'model_name="{model}"'
    return [
        *metric_lines(
            "bound_violations_total",
            "counter",
            "Bursts that ended past their GPS finish by more than the bound.",
            f"justitia_bound_violations_total{{{tag}}} {sum(r['violations'] for r in rows)}",
        ),
        *metric_lines(
            "prefix_cache_queries_total",
            "counter",
            "Prompt tokens of finished requests whose prefix-cache lookup the engine reported (Justitia's "
            "requests; vLLM's own vllm:prefix_cache_queries counts every lookup).",
            f"justitia_prefix_cache_queries_total{{{tag}}} {sum(r['prompt_tokens'] for r in rows)}",
        ),
        *metric_lines(
            "prefix_cache_hits_total",
            "counter",
            "Of those, the tokens vLLM's prefix cache held when each request was first scheduled.",
            f"justitia_prefix_cache_hits_total{{{tag}}} {sum(r['cached_tokens'] for r in rows)}",
        ),
    ]
