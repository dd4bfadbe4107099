"""API keys: who a client is, which tenant it belongs to, and whether it may set prices.

Keys come from ``--api-key KEY`` (repeatable; each key its own tenant, weight 1) and
``--api-keys FILE``, one key a line, ``KEY [TENANT WEIGHT] [trusted] [admin]``::

    # key                     tenant     weight   [trusted] [admin]
    sk-team-a-1b9f...         team-a     2
    sk-team-a-c03e...         team-a     2
    sk-alice-9d2a...                               (a tenant of its own, weight 1)
    sk-bob-5e7a...            -          3        (a tenant of its own, weight 3)
    sk-frontend-77c1...       frontends  1        trusted
    sk-ops-41aa...            ops        1        admin

Blank lines and lines starting with ``#`` are skipped. A client sends its key as vLLM's OpenAI
server expects, ``Authorization: Bearer KEY``. Keys are compared in constant time (``hmac``), every
configured key each time, so the time taken says nothing about which key came close.

What a key gives:

- **ownership**: an agent belongs to the key that submitted it; another key's GET, DELETE or events
  get 404, and OpenAI-path agent ids (``vllm_xargs.agent_id``, ``X-Agent-Id``) live in the key's
  own namespace, so a guessable id cannot be claimed or joined by another key;
- **a tenant and its weight**: tenants share the engine by weight, and a tenant's agents share its
  part as the paper's GPS shares the engine, served in their tags' order inside it (hierarchical
  GPS: ``core.VirtualClock``; docs/design.md, "Tenants"). A key is a tenant of its own unless the
  key file names a tenant, which several keys may share;
- **trust**: only a ``trusted`` key (a front end that prices requests itself) may send
  ``agent_cost``, ``request_cost``, ``agent_weight`` or ``tenant`` in ``vllm_xargs``; anyone else
  gets 400 naming the field;
- **admin**: an ``admin`` key sees every tenant on the live page and its state endpoint
  (``/justitia``, ``/justitia/state``); any other key sees its own tenant only.

With no key configured the server is open (the embedded default, on loopback): every client is
the one anonymous, untrusted owner, and the server logs that it is open.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from pathlib import Path

from justitia.core import is_positive_finite

OPEN_OWNER = "open"
KEY_FLAGS = ("trusted", "admin")  # what may follow a key (and its tenant and weight) in a key file


class KeyFileError(ValueError):
    """A bad key file or key (the message names the line)."""


@dataclass(frozen=True)
class Client:
    """An authenticated client: its owner id (never the key itself), tenant, weight and trust."""

    owner: str
    tenant: str | None = None
    weight: float = 1.0
    trusted: bool = False
    admin: bool = False  # sees every tenant's figures (the live page)


ANONYMOUS = Client(OPEN_OWNER)


def client_of(request) -> Client:
    """The client the server's auth middleware found for an HTTP request."""
    return getattr(request.state, "client", ANONYMOUS)


def _owner_id(key: str) -> str:
    """A stable id for a key that does not reveal it (agent ids and logs carry this, not the key)."""
    return "k" + hashlib.sha256(key.encode()).hexdigest()[:12]


class KeyRing:
    """The server's keys; empty: an open server."""

    def __init__(self, entries: dict[str, Client] | None = None):
        self._keys = [(k.encode(), c) for k, c in (entries or {}).items()]

    @property
    def open(self) -> bool:
        return not self._keys

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def load(cls, keys: list[str] | None = None, path: Path | None = None) -> "KeyRing":
        """``--api-key`` values (each a tenant of its own, weight 1) and an ``--api-keys`` file."""
        entries: dict[str, Client] = {}
        for key in keys or []:
            _check_key(key, "--api-key")
            entries[key] = Client(_owner_id(key), _owner_id(key), 1.0, False)
        if path is not None:
            try:
                text = Path(path).read_text()
            except OSError as exc:
                raise KeyFileError(f"--api-keys: cannot read {path}: {exc.strerror or exc}.") from None
            for no, line in enumerate(text.splitlines(), 1):
                fields = line.split()
                if not fields or fields[0].startswith("#"):
                    continue
                where = f"--api-keys {path}:{no}"
                head = 1 if len(fields) < 2 or fields[1] in KEY_FLAGS else 3  # KEY alone, or KEY TENANT WEIGHT
                flags = fields[head:]
                if len(fields) == 2 and fields[1] not in KEY_FLAGS:
                    head, flags = 2, []  # KEY TENANT: weight 1
                if any(f not in KEY_FLAGS for f in flags) or len(set(flags)) < len(flags):
                    raise KeyFileError(
                        f"{where}: expected 'KEY [TENANT WEIGHT] [trusted] [admin]', got "
                        f"{' '.join(fields[1:])!r} after the key."
                    )
                fields = fields[:head]
                key, tenant, weight = (fields + ["-", "1"][len(fields) - 1 :])[:3]
                _check_key(key, where)
                if tenant == "-":
                    tenant = _owner_id(key)  # a tenant of its own
                if len(tenant) > 128:
                    raise KeyFileError(f"{where}: the tenant name has more than 128 characters.")
                try:
                    w = float(weight)
                except ValueError:
                    w = math.nan
                if not is_positive_finite(w):
                    raise KeyFileError(f"{where}: the weight must be a finite number > 0, got '{weight}'.")
                if key in entries:
                    raise KeyFileError(f"{where}: this key is listed twice.")
                entries[key] = Client(_owner_id(key), tenant, w, "trusted" in flags, "admin" in flags)
        return cls(entries)

    def authenticate(self, authorization: str | None) -> Client | None:
        """The client an ``Authorization`` header names, ``ANONYMOUS`` on an open server, or None."""
        if self.open:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        found = None
        for key, client in self._keys:  # every key, every time: constant time in which one matched
            if hmac.compare_digest(key, given) and given:
                found = client
        return found


def _check_key(key: str, where: str) -> None:
    if len(key) < 8 or any(c.isspace() for c in key) or not key.isprintable():
        raise KeyFileError(f"{where}: a key must be at least 8 printable characters without spaces.")
