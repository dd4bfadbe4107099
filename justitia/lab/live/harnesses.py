"""Agent harnesses as clients: Claude Code and Codex CLI, run headless against a Justitia server.

They are the npm packages pinned in ``tests/harnesses/package.json`` (``make harnesses`` installs
them; test-only, like the agent frameworks). Each runs in a home and a work directory of its own,
pointed at the server by the variables and the config docs/sessions.md gives as recipes, and
sends its own requests: nothing here changes them.

A random-weight model never chooses a tool, so the engine answers from ``SCRIPT``
(``justitia.engine.scripted``, loaded with ``--logits-processors``): a tool call when the user's
message asks for one, a plain answer once its result follows, a subagent through Claude Code's
``Agent`` tool. ``SESSION`` is what each harness says, turn by turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BIN = ROOT / "tests" / "harnesses" / "node_modules" / ".bin"
TIMEOUT_S = 300  # one harness command; the model answers each request in well under a second

MARK, SUBTASK, SUBDONE = "JUSTITIA-MARK-7", "SUBTASK-5", "SUBDONE-5"


def _call(name: str, arguments: dict) -> str:
    """A tool call as the ``hermes`` tool parser reads it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# (pattern, answer): the rule whose pattern matches latest in a request's prompt answers it
SCRIPT = [
    {
        "match": "(?i)run the echo tool",
        "answer": _call("Bash", {"command": f"echo {MARK}", "description": "Print a marker"}),
    },
    {"match": "(?i)run the shell tool", "answer": _call("exec_command", {"cmd": f"echo {MARK}"})},
    {"match": MARK + r"\s", "answer": "The tool printed the marker."},
    {
        "match": "(?i)ask a subagent",
        "answer": _call(
            "Agent",
            {
                "description": "Answer a task",
                "subagent_type": "general-purpose",
                "prompt": f"Answer the subagent task {SUBTASK}.",
            },
        ),
    },
    {"match": "(?i)async agent launched", "answer": "Waiting for the subagent."},
    {"match": SUBTASK, "answer": SUBDONE},
    {"match": SUBDONE, "answer": "The subagent is done."},
    {"match": "(?i)say hello", "answer": "Hello."},
]
# each harness's session: its user turns, and the answer each turn ends with
SESSION = {
    "claude-code": [
        ("Please run the echo tool.", "The tool printed the marker."),
        ("Now ask a subagent.", "The subagent is done."),
    ],
    "codex": [("Please run the shell tool.", "The tool printed the marker."), ("Now say hello.", "Hello.")],
}


def write_script(path: Path) -> Path:
    path.write_text(json.dumps(SCRIPT, indent=1))
    return path


@dataclass
class Run:
    """One harness session: its id as the harness names it, and per turn its final answer, its
    time (the harness command's wall clock) and the tokens the harness says it was served (prompt,
    cached prompt and answer tokens of all its requests)."""

    harness: str
    session_id: str | None = None
    answers: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    turn_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)  # time.monotonic() when each turn ended


def _run(cmd: list[str], env: dict, cwd: Path, run: Run) -> str:
    start = time.monotonic()
    done = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    run.ended.append(time.monotonic())
    run.turn_s.append(run.ended[-1] - start)
    run.outputs.append(done.stdout)
    return done.stdout


def claude_code(url: str, key: str, model: str, where: Path, turns=None, bin_dir: Path = BIN) -> Run:
    """A Claude Code session (``claude -p``, then ``--continue``), the Bash and Agent tools allowed."""
    home, work = where / "home", where / "work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        HOME=str(home),
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY=key,
        ANTHROPIC_MODEL=model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=model,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    run = Run("claude-code")
    for i, (prompt, _) in enumerate(turns or SESSION["claude-code"]):
        cmd = [
            str(bin_dir / "claude"),
            "-p",
            prompt,
            "--output-format",
            "json",
            "--allowedTools",
            "Bash(echo:*)",
            "Agent",
            *(["--continue"] if i else []),
        ]
        doc = json.loads(_run(cmd, env, work, run).strip().splitlines()[-1])
        run.session_id = run.session_id or doc.get("session_id")
        run.answers.append(doc.get("result", ""))
        usage = doc.get("usage") or {}
        run.tokens.append(
            sum(
                int(usage.get(k) or 0)
                for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
            )
        )
    return run


def codex(url: str, key: str, model: str, where: Path, turns=None, bin_dir: Path = BIN) -> Run:
    """A Codex CLI session (``codex exec``, then ``exec resume --last``) on the Responses API."""
    home, work = where / "home", where / "work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CODEX_HOME=str(home), JUSTITIA_KEY=key)
    provider = (
        f'model_providers.justitia={{name="justitia",base_url="{url}/v1",wire_api="responses",env_key="JUSTITIA_KEY"}}'
    )
    run = Run("codex")
    for i, (prompt, _) in enumerate(turns or SESSION["codex"]):
        cmd = [
            str(bin_dir / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--json",
            "-m",
            model,
            "-c",
            "model_provider=justitia",
            "-c",
            provider,
            *(["resume", "--last"] if i else []),
            prompt,
        ]
        answer, tokens = "", 0
        for line in _run(cmd, env, work, run).splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") == "thread.started":
                run.session_id = run.session_id or event.get("thread_id")
            item = event.get("item") or {}
            if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                answer = item.get("text", "")
            if event.get("type") == "turn.completed":  # its input_tokens include the cached ones
                usage = event.get("usage") or {}
                tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
        run.answers.append(answer)
        run.tokens.append(tokens)
    return run


HARNESSES = {"claude-code": claude_code, "codex": codex}
