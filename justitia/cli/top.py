"""``justitia top``: the live page for a terminal, over the same state (``GET /justitia/state``):
each tenant's share of the service in the window against its fair share, its queue, its lateness
and slack to the delay bound, the clock, and the agents at the head of the queue. Refreshes every
``--every`` seconds until interrupted; ``--once`` prints one frame and exits (exit 1 if the server
cannot be read)."""

from __future__ import annotations

import sys
import time

from justitia.defaults import ENV_API_KEY, env

DEFAULT_URL = "http://127.0.0.1:8000"


def add_parser(sub) -> None:
    top = sub.add_parser("top", help="a live view of a running server: tenants' shares, the queue, the bound's slack")
    top.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    top.add_argument(
        "--api-key",
        default=env(ENV_API_KEY),
        help="the key to read with (default: $JUSTITIA_API_KEY; none on a server without keys). "
        "An admin key sees every tenant, another key its own",
    )
    top.add_argument("--every", type=float, default=2.0, help="seconds between refreshes (default 2)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def render(doc: dict):
    """The frame for one state document (``Watch.doc``), as a rich renderable. Names a client chose
    (agent ids, types) go in as plain ``Text``, never as rich markup."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    clock = doc.get("clock")
    title = Text(f"Justitia on {doc.get('model')}: policy {doc.get('policy')}; ", style="bold")
    title.append(
        f"V {_fmt(clock['virtual_time'], 6)}, N_t {clock['active']}, M {_fmt(clock['capacity_per_s'], 4)}/s; "
        if clock
        else "no GPS clock; "
    )
    title.append(f"bound {_fmt(doc.get('bound_s'))} s, {doc.get('violations', 0)} past it")
    tenants = Table(title=f"tenants (shares over the last {_fmt(doc.get('window_s'))} s)", title_justify="left")
    for name in (
        "tenant",
        "weight",
        "share",
        "fair share",
        "waiting",
        "agents",
        "sessions",
        "lateness s",
        "slack s",
        "past bound",
        "cache hits",
    ):
        tenants.add_column(name, justify="left" if name == "tenant" else "right")
    for t in doc.get("tenants", []):
        slack = t.get("margin_s")
        tenants.add_row(
            Text(t["tenant"]),
            _fmt(t.get("weight")),
            _pct(t.get("share")),
            _pct(t.get("fair_share")),
            str(t.get("waiting", 0)),
            str(t.get("agents", 0)),
            str(t.get("sessions", 0)),
            _fmt(t.get("late_s")),
            Text(_fmt(slack), style="bold red" if slack is not None and slack < 0 else ""),
            str(t.get("violations", 0)),
            _pct(t.get("cache_hit_rate")),
        )
    head = Table(title="head of the queue", title_justify="left")
    for name in ("agent", "tenant", "type", "tag", "predicted", "attained", "requests"):
        head.add_column(name, justify="left" if name in ("agent", "tenant", "type") else "right")
    for a in doc.get("head", []):
        head.add_row(
            Text(a["agent_id"]),
            Text(a["tenant"]),
            Text(a["type"]),
            _fmt(a.get("tag"), 6),
            _fmt(a.get("predicted")),
            _fmt(a.get("attained")),
            str(a.get("requests")),
        )
    return Group(title, tenants, head)


def fetch(url: str, key: str | None) -> dict:
    """The server's state document; a ``RuntimeError`` naming the status if it will not give it."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(url.rstrip("/") + "/justitia/state", headers=headers, timeout=10.0)
    if r.status_code != 200:
        try:
            error = r.json().get("error")
        except ValueError:
            error = r.text[:200]
        raise RuntimeError(f"{r.status_code} from {url}: {error.get('message') if isinstance(error, dict) else error}")
    return r.json()


def run(args) -> int:
    import httpx
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if args.once:
        try:
            console.print(render(fetch(args.url, args.api_key)))
        except (RuntimeError, httpx.HTTPError) as exc:
            print(f"justitia top: {exc}", file=sys.stderr)
            return 1
        return 0
    with Live(console=console, auto_refresh=False) as live:
        try:
            while True:
                try:
                    live.update(render(fetch(args.url, args.api_key)), refresh=True)
                except (RuntimeError, httpx.HTTPError) as exc:
                    live.update(f"justitia top: {exc} (retrying)", refresh=True)
                time.sleep(max(0.2, args.every))
        except KeyboardInterrupt:
            return 0
