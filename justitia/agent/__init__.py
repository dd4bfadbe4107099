"""One agent's life, written once (``process``: ``AgentProcess``), what it sends and gets back and
its outcome (``calls``), and ``drive``, which runs it on asyncio. See ``process`` for the states."""

from justitia.agent.calls import AgentResult, Answer, Call, Render, RunResult
from justitia.agent.drive import drive
from justitia.agent.process import BURSTS, PRICINGS, SUBAGENTS, AgentProcess, Options

__all__ = [
    "AgentProcess",
    "AgentResult",
    "Answer",
    "BURSTS",
    "Call",
    "Options",
    "PRICINGS",
    "Render",
    "RunResult",
    "SUBAGENTS",
    "drive",
]
