"""``online``: prices learned from the deployment's own traffic, as distributions.

What a server sees when an agent arrives (its type, tenant, first-stage prompts and their tokens,
its fan-out) or a session's turn starts (the turn's index, its first call's prompt tokens, what the
session's earlier turns cost) is turned into a small feature vector ``x``; the price is the
distribution of ``log C`` given ``x``:

    log C = beta . x + e,      e ~ the residuals of the last fit (``ATOMS`` equal-weight quantiles)

``x`` starts with 1 and the log of a *prior* price: for agents, the first stage's prompts priced
with short answers (``online``), or a predictor trained on the committed profile kept within
``PRIOR_RANGE`` of that (``online:KIND``, e.g. ``online:mlp``: the paper's per-type TF-IDF + MLP);
for turns, the ``session`` heuristic (its own earlier turns, grown by its type's ratio). With no
history, ``beta`` is the prior itself (``log C = log prior + offset``) and the spread a wide
default; as agents and turns finish (``learn``), a ridge regression pulled toward that prior is
refitted on the last ``WINDOW`` of them, per (kind, tenant, type):

    beta = argmin |X beta - y|^2 + RIDGE |beta - beta_0|^2,   beta_0 = (offset, 1, 0, ...)

While bursts of a type are still running past their prices (``progress``: what their answered
calls cost so far), the upper half of the type's next distributions moves up by their mean excess.

A tenant's traffic moves only its own prices (clients are untrusted); the models kept are bounded
(``MAX_MODELS``, and ``MAX_MODELS_PER_TENANT`` of one tenant, least recently used out; ``WINDOW``
observations each), so memory is too, and a client that invents type names evicts only its own
tenant's models.
Refits happen every ``REFIT_EVERY`` observations of a model: inline (the simulator: deterministic,
and only on what finished earlier in the run), or in a background thread (``background=True``,
the server: pricing reads the last fitted coefficients and never waits for a fit). What was learned
is saved and loaded as JSON (``state``/``load_state``, ``save``/``load``), so a restart keeps it.

The point price ``agent_cost`` / ``turn_cost`` is the distribution's Gittins index at zero
(``core.gittins``), which is what Justitia tags a burst with; the engine reprices it as service
is attained.

The file is longer than the house's 400 lines: the three burst kinds (agents, turns, the engine's
bursts) share one model store, one fit and one saved state, and the background refits read and
write that store under one lock; apart, each would reach into the others' state.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np

from justitia.core import CostDist, CostModel
from justitia.predictors.base import Predictor
from justitia.predictors.session import SessionPredictor
from justitia.workload import Agent

SCHEMA = "justitia.online/1"
WINDOW = 256  # observations kept per model (the newest)
REFIT_EVERY = 4  # observations between two refits of a model
MIN_FIT = 6  # observations before a model's own regression replaces the prior plus offset
RIDGE = 2.0  # the pull toward the prior's coefficients
ATOMS = 8  # quantiles of the residuals a price's distribution has
PRIOR_SPREAD = 1.0  # the residuals' deviation (log units) assumed before any was seen
MAX_MODELS = 4096  # (kind, tenant, type) models kept, least recently used dropped
MAX_MODELS_PER_TENANT = 512  # of them, one tenant's: past it, that tenant's own least recently used go
RUNNING_PER_MODEL = 64  # bursts priced and not yet learned tracked per model (the newest)
PRIOR_OUTPUT_TOKENS = 32  # the answer length a prompt is priced with when no prior says more
PRIOR_RANGE = math.exp(4.0)  # how far a prior may stray from that, either way
PRIOR_WEIGHT = 1.0  # pseudo-observations of the tenant's pooled offset and the default spread, in a type's cold start
OFFSET_WEIGHT = 0.2  # the newest observation's weight in a (kind, tenant)'s offset from its prior
_Z = [-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341]
# ^ standard normal quantiles at (k + 0.5) / 8: the default spread's atoms


class _Model:
    """One (kind, tenant, type)'s window of observations and its last fit."""

    __slots__ = ("xs", "ys", "beta", "residuals", "pending", "prior_resid")

    def __init__(self) -> None:
        self.xs: deque = deque(maxlen=WINDOW)
        self.ys: deque = deque(maxlen=WINDOW)
        self.beta: tuple[float, ...] | None = None  # None: the prior plus its offset
        self.residuals: tuple[float, ...] = ()  # ATOMS quantiles of the last fit's residuals
        self.pending = 0  # observations since the last fit
        self.prior_resid: deque = deque(maxlen=WINDOW)  # log(actual / prior) of its observations


