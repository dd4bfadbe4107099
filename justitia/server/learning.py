"""The server's predictor: built once per server, and, for ``online``, learning in the background
and kept across restarts.

``online`` (the default) refits in a worker thread (pricing reads the last fit and never waits for
one) and saves what it learned to ``predictor_state`` (JSON, written atomically) every
``SAVE_EVERY`` finished agents or turns and when the process exits; the next start loads it, so a
restart keeps the deployment's history. A state file that cannot be read is set aside (renamed
``*.bad``) and the predictor starts cold, saying so: a damaged file never stops a server.
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path

from justitia.predictors import ONLINE_PRIOR, Predictor, make_online, make_predictor
from justitia.predictors.online import keep, load_kept
from justitia.server import logs

SAVE_EVERY = 32  # finished agents or turns between two saves of an online predictor's state
log = logging.getLogger("justitia.server")


def is_online(spec: str) -> bool:
    return spec == "online" or spec.startswith("online:")


def server_predictor(spec: str, state_path: str | Path | None = None) -> Predictor:
    """The predictor ``spec`` names, as a server runs it (``online``: in the background, its state at
    ``state_path`` loaded now and saved as it learns; None: not kept)."""
    if not is_online(spec):
        return make_predictor(spec)
    pred = make_online(spec.partition(":")[2] or ONLINE_PRIOR, background=True)  # the bench's cold start too
    if state_path is not None:
        path = Path(state_path)
        logs.event("online_predictor", state=str(path), loaded=load_kept(pred, path))
        atexit.register(keep(pred, path, SAVE_EVERY, log.warning))
    return pred
