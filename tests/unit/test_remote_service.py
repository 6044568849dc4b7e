"""The flaky remote service of the order demo, exercised over real loopback HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sasflow.examples.orders import remote
from sasflow.examples.orders.remote import Faults, RemoteService

Start = Callable[..., RemoteService]
NO_FAULTS = Faults()


@pytest.fixture
def start() -> Iterator[Start]:
    """Start services on port 0; every one is stopped after the test."""
    services: list[RemoteService] = []

    def _start(faults: Faults = NO_FAULTS) -> RemoteService:
        service = RemoteService(faults=faults).start()
        services.append(service)
        return service

    yield _start
    for service in services:
        service.stop()


HANG_GUARD = 60.0  # seconds: only a hang fails on it, never a slow machine


def connect(service: RemoteService, timeout: float = HANG_GUARD) -> http.client.HTTPConnection:
    url = urlsplit(service.url)
    assert url.hostname is not None
    return http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)


def send(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: Any = None,
    key: str | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def call(
    service: RemoteService,
    method: str,
    path: str,
    body: Any = None,
    key: str | None = None,
    raw: bytes | None = None,
    timeout: float = HANG_GUARD,
) -> tuple[int, Any]:
    """One request on a fresh connection."""
    conn = connect(service, timeout)
    try:
        return send(conn, method, path, body, key, raw)
    finally:
        conn.close()


def stats(service: RemoteService) -> dict[str, Any]:
    status, body = call(service, "GET", "/stats")
    assert status == 200
    assert isinstance(body, dict)
    return body


def test_ok_call_applies_effect_and_replies_with_effect_id(start: Start) -> None:
    service = start()
    status, body = call(service, "POST", "/reserve", {"order_id": 7}, key="k1")
    assert (status, body) == (
        200,
        {"operation": "reserve", "order_id": 7, "effect_id": "reserve-1"},
    )
    assert stats(service)["effects_by_operation"]["reserve"] == 1


def test_dedup_returns_same_body_and_applies_once(start: Start) -> None:
    service = start()
    first = call(service, "POST", "/charge", {"order_id": 1, "amount": 5}, key="k1")
    again = call(service, "POST", "/charge", {"order_id": 1, "amount": 5}, key="k1")
    assert first == again
    assert first[0] == 200
    s = stats(service)
    assert (s["effects"], s["deduplicated"], s["duplicate_effects"]) == (1, 1, 0)


def test_dedup_reply_is_marked_as_replayed(start: Start) -> None:
    service = start()
    conn = connect(service)
    try:
        for expected in (None, "true"):
            conn.request("POST", "/ship", json.dumps({"order_id": 1}), {"Idempotency-Key": "k"})
            response = conn.getresponse()
            response.read()
            assert response.getheader("Idempotent-Replayed") == expected
    finally:
        conn.close()


def test_transient_fault_replies_503_and_applies_nothing(start: Start) -> None:
    service = start(Faults(transient=1.0))
    for _ in range(2):  # nothing is stored, so the retry is drawn (and fails) again
        status, _body = call(service, "POST", "/reserve", {"order_id": 1}, key="k1")
        assert status == 503
    s = stats(service)
    assert (s["effects"], s["deduplicated"], s["faults"]["transient"]) == (0, 0, 2)


def test_lost_reply_applies_effect_once_and_retry_with_same_key_gets_stored_body(
    start: Start,
) -> None:
    service = start(Faults(lost=1.0))
    with pytest.raises(http.client.RemoteDisconnected):
        call(service, "POST", "/charge", {"order_id": 3}, key="k1")
    assert stats(service)["effects"] == 1

    status, body = call(service, "POST", "/charge", {"order_id": 3}, key="k1")
    assert (status, body) == (200, {"operation": "charge", "order_id": 3, "effect_id": "charge-1"})
    s = stats(service)
    assert (s["effects"], s["deduplicated"], s["faults"]["lost"]) == (1, 1, 1)


def test_slow_reply_applies_effect_and_replies_after_slow_s(start: Start) -> None:
    service = start(Faults(slow=1.0, slow_s=0.3))
    began = time.monotonic()
    status, body = call(service, "POST", "/ship", {"order_id": 4}, key="k1")
    assert time.monotonic() - began >= 0.3
    assert (status, body["effect_id"]) == (200, "ship-1")
    assert stats(service)["faults"]["slow"] == 1


def test_caller_timing_out_on_slow_reply_still_got_the_effect(start: Start) -> None:
    # a reply 2 s late: no stall of a loaded machine lets it beat the caller's 0.1 s
    service = start(Faults(slow=1.0, slow_s=2.0))
    with pytest.raises(TimeoutError):
        call(service, "POST", "/ship", {"order_id": 4}, key="k1", timeout=0.1)
    # applied before the late reply (the service's thread may not have got there yet)
    deadline = time.monotonic() + HANG_GUARD
    while stats(service)["effects"] != 1:
        assert time.monotonic() < deadline, stats(service)
        time.sleep(0.01)

    status, body = call(service, "POST", "/ship", {"order_id": 4}, key="k1")
    assert (status, body["effect_id"]) == (200, "ship-1")
    s = stats(service)  # dedup answers before any fault is drawn: no second slow reply
    assert (s["effects"], s["deduplicated"], s["faults"]["slow"]) == (1, 1, 1)


def test_declined_card_is_402_with_no_effect_even_when_faults_are_certain(start: Start) -> None:
    service = start(Faults(transient=1.0))
    status, body = call(service, "POST", "/charge", {"order_id": 5, "card": "declined"}, key="k")
    assert (status, body) == (402, {"error": "card declined"})
    s = stats(service)
    assert (s["effects"], s["faults"]["declined"], s["faults"]["transient"]) == (0, 1, 0)


def test_different_keys_for_same_operation_and_order_count_a_duplicate_effect(
    start: Start,
) -> None:
    service = start()
    assert call(service, "POST", "/charge", {"order_id": 7}, key="k1")[0] == 200
    assert call(service, "POST", "/charge", {"order_id": "7"}, key="k2")[0] == 200
    s = stats(service)
    assert (s["effects"], s["duplicate_effects"], s["deduplicated"]) == (2, 1, 0)
    assert call(service, "GET", "/effects?order_id=7") == (200, ["charge", "charge"])


def test_missing_idempotency_key_is_400_and_applies_nothing(start: Start) -> None:
    service = start()
    status, body = call(service, "POST", "/reserve", {"order_id": 1})
    assert status == 400
    assert "Idempotency-Key" in body["error"]
    assert stats(service)["requests"] == 0


def test_unknown_operation_is_404(start: Start) -> None:
    service = start()
    status, body = call(service, "POST", "/teleport", {"order_id": 1}, key="k")
    assert status == 404
    assert "error" in body


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1]", b'{"order": 1}', b'{"order_id": true}', b'{"order_id": null}'],
)
def test_body_without_json_object_with_order_id_is_400(start: Start, raw: bytes) -> None:
    service = start()
    status, body = call(service, "POST", "/reserve", key="k", raw=raw)
    assert status == 400
    assert "error" in body


def test_key_reused_for_a_different_request_is_422(start: Start) -> None:
    service = start()
    assert call(service, "POST", "/charge", {"order_id": 1}, key="k")[0] == 200
    status, _body = call(service, "POST", "/ship", {"order_id": 1}, key="k")
    assert status == 422
    assert stats(service)["effects"] == 1


def test_concurrent_posts_with_same_key_apply_exactly_one_effect(start: Start) -> None:
    service = start()
    barrier = threading.Barrier(50)

    def post(_: int) -> tuple[int, Any]:
        barrier.wait()
        return call(service, "POST", "/reserve", {"order_id": 9}, key="same")

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(post, range(50)))

    assert len(results) == 50
    assert all(result == results[0] for result in results)
    s = stats(service)
    assert (s["effects"], s["deduplicated"], s["duplicate_effects"]) == (1, 49, 0)


def test_effects_lists_operations_applied_to_an_order_in_order(start: Start) -> None:
    service = start()
    for key, (operation, order_id) in enumerate(
        [("reserve", 1), ("reserve", 2), ("charge", 1), ("ship", "1")]
    ):
        assert (
            call(service, "POST", f"/{operation}", {"order_id": order_id}, key=str(key))[0] == 200
        )
    assert call(service, "GET", "/effects?order_id=1") == (200, ["reserve", "charge", "ship"])
    assert call(service, "GET", "/effects?order_id=3") == (200, [])


def test_stats_endpoint_matches_stats_method_and_accounts_for_every_request(
    start: Start,
) -> None:
    service = start(Faults(transient=0.3, slow=0.2, slow_s=0.0, lost=0.2, seed=1))
    for i in range(40):
        key = f"k{i % 30}"  # some retries of earlier keys
        body = {"order_id": i % 30, "card": "declined" if i % 7 == 0 else "ok"}
        with contextlib.suppress(http.client.RemoteDisconnected):  # a lost reply
            call(service, "POST", "/charge", body, key=key)
    s = stats(service)
    assert s == service.stats()
    faults = s["faults"]
    assert s["requests"] == 40
    assert (
        s["requests"] == s["effects"] + s["deduplicated"] + faults["transient"] + faults["declined"]
    )
    assert min(faults.values()) > 0  # the seed exercises every fault kind


def test_same_seed_draws_the_same_faults(start: Start) -> None:
    def outcomes(service: RemoteService) -> list[int]:
        seen = []
        for i in range(30):
            try:
                seen.append(call(service, "POST", "/reserve", {"order_id": i}, key=str(i))[0])
            except http.client.RemoteDisconnected:
                seen.append(0)
        return seen

    faults = Faults(transient=0.3, lost=0.3, seed=42)
    assert outcomes(start(faults)) == outcomes(start(faults))


def test_reset_clears_everything(start: Start) -> None:
    service = start()
    call(service, "POST", "/reserve", {"order_id": 1}, key="k")
    assert call(service, "POST", "/reset") == (200, {"reset": True})
    assert stats(service)["requests"] == 0
    assert call(service, "GET", "/effects?order_id=1") == (200, [])
    # The key is forgotten too: the same call applies a fresh effect.
    assert (
        call(service, "POST", "/reserve", {"order_id": 1}, key="k")[1]["effect_id"] == "reserve-1"
    )


def test_keep_alive_connection_serves_several_requests(start: Start) -> None:
    service = start()
    conn = connect(service)
    try:
        assert send(conn, "POST", "/reserve", raw=b"{}", key="k")[0] == 400  # body drained
        assert send(conn, "POST", "/reserve", {"order_id": 1}, key="k")[0] == 200
        assert send(conn, "GET", "/stats")[1]["effects"] == 1
    finally:
        conn.close()


def test_stop_cuts_kept_alive_connections(start: Start) -> None:
    service = start()
    conn = connect(service)
    try:
        assert send(conn, "GET", "/stats")[0] == 200
        service.stop()
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            send(conn, "GET", "/stats")
    finally:
        conn.close()


def test_open_connections_counts_a_caller_until_it_hangs_up(start: Start) -> None:
    """A connection counts from its accept until its caller hung up and its handler
    finished; a kept-alive one counts between requests."""
    service = start()
    assert service.open_connections() == 0
    conn = connect(service)
    assert send(conn, "POST", "/reserve", {"order_id": 1}, key="k1")[0] == 200
    assert service.open_connections() == 1  # kept alive: its handler waits for more
    conn.close()
    deadline = time.monotonic() + 30  # a hang guard only
    while service.open_connections():
        assert time.monotonic() < deadline, "the connection never closed"
        time.sleep(0.01)


def test_fault_probabilities_must_sum_to_at_most_one() -> None:
    with pytest.raises(ValueError):
        Faults(transient=0.7, lost=0.7)


def test_module_serves_until_sigterm_and_prints_its_url() -> None:
    src = Path(remote.__file__).resolve().parents[3]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "sasflow.examples.orders.remote", "--port", "0", "--seed", "1"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        url = urlsplit(process.stdout.readline().strip())
        assert url.hostname is not None
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=HANG_GUARD)
        try:
            assert send(conn, "GET", "/stats")[1]["requests"] == 0
        finally:
            conn.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=HANG_GUARD) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
