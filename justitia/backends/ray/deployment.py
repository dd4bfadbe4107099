"""Starting Justitia's engine replicas on Ray Serve: Ray itself (a local instance, or an existing
cluster), then one deployment of ``EngineReplica``s routed by ``JustitiaRouter``.

Locally Ray keeps every address on loopback and starts no dashboard; Serve's own HTTP proxy is
not started (``NoServer``): the server's app calls the replicas through a deployment handle. A
replica asks Ray for ``num_cpus`` (fractional on a CPU machine, or Ray waits for cores) and
``num_gpus``. Ray restarts a replica whose process dies or whose health check fails. A local Ray's
processes (its raylet, agents and replicas) die with the server, even by SIGKILL (``reaper.guard``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

APP_NAME = "justitia"
DEPLOYMENT_NAME = "EngineReplica"


@dataclass(frozen=True)
class RaySpec:
    """How to run the replicas on Ray."""

    replicas: int = 2
    address: str | None = None  # None: start a local Ray instance; else join this cluster ("auto", "ray://...")
    router: str = "least-load"  # core.routing.ROUTER_NAMES
    num_cpus: float = 0.5  # per replica
    num_gpus: float = 0.0  # per replica (1 on a GPU cluster)
    health_check_s: float = 2.0

    def __post_init__(self) -> None:
        from justitia.core import ROUTER_NAMES

        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}.")
        if self.router not in ROUTER_NAMES:
            raise ValueError(f"--router: unknown router '{self.router}'; expected one of: {', '.join(ROUTER_NAMES)}.")
        if not (self.num_cpus >= 0 and self.num_gpus >= 0):
            raise ValueError("--ray-replica-cpus and --ray-replica-gpus must be >= 0.")


def start_ray(address: str | None) -> None:
    """Join the Ray cluster at ``address``, or start a local one on loopback (no dashboard)."""
    import ray

    if ray.is_initialized():
        return
    quiet = dict(logging_level=logging.WARNING, log_to_driver=False)
    if address is None:
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)


def deploy(ray_spec: RaySpec, engine_spec: dict, plugin_env: dict, vllm_argv: list[str] | None = None):
    """Start Serve (no HTTP proxy) and the replicas; the deployment's handle."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from justitia.backends.ray.replica import EngineReplica
    from justitia.backends.ray.router import JustitiaRouter

    start_ray(ray_spec.address)
    serve.start(http_options={"location": "NoServer"})
    kv_tokens = max(1, ((engine_spec.get("kv_blocks") or 2) - 1) * 128)  # until the replicas report theirs
    deployment = serve.deployment(
        EngineReplica,
        name=DEPLOYMENT_NAME,
        num_replicas=ray_spec.replicas,
        max_ongoing_requests=1_000_000,  # the engine's own queue waits, in the plug-in's order
        max_queued_requests=-1,
        health_check_period_s=ray_spec.health_check_s,
        health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=5.0,
        ray_actor_options={"num_cpus": ray_spec.num_cpus, "num_gpus": ray_spec.num_gpus},
        request_router_config=RequestRouterConfig(
            request_router_class=JustitiaRouter,
            request_router_kwargs={"router": ray_spec.router, "kv_tokens": kv_tokens},
            request_routing_stats_period_s=2.0,
        ),
    )
    handle = serve.run(
        deployment.bind(engine_spec, plugin_env, list(vllm_argv or [])), name=APP_NAME, route_prefix=None
    )
    if ray_spec.address is None:  # a local Ray's processes die with this one, even by SIGKILL
        from justitia.engine.reaper import guard

        guard()
    return handle


def shutdown(local: bool) -> None:
    """Delete the application; a local Ray instance is stopped too."""
    import ray
    from ray import serve

    try:
        serve.delete(APP_NAME)
        if local:
            serve.shutdown()
    finally:
        if local:
            ray.shutdown()
