"""systemd's readiness and watchdog protocol, for `Type=notify` units (R2).

A unit with ``Type=notify`` and ``WatchdogSec=`` gives its process a datagram
socket in ``$NOTIFY_SOCKET``: the worker says ``READY=1`` once its first
heartbeat is recorded, and ``WATCHDOG=1`` after each later one, so systemd
restarts a worker that has stopped beating (frozen, wedged, cut off from its
store) as a Kubernetes liveness probe would. Outside systemd it does nothing.
"""

from __future__ import annotations

import os
import socket

__all__ = ["notify"]


def notify(state: str) -> None:
    """Send `state` (e.g. ``READY=1``) to systemd if it listens; never raises."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):  # an abstract socket
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(path)
            sock.sendall(state.encode())
    except OSError:  # systemd went away, or the socket is not ours: nothing to tell
        pass
