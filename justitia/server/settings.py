"""``justitia serve``'s settings: ``ServeSettings``, one field per option, each checked once, when
made. ``server.launch`` runs vLLM's own server with them; ``justitia.gateway.serve``, the front end
over several engines (``--upstream``, ``--ray``); ``justitia.cli.serve`` makes them from the
command line and picks which (``front_end``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from justitia.core import BASELINE_NAMES, POLICY_NAMES, positive_finite

# the paper's seven, justitia behind its lag guard, and the non-clairvoyant baselines (las-turn, las-decay)
SERVE_POLICIES = (*POLICY_NAMES, "justitia-guarded", *BASELINE_NAMES)


@dataclass
class ServeSettings:
    """What ``justitia serve`` runs: one field per option, named as the option (``--max-num-seqs``:
    ``max_num_seqs``; the repeatable ``--api-key``: ``api_key``; ``--api-keys FILE``: ``api_keys``;
    ``--header-timeout`` and ``--upstream-timeout`` in seconds), and ``vllm_args``, vLLM's own options
    passed through; ``ray``, the replicas' ``RaySpec`` (``justitia.backends.ray``: its options check themselves) or
    None. Checked when made: a bad value raises ValueError naming its option."""

    model: str | None = (
        None  # tiny, tiny-long, smollm2 or a model directory (None: tiny; upstream: the replicas' model)
    )
    policy: str = "justitia"
    predictor: str = "online"
    predictor_state: Path | None = None  # None: next to the journal (nothing kept under no_journal)
    host: str = "127.0.0.1"
    port: int = 8000
    kv_blocks: int | None = None  # None: what memory allows
    calibration: Path | None = None  # a `justitia calibrate` file: the clock's M starts at what it measured
    max_num_seqs: int = 256
    max_model_len: int = 2048
    max_tasks_per_agent: int = 256
    max_agents_in_flight: int = 2048
    max_body_bytes: int = 1_000_000
    api_key: list[str] | None = None  # client keys (tenant 'default', weight 1)
    api_keys: Path | None = None  # a file of client keys (server.keys)
    key_agents_in_flight: int | None = None  # None: max_agents_in_flight
    key_requests_in_flight: int = 256
    key_rate: float = 0.0  # per second per key; 0: no limit
    key_burst: int = 0  # 0: one second's worth
    max_requests_in_flight: int = 1024
    max_streams_per_agent: int = 8
    finished_mib: int = 64
    finished_hours: float = 24.0
    metrics_tenants: int = 10  # tenants with /metrics series of their own; the rest: "other"
    metrics_window: float = 300.0  # seconds: the window of the per-tenant shares
    journal: Path | None = None  # None: the default file (journal.default_path), unless no_journal
    no_journal: bool = False
    upstream_timeout: float = 600.0
    header_timeout: float = 10.0
    drain_s: float = 30.0
    upstream: list[str] | None = None  # stock vLLM servers to front
    upstream_kv_tokens: int | None = None  # None: read from each replica's /metrics
    ray: object = None  # a RaySpec: engine replicas on Ray Serve behind one clock here
    vllm_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "max_model_len",
            "max_tasks_per_agent",
            "max_agents_in_flight",
            "max_body_bytes",
            "key_requests_in_flight",
            "max_requests_in_flight",
            "max_streams_per_agent",
            "finished_mib",
            "metrics_tenants",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}.")
        if self.key_agents_in_flight is not None and self.key_agents_in_flight < 1:
            raise ValueError(f"--key-agents-in-flight must be >= 1, got {self.key_agents_in_flight}.")
        for name in ("key_rate", "key_burst", "finished_hours"):
            value = getattr(self, name)
            if not (value >= 0 and value < math.inf):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}.")
        if self.policy not in SERVE_POLICIES:
            raise ValueError(f"--policy: unknown policy '{self.policy}'; expected one of: {', '.join(SERVE_POLICIES)}.")
        if self.upstream_kv_tokens is not None and self.upstream_kv_tokens < 1:
            raise ValueError(f"--upstream-kv-tokens must be >= 1, got {self.upstream_kv_tokens}.")
        if self.no_journal and self.journal:
            raise ValueError("--journal and --no-journal contradict each other.")
        if not (self.drain_s >= 0 and self.drain_s < math.inf):
            raise ValueError(f"--drain-s must be a finite number >= 0, got {self.drain_s}.")
        for name in ("header_timeout", "upstream_timeout", "metrics_window"):
            positive_finite(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.ray is not None and self.upstream:
            raise ValueError("--ray and --upstream contradict each other: replicas run on Ray, or upstream.")
        if self.calibration is not None and self.front_end:
            raise ValueError("--calibration: for the engine justitia serve runs itself; replicas measure their own M.")
        if self.vllm_args and self.upstream:
            raise ValueError(f"{' '.join(self.vllm_args)}: with --upstream, give vLLM's options to the replicas.")

    @property
    def front_end(self) -> bool:
        """Whether it fronts engines elsewhere (``upstream``, ``ray``: ``justitia.gateway``) rather
        than running vLLM's own server here (``server.launch``)."""
        return bool(self.upstream) or self.ray is not None

    def limits(self) -> dict:
        """The per-key limits and what finished agents are kept: fields of the server's ``Settings``."""
        return {
            "key_agents_in_flight": self.key_agents_in_flight,
            "key_requests_in_flight": self.key_requests_in_flight,
            "key_rate": self.key_rate,
            "key_burst": self.key_burst,
            "max_requests_in_flight": self.max_requests_in_flight,
            "max_streams_per_agent": self.max_streams_per_agent,
            "finished_bytes": self.finished_mib << 20,
            "finished_s": self.finished_hours * 3600,
            "metrics_tenants": self.metrics_tenants,
            "metrics_window_s": self.metrics_window,
        }

    def journal_path(self) -> Path | None:
        """The journal's file: None with ``no_journal``, else ``journal`` or the default one of this host and port."""
        if self.no_journal:
            return None
        from justitia.server.journal import default_path

        return self.journal or default_path(self.host, self.port)

    def predictor_state_path(self) -> Path | None:
        """Where ``online`` keeps what it learned: ``predictor_state``, else beside the journal
        (``*.online.json``); None without a journal."""
        if self.predictor_state is not None:
            return self.predictor_state
        journal = self.journal_path()
        return None if journal is None else journal.with_suffix(".online.json")
