"""Progress bars for long runs (rich), or nothing when they are off."""

from __future__ import annotations

import time


class progress_bar:
    """A rich progress bar over agents finished in all runs (or nothing when disabled)."""

    def __init__(self, total: int, enabled: bool, description: str = "simulating"):
        self.total, self.enabled, self.description = total, enabled, description

    def __enter__(self):
        if not self.enabled:
            return lambda label: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
        )
        self._bar.start()
        task = self._bar.add_task(self.description, total=self.total)
        last = [0.0]

        def advance(label: str) -> None:
            now = time.perf_counter()
            self._bar.update(task, advance=1, description=label)
            if now - last[0] > 0.1:
                last[0] = now
                self._bar.refresh()

        return advance

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.stop()
