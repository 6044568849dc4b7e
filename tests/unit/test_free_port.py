"""The ports the tests' private servers listen on (support/ports.py): outside the
kernel's ephemeral range, so that no outbound connection is given one between its
pick and the server's listen; one test process's alone; never one in use."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import ports

TESTS = Path(__file__).resolve().parents[1]
TAKE = """
import sys
from support.ports import free_port
print(" ".join(str(free_port()) for _ in range(int(sys.argv[1]))), flush=True)
sys.stdin.read()  # held until the test lets go
"""


def ephemeral() -> range:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def test_ports_are_outside_the_ephemeral_range_and_never_given_twice() -> None:
    taken = [ports.free_port() for _ in range(200)]
    assert len(set(taken)) == len(taken)
    kernels = ephemeral()
    assert not [port for port in taken if port in kernels]
    assert all(1024 < port < 65536 for port in taken)


def test_two_test_processes_never_take_the_same_port() -> None:
    holders: list[subprocess.Popen[str]] = []
    try:
        taken: list[set[int]] = []
        for _ in range(2):  # the second takes its ports while the first holds its own
            holder = subprocess.Popen([sys.executable, "-c", TAKE, "300"], cwd=TESTS,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            holders.append(holder)
            assert holder.stdout is not None
            taken.append({int(port) for port in holder.stdout.readline().split()})
        assert len(taken[0]) == len(taken[1]) == 300
        assert not taken[0] & taken[1]
        here = {ports.free_port() for _ in range(300)}
        assert not here & (taken[0] | taken[1])
    finally:
        for holder in holders:
            holder.communicate("", timeout=60)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port in the range something listens on (not through the locks)."""
    with socket.socket() as sock:
        for port in ports.outside_ephemeral():
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            sock.listen()
            yield port
            return
    raise AssertionError("no port to listen on")


def test_a_port_something_listens_on_is_passed_over(
        listening: int, monkeypatch: pytest.MonkeyPatch) -> None:
    choose = random.choice
    first = [listening]  # picked first, then as the helper would pick
    monkeypatch.setattr(random, "choice",
                        lambda candidates: first.pop() if first else choose(candidates))
    port = ports.free_port()
    assert not first and port != listening