class _Running:
    """A (kind, tenant, type)'s bursts priced and not yet learned: each one's log price (its
    distribution's center) and how far its cost so far runs past it, summed."""

    __slots__ = ("entries", "excess")

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, list] = OrderedDict()  # ident -> [mu, excess, its features as priced]
        self.excess = 0.0

    def start(self, ident: tuple, mu: float, x: list[float]) -> None:
        if ident in self.entries:
            return
        self.entries[ident] = [mu, 0.0, x]
        while len(self.entries) > RUNNING_PER_MODEL:  # bursts never learned (cancelled) age out
            _, (_, old, _) = self.entries.popitem(last=False)
            self.excess -= old

    def progress(self, ident: tuple, log_so_far: float) -> None:
        entry = self.entries.get(ident)
        if entry is not None:
            new = max(0.0, log_so_far - entry[0])
            self.excess += new - entry[1]
            entry[1] = new

    def finish(self, ident: tuple) -> list[float] | None:
        """The burst is learned: it leaves; its features as they were when it was priced."""
        entry = self.entries.pop(ident, None)
        if entry is None:
            return None
        self.excess -= entry[1]
        return entry[2]

    def lift(self) -> float:
        """The mean excess over the bursts running (and one pseudo-burst that runs at its price)."""
        return self.excess / (len(self.entries) + PRIOR_WEIGHT) if self.excess > 1e-9 else 0.0


class _Lru:
    """(kind, tenant, type) -> its entry, the least recently used first: at most ``MAX_MODELS`` in
    all and ``MAX_MODELS_PER_TENANT`` of one tenant (past its share, a tenant loses its own least
    recently used first)."""

    def __init__(self) -> None:
        self._all: OrderedDict[tuple[str, str, str], object] = OrderedDict()
        self._of: dict[str, OrderedDict] = {}  # tenant -> its keys, least recently used first

    def __len__(self) -> int:
        return len(self._all)

    def __getitem__(self, key):
        return self._all[key]

    def get(self, key):
        return self._all.get(key)

    def items(self):
        return self._all.items()

    def values(self):
        return self._all.values()

    def touch(self, key) -> None:
        """``key`` was used now."""
        self._all.move_to_end(key)
        self._of[key[1]].move_to_end(key)

    def put(self, key, value) -> None:
        """A new entry (or ``key``'s replaced, used now); then the tenant's least recently used go
        past its share, and anyone's past ``MAX_MODELS``."""
        mine = self._of.setdefault(key[1], OrderedDict())
        self._all[key] = value
        mine[key] = None
        self.touch(key)
        while len(mine) > MAX_MODELS_PER_TENANT:
            self._all.pop(mine.popitem(last=False)[0])
        while len(self._all) > MAX_MODELS:
            old, _ = self._all.popitem(last=False)
            self._drop(old)

    def _drop(self, key) -> None:
        mine = self._of[key[1]]
        del mine[key]
        if not mine:
            del self._of[key[1]]


