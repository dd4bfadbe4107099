"""The step log: one CSV line per engine step, written by the plug-in's base (``StepLogScheduler``)
and read by the lab (``lab.live.runner`` for a run's steps, ``lab.live.calibrate`` for the latency fit and
the measured M). The format is in docs/formats.md ("Step log").

A line holds ``StepRow``'s fields in order, comma-separated, no header: ``t_s`` with six decimals,
every other field an integer. Older logs have fewer columns (7: up to ``preemptions``; 9: up to
``delivered_kv``; 10: up to ``sched_us``; 12: up to ``finished``); their rows read with the missing
fields None, and a reader that needs a field skips the rows or runs without it.

Needs no vLLM: the lab reads logs without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import IO


@dataclass(frozen=True, slots=True)
class StepRow:
    """One engine step, as the step log records it."""

    t_s: float  # seconds from the log's opening (the reset that opened it) to when the step was scheduled
    # (in a log ``JUSTITIA_STEP_LOG`` names: the system's monotonic clock, ``time.monotonic``)
    batched_tokens: int  # tokens computed in the step: prefill chunks and decodes
    decode_context_tokens: int  # KV tokens the step's decoding requests attend to
    prefill_reqs: int  # requests in the step that prefill
    decode_reqs: int  # requests in the step that decode
    busy_after: int  # 1: requests were left after the step, so the next one followed at once; else 0
    preemptions: int = 0  # requests preempted (recompute) since the previous line was written
    # -- columns added later: None in a log written before them
    waiting_before: int | None = None  # requests waiting when the step was scheduled
    delivered_kv: int | None = None  # KV tokens held by the step's sampling requests (KV token-iterations)
    sched_us: int | None = None  # microseconds in the scheduler's schedule and update_from_output (vLLM's too)
    arrived_before: int | None = None  # new requests the engine took in since the previous step
    finished: int | None = None  # requests that ended (finished or aborted) in the step
    prefill_attention: int | None = None  # the prefill chunks' attention pairs (accounting.prefill_attention), summed

    def line(self) -> str:
        """The row as a step-log line (its fields up to the first missing one), newline included."""
        values = [getattr(self, name) for name in COLUMNS[1:]]
        if None in values:
            values = values[: values.index(None)]
        return f"{self.t_s:.6f}" + "".join(f",{v}" for v in values) + "\n"


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(StepRow))  # the line's columns, in order
REQUIRED_COLUMNS = 6  # the oldest logs' columns (up to busy_after)


def parse_row(line: str) -> StepRow:
    """One step-log line (without its newline) as a row; a line of the wrong shape raises ValueError."""
    t, *rest = line.split(",")
    if not REQUIRED_COLUMNS <= len(rest) + 1 <= len(COLUMNS):
        raise ValueError(f"a step-log line has {REQUIRED_COLUMNS} to {len(COLUMNS)} columns, this one {len(rest) + 1}.")
    try:
        return StepRow(float(t), *(int(x) for x in rest))
    except ValueError:
        raise ValueError(f"a step-log line is a number of seconds, then integers: {line!r}.") from None


def read_step_log(path: str | Path) -> list[StepRow]:
    """Every row of the step log at ``path``, in order; a bad line raises ValueError naming it."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line:
            try:
                rows.append(parse_row(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
    return rows


class StepLogWriter:
    """Appends rows to a step log file, buffered (``close`` flushes); ``by_line``: each row written as
    it comes (a log an engine keeps until it is stopped, which may never close it); ``origin``: added
    to every row's time (such a log's times are the system's monotonic clock, which a reader in
    another process shares)."""

    def __init__(self, path: str | Path, by_line: bool = False, origin: float = 0.0):
        self._file: IO[str] = open(path, "a", buffering=1 if by_line else 1 << 16)
        self._origin = origin

    def write(self, row: StepRow) -> None:
        self._file.write((replace(row, t_s=row.t_s + self._origin) if self._origin else row).line())

    def close(self) -> None:
        self._file.close()
