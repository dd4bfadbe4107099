"""Real traffic as workloads: three readers of what platforms already have, and one builder.

- **tau2-bench results files** (``read_tau2``): one conversation per simulation; its calls are the
  ``assistant`` messages that carry ``usage`` (the API's own token counts); a ``user`` message opens a
  user turn; the solo (no-user) simulations are one turn.
- **A chat-log JSONL** (``read_chat_log``, docs/formats.md): one conversation per line, a list of
  OpenAI chat messages, each with an optional ``usage`` and ``timestamp``: what a gateway logs.
- **Mooncake's conversation trace** (``read_mooncake``): a request whose leading KV blocks
  (``hash_ids``, two or more) extend an earlier request's continues that request's conversation.

Each reader gives ``Conversation``s: the calls in order, each with its prompt and output tokens, the
pause before it (a tool's time, or the user's think time) and the turn it belongs to.
``conversations_to_agents`` makes them sessions of the workload format: a stage per call, its
context the previous call's prompt and output on top of a system prompt shared per kind (tokens in
the context are the prefix cache's to reuse), or task-parallel agents of one turn (``solo``).

``TAU2_COMPACT`` is the compact file derived from the eight tau2-bench files (MIT; its notice is
``justitia/data/NOTICE``): token counts, times, the texts that open turns. A clone with nothing
beside it replays tau2-bench from it. Bad input raises ``WorkloadError``: one sentence naming the
file, the line or simulation, and the field; nothing is returned.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

from justitia.workload.agents import Agent, Segment, Stage, Task, WorkloadError
from justitia.workload.files import read_jsonl

TAU2_COMPACT: Path = Path(__file__).parents[1] / "data" / "tau2_bench.jsonl.gz"
TAU2_SHARED: Path = Path(__file__).parents[3] / "shared" / "traces" / "tau2-bench"  # beside a checkout
OPENING_CHARS = 2000  # the compact file keeps a turn's opening text up to this many characters
TEXT_CHARS = 160  # and the start of every other call's new text (tool results)
CHARS_PER_TOKEN = 4.0  # tokens estimated from text when there is neither usage nor a tokenizer


@dataclass
class Call:
    """One call to the agent's model: its tokens (the API's count), the pause before it was sent
    (after the previous call's answer: a tool, or the user's think time), its user turn, and the new
    text of its prompt (the user's message for a turn's first call)."""

    prompt_tokens: int
    output_tokens: int
    pause_s: float
    turn: int
    text: str = ""


@dataclass
class Conversation:
    """One session as it was served: ``kind`` names its type (a predictor learns per kind),
    ``system`` the system prompt it shares with others, ``solo`` whether no user spoke."""

    conv_id: str
    kind: str
    system: str
    calls: list[Call]
    solo: bool = False
    arrival_s: float | None = None  # from the source itself (Mooncake); else the arrival process's
    meta: dict = field(default_factory=dict)
    system_tokens: int | None = None  # its system prompt's length where the source shows its text


# ---------------------------------------------------------------------------------------- tau2
def _when(value: object, where: str, name: str) -> float:
    if not isinstance(value, str):
        raise WorkloadError(f"{where}: field '{name}' must be an ISO timestamp string, got {json.dumps(value)[:60]}.")
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise WorkloadError(f"{where}: field '{name}' is not an ISO timestamp: {value[:60]!r}.") from None


def _count(usage: object, key: str, where: str) -> int:
    v = usage.get(key) if isinstance(usage, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WorkloadError(f"{where}: field 'usage.{key}' must be an integer >= 1, got {json.dumps(v)[:60]}.")
    return v


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def tau2_calls(
    messages: object, where: str, estimate: Callable[[str], int] | None = None
) -> tuple[list[Call], bool, str]:
    """The agent's calls in a list of chat messages (tau2-bench's, or a chat log's), whether a user
    spoke, and where tokens came from (``usage``, or ``estimate`` of the conversation's text).

    A call is an ``assistant`` message with ``usage`` (or, with ``estimate``, any ``assistant``
    message after a ``user`` or ``tool`` one); a ``user`` message opens a turn. Pauses come from
    ``timestamp`` where both ends have one (0 otherwise)."""
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: field 'messages' must be a non-empty list of chat messages.")
    calls: list[Call] = []
    turn, user_seen, new_text = -1, False, []
    last_answer_s: float | None = None
    last_event_s: float | None = None
    context = 0  # estimated tokens so far (estimate only)
    sources = set()
    for i, m in enumerate(messages):
        at = f"{where}: message {i}"
        if not isinstance(m, dict):
            raise WorkloadError(f"{at}: expected a JSON object, got {type(m).__name__}.")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer", "function"):
            raise WorkloadError(
                f"{at}: field 'role' must be one of system, user, assistant, tool, got {json.dumps(role)[:60]}."
            )
        stamp = _when(m["timestamp"], at, "timestamp") if m.get("timestamp") is not None else None
        text = _text(m.get("content"))
        if role == "user":
            user_seen = True
            turn += 1
            new_text = [text]
            last_event_s = stamp
        elif role in ("tool", "function"):
            new_text.append(text)
            last_event_s = stamp if stamp is not None else last_event_s
        elif role == "assistant":
            usage = m.get("usage")
            if usage is not None:
                prompt, output = _count(usage, "prompt_tokens", at), _count(usage, "completion_tokens", at)
                sources.add("usage")
            elif estimate is not None and (new_text or not calls) and not (i == 0 and not user_seen):
                prompt = max(1, context + estimate(" ".join(new_text)))
                output = max(1, estimate(text + json.dumps(m.get("tool_calls") or "")))
                sources.add("estimate")
            else:
                if estimate is not None:
                    context += estimate(text)
                continue  # a fixed greeting, not a call
            if turn < 0:
                turn = 0
            pause = 0.0
            if calls and last_answer_s is not None and last_event_s is not None:
                pause = max(0.0, last_event_s - last_answer_s)
            calls.append(Call(prompt, output, pause, turn, " ".join(t for t in new_text if t)))
            context = prompt + output
            new_text = []
            last_answer_s = stamp
            continue
        if estimate is not None and role in ("system", "developer"):  # the rest is a call's new text
            context += estimate(text)
    if not calls:
        raise WorkloadError(f"{where}: field 'messages' holds no agent call (an assistant message with usage).")
    # turns that opened with no call (the user's last word) leave no gap
    seen = sorted({c.turn for c in calls})
    renumber = {t: k for k, t in enumerate(seen)}
    for c in calls:
        c.turn = renumber[c.turn]
    return calls, user_seen, ("usage" if sources == {"usage"} else "estimated" if sources == {"estimate"} else "mixed")


def _tau2_kind(path: Path, solo: bool) -> tuple[str, str]:
    """The domain from a results file's name (``gpt41_airline.json`` -> airline), and its agent model."""
    stem = path.name.split(".")[0]
    model, _, domain = stem.partition("_")
    domain = domain.replace("_nouser", "")
    return f"tau2-{domain}" + ("-solo" if solo else "") + f"/{model}", model


def read_tau2(paths: Iterable[str | Path]) -> list[Conversation]:
    """Conversations from tau2-bench results files (``*.json``), or from the compact derived file
    (``*.jsonl.gz``, ``write_compact``); a directory stands for its results files."""
    out: list[Conversation] = []
    for p in _expand(paths):
        if p.name.endswith(".jsonl.gz") or p.name.endswith(".jsonl"):
            out.extend(read_compact(p))
            continue
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise WorkloadError(f"{p}: no such tau2-bench results file.") from None
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}).") from None
        sims = doc.get("simulations") if isinstance(doc, dict) else None
        if not isinstance(sims, list):
            raise WorkloadError(f"{p}: field 'simulations' must be a list (a tau2-bench results file).")
        for k, sim in enumerate(sims):
            if not isinstance(sim, dict) or not isinstance(sim.get("id"), str) or not sim["id"]:
                raise WorkloadError(f"{p}: simulation {k}: field 'id' must be a non-empty string.")
            where = f"{p}: simulation {sim['id']}"
            calls, user_seen, _ = tau2_calls(sim.get("messages"), where)
            kind, model = _tau2_kind(p, not user_seen)
            system = kind.partition("/")[0].removesuffix("-solo")  # one system prompt per domain
            out.append(
                Conversation(
                    f"{p.name.split('.')[0]}/{sim['id'][:8]}",
                    kind,
                    system,
                    calls,
                    not user_seen,
                    meta={
                        "source": "tau2-bench",
                        "file": p.name,
                        "agent_model": model,
                        "task_id": str(sim.get("task_id")),
                        "simulation": sim["id"],
                    },
                )
            )
    if not out:
        raise WorkloadError("no tau2-bench simulations were read: name results files or their directory.")
    return out


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise WorkloadError(f"{p}: the directory holds no results files (*.json).")
            out.extend(found)
        else:
            out.append(p)
    return out


