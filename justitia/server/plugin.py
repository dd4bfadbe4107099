"""Justitia as a vLLM endpoint plugin: ``VLLM_PLUGINS=justitia`` on ``vllm serve``.

With ``--scheduler-cls justitia.vllm.plugin.JustitiaScheduler --scheduling-policy priority`` (the
scheduler, in the engine process) and this plugin (the HTTP side, in the API server process),
vLLM's own server gets what is Justitia's and keeps everything else:

- ``attach_router``: the door (``door.Door``: 413, 401, ``vllm_xargs`` prices, harness identity,
  limits with ``Retry-After``) in front of vLLM's own endpoints, and the agent API
  (``/v1/agents``, ``/v1/sessions``);
- ``init_state``: the agent manager over vLLM's engine client (``local.EngineBackend``), its
  journal reloaded; Justitia's metrics join vLLM's at ``/metrics``.

vLLM's endpoints, request models, validation and error messages are vLLM's, unchanged.

Configuration: the scheduler reads ``JUSTITIA_POLICY`` and the other ``JUSTITIA_*`` variables
(``justitia.defaults``); this plugin reads ``JUSTITIA_SERVE``, a JSON object (``serve_config``):
``predictor`` (default ``online``), ``predictor_state`` (where ``online`` keeps what it learned, or
null), ``api_keys``, ``api_keys_file``, ``journal`` (a path, or false) and ``limits`` (the
``agents.Settings`` fields). ``justitia serve`` sets both; docs/deploy.md has the recipe for a
``vllm serve`` command line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from justitia.defaults import ENV_SERVE, env, policy_settings
from justitia.server import logs

log = logging.getLogger("justitia.server")
SERVE_KEYS = ("predictor", "predictor_state", "api_keys", "api_keys_file", "journal", "limits")


def serve_config(environ=None) -> dict:
    """``JUSTITIA_SERVE`` read and checked (a bad one raises ValueError, naming the key)."""
    raw = env(ENV_SERVE, "{}") if environ is None else environ.get(ENV_SERVE, "{}")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_SERVE}: not JSON ({exc}).") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{ENV_SERVE}: must be a JSON object.")
    unknown = set(doc) - set(SERVE_KEYS)
    if unknown:
        raise ValueError(f"{ENV_SERVE}: unknown key(s) {', '.join(sorted(unknown))}; expected {', '.join(SERVE_KEYS)}.")
    return doc


class JustitiaPlugin:
    """The ``vllm.endpoint_plugins`` entry point ``justitia`` (the module's docstring)."""

    name = "justitia"
    required_tasks = ("generate",)

    def __init__(self):
        from justitia.server.agents import Settings
        from justitia.server.keys import KeyRing
        from justitia.server.learning import server_predictor

        try:
            config = serve_config()
            self.policy = policy_settings().policy
            self.predictor = server_predictor(config.get("predictor", "online"), config.get("predictor_state"))
            self.keys = KeyRing.load(config.get("api_keys"), config.get("api_keys_file"))
            self.journal_path = config.get("journal")
            self.settings = Settings(policy=self.policy, **(config.get("limits") or {}))
        except (ValueError, TypeError) as exc:
            # vLLM skips a plugin whose factory raises an Exception and serves on without it: with a
            # bad key file that would be a server open to everyone. SystemExit stops the server instead.
            raise SystemExit(f"justitia: the endpoint plugin cannot start: {exc}") from None
        self.manager = None  # built in init_state, once the engine is up
        self.policy_state = None  # the policy, as last read for /metrics
        self.journal = None

    def attach_router(self, app) -> None:
        """The door and the agent API on vLLM's app (called inside vLLM's ``build_app``)."""
        from justitia.server.app import add_justitia

        add_justitia(app, self, self.keys, self.settings)

    async def init_state(self, engine_client, state, args) -> None:
        """The agent manager over vLLM's engine client; the journal reloaded; the metrics collector."""
        from transformers import AutoTokenizer

        from justitia.backends.local import EngineBackend
        from justitia.engine.reaper import guard
        from justitia.server.agents import AgentManager
        from justitia.server.journal import Journal
        from justitia.server.metrics import register_collector

        if engine_client is None:
            raise RuntimeError("the justitia plugin needs an engine (not vLLM's render-only server).")
        guard()  # vLLM's engine processes die with this one, even by SIGKILL
        names = args.served_model_name or [args.model]
        tokenizer_dir = Path(args.tokenizer or args.model)
        backend = EngineBackend(engine_client, self.policy, names[0], tokenizer_dir)
        self.settings.model, self.settings.max_model_len = backend.model, backend.max_model_len
        if self.journal_path:
            self.journal = Journal(Path(self.journal_path))
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.manager = AgentManager(backend, tokenizer, self.settings, self.predictor, self.journal)
        register_collector(self)
        if self.journal is not None:
            finished, resumed = await self.manager.recover()
            logs.setup()
            logs.event("journal_reloaded", path=self.journal.path, finished=finished, unfinished=resumed)
        logs.setup()
        logs.event(
            "serving",
            engine=backend.model,
            kv_tokens=backend.kv_tokens,
            policy=self.policy,
            api_keys=len(self.keys) if not self.keys.open else "none: open to every client that can reach it",
        )
