"""Rate-limited reporting of what fails for as long as it takes (SPEC R2).

A client that reopens a lost connection with backoff, for as long as it takes,
must not log every attempt: a store down for ten minutes, or a broker restart
under a hundred consumers, would write thousands of lines. Two shapes of
failure, one rule for both: a few lines, however long or however many.

* `Outage`: one connection (the store, a broker) that is down and then back.
  One line when it goes down, one every `every` seconds while it stays down,
  with how long so far and how many attempts, and one when it is back. Several
  users of one connection (a transport's consumers) report under their own
  name: the outage lasts until every one of them is through again.
* `Repeats`: failures that come in numbers rather than as one outage (a
  hundred task drivers failing on the same lost broker): one line per cause,
  then a count every `every` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["Outage", "Repeats"]


class Outage:
    """The state of one connection's outage, and the few lines it is worth.

    Safe to share between threads (the store's blocking and async paths report
    to the same one)."""

    def __init__(self, log: logging.Logger, what: str, *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._what = what  # e.g. "the PostgreSQL store"
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the outage began; None while connected
        self._said = 0.0  # when it was last said
        self._down: set[Hashable] = set()  # the users still failing
        self.failures = 0  # attempts failed in this outage
        self.last: BaseException | None = None  # the latest failure, for errors to name

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException | None, by: Hashable = None) -> None:
        """An attempt by `by` failed for want of the connection."""
        now = self._clock()
        with self._lock:
            self.failures += 1
            self.last = error
            self._down.add(by)
            if self._since is None:
                self._since = self._said = now
                line: tuple[object, ...] = (
                    "%s is unreachable (%s); reconnecting until it is back", self._what,
                    _one_line(error))
            elif now - self._said >= self._every:
                self._said = now
                line = ("%s still unreachable after %.0fs (%d attempts; %s); reconnecting",
                        self._what, now - self._since, self.failures, _one_line(error))
            else:
                return
        self._log.warning(*line)

    def recovered(self, by: Hashable = None) -> None:
        """An attempt by `by` went through: once every user is, the outage is over."""
        if self._since is None:  # the common case: no lock
            return
        with self._lock:
            self._down.discard(by)
            since = self._since
            if since is None or self._down:
                return
            self._since, self.failures, self.last = None, 0, None
        self._log.warning("%s is reachable again after %.1fs", self._what,
                          self._clock() - since)

    def left(self, by: Hashable) -> None:
        """`by` stopped trying: the outage no longer waits for it to be through."""
        with self._lock:
            self._down.discard(by)


class Repeats:
    """Failures of one kind, said once per cause and then counted. A cause is the
    error's type and its cause's type (a TransportError from a refused connection),
    so the lines are bounded by kinds, not by tasks or queues named in the messages."""

    def __init__(self, log: logging.Logger, what: str, *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 level: int = logging.ERROR) -> None:
        self._log = log
        self._what = what
        self._every = every
        self._clock = clock
        self._level = level
        self._causes: dict[tuple[type[BaseException], type[BaseException] | None],
                           list[float]] = {}  # cause -> [when last said, count since]

    def failed(self, error: BaseException) -> None:
        cause = (type(error), type(error.__cause__) if error.__cause__ is not None else None)
        now = self._clock()
        said = self._causes.get(cause)
        if said is None:
            self._causes[cause] = [now, 0]
            self._log.log(self._level, "%s: %s: %s", self._what, type(error).__name__,
                          _one_line(error))
            # the first of each cause keeps its traceback, for whoever debugs
            self._log.debug("%s: the first %s", self._what, type(error).__name__,
                            exc_info=error)
            return
        said[1] += 1
        if now - said[0] >= self._every:
            self._log.log(self._level, "%s: %d more %s in %.0fs (last: %s)", self._what,
                          int(said[1]), type(error).__name__, now - said[0], _one_line(error))
            said[0], said[1] = now, 0


def _one_line(error: BaseException | str | None) -> str:
    text = " ".join(str(error or "no answer").split())
    return text or type(error).__name__
