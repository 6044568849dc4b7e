"""A deliberately flaky remote service for the order-processing demo.

The demo's agents run in separate worker processes and call this service over
real HTTP on loopback, so every failure they must survive is a real one:

* transient: 503, nothing applied -- the caller should retry;
* slow:      the effect is applied but the reply arrives after the caller's
             deadline -- the caller sees a timeout although the work was done;
* lost:      the effect is applied, then the connection is dropped without a
             reply -- the caller cannot tell whether anything happened;
* declined:  ``charge`` with ``"card": "declined"`` is a permanent 402.

Callers make retries safe with an ``Idempotency-Key`` header: a key that
already produced an effect gets the stored reply and nothing is applied again.
Independently of keys, effects are counted per business identity
``(operation, order_id)``, so ``GET /stats`` can prove that no effect was
applied twice (``duplicate_effects`` stays 0 unless callers' keys are unstable).

Run standalone with ``python -m sasflow.examples.orders.remote --port 8765``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

OPERATIONS = ("reserve", "release", "charge", "refund", "ship")
FAULT_KINDS = ("transient", "slow", "lost", "declined")

Json = dict[str, Any]
OrderId = int | str


@dataclass(frozen=True)
class Faults:
    """Per-request fault probabilities (drawn once per non-deduplicated call)."""

    transient: float = 0.0  # reply 503, no effect applied
    slow: float = 0.0  # apply the effect, reply only after `slow_s`
    slow_s: float = 3.0
    lost: float = 0.0  # apply the effect, then drop the connection unanswered
    seed: int | None = None

    def __post_init__(self) -> None:
        probabilities = (self.transient, self.slow, self.lost)
        if any(not 0.0 <= p <= 1.0 for p in probabilities) or sum(probabilities) > 1.0:
            raise ValueError(f"fault probabilities must be in [0, 1] and sum to <= 1: {self}")
        if self.slow_s < 0:
            raise ValueError(f"slow_s must be >= 0: {self.slow_s}")


@dataclass(frozen=True)
class _Reply:
    status: int
    body: Any
    fault: str | None = None  # "slow" / "lost" change how the reply is delivered
    replayed: bool = False  # served from the idempotency store


@dataclass
class _State:
    requests: int = 0
    deduplicated: int = 0
    duplicate_effects: int = 0
    effects_by_operation: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(OPERATIONS, 0)
    )
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    # Idempotency-Key -> ((operation, order_id), first reply body).
    replies: dict[str, tuple[tuple[str, str], Json]] = field(default_factory=dict)
    # order_id -> operations applied to it, in order.
    effects_by_order: dict[str, list[str]] = field(default_factory=dict)


class _Ledger:
    """The service's bookkeeping. One lock makes check-then-apply atomic."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._lock = threading.Lock()
        self._state = _State()
        self._random = random.Random(faults.seed)

    def reset(self) -> None:
        with self._lock:
            self._state = _State()
            self._random = random.Random(self.faults.seed)  # replays the same fault sequence

    def call(self, operation: str, key: str, order_id: OrderId, body: Json) -> _Reply:
        # order_id 7 and "7" are the same order (query strings only carry text).
        identity = (operation, str(order_id))
        with self._lock:
            state = self._state
            stored = state.replies.get(key)
            # Dedup comes before any fault: a retry after a lost reply gets the stored answer.
            if stored is not None:
                if stored[0] != identity:
                    # Replaying another request's answer would silently skip this one.
                    return _Reply(422, {"error": "Idempotency-Key reused for a different request"})
                state.requests += 1
                state.deduplicated += 1
                return _Reply(200, stored[1], replayed=True)

            state.requests += 1
            if operation == "charge" and body.get("card") == "declined":
                state.faults["declined"] += 1
                return _Reply(402, {"error": "card declined"})

            fault = self._draw_fault()
            if fault is not None:
                state.faults[fault] += 1
            if fault == "transient":
                return _Reply(503, {"error": "service unavailable"})

            done = state.effects_by_order.setdefault(str(order_id), [])
            if operation in done:
                # Same business effect under a different key: the caller's key is unstable.
                state.duplicate_effects += 1
            done.append(operation)
            state.effects_by_operation[operation] += 1
            n = state.effects_by_operation[operation]
            reply = {"operation": operation, "order_id": order_id, "effect_id": f"{operation}-{n}"}
            state.replies[key] = (identity, reply)
            return _Reply(200, reply, fault=fault)

    def _draw_fault(self) -> str | None:
        # One uniform draw split into consecutive intervals; p=1.0 always hits.
        u = self._random.random()
        for kind, p in (
            ("transient", self.faults.transient),
            ("slow", self.faults.slow),
            ("lost", self.faults.lost),
        ):
            if u < p:
                return kind
            u -= p
        return None

    def stats(self) -> Json:
        # `requests` counts well-formed operation calls (400/404/422 are not), so
        # requests == effects + deduplicated + faults.transient + faults.declined.
        with self._lock:
            s = self._state
            return {
                "requests": s.requests,
                "effects": sum(s.effects_by_operation.values()),
                "effects_by_operation": dict(s.effects_by_operation),
                "duplicate_effects": s.duplicate_effects,
                "deduplicated": s.deduplicated,
                "faults": dict(s.faults),
            }

    def effects(self, order_id: str) -> list[str]:
        with self._lock:
            return list(self._state.effects_by_order.get(order_id, []))


