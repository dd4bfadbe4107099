"""Justitia's ``vllm.general_plugins`` entry point: vLLM runs it in each of its processes, first in
the API server's while it reads its arguments, before it starts the engine's.

In vLLM's OpenAI server (``vllm serve``, or its ``api_server`` module) it gives the server one
secret, ``JUSTITIA_DOOR_TOKEN``, unless the environment has one: the API server's process sets it,
and the engine's processes inherit it. Justitia's door (the endpoint plugin) writes it into each
request it has checked, and the scheduler plug-in then reads prices, weights and tenants only from
requests that carry it (``justitia.defaults``): a client that reaches vLLM without passing the door
cannot price its own requests. An engine in a program's own process (``LLM``, ``AsyncLLM``) has no
HTTP clients and gets no token: the plug-in trusts its caller there.
"""

from __future__ import annotations

import os
import secrets
import sys

from justitia.defaults import ENV_DOOR_TOKEN, door_token

SERVER_MODULES = ("vllm.entrypoints.launchers", "vllm.entrypoints.cli", "vllm.entrypoints.openai.api_server")


def register() -> None:
    """Set the door's token for this server's processes (once: the first process sets it), if this
    process is vLLM's OpenAI server."""
    if not door_token() and any(m.startswith(SERVER_MODULES) for m in list(sys.modules)):
        os.environ[ENV_DOOR_TOKEN] = secrets.token_hex(16)
