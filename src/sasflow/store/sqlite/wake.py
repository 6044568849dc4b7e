"""Wake-ups between the processes that share one SQLite file.

PostgreSQL tells its listeners of new work with NOTIFY; SQLite has no such
channel, so a `sasflow worker` polled for work submitted by the application, and
the application polled for the worker's results: 16 ms for a task whose steps
take 3 ms in one process. This is the missing channel: each process that wants
to hear binds a Unix datagram socket in a private directory named after the
database file, and each commit that others may wait for sends a few bytes to
every socket there.

A datagram is a hint, never the truth: whoever hears it reads the store. One
that is lost (a full receive buffer, a process that has not bound yet) costs
only the time to the next poll, which stays as the safety net. The directory
is the user's own (0700, under $XDG_RUNTIME_DIR or the temp directory), so
processes of one user hear each other; another user's processes on the same
file fall back to polling.

Messages: ``w<at>`` work is claimable from `at` (store clock);
``f<task id>`` a task reached a terminal state; ``o`` status messages were
written to the outbox. The last is told to this process's own listeners too:
an outbox relay or status stream waits for it whichever process wrote.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Callable

__all__ = ["WakeChannel"]

log = logging.getLogger("sasflow.store")

_WORK, _FINISHED, _OUTBOX = b"w", b"f", b"o"
_MAX_DATAGRAM = 4096


class WakeChannel:
    """The wake-up sockets of one database file; safe to use from any thread."""

    def __init__(self, db_path: str) -> None:
        digest = hashlib.sha256(os.path.realpath(db_path).encode()).hexdigest()[:16]
        self.directory = os.path.join(_private_base(), digest)
        self._lock = threading.Lock()
        self._own: socket.socket | None = None
        self._own_name: str | None = None
        self._sender: socket.socket | None = None
        self._peers: list[str] = []
        self._peers_seen: float | None = None  # the directory's mtime when listed
        self._work: list[Callable[[float], object]] = []
        self._finished: list[Callable[[str], object]] = []
        self._outbox: list[Callable[[], object]] = []
        self._receiver: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------ hearing
    def on_work(self, wake: Callable[[float], None]) -> Callable[[], None]:
        """Call `wake(at)` (from the channel's thread) when another process says work
        is claimable at `at`; returns the unsubscribe."""
        return self._subscribe(self._work, wake)

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)` (from the channel's thread) when another process
        ended a task; returns the unsubscribe."""
        return self._subscribe(self._finished, finished)

    def on_outbox(self, written: Callable[[], object]) -> Callable[[], None]:
        """Call `written()` (from the channel's thread, or the writer's) when any
        process, this one included, wrote status messages; returns the unsubscribe."""
        return self._subscribe(self._outbox, written)

    def _subscribe(self, into: list[Callable[..., object]], callback: Callable[..., object]
                   ) -> Callable[[], None]:
        with self._lock:
            into.append(callback)
            self._listen()

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                into.remove(callback)

        return unsubscribe

    def _listen(self) -> None:
        """Bind this process's socket and start hearing on it, once (under the lock)."""
        if self._own is not None or self._closed:
            return
        name = os.path.join(self.directory, f"{os.getpid()}-{os.urandom(4).hex()}")
        own = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for attempt in (1, 2):
            if not _make_private(self.directory):
                own.close()
                return  # not ours to use: the poll finds everything, a little later
            try:
                own.bind(name)
                break
            except OSError as error:
                if isinstance(error, FileNotFoundError) and attempt == 1:
                    continue  # the last process to leave removed the directory: again
                own.close()
                log.info("no wake-ups between processes on this store (%s): polling", error)
                return
        self._own, self._own_name = own, name
        self._receiver = threading.Thread(target=self._receive, args=(own,),
                                          name="sasflow-sqlite-wake", daemon=True)
        self._receiver.start()

    def _receive(self, own: socket.socket) -> None:
        while True:
            try:
                message = own.recv(_MAX_DATAGRAM)
            except OSError:
                return  # closed
            if not message:  # close() wakes the thread with an empty datagram
                if self._closed:
                    return
                continue
            kind, body = message[:1], message[1:].decode(errors="replace")
            with self._lock:
                work, finished = list(self._work), list(self._finished)
            try:
                if kind == _WORK:
                    at = float(body)
                    for wake in work:
                        wake(at)
                elif kind == _FINISHED:
                    for done in finished:
                        done(body)
                elif kind == _OUTBOX:
                    self._tell_outbox_here()
            except Exception:  # a listener's fault must not stop the channel hearing
                log.exception("a wake-up listener failed")

    # ------------------------------------------------------------ telling
    def work(self, at: float) -> None:
        """Tell the other processes that work is claimable from `at`."""
        self._tell(_WORK + repr(at).encode())

    def finished(self, task_id: str) -> None:
        """Tell the other processes that `task_id` reached a terminal state."""
        self._tell(_FINISHED + task_id.encode())

    def outbox(self) -> None:
        """Tell every process, this one included, that status messages were written."""
        self._tell_outbox_here()
        self._tell(_OUTBOX)

    def _tell_outbox_here(self) -> None:
        with self._lock:
            listeners = list(self._outbox)
        for written in listeners:
            written()

    def _tell(self, message: bytes) -> None:
        peers = self._current_peers()
        if not peers:
            return
        with self._lock:
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            sender = self._sender
        gone = []
        for peer in peers:
            try:
                sender.sendto(message, peer)
            except (ConnectionRefusedError, FileNotFoundError):
                gone.append(peer)  # its process died without unbinding
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.ENOBUFS):
                    log.debug("wake-up to %s not sent: %s", peer, error)
                # a full buffer: that process has wake-ups waiting already
        for peer in gone:
            with contextlib.suppress(OSError):
                os.unlink(peer)

    def _current_peers(self) -> list[str]:
        """The other processes' sockets, listed again whenever the directory changed."""
        try:
            changed = os.stat(self.directory).st_mtime_ns
        except OSError:
            return []
        with self._lock:
            if changed != self._peers_seen:
                try:
                    names = os.listdir(self.directory)
                except OSError:
                    names = []
                self._peers = [os.path.join(self.directory, n) for n in names
                               if os.path.join(self.directory, n) != self._own_name]
                self._peers_seen = changed
            return self._peers

    def close(self) -> None:
        with self._lock:
            self._closed = True
            own, name, sender = self._own, self._own_name, self._sender
            self._own = self._sender = None
        if own is not None and name is not None:
            with contextlib.suppress(OSError), socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM) as waker:
                waker.sendto(b"", name)  # the receiving thread's cue to stop
            with contextlib.suppress(OSError):
                os.unlink(name)
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)  # the last to leave: no directory per test file
        if self._receiver is not None and self._receiver is not threading.current_thread():
            self._receiver.join(timeout=5)
        for sock in (own, sender):
            if sock is not None:
                sock.close()


def _private_base() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "sasflow-wake")
    return os.path.join(tempfile.gettempdir(), f"sasflow-wake-{os.getuid()}")


def _make_private(directory: str) -> bool:
    """Create `directory` (and its parent) as this user's own, 0700; False if a
    directory of that name exists and is not (another user's, or a link)."""
    for path in (os.path.dirname(directory), directory):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or (
                info.st_mode & 0o077):
            log.info("wake-up directory %s is not this user's own: polling", path)
            return False
    return True
