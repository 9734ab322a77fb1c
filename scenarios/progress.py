"""Progress bars for long runs (rich.progress), one per named stage, on stderr.

In a terminal the bars redraw in place; elsewhere (CI logs, a pipe) rich prints nothing
transient, so no control characters leak into the output.
"""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressBars:
    """``with ProgressBars(console) as bars: bars.update("calibration", 3, 51)``."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self._console = console
        self._progress = Progress(TextColumn("{task.description:<18}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                  disable=not (enabled and console.is_terminal), transient=False)
        self._tasks: dict[str, int] = {}
        self._enabled = enabled

    def __enter__(self) -> "ProgressBars":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._progress.stop()

    def update(self, what: str, done: int, total: int) -> None:
        if what not in self._tasks:
            self._tasks[what] = self._progress.add_task(what, total=total)
        elif self._progress.tasks[self._tasks[what]].completed == done:
            return
        self._progress.update(self._tasks[what], completed=done, total=total)
        if self._enabled and self._progress.disable and done >= total:
            self._console.print(f"… {what}: {done}/{total}")  # a log line where bars can't draw

    def print(self, text: str) -> None:
        """A line above the bars (or a plain line without a terminal)."""
        if self._enabled:
            self._progress.console.print(text)

    def say(self, msg: str, transient: bool = False) -> None:
        """A runner's progress in words (``say(msg, transient)``): a dim line above the bars;
        transient messages (the per-second status) are left to the bars."""
        if self._enabled and not transient:
            self._progress.console.print(f"[dim]… {escape(msg)}[/dim]")