def _parse_call(raw: bytes) -> tuple[OrderId, Json] | None:
    """Return (order_id, body) for a JSON object with an int/str order_id, else None."""
    try:
        body = json.loads(raw)
    except ValueError:  # includes JSONDecodeError and UnicodeDecodeError
        return None
    if not isinstance(body, dict):
        return None
    order_id = body.get("order_id")
    if isinstance(order_id, bool) or not isinstance(order_id, int | str):
        return None
    return order_id, body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every reply carries Content-Length
    timeout = 30  # an idle keep-alive connection must not pin a thread forever
    # headers and body go out in two writes: without this, Nagle's algorithm and the
    # client's delayed ACK hold every reply on a kept-alive connection ~40 ms
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the demo's output is the agents' story, not an access log

    def do_POST(self) -> None:
        raw = self._read_body()  # read even when rejecting, or keep-alive desyncs
        if raw is None:
            return
        path = urlsplit(self.path).path
        if path == "/reset":
            self.server.ledger.reset()
            self._send(200, {"reset": True})
            return
        operation = path.removeprefix("/")
        if operation not in OPERATIONS:
            self._send(404, {"error": f"unknown operation: {operation!r}"})
            return
        key = self.headers.get("Idempotency-Key")
        if not key:
            self._send(400, {"error": "missing Idempotency-Key header"})
            return
        parsed = _parse_call(raw)
        if parsed is None:
            self._send(400, {"error": "body must be a JSON object with order_id (int or str)"})
            return

        reply = self.server.ledger.call(operation, key, *parsed)
        if reply.fault == "lost":
            self.close_connection = True  # the effect is applied; the caller hears nothing
            return
        if reply.fault == "slow":
            time.sleep(self.server.ledger.faults.slow_s)  # outside the ledger lock
        self._send(reply.status, reply.body, replayed=reply.replayed)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/stats":
            self._send(200, self.server.ledger.stats())
        elif url.path == "/effects":
            order_ids = parse_qs(url.query).get("order_id")
            if not order_ids:
                self._send(400, {"error": "missing order_id query parameter"})
            else:
                self._send(200, self.server.ledger.effects(order_ids[0]))
        else:
            self._send(404, {"error": f"not found: {url.path}"})

    def _read_body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True  # cannot tell where the next request starts
            self._send(400, {"error": "bad Content-Length"})
            return None
        return self.rfile.read(length)

    def _send(self, status: int, body: Any, replayed: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait out a slow reply
    request_queue_size = 128  # the default backlog of 5 resets bursts of concurrent callers

    def __init__(self, address: tuple[str, int], ledger: _Ledger) -> None:
        super().__init__(address, _Handler)
        self.ledger = ledger
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    # Track connections so stop() can cut keep-alive ones: a stopped service must
    # stop answering, even on connections a client pool still holds.
    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        with self._open_lock:
            self._open.add(sock)
        return sock, address

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        if isinstance(request, socket.socket):
            with self._open_lock:
                self._open.discard(request)
        super().shutdown_request(request)

    def open_connections(self) -> int:
        with self._open_lock:
            return len(self._open)

    def close_connections(self) -> None:
        with self._open_lock:
            for sock in self._open:
                with contextlib.suppress(OSError):  # already closed by the peer
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked on read
            self._open.clear()

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        # A caller hanging up (e.g. giving up on a slow reply) is normal here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class RemoteService:
    """The flaky service on a loopback port, served from a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, faults: Faults = Faults()) -> None:
        self._address = (host, port)
        self._ledger = _Ledger(faults)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("RemoteService is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> RemoteService:
        if self._server is not None:
            raise RuntimeError("RemoteService is already started")
        self._server = _Server(self._address, self._ledger)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.05,),  # poll interval: how long stop() waits (default 0.5 s)
            name="remote-service",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()  # stop accepting; returns once serve_forever has exited
        server.close_connections()
        server.server_close()
        thread.join()
        self._server = self._thread = None

    def open_connections(self) -> int:
        """Callers' connections open now. A connection is open from its accept until its
        handler is done with it: 0 once every caller has hung up means every request
        received has been answered or dropped, so no effect is still on its way."""
        if self._server is None:
            return 0
        return self._server.open_connections()

    def stats(self) -> Json:
        """The same counters as ``GET /stats``."""
        return self._ledger.stats()

    def __enter__(self) -> RemoteService:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--transient", type=float, default=0.0)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--lost", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    faults = Faults(
        transient=args.transient, slow=args.slow, slow_s=args.slow_s, lost=args.lost, seed=args.seed
    )

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    with RemoteService(args.host, args.port, faults) as service:
        print(service.url, flush=True)  # the launcher waits for this line
        stopping.wait()


if __name__ == "__main__":
    main()