def default_tau2_source() -> list[Path]:
    """tau2-bench's files beside the checkout (``../shared/traces/tau2-bench``) when present, else
    the compact file the package ships."""
    return [TAU2_SHARED] if TAU2_SHARED.is_dir() and any(TAU2_SHARED.glob("*.json")) else [TAU2_COMPACT]


def write_compact(convs: list[Conversation], path: str | Path) -> Path:
    """The conversations as the compact JSONL (gzip): per call ``[prompt, output, pause_s, turn,
    text]``, a turn's opening text up to ``OPENING_CHARS``, other texts up to ``TEXT_CHARS``."""
    path = Path(path)
    lines = []
    for c in convs:
        calls, turn = [], -1
        for call in c.calls:
            keep = OPENING_CHARS if call.turn != turn else TEXT_CHARS
            turn = call.turn
            calls.append([call.prompt_tokens, call.output_tokens, round(call.pause_s, 3), call.turn, call.text[:keep]])
        lines.append(
            json.dumps(
                {"id": c.conv_id, "kind": c.kind, "system": c.system, "solo": c.solo, "meta": c.meta, "calls": calls},
                ensure_ascii=False,
            )
        )
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9, mtime=0))  # reproducible
    return path


def read_compact(path: Path) -> list[Conversation]:
    """Conversations from the compact JSONL ``write_compact`` writes."""
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file.")
    out = []
    for _, where, doc in read_jsonl(path):
        if not isinstance(doc, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(doc).__name__}.")
        for key, kind in (("id", str), ("kind", str), ("system", str), ("calls", list)):
            if not isinstance(doc.get(key), kind) or not doc.get(key):
                raise WorkloadError(f"{where}: field '{key}' must be a non-empty {kind.__name__}.")
        calls = []
        for i, c in enumerate(doc["calls"]):
            ok = (
                isinstance(c, list)
                and len(c) == 5
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in c[:2])
                and isinstance(c[2], (int, float))
                and c[2] >= 0
                and isinstance(c[3], int)
                and isinstance(c[4], str)
            )
            if not ok:
                raise WorkloadError(
                    f"{where}: field 'calls[{i}]' must be [prompt_tokens, output_tokens, pause_s, "
                    f"turn, text], got {json.dumps(c)[:80]}."
                )
            calls.append(Call(c[0], c[1], float(c[2]), c[3], c[4]))
        out.append(
            Conversation(
                doc["id"], doc["kind"], doc["system"], calls, bool(doc.get("solo")), meta=dict(doc.get("meta") or {})
            )
        )
    return out


