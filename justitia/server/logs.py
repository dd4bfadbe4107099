"""The server's log: one JSON object a line, on stderr, logger ``justitia.server`` (docs/reference.md).

Every event is ``{"event": NAME, ...fields}``; ``event`` writes one, ``setup`` gives the logger its
handler once (``justitia serve`` and the vLLM endpoint plug-in call it when they start; a program
that configured ``justitia.server`` itself keeps its own handlers).
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger("justitia.server")


def setup() -> logging.Logger:
    """The logger, with a handler that writes each message as is on stderr, unless it has one."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def event(name: str, level: int = logging.INFO, **fields) -> None:
    """Log the event ``name`` with ``fields`` as one JSON object."""
    log.log(level, json.dumps({"event": name, **fields}, default=str))
