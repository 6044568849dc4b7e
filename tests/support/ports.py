"""Loopback ports for the servers the tests start, that nothing else takes meanwhile.

The kernel's pick of a free port (bind to port 0, close) is a port of the ephemeral
range: between the pick and the server's listen, any outbound connection on the
machine may be given it as its local port. CI saw a private RabbitMQ node fail with
`eaddrinuse` that way, and a server restarted on its port races every connection
for it again. So a port here comes from below the ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), where the kernel hands out none, and is
held by a lock file for the life of the test process that took it, so that no
other test process (the suite runs in several) takes it too. A port whose lock is
free but that something listens on, or that is in TIME_WAIT, is passed over.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

__all__ = ["free_port", "outside_ephemeral"]

_LOCKS = Path(tempfile.gettempdir()) / "sasflow-test-ports"
_LOWEST = 10_000  # below: ports that well-known services of the machine may hold
_held: dict[int, int] = {}  # port -> the open lock file that holds it


def outside_ephemeral() -> range:
    """The ports below the kernel's ephemeral range (or above it, if it starts low)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    if low - _LOWEST >= 2_000:
        return range(_LOWEST, low)
    return range(high + 1, 65536)


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, this test
    process's alone until it exits."""
    _LOCKS.mkdir(mode=0o777, exist_ok=True)
    candidates = outside_ephemeral()
    for _ in range(1_000):
        port = random.choice(candidates)
        if port in _held:
            continue
        lock = os.open(_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another test process holds it
            os.close(lock)
            continue
        if _bindable(port):
            _held[port] = lock
            return port
        os.close(lock)
    raise RuntimeError(f"no free loopback port in {candidates} after 1,000 tries")


def _bindable(port: int) -> bool:
    # Without SO_REUSEADDR: a port in TIME_WAIT is refused too, and passed over
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True