def _fit(xs: list[list[float]], ys: list[float], offset: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Ridge toward (offset, 1, 0, ...): the coefficients and the residuals' ``ATOMS`` quantiles."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    k = x.shape[1]
    beta0 = np.zeros(k)
    beta0[0], beta0[1] = offset, 1.0
    a = x.T @ x + RIDGE * np.eye(k)
    b = x.T @ y + RIDGE * beta0
    beta = np.linalg.solve(a, b)
    res = y - x @ beta
    # leave-one-out residuals (the hat matrix's diagonal): in-sample ones would understate the spread
    h = np.einsum("ij,jk,ik->i", x, np.linalg.inv(a), x)
    res = res / np.maximum(1.0 - h, 0.05)
    qs = np.quantile(res, (np.arange(ATOMS) + 0.5) / ATOMS)
    return tuple(float(v) for v in beta), tuple(float(v) for v in qs)


class OnlinePredictor(Predictor):
    """Prices learned online from finished agents and turns (the module's docstring)."""

    name = "online"

    def __init__(self, prior: Predictor | None = None, background: bool = False, prior_name: str = "none"):
        self.prior = prior
        self.prior_name = prior_name
        self.session = SessionPredictor()  # the turns' prior, and a session call's cost
        self._models = _Lru()  # (kind, tenant, type) -> _Model
        self._offsets: dict[tuple[str, str], list[float]] = {}  # (kind, tenant) -> [offset, residuals seen]
        self._running = _Lru()  # (kind, tenant, type) -> _Running: bursts priced, not yet learned
        self._lock = threading.Lock()
        self.observations = 0
        self.observations_loaded = 0  # of them, those a saved state brought back
        self.refits = 0
        self.after_learn = None  # called (in the learning thread) after each observation: a server saves
        self._queue: queue.SimpleQueue | None = None
        self._worker: threading.Thread | None = None
        if background:
            self._queue = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._work, name="justitia-online-refit", daemon=True)
            self._worker.start()

    # ------------------------------------------------------------------------------ features
    def _agent_features(self, agent: Agent, model: CostModel) -> list[float]:
        first = agent.stages[0]
        prior = self._agent_prior(agent, model)
        return [1.0, math.log(max(prior, 1.0)), math.log1p(sum(t.prompt_tokens for t in first)), math.log1p(len(first))]

    def _agent_prior(self, agent: Agent, model: CostModel) -> float:
        """The prior's price, kept within ``PRIOR_RANGE`` of what the first stage's prompts alone
        would cost with short answers: a model trained elsewhere can extrapolate wildly on text it
        never saw (the committed ``mlp`` prices some agents at e^60)."""
        first = agent.stages[0]
        lengths = max(1.0, sum(model.request_cost(t.prompt_tokens, PRIOR_OUTPUT_TOKENS) for t in first))
        if self.prior is None:
            return lengths
        price = float(self.prior.agent_cost(agent, model))
        if not math.isfinite(price):
            return lengths
        return min(max(price, lengths / PRIOR_RANGE), lengths * PRIOR_RANGE)

    def _turn_features(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> list[float]:
        prior = self.session.turn_cost(agent, turn, earlier, model)
        calls = agent.turn_calls(turn)
        first = agent.task(*calls[0]).prompt_tokens if calls else 0
        recent = [max(c, 1.0) for c in earlier[-3:]]
        history = sum(math.log(c) for c in recent) / len(recent) if recent else 0.0
        return [1.0, math.log(max(prior, 1.0)), math.log1p(turn), math.log1p(first), history, 1.0 if recent else 0.0]

    # ------------------------------------------------------------------------------- prices
    def _dist(self, kind: str, agent: Agent, x: list[float], ident: tuple | None = None) -> CostDist:
        return self._priced(kind, agent.tenant or "", agent.type, x, ident)

    def _priced(self, kind: str, tenant: str, agent_type: str, x: list[float], ident: tuple | None) -> CostDist:
        with self._lock:
            m = self._models.get((kind, tenant, agent_type))
            beta, residuals = (m.beta, m.residuals) if m is not None else (None, ())
            seen = list(m.prior_resid) if m is not None and beta is None else []
            pooled = self._offsets.get((kind, tenant), [0.0, 0])[0]
            running = self._running.get((kind, tenant, agent_type))
            lift = running.lift() if running is not None else 0.0
        if beta is not None:
            mu = float(np.dot(beta, x))
            spread = residuals
        else:  # the prior, moved by what this type has shown (shrunk toward the tenant's pooled offset)
            n = len(seen)
            offset = (sum(seen) + PRIOR_WEIGHT * pooled) / (n + PRIOR_WEIGHT)
            mean = sum(seen) / n if n else 0.0
            sd = math.sqrt((sum((r - mean) ** 2 for r in seen) + PRIOR_WEIGHT * PRIOR_SPREAD**2) / (n + PRIOR_WEIGHT))
            mu = x[1] + offset
            spread = tuple(sd * z for z in _Z)
        if ident is not None:
            with self._lock:
                running = self._running.get((kind, tenant, agent_type))
                if running is None:
                    running = _Running()
                    self._running.put((kind, tenant, agent_type), running)
                running.start(ident, mu, x)
        # bursts of this type running past their prices: the upper half of the distribution moves up by
        # their mean excess (the lower half stays: a price errs low, where service corrects it)
        values = sorted(math.exp(min(mu + r + (lift if r > 0 else 0.0), 80.0)) for r in spread)
        return CostDist.from_samples(values)

    def agent_dist(self, agent: Agent, model: CostModel) -> CostDist:
        return self._dist("agent", agent, self._agent_features(agent, model), (agent.agent_id, None))

    def agent_cost(self, agent: Agent, model: CostModel) -> float:
        if agent.is_session:
            return self.turn_cost(agent, 0, [], model)
        return self.agent_dist(agent, model).index(0.0)

    def turn_dist(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> CostDist:
        return self._dist("turn", agent, self._turn_features(agent, turn, earlier, model), (agent.agent_id, turn))

    def turn_cost(self, agent: Agent, turn: int, earlier: list[float], model: CostModel) -> float:
        return self.turn_dist(agent, turn, earlier, model).index(0.0)

    # -------------------------------------------- bursts an engine sees (no workload behind them)
    @staticmethod
    def burst_features(prompt_tokens: int, turn: int, earlier: list[float], model: CostModel) -> list[float]:
        """What an engine knows when a burst without a price opens (a harness's turn, a named agent's
        first request): its first request's prompt tokens, the burst's index in its session, and what
        the session's earlier bursts cost. The prior: that prompt with a short answer."""
        prior = max(1.0, float(model.request_cost(prompt_tokens, PRIOR_OUTPUT_TOKENS)))
        recent = [max(c, 1.0) for c in earlier[-3:]]
        history = sum(math.log(c) for c in recent) / len(recent) if recent else 0.0
        return [1.0, math.log(prior), math.log1p(turn), math.log1p(prompt_tokens), history, 1.0 if recent else 0.0]

    def burst_dist(self, tenant: str, agent_type: str, ident: tuple, x: list[float]) -> CostDist:
        """A burst's price from ``burst_features``, learned per (tenant, type) from the bursts that
        ended before it (``burst_learn``)."""
        return self._priced("burst", tenant, agent_type, x, ident)

    def burst_learn(self, tenant: str, agent_type: str, ident: tuple, x: list[float], actual: float) -> None:
        """A burst ended: its features as priced, and the service it was charged."""
        with self._lock:
            running = self._running.get(("burst", tenant, agent_type))
            if running is not None:
                running.finish(ident)
        if actual > 0 and math.isfinite(actual):
            item = ("burst", tenant, agent_type, list(x), math.log(actual))
            if self._queue is not None:
                self._queue.put(item)
            else:
                self._add(*item)

    def request_cost(self, agent: Agent, stage: int, index: int, model: CostModel) -> float:
        if agent.is_session or self.prior is None:
            return self.session.request_cost(agent, stage, index, model)
        with self._lock:
            offset = self._offsets.get(("agent", agent.tenant or ""), [0.0, 0])[0]
        return float(self.prior.request_cost(agent, stage, index, model)) * math.exp(offset)

    # ------------------------------------------------------------------------------ learning
    def observe_turn(
        self, agent_type: str, turn: int, predicted: float, actual: float, earlier: float | None = None
    ) -> None:
        self.session.observe_turn(agent_type, turn, predicted, actual, earlier)

    def observe_call(self, agent_type: str, prompt_tokens: int, output_tokens: int) -> None:
        self.session.observe_call(agent_type, prompt_tokens, output_tokens)

    def progress(self, agent: Agent, so_far: float, turn: int | None = None) -> None:
        """An agent (or its turn ``turn``) still running has cost ``so_far`` (its answered calls): a
        lower bound on its cost. While bursts of a type run past their prices, the type's next
        prices rise by their mean excess (``_Running.lift``): what a finished-only learner could not
        see until they finish, when the engine has long been serving them."""
        if so_far > 0 and math.isfinite(so_far):
            with self._lock:
                running = self._running.get(("agent" if turn is None else "turn", agent.tenant or "", agent.type))
                if running is not None:
                    running.progress((agent.agent_id, turn), math.log(so_far))

    def learn(self, agent: Agent, actual: float, turn: int | None = None, earlier: list[float] | None = None) -> None:
        """A finished agent or turn: its features as they were at its start, and its true cost."""
        kind = "agent" if turn is None else "turn"
        with self._lock:
            running = self._running.get((kind, agent.tenant or "", agent.type))
            x = running.finish((agent.agent_id, turn)) if running is not None else None
        if not (actual > 0 and math.isfinite(actual)):
            return
        if x is None:  # not priced here (or aged out): its features now
            from justitia.core import KV

            x = (
                self._agent_features(agent, KV)
                if turn is None
                else self._turn_features(agent, turn, list(earlier or []), KV)
            )
        item = (kind, agent.tenant or "", agent.type, x, math.log(actual))
        if self._queue is not None:
            self._queue.put(item)
        else:
            self._add(*item)

    def _add(self, kind: str, tenant: str, agent_type: str, x: list[float], y: float) -> None:
        with self._lock:
            off = self._offsets.setdefault((kind, tenant), [0.0, 0])
            resid = y - x[1]
            off[0] = resid if off[1] == 0 else (1 - OFFSET_WEIGHT) * off[0] + OFFSET_WEIGHT * resid
            off[1] += 1
            key = (kind, tenant, agent_type)
            m = self._models.get(key)
            if m is None:
                m = _Model()
                self._models.put(key, m)
            else:
                self._models.touch(key)
            m.xs.append(x)
            m.ys.append(y)
            m.prior_resid.append(resid)
            m.pending += 1
            self.observations += 1
            due = len(m.ys) >= MIN_FIT and m.pending >= REFIT_EVERY
            data = (list(m.xs), list(m.ys), off[0]) if due else None
            if due:
                m.pending = 0
        if data is not None:
            beta, residuals = _fit(*data)  # outside the lock: pricing never waits for a fit
            with self._lock:
                m.beta, m.residuals = beta, residuals
                self.refits += 1

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._add(*item)
                if self.after_learn is not None:
                    self.after_learn()
            except Exception:  # a bad fit or a failed save must not stop learning
                continue

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the background worker has learned everything queued so far (tests, shutdown);
        True if it did within ``timeout_s``."""
        if self._queue is None:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def close(self) -> None:
        """Stop the background worker (it finishes what is queued)."""
        if self._queue is not None and self._worker is not None and self._worker.is_alive():
            self._queue.put(None)
            self._worker.join(timeout=5.0)

    # --------------------------------------------------------------------------------- state
    def state(self) -> dict:
        """What was learned, as a JSON document (``from_state`` reads it back)."""
        with self._lock:
            models = [
                {
                    "kind": k,
                    "tenant": t,
                    "type": ty,
                    "xs": [list(x) for x in m.xs],
                    "ys": list(m.ys),
                    "beta": None if m.beta is None else list(m.beta),
                    "residuals": list(m.residuals),
                    "pending": m.pending,
                }
                for (k, t, ty), m in self._models.items()
            ]
            offsets = [{"kind": k, "tenant": t, "offset": v[0], "seen": v[1]} for (k, t), v in self._offsets.items()]
        return {"schema": SCHEMA, "prior": self.prior_name, "models": models, "offsets": offsets}

    def load_state(self, doc: dict) -> None:
        """Restore what ``state`` saved (refitting each model); a malformed document raises ValueError."""
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ValueError(f"not an online predictor's state (expected schema '{SCHEMA}').")
        if doc.get("prior") != self.prior_name:  # its features hold another prior's prices
            raise ValueError(f"learned with the cold start '{doc.get('prior')}', not '{self.prior_name}'.")
        try:
            offsets = {(str(o["kind"]), str(o["tenant"])): [float(o["offset"]), int(o["seen"])] for o in doc["offsets"]}
            models = []
            for d in doc["models"][-MAX_MODELS:]:
                xs = [[float(v) for v in x] for x in d["xs"]][-WINDOW:]
                ys = [float(v) for v in d["ys"]][-WINDOW:]
                if (
                    not xs
                    or len(xs) != len(ys)
                    or any(len(x) != len(xs[0]) for x in xs)
                    or not all(math.isfinite(v) for x in xs for v in x)
                    or not all(map(math.isfinite, ys))
                ):
                    raise ValueError("ragged or non-finite observations")
                beta = d.get("beta")
                fit = None
                if beta is not None:
                    fit = (tuple(float(v) for v in beta), tuple(float(v) for v in d.get("residuals") or ()))
                    if (
                        len(fit[0]) != len(xs[0])
                        or len(fit[1]) != ATOMS
                        or not all(map(math.isfinite, fit[0] + fit[1]))
                    ):
                        raise ValueError("a fit that does not match its observations")
                models.append(
                    ((str(d["kind"]), str(d["tenant"]), str(d["type"])), xs, ys, fit, int(d.get("pending", 0)))
                )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"malformed online predictor state: {exc}") from None
        with self._lock:
            self._offsets = offsets
            self._models = _Lru()
            self.observations = self.observations_loaded = sum(len(m[2]) for m in models)
        for key, xs, ys, fit, pending in models:
            m = _Model()
            m.xs.extend(xs)
            m.ys.extend(ys)
            m.prior_resid.extend(y - x[1] for x, y in zip(xs, ys))
            m.pending = pending
            if fit is not None:  # the fit as it was: prices after a restart are those before it
                m.beta, m.residuals = fit
            elif len(ys) >= MIN_FIT:
                m.beta, m.residuals = _fit(xs, ys, offsets.get(key[:2], [0.0, 0])[0])
            with self._lock:
                self._models.put(key, m)  # in the saved order: past a share, the least recently used go

    def save(self, path: str | Path) -> None:
        """Write the state to ``path`` atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.state()))
        os.replace(tmp, path)

    def load(self, path: str | Path) -> bool:
        """Read a state ``save`` wrote, if the file exists; True if it did."""
        path = Path(path)
        if not path.is_file():
            return False
        self.load_state(json.loads(path.read_text()))
        return True


