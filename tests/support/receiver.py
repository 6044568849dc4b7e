"""A webhook receiver on 127.0.0.1 for the alert delivery tests: a real HTTP server, in
a thread, that records every POST before it answers.

It answers each POST with the next status queued by `answer` (200 once none is
left); `hold()` keeps the next answers back until `release()`, to make a sender
time out. Tests wait for a positive signal, `wait_for(n)`: the n-th request.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = ["Received", "Receiver"]

WAIT = 60.0  # seconds: a hang guard, not a claim about speed


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # by lower-case name
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def alert_id(self) -> int:
        return int(self.headers["x-sasflow-alert-id"])


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._answers: list[int] = []
        self._changed = threading.Condition()
        self._released = threading.Event()
        self._released.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._changed:
                    receiver.requests.append(Received(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    status = receiver._answers.pop(0) if receiver._answers else 200
                    receiver._changed.notify_all()
                receiver._released.wait(WAIT)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test says what it saw

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # (it looks for a shutdown every poll_interval: a test's teardown waits that long)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hooks/alerts"

    def answer(self, *statuses: int) -> None:
        """Answer the next POSTs with these statuses, in order."""
        with self._changed:
            self._answers.extend(statuses)

    def hold(self) -> None:
        """Keep every answer back (the request is recorded) until `release`."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wait_for(self, count: int) -> list[Received]:
        """The first `count` requests, once they have come."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.requests) >= count, WAIT):
                pytest.fail(f"timed out after {WAIT:.0f}s waiting for request {count};"
                            f" got {len(self.requests)}", pytrace=False)
            return self.requests[:count]

    @property
    def alert_ids(self) -> list[int]:
        with self._changed:
            return [r.alert_id for r in self.requests]

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(WAIT)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