# ----------------------------------------------------------------------------------- chat log
def read_chat_log(path: str | Path, tokenizer: str | None = None) -> list[Conversation]:
    """Conversations from a chat-log JSONL: each line a list of OpenAI chat messages, or an object
    with ``messages`` (and optional ``id`` and ``kind``). Tokens come from each answer's ``usage``;
    where a line has none, from ``tokenizer`` (a local Hugging Face tokenizer directory) if named,
    else estimated at ``CHARS_PER_TOKEN`` characters a token; ``meta.tokens`` says which."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such chat-log file.")
    estimate, how = _estimator(tokenizer)
    out = []
    for lineno, where, doc in read_jsonl(path):
        messages, conv_id, kind = doc, f"chat-{lineno}", "chat"
        if isinstance(doc, dict):
            messages = doc.get("messages")
            conv_id = doc.get("id", conv_id)
            kind = doc.get("kind", kind)
            if not isinstance(conv_id, str) or not conv_id:
                raise WorkloadError(f"{where}: field 'id' must be a non-empty string.")
            if not isinstance(kind, str) or not kind:
                raise WorkloadError(f"{where}: field 'kind' must be a non-empty string.")
        elif not isinstance(doc, list):
            raise WorkloadError(
                f"{where}: expected a list of chat messages or an object with 'messages', got {type(doc).__name__}."
            )
        has_usage = isinstance(messages, list) and any(
            isinstance(m, dict) and m.get("usage") is not None for m in messages
        )
        calls, user_seen, tokens = tau2_calls(messages, where, None if has_usage else estimate)
        system = next(
            (_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "system"), ""
        )
        out.append(
            Conversation(
                conv_id,
                kind,
                f"{kind}-system-{zlib.crc32(system.encode()):08x}" if system else kind,
                calls,
                not user_seen,
                meta={"source": str(path.name), "line": lineno, "tokens": "usage" if tokens == "usage" else how},
                system_tokens=estimate(system) if system else 0,
            )
        )
    if not out:
        raise WorkloadError(f"{path}: the chat log holds no conversations.")
    return out


def _estimator(tokenizer: str | None) -> tuple[Callable[[str], int], str]:
    if tokenizer is None:
        return (lambda text: max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0), "estimated"
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise WorkloadError("--tokenizer needs the transformers package (installed with vLLM).") from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure is the user's path
        raise WorkloadError(f"--tokenizer {tokenizer}: cannot load a tokenizer from it ({exc}).") from None
    return (lambda text: len(tok.encode(text, add_special_tokens=False)) if text else 0), "tokenizer"


# ----------------------------------------------------------------------------------- mooncake
def read_mooncake(path: str | Path, limit: int | None = None) -> list[Conversation]:
    """Conversations from a Mooncake-format trace by its ``hash_ids``: a request that shares its
    first two or more KV blocks with an earlier request continues the conversation of the latest
    such request (one turn each; its think time is the gap between the two timestamps, the earlier
    answer's service in the original deployment included). The others open conversations."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such trace file.")
    holder: dict[int, int] = {}  # block id -> the latest request that holds it
    of: list[int] = []  # request -> its conversation
    convs: list[Conversation] = []
    last_s: list[float] = []
    for lineno, where, doc in read_jsonl(path):
        if limit is not None and len(of) >= limit:
            break
        if not isinstance(doc, dict):
            raise WorkloadError(f"{where}: expected a JSON object for the record, got {type(doc).__name__}.")
        for key in ("input_length", "output_length"):
            v = doc.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise WorkloadError(f"{where}: field '{key}' must be an integer >= 1, got {json.dumps(v)[:60]}.")
        ts, hashes = doc.get("timestamp"), doc.get("hash_ids")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise WorkloadError(f"{where}: field 'timestamp' must be a number of milliseconds >= 0.")
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise WorkloadError(f"{where}: field 'hash_ids' must be a list of integers.")
        k = 0
        while k < len(hashes) and hashes[k] in holder:
            k += 1
        t_s = ts / 1000.0
        if k >= 2:
            conv = of[holder[hashes[k - 1]]]
            c = convs[conv]
            c.calls.append(Call(doc["input_length"], doc["output_length"], max(0.0, t_s - last_s[conv]), len(c.calls)))
            last_s[conv] = t_s
        else:
            conv = len(convs)
            convs.append(
                Conversation(
                    f"mooncake-{lineno}",
                    "mooncake",
                    "mooncake",
                    [Call(doc["input_length"], doc["output_length"], 0.0, 0)],
                    arrival_s=t_s,
                    meta={"source": "mooncake", "line": lineno},
                )
            )
            last_s.append(t_s)
        for h in hashes:
            holder[h] = len(of)
        of.append(conv)
    if not convs:
        raise WorkloadError(f"{path}: the trace holds no requests.")
    return convs


# ------------------------------------------------------------------------------------ builder
def system_tokens(convs: list[Conversation]) -> dict[str, int]:
    """Each shared system prompt's length: its text's where the source shows it, else the shortest
    first prompt among the conversations that share it, less one token (at least 0)."""
    out: dict[str, int] = {}
    for c in convs:
        first = c.calls[0].prompt_tokens - 1
        if c.system_tokens is not None:
            first = min(first, c.system_tokens)
        out[c.system] = min(out.get(c.system, first), first)
    return out


def conversation_to_agent(c: Conversation, agent_id: str, arrival_s: float, shared: int) -> Agent:
    """One conversation as a session of the workload format (a stage per call), or as a
    task-parallel agent of one turn when it is ``solo``. A call's context is the previous call's
    prompt and output (what a chat API sends again), on top of the shared system prompt for the
    first; where the counts leave no own text for that, less of it."""
    stages, prev = [], None
    for k, call in enumerate(c.calls):
        tid = f"c{k}"
        if prev is None:
            context = (Segment.shared(c.system, shared),) if 0 < shared < call.prompt_tokens else ()
        elif call.prompt_tokens > prev.prompt_tokens + prev.output_tokens:
            context = (Segment.prompt_of(prev.id), Segment.output_of(prev.id))
        elif call.prompt_tokens > prev.prompt_tokens:
            context = (Segment.prompt_of(prev.id),)
        else:
            context = ()
        task = Task(call.text, call.prompt_tokens, call.output_tokens, tid, context)
        if c.solo:
            stages.append(Stage((task,)))
        else:
            opens = prev is None or call.turn != c.calls[k - 1].turn
            stages.append(Stage((task,), pause_s=call.pause_s if k else 0.0, turn=call.turn if opens else None))
        prev = task
    return Agent(agent_id, c.kind, arrival_s, tuple(stages), dict(c.meta))


def conversations_to_agents(convs: list[Conversation], arrivals: list[float] | None = None) -> list[Agent]:
    """The conversations as agents, the k-th arriving at ``arrivals[k]`` (or at its own
    ``arrival_s``); ids are the conversations' (``#n`` added where one repeats)."""
    shared = system_tokens(convs)
    seen: dict[str, int] = {}
    agents = []
    for k, c in enumerate(convs):
        n = seen[c.conv_id] = seen.get(c.conv_id, 0) + 1
        agent_id = c.conv_id if n == 1 else f"{c.conv_id}#{n}"
        at = arrivals[k] if arrivals is not None else (c.arrival_s or 0.0)
        agents.append(conversation_to_agent(c, agent_id, at, shared[c.system]))
    return sorted(agents, key=lambda a: a.arrival_s)
