"""Operator commands against a PostgreSQL store that does not answer: one line, soon,
naming the cause."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from support.cli import SHOP
from support.faultproxy import fault_proxy
from support.ports import free_port
from support.servers import PrivatePostgres

# Hang guard, not a measure: five times the commands' 5 s connect budget, and less
# than the 30 s the pool used to wait before it gave up.
HANG_GUARD = 25.0


def sasflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sasflow.cli", *args], capture_output=True,
                          text=True, timeout=HANG_GUARD)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("sasflow: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [
    ("tasks", "list"), ("tasks", "show", "t1"), ("alerts", "list"), ("db", "upgrade"),
])
def test_a_command_against_a_postgres_store_that_is_down_prints_one_line(
        command: tuple[str, ...]) -> None:
    """Nothing listens on the port: the command gives up within its connect budget and
    prints one error line, none of the client library's retry warnings."""
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    line = one_error_line(sasflow(*command, "--store", down))
    assert "PostgreSQL" in line


@pytest.fixture(scope="module")
def password_postgres() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL asking TCP clients for a SCRAM password (the machine's own
    server trusts 127.0.0.1, so it cannot refuse one)."""
    server = PrivatePostgres().start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("ALTER ROLE postgres PASSWORD 'the-right-one'")
            hba = conn.execute("SHOW hba_file").fetchone()
        assert hba is not None
        subprocess.run(["runuser", "-u", "postgres", "--", "sh", "-c",
                        "printf 'local all all trust\\nhost all all 127.0.0.1/32"
                        f" scram-sha-256\\n' > {hba[0]}"], check=True, timeout=30)
        with psycopg.connect(f"{server.url()}?password=the-right-one",
                             autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        server.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word (a black hole that
    forwards nowhere)."""
    with fault_proxy(5432) as silent:
        silent.set_mode("black-hole")
        yield silent.port


def test_healthcheck_names_a_refused_port() -> None:
    """Nothing listens: 'connection refused'."""
    line = one_error_line(sasflow("healthcheck", "--store",
                                  f"postgresql://postgres@127.0.0.1:{free_port()}/test"))
    assert line.endswith(": connection refused"), line


def test_healthcheck_names_a_missing_database(postgres_server: str) -> None:
    """The server answers, the database is not there: it says which."""
    line = one_error_line(sasflow("healthcheck", "--store",
                                  "postgresql://postgres@127.0.0.1:5432/no_such_db_here"))
    assert line.endswith(': database "no_such_db_here" does not exist'), line


def test_healthcheck_names_a_wrong_password(password_postgres: PrivatePostgres) -> None:
    """The server refuses the password: 'authentication failed' (and no password shown)."""
    url = f"postgresql://postgres:the-wrong-one@127.0.0.1:{password_postgres.port}/postgres"
    line = one_error_line(sasflow("healthcheck", "--store", url))
    assert line.endswith(": authentication failed"), line
    assert "the-wrong-one" not in line


def test_healthcheck_names_a_server_that_does_not_answer(silent_port: int) -> None:
    """The port accepts and stays silent: 'timed out'."""
    line = one_error_line(sasflow("healthcheck", "--timeout", "2", "--store",
                                  f"postgresql://postgres@127.0.0.1:{silent_port}/test"))
    assert line.endswith(": timed out"), line


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:notaport/test",
    "postgresql://postgres@127.0.0.1:5432/test?sslmode=sometimes",
])
@pytest.mark.parametrize("command", [("tasks", "list"), ("worker", SHOP)])
def test_a_postgres_url_no_server_can_accept_is_refused_at_once(
        url: str, command: tuple[str, ...]) -> None:
    """A URL libpq cannot use (a port that is no number, an unknown sslmode) is a bad
    setting, not an outage: one line naming it, even from a worker, which would
    otherwise wait for the database for as long as it takes (R2)."""
    done = sasflow(*command, "--store", url)
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == (2 if command[0] == "worker" else 1), done.stderr  # + its start line
    assert lines[-1].startswith("sasflow: error: bad PostgreSQL URL"), done.stderr
    assert "notaport" in lines[-1] or "sometimes" in lines[-1]
