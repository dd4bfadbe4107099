"""``justitia serve`` without ``--upstream`` or ``--ray``: vLLM's own OpenAI server, in this process,
with Justitia's scheduler (``justitia.vllm.plugin``) and endpoint plugin (``server.plugin``):
``run`` checks what it can before vLLM's minutes of start-up, then runs ``vllm serve``'s arguments
(``vllm_command``) under the environment that configures the plug-ins (``vllm_environment``)
through vLLM's own entry point (``serve_vllm``)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from justitia.predictors import make_predictor
from justitia.server.settings import ServeSettings


def run(settings: ServeSettings) -> int:
    """Run vLLM's own server with Justitia's scheduler and endpoint plugin until it stops; returns
    its exit status."""
    from justitia.server.keys import KeyRing

    make_predictor(settings.predictor)  # fail before minutes of start-up (online: its prior, trained once)
    KeyRing.load(settings.api_key, settings.api_keys)
    path = settings.journal_path()
    state = settings.predictor_state_path()
    config = {
        "predictor": settings.predictor,
        "predictor_state": None if state is None else str(state),
        "api_keys": settings.api_key or [],
        "api_keys_file": None if settings.api_keys is None else str(settings.api_keys),
        "journal": None if path is None else str(path),
        "limits": settings.limits()
        | {
            "max_tasks_per_agent": settings.max_tasks_per_agent,
            "max_agents_in_flight": settings.max_agents_in_flight,
            "max_body_bytes": settings.max_body_bytes,
        },
    }
    argv = vllm_command(
        settings.model or "tiny",
        settings.host,
        settings.port,
        settings.kv_blocks,
        settings.max_num_seqs,
        settings.max_model_len,
        settings.vllm_args,
    )
    try:
        pricing = None if state is None else state.with_suffix(".pricing.json")  # the plug-in's (vllm/pricer.py)
        return serve_vllm(
            argv, vllm_environment(settings.policy, config, settings.calibration, pricing), settings.header_timeout
        )
    except KeyboardInterrupt:
        return 0


def vllm_command(
    model: str,
    host: str,
    port: int,
    kv_blocks: int | None,
    max_num_seqs: int,
    max_model_len: int,
    passthrough: list[str],
) -> list[str]:
    """The ``vllm serve`` arguments (after ``vllm serve``) that run Justitia: the model, the scheduler
    class, vLLM's priority queue (the plug-in stamps each request's key as its priority), and the
    server options given, then ``passthrough`` (any of vLLM's own options, which win)."""
    from justitia.engine.launch import engine_dtype, has_gpu
    from justitia.engine.models import resolve_model

    given = {a.split("=", 1)[0] for a in passthrough if a.startswith("--")}
    if "--model" in given:
        raise ValueError("--model: give it to justitia serve itself (tiny, tiny-long, smollm2 or a model directory).")
    argv = [
        "--model",
        str(resolve_model(model)),
        "--scheduler-cls",
        "justitia.vllm.plugin.JustitiaScheduler",
        "--scheduling-policy",
        "priority",
    ]
    defaults = {
        "--host": host,
        "--port": str(port),
        "--max-model-len": str(max_model_len),
        "--max-num-seqs": str(max_num_seqs),
        "--dtype": engine_dtype("auto"),
    }
    if kv_blocks is not None:
        defaults["--num-gpu-blocks-override"] = str(kv_blocks)
    if "/" not in model:  # a built-in model answers to its own name, as before
        defaults["--served-model-name"] = model
    if not has_gpu():
        defaults["--enforce-eager"] = None  # no graphs to capture on a CPU; starts sooner
    for flag, value in defaults.items():
        if flag not in given:
            argv += [flag] if value is None else [flag, value]
    return argv + passthrough


def vllm_environment(
    policy: str, serve: dict, calibration: Path | None = None, pricing_state: Path | None = None
) -> dict[str, str]:
    """What configures Justitia inside vLLM's server: the plugin allowed, the scheduler's policy,
    the plugin's settings (``server.plugin.serve_config``), a calibration to start the clock's M
    from (``JUSTITIA_CALIBRATION``), and where the plug-in keeps what its own pricing learned
    (``JUSTITIA_PRICING_STATE``)."""
    from justitia.defaults import ENV_CALIBRATION, ENV_DOOR_TOKEN, ENV_POLICY, ENV_PRICING_STATE, ENV_SERVE, door_token
    from justitia.defaults import env as environ
    from justitia.engine.launch import has_gpu

    plugins = [p for p in environ("VLLM_PLUGINS", "").split(",") if p]
    env = {
        "VLLM_PLUGINS": ",".join(dict.fromkeys(plugins + ["justitia"])),
        ENV_POLICY: policy,
        ENV_SERVE: json.dumps(serve),
    }
    if calibration is not None:
        if not calibration.is_file():
            raise ValueError(f"--calibration: no file at {calibration}.")
        env[ENV_CALIBRATION] = str(calibration.resolve())
    if pricing_state is not None and environ(ENV_PRICING_STATE) is None:
        env[ENV_PRICING_STATE] = str(pricing_state)
    env.setdefault("HF_HUB_OFFLINE", environ("HF_HUB_OFFLINE", "1"))  # the model is a local directory
    env[ENV_DOOR_TOKEN] = door_token() or secrets.token_hex(16)  # justitia.vllm.general
    if environ("VLLM_CPU_KVCACHE_SPACE") is None and not has_gpu():
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB, as the benches' engines (vLLM's own default is 4)
    return env


def serve_vllm(argv: list[str], env: dict[str, str], header_timeout_s: float = 10.0) -> int:
    """Run vLLM's own OpenAI server (``vllm serve``'s entry point) with ``argv`` in this process,
    ``env`` set first; its uvicorn closes a connection whose request headers take longer than
    ``header_timeout_s`` (``limits.http_with_header_timeout``). Returns when it stops."""
    os.environ.update(env)
    import uvloop

    try:  # vLLM 0.32; 0.33 moved the parser to common/
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # pragma: no cover
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="justitia serve", description="vLLM's server options"))
    args = parser.parse_args(argv)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    from justitia.server.limits import http_with_header_timeout

    uvloop.run(run_server(args, http=http_with_header_timeout(header_timeout_s)))
    return 0