def load_kept(pred: OnlinePredictor, path: str | Path) -> str:
    """Load what ``pred`` learned before from ``path``, saying so in one line: reloaded, nothing
    there yet, or damaged (set aside as ``*.bad``, and ``pred`` starts cold: a damaged file never
    stops a server)."""
    path = Path(path)
    try:
        if pred.load(path):
            return f"{pred.observations_loaded} finished agents, turns and bursts reloaded from {path}"
        return f"nothing kept at {path} yet: starting cold"
    except (ValueError, OSError) as exc:
        bad = path.with_suffix(path.suffix + ".bad")
        try:
            path.replace(bad)
        except OSError:
            pass
        return f"{path} cannot be read ({exc}); set aside as {bad.name}, starting cold"


def keep(pred: OnlinePredictor, path: str | Path, every: int = 32, warn=None):
    """Save ``pred``'s state to ``path`` every ``every`` observations, from its learning thread (so
    pricing never waits on a save; ``warn(message, path, error)`` hears of a failed one), and return
    what saves the rest: call it once, at exit (it closes ``pred``)."""
    path = Path(path)
    lock = threading.Lock()
    last = [pred.observations]

    def maybe_save() -> None:
        if pred.observations - last[0] >= every and lock.acquire(blocking=False):
            try:
                last[0] = pred.observations
                pred.save(path)
            except OSError as exc:
                if warn is not None:
                    warn("justitia: online predictor state not saved to %s: %s", path, exc)
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

    return at_exit
