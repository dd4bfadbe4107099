"""The request metadata an engine reads, and the control calls a front end makes into an engine.

**Request metadata** rides on each request as a flat dict of extra sampling arguments (an engine
carries it; on vLLM's OpenAI server it is a request's ``vllm_xargs``). ``RequestMeta`` is the only code that writes
or reads these keys:

    agent_id      the agent the request belongs to; absent: the request is an agent of its own
    agent_type    the agent's workflow type (for predictors and logs)
    agent_cost    predicted total cost C of the agent, in the cost model's unit (its first request sets it)
    request_cost  predicted cost of this request (for sjf)
    agent_done    truthy on the requests of the agent's last stage: its state goes when they finish
    agent_weight  the agent's weight under weighted fairness (> 0, default 1; its first request sets it)
    tenant        the tenant the agent belongs to (a string; its first request sets it): under justitia a
                  tenant's agents share its part of the engine, and weights divide the engine among tenants
    agent_tag     the request's key from a front end that keeps the clock for several engines (its
                  agent's virtual finish tag, or root key in a tenant, a finite number >= 0): the
                  ``tagged`` policy orders by it
    agent_rank    from the same front end, for an agent in a tenant: its place among its tenant's
                  agents (its inner tag, >= 0); ``tagged`` orders a tenant's requests by it
    session       truthy: the agent is a session (docs/sessions.md), priced and tagged burst by burst
                  and kept across its pauses (``AgentBook.session_keep_s``) rather than released
    turn_start    truthy on a session's request that opens a new burst (a user turn): a session with
                  nothing open is settled for the burst it ran and arrives again, at this request's
                  ``agent_cost`` (or its own price). A pause inside a turn keeps the session's place

**Control calls** go from the process that started a vLLM engine into the plug-in, inside the
engine process (vLLM's utility-call channel, never reachable by an HTTP client): ``register`` an
agent ahead of its requests and read back its virtual finish tag, ``release`` an agent (as soon as
none of its requests is open), read the policy's ``state`` (its clock included), or ``reset`` the
policy state of an idle engine (the bench reuses one engine for every policy). Each is one
``ControlCall``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from justitia.core.gittins import CostDist

AGENT_ID, AGENT_TYPE, AGENT_COST, REQUEST_COST, AGENT_DONE, AGENT_WEIGHT, TENANT, AGENT_TAG, AGENT_RANK = (
    "agent_id",
    "agent_type",
    "agent_cost",
    "request_cost",
    "agent_done",
    "agent_weight",
    "tenant",
    "agent_tag",
    "agent_rank",
)
SESSION, TURN_START = "session", "turn_start"
META_KEYS = (
    AGENT_ID,
    AGENT_TYPE,
    AGENT_COST,
    REQUEST_COST,
    AGENT_DONE,
    AGENT_WEIGHT,
    TENANT,
    AGENT_TAG,
    AGENT_RANK,
    SESSION,
    TURN_START,
)
PRICE_KEYS = (
    AGENT_COST,
    REQUEST_COST,
    AGENT_WEIGHT,
    TENANT,
    AGENT_TAG,
    AGENT_RANK,
)  # what only a trusted sender may set


@dataclass(frozen=True)
class RequestMeta:
    """What a request says about its agent. ``None`` costs: the engine estimates them. A request
    without ``agent_id`` is an agent of its own, done when it finishes."""

    agent_id: str | None = None
    agent_type: str = ""
    agent_cost: float | None = None
    request_cost: float | None = None
    agent_done: bool = False
    agent_weight: float | None = None
    tenant: str | None = None
    agent_tag: float | None = None
    agent_rank: float | None = None
    session: bool = False
    turn_start: bool = False

    def without_prices(self) -> "RequestMeta":
        """The metadata with what only a trusted sender may set left out (costs, weight, tenant):
        the engine then prices the request itself (``JUSTITIA_CLIENT_PRICES=0``)."""
        return RequestMeta(
            self.agent_id,
            self.agent_type,
            None,
            None,
            self.agent_done,
            session=self.session,
            turn_start=self.turn_start,
        )

    def to_extra_args(self) -> dict[str, Any]:
        """The metadata as ``extra_args`` / ``vllm_xargs`` (fields left unset are left out)."""
        doc: dict[str, Any] = {}
        if self.agent_id is not None:
            doc[AGENT_ID] = self.agent_id
        if self.agent_type:
            doc[AGENT_TYPE] = self.agent_type
        for key, value in ((AGENT_COST, self.agent_cost), (REQUEST_COST, self.request_cost)):
            if value is not None:
                doc[key] = value
        if self.agent_done:
            doc[AGENT_DONE] = True
        if self.agent_weight is not None:
            doc[AGENT_WEIGHT] = self.agent_weight
        if self.tenant is not None:
            doc[TENANT] = self.tenant
        if self.agent_tag is not None:
            doc[AGENT_TAG] = self.agent_tag
        if self.agent_rank is not None:
            doc[AGENT_RANK] = self.agent_rank
        if self.session:
            doc[SESSION] = True
        if self.turn_start:
            doc[TURN_START] = True
        return doc

    @classmethod
    def parse(
        cls, extra_args: Mapping[str, Any] | None, request_id: str = "", log: logging.Logger | None = None
    ) -> "RequestMeta":
        """Read the metadata of a request; a bad cost is logged and ignored (it must not stop an engine)."""
        doc = extra_args or {}
        agent_id = doc.get(AGENT_ID)
        costs = {key: _cost(doc.get(key), key, request_id, log) for key in (AGENT_COST, REQUEST_COST)}
        weight = _cost(doc.get(AGENT_WEIGHT), AGENT_WEIGHT, request_id, log, positive=True)
        tenant = doc.get(TENANT)
        if tenant is not None and not (isinstance(tenant, str) and 1 <= len(tenant) <= 128):
            (log or logging.getLogger("justitia")).warning(
                "justitia: request %s: %s=%.60r is not a string of 1-128 characters; ignored",
                request_id,
                TENANT,
                tenant,
            )
            tenant = None
        return cls(
            str(agent_id) if agent_id else None,
            str(doc.get(AGENT_TYPE, "")),
            costs[AGENT_COST],
            costs[REQUEST_COST],
            bool(doc.get(AGENT_DONE)),
            weight,
            tenant,
            _cost(doc.get(AGENT_TAG), AGENT_TAG, request_id, log),
            _cost(doc.get(AGENT_RANK), AGENT_RANK, request_id, log),
            bool(doc.get(SESSION)),
            bool(doc.get(TURN_START)),
        )


def _cost(value: Any, key: str, request_id: str, log: logging.Logger | None, positive: bool = False) -> float | None:
    """A number from the metadata (>= 0, or > 0 if ``positive``); a bad one is logged and ignored."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isfinite(number) and (number > 0 if positive else number >= 0):
        return number
    (log or logging.getLogger("justitia")).warning(
        "justitia: request %s: %s=%r is not a finite number %s 0; ignored (the default is used)",
        request_id,
        key,
        value,
        ">" if positive else ">=",
    )
    return None


