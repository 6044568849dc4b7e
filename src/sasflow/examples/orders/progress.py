"""The demo's progress line (`sasflow demo`): redrawn in place on a terminal.

On a terminal one line is redrawn as the counts change, and notes (a worker
killed, a timeout) are printed above it; to a file or a pipe it is a line a
second instead, so a log of the run stays short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """One line redrawn in place on a terminal; a line a second otherwise."""

    def __init__(self, out: TextIO, total: int, states: Sequence[str]) -> None:
        self.out, self.total = out, total
        self.states = list(states)  # shown in this order, those with tasks
        self.tty = out.isatty()
        self.last = -1.0
        self.drawn = False

    def _line(self, counts: Mapping[str, int], finished: int, elapsed: float) -> str:
        width = 20
        filled = width * finished // self.total
        parts = " ".join(f"{s} {counts[s]}" for s in self.states if counts.get(s))
        return (f"{elapsed:5.1f}s [{'#' * filled}{'.' * (width - filled)}]"
                f" {finished}/{self.total}  {parts}")

    def show(self, counts: Mapping[str, int], finished: int, elapsed: float) -> None:
        if self.tty:
            self.out.write(f"\r\x1b[K{self._line(counts, finished, elapsed)}")
            self.drawn = True
        elif elapsed - self.last >= 1.0:
            self.out.write(self._line(counts, finished, elapsed) + "\n")
            self.last = elapsed
        self.out.flush()

    def done(self, counts: Mapping[str, int], finished: int, elapsed: float) -> None:
        if self.tty:
            self.out.write("\n")
        else:
            self.out.write(self._line(counts, finished, elapsed) + "\n")
        self.drawn = False
        self.out.flush()

    def note(self, message: str) -> None:
        if self.drawn:
            self.out.write("\r\x1b[K")
            self.drawn = False
        self.out.write(message + "\n")
        self.out.flush()
