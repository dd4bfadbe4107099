"""Justitia: fair and efficient scheduling of task-parallel LLM agents (selective pampering)."""

__version__ = "0.1.0"
