"""``justitia serve``: serve agents over HTTP on vLLM with the Justitia scheduler. Its options become a
``ServeSettings`` (``justitia.server.settings``: one field per option, checked when made; the ``--ray``
options a ``RaySpec``), which runs vLLM's own server with Justitia's plug-ins (``justitia.server.launch``)
or, with ``--upstream`` or ``--ray``, the front end over those engines (``justitia.gateway.serve``)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path


def add_parser(sub) -> None:
    sv = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="serve agents over HTTP on vLLM with the Justitia scheduler",
        description="vLLM's own OpenAI server with Justitia's scheduler and endpoint plugin; "
        "any other option is vLLM's (vllm serve --help), passed through, e.g. "
        "--enable-auto-tool-choice --tool-call-parser hermes (docs/deploy.md)",
    )
    _engine_args(sv.add_argument_group("the engine and its policy"))
    _client_args(sv.add_argument_group("clients: keys and limits"))
    _kept_args(sv.add_argument_group("what it keeps and reports"))
    _timeout_args(sv.add_argument_group("timeouts"))
    _remote_args(sv.add_argument_group("remote engines (--upstream, --ray)"))


def _engine_args(g) -> None:
    from justitia.predictors import SPEC_HELP
    from justitia.server.settings import SERVE_POLICIES
    from justitia.server.settings import ServeSettings as D

    g.add_argument(
        "--model",
        help="tiny, tiny-long, smollm2 or a model directory (default tiny; with --upstream: the "
        "tokenizer, by default the replicas' model directory)",
    )
    g.add_argument(
        "--policy", default=D.policy, help=f"scheduling policy: {', '.join(SERVE_POLICIES)} (default {D.policy})"
    )
    g.add_argument("--predictor", default=D.predictor, help=f"cost predictor: {SPEC_HELP} (default {D.predictor})")
    g.add_argument("--host", default=D.host)
    g.add_argument("--port", type=int, default=D.port)
    g.add_argument("--kv-blocks", type=int, help="cap the KV cache at this many blocks (default: what memory allows)")
    g.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="a `justitia calibrate` file of this engine: the clock's M starts at what it measured "
        "(default: the formula's guess until the first measured window, about 2 s of busy time)",
    )
    g.add_argument("--max-num-seqs", type=int, default=D.max_num_seqs)
    g.add_argument("--max-model-len", type=int, default=D.max_model_len)


def _client_args(g) -> None:
    from justitia.server.settings import ServeSettings as D

    g.add_argument("--max-tasks-per-agent", type=int, default=D.max_tasks_per_agent)
    g.add_argument("--max-agents-in-flight", type=int, default=D.max_agents_in_flight)
    g.add_argument("--max-body-bytes", type=int, default=D.max_body_bytes)
    g.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="a client key (repeatable; tenant 'default', weight 1); clients send 'Authorization: Bearer KEY'",
    )
    g.add_argument(
        "--api-keys",
        type=Path,
        metavar="FILE",
        help="client keys, one a line: KEY [TENANT WEIGHT] [trusted] [admin] (docs/reference.md)",
    )
    g.add_argument(
        "--key-agents-in-flight", type=int, help="agents in flight per key (default: --max-agents-in-flight)"
    )
    g.add_argument(
        "--key-requests-in-flight",
        type=int,
        default=D.key_requests_in_flight,
        help="inference requests (chat, completions, responses, messages) in flight per key "
        f"(default {D.key_requests_in_flight})",
    )
    g.add_argument(
        "--key-rate",
        type=float,
        default=D.key_rate,
        help=f"requests (agents and completions) per second per key, 0: no limit (default {D.key_rate:g})",
    )
    g.add_argument(
        "--key-burst", type=int, default=D.key_burst, help="the rate limit's burst (default: one second's worth)"
    )
    g.add_argument(
        "--max-requests-in-flight",
        type=int,
        default=D.max_requests_in_flight,
        help=f"inference requests in flight in all; beyond: 503 (default {D.max_requests_in_flight})",
    )
    g.add_argument(
        "--max-streams-per-agent",
        type=int,
        default=D.max_streams_per_agent,
        help=f"open event streams per agent (default {D.max_streams_per_agent})",
    )


def _kept_args(g) -> None:
    from justitia.server.settings import ServeSettings as D

    g.add_argument(
        "--finished-mib",
        type=int,
        default=D.finished_mib,
        help=f"finished agents kept, in MiB of documents (default {D.finished_mib})",
    )
    g.add_argument(
        "--finished-hours",
        type=float,
        default=D.finished_hours,
        help=f"finished agents kept this long (default {D.finished_hours:g})",
    )
    g.add_argument(
        "--metrics-tenants",
        type=int,
        default=D.metrics_tenants,
        help="tenants with /metrics series of their own, the busiest; the rest add up as 'other' "
        f"(default {D.metrics_tenants})",
    )
    g.add_argument(
        "--metrics-window",
        type=float,
        default=D.metrics_window,
        help=f"seconds over which /metrics and the live page give tenants' shares (default {D.metrics_window:g})",
    )
    g.add_argument(
        "--journal",
        type=Path,
        metavar="FILE",
        help="SQLite journal of accepted agents and their outputs (default "
        "~/.local/state/justitia/serve-HOST-PORT.sqlite, or $JUSTITIA_STATE_DIR)",
    )
    g.add_argument("--no-journal", action="store_true", help="keep agents in memory only (a restart loses them)")
    g.add_argument(
        "--predictor-state",
        type=Path,
        metavar="FILE",
        help="--predictor online: where it keeps what it learned from this deployment's finished agents "
        "and turns, reloaded at the next start (default: beside the journal, *.online.json; "
        "none with --no-journal)",
    )


def _timeout_args(g) -> None:
    from justitia.server.settings import ServeSettings as D

    g.add_argument(
        "--upstream-timeout",
        type=float,
        default=D.upstream_timeout,
        metavar="S",
        help="--upstream: seconds a replica may take to send the next bytes of an answer "
        f"(default {D.upstream_timeout:g})",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=D.header_timeout,
        metavar="S",
        help=f"close a connection whose request headers take longer than this (default {D.header_timeout:g})",
    )
    g.add_argument(
        "--drain-s",
        type=float,
        default=D.drain_s,
        help=f"--upstream, --ray: on SIGTERM, wait this long for agents in flight before stopping (default "
        f"{D.drain_s:g}; vLLM's own server stops at once, and the journal resumes its agents)",
    )


def _remote_args(g) -> None:
    from justitia.backends.ray.deployment import RaySpec as R  # the defaults

    g.add_argument(
        "--upstream",
        nargs="+",
        metavar="URL",
        help="front stock vLLM OpenAI servers (started with --scheduling-policy priority) instead of "
        "running an engine here; one clock over all of them, least-loaded routing",
    )
    g.add_argument(
        "--upstream-kv-tokens",
        type=int,
        help="KV cache of each replica in tokens (default: read from the replica's /metrics)",
    )
    g.add_argument(
        "--ray",
        action="store_true",
        help="run --replicas engines (each with the plug-in) as a Ray Serve deployment behind one clock "
        "here (pip install justitia[ray]; docs/deploy.md)",
    )
    g.add_argument("--replicas", type=int, default=R.replicas, help=f"--ray: engine replicas (default {R.replicas})")
    g.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="--ray: join this Ray cluster ('auto', 'ray://HOST:10001') instead of starting a local one",
    )
    g.add_argument(
        "--router",
        default=R.router,
        help=f"--ray: {R.router} (default), affinity (a prompt's first block goes back to the replica "
        "that served it, within a load slack) or round-robin",
    )
    g.add_argument(
        "--ray-replica-cpus",
        type=float,
        default=R.num_cpus,
        help=f"--ray: CPUs Ray reserves per replica (default {R.num_cpus:g})",
    )
    g.add_argument(
        "--ray-replica-gpus",
        type=float,
        default=R.num_gpus,
        help=f"--ray: GPUs per replica (default {R.num_gpus:g}; 1 on GPUs)",
    )


def run(args) -> int:
    from justitia.server.settings import ServeSettings

    ray = None
    if args.ray:
        from justitia.backends.ray.deployment import RaySpec

        ray = RaySpec(args.replicas, args.ray_address, args.router, args.ray_replica_cpus, args.ray_replica_gpus)
    given = {f.name: getattr(args, f.name) for f in fields(ServeSettings) if f.name != "ray"}
    settings = ServeSettings(**given, ray=ray)
    if settings.front_end:
        from justitia.gateway.serve import run
    else:
        from justitia.server.launch import run
    return run(settings)
