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
import threading
from pathlib import Path

from justitia.predictors import ONLINE_PRIOR, OnlinePredictor, Predictor, make_online, make_predictor
from justitia.predictors.online import load_kept

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
        print(f"justitia: online predictor: {load_kept(pred, path)}", flush=True)
        _keep(pred, path)
    return pred


def _keep(pred: OnlinePredictor, path: Path) -> None:
    """Save every ``SAVE_EVERY`` observations (from the worker thread) and at exit."""
    lock = threading.Lock()
    last = [pred.observations]

    def maybe_save() -> None:
        if pred.observations - last[0] >= SAVE_EVERY and lock.acquire(blocking=False):
            try:
                last[0] = pred.observations
                pred.save(path)
            except OSError as exc:
                log.warning("justitia: online predictor state not saved to %s: %s", path, exc)
            finally:
                lock.release()

    pred.after_learn = maybe_save

    def at_exit() -> None:
        pred.close()
        if pred.observations != last[0] and path.parent.is_dir():  # what was learned since the last save
            try:
                pred.save(path)
            except OSError:
                pass

    atexit.register(at_exit)