# ------------------------------------------------------------------------------ control calls
@dataclass(frozen=True)
class Registration:
    """An agent's registration, the one payload that registers an agent across every engine boundary
    (a backend's ``register``, the plug-in's ``register`` control call, ``AgentBook.register``): built
    once, serialized once (``to_json``), parsed once (``from_json``); the core takes its fields
    (``AgentScheduler.agent_arrived``).

    ``weight``: its share under weighted fairness; ``tenant``: hierarchical GPS; ``resume_cost``: an
    agent resumed from the journal, with this much still owed by GPS; ``session``: a session, kept
    across its pauses (one paused between turns, registered again, returns with ``predicted_cost``
    its next turn's price); ``dist``: its price as a distribution (``core.gittins``)."""

    agent_id: str
    agent_type: str
    predicted_cost: float
    weight: float = 1.0
    tenant: str | None = None
    resume_cost: float | None = None
    session: bool = False
    dist: CostDist | None = None

    def to_json(self) -> dict:
        """Plain JSON values (``dist`` as ``[values, probs]``), for the plug-in's channel."""
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dist"}
        if self.dist is not None:
            doc["dist"] = [list(self.dist.values), list(self.dist.probs)]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping, log: logging.Logger | None = None) -> "Registration":
        """From ``to_json``'s form. A malformed ``dist`` is dropped (the agent is priced at its point
        price; ``log`` says so); a malformed required field raises ValueError naming it."""
        try:
            agent_id, price = str(doc["agent_id"]), float(doc["predicted_cost"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"register: agent_id and a numeric predicted_cost are required ({exc}).") from None
        resume, dist = doc.get("resume_cost"), doc.get("dist")
        if dist is not None:
            try:
                values, probs = dist
                dist = CostDist(tuple(float(v) for v in values), tuple(float(p) for p in probs))
            except (TypeError, ValueError):
                if log is not None:
                    log.warning("justitia: a register call's price distribution is malformed; its point price is used.")
                dist = None
        tenant = doc.get("tenant")
        return cls(
            agent_id,
            str(doc.get("agent_type", "")),
            price,
            float(doc.get("weight", 1.0)),
            None if tenant is None else str(tenant),
            None if resume is None else float(resume),
            doc.get("session") is True,
            dist,
        )


ENGINE_UTILITY = "justitia_control"  # the method the plug-in adds to vLLM's EngineCore
REGISTER, RETIRE, STATE, RESET = "register", "retire", "state", "reset"
VERBS = (REGISTER, RETIRE, STATE, RESET)


@dataclass(frozen=True)
class ControlCall:
    """One call into the plug-in: a verb and its arguments (plain JSON values).

    ``register``: ``Registration.to_json()`` -> the agent's virtual finish tag (None under a policy
    without a clock); ``retire``: ``agent_id`` -> whether it was released now (else: when its last
    open request ends),
    or with ``pause`` true: a session paused between bursts, settled now or when its last open request ends;
    ``state`` -> ``PolicyState.to_json()``; ``reset``: ``policy``, ``cost``,
    ``capacity_per_s``, ``measure_capacity``, ``retag``, ``step_log`` (a CSV path or None) -> whether the idle
    engine was reset.
    """

    verb: str
    args: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verb not in VERBS:
            raise ValueError(f"unknown control verb '{self.verb}'; expected one of: {', '.join(VERBS)}.")

    def to_json(self) -> dict:
        """The call as sent over vLLM's utility channel."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping) -> "ControlCall":
        """The call from what the channel delivered."""
        return cls(str(doc.get("verb")), dict(doc.get("args") or {}))


@dataclass(frozen=True)
class PolicyState:
    """The policy that orders an engine, read at one moment; the clock fields are None under a
    policy without a GPS clock (every policy but justitia)."""

    policy: str
    agents: int  # agents holding policy state
    virtual_time: float | None = None  # V(now), in cost units
    gps_active: int | None = None  # N_t: agents active in GPS
    capacity_per_s: float | None = None  # the clock's M
    capacity_schedule: list | None = None  # [t_s, M] every value M took, when it is measured
    tenants: dict | None = None  # read with detail: tenant -> its figures (AgentBook.state; core.ledger)
    head: list | None = None  # read with detail: the agents with the smallest keys, as plain JSON
    errors: dict | None = None  # read with detail: agent type -> price errors (core.ledger.Ledger.errors)

    @property
    def has_clock(self) -> bool:
        """Whether the policy keeps a GPS virtual clock."""
        return self.virtual_time is not None

    def to_json(self) -> dict:
        """The reading as plain JSON."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping) -> "PolicyState":
        """A reading from plain JSON."""
        keys = (
            "policy",
            "agents",
            "virtual_time",
            "gps_active",
            "capacity_per_s",
            "capacity_schedule",
            "tenants",
            "head",
            "errors",
        )
        return cls(**{k: doc.get(k) for k in keys})
