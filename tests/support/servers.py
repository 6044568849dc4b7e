"""Private servers a scenario can crash and restart without touching the machine's own.

* PrivatePostgres: a PostgreSQL cluster of its own (initdb in a temporary
  directory owned by the ``postgres`` user), on a free port, listening on
  127.0.0.1 only; one per test session, each test in a database of its own.
  ``restart(crash=True)`` is ``pg_ctl stop -m immediate`` (no shutdown
  checkpoint: the next start replays the WAL, as after a power cut), then a
  start on the same port.
* PrivateRedis: a ``redis-server`` child on a free port. It keeps an
  append-only file fsynced on every write (``--appendonly yes --appendfsync
  always``), so a SIGKILL loses nothing that was acknowledged: a restart then
  behaves like RabbitMQ's durable queues and persistent messages, and the
  scenario checks the transports' reconnect and redelivery rather than a loss.
  ``persistent=False`` gives the other Redis, whose restart loses every stream
  (then only the supervisor's step expiry can bring the lost requests back).
* PrivateRabbit: a RabbitMQ node of its own (``sasflow-test-<port>@localhost``)
  with its own data directory, logs, Erlang cookie and epmd port, no plugins.
  ``restart(crash=True)`` SIGKILLs the whole node, then boots it again on the
  same data directory, so durable queues and their persistent messages survive.

Every server is started, watched and stopped by the test process alone, every
wait has a deadline, and ``close()`` always leaves nothing running.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from support.ports import free_port

# A hang guard: a server starting on a loaded 2-core machine beside a whole test run
# (RabbitMQ's Erlang VM above all) can take a minute, never this long
STARTUP_TIMEOUT = 180.0


def wait_for_port(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}"
                                   f" within {timeout:.0f}s") from None
            time.sleep(0.05)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text)


def _run(command: list[str], timeout: float = STARTUP_TIMEOUT,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                            stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n"
                           f"{result.stdout}\n{result.stderr}")
    return result


# ---------------------------------------------------------------- PostgreSQL
def postgres_bindir() -> Path:
    """$SASFLOW_TEST_PG_BIN, else the newest /usr/lib/postgresql/*/bin with an initdb."""
    given = os.environ.get("SASFLOW_TEST_PG_BIN")
    if given:
        return Path(given)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (set SASFLOW_TEST_PG_BIN)")
    return Path(found[-1]).parent


class PrivatePostgres:
    """A PostgreSQL cluster in a temporary directory, run by the ``postgres`` user."""

    def __init__(self, root: Path | None = None, *, initdb_options: tuple[str, ...] = ()) -> None:
        """In a new temporary directory, or in `root` (a file system the test made, say)."""
        self.bindir = postgres_bindir()
        # PostgreSQL refuses to run as root: as root, the cluster belongs to `postgres`
        self._as = (["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else [])
        self.root = root or Path(tempfile.mkdtemp(prefix="sasflow-scenario-pg-"))
        self.initdb_options = initdb_options
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.restarts = 0

    def _ctl(self, *args: str) -> None:
        _run([*self._as, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args])

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            _run([*self._as, str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust",
                  "-U", "postgres", "--no-sync", *self.initdb_options])
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
                   " -c fsync=on -c max_connections=300")
        try:
            self._ctl("-l", str(self.log), "-o", options, "-w", "-t",
                      str(int(STARTUP_TIMEOUT)), "start")
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n{tail(self.log)}") from None
        return self

    def stop(self, *, crash: bool = False) -> None:
        self._ctl("-m", "immediate" if crash else "fast", "-w", "stop")

    def restart(self, *, crash: bool = True) -> float:
        """Stop (by default as a crash) and start again on the same port; returns downtime."""
        began = time.monotonic()
        self.stop(crash=crash)
        self.start()
        self.restarts += 1
        return time.monotonic() - began

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def close(self) -> None:
        try:
            if self.running():
                self.stop(crash=True)  # nothing here is worth a checkpoint
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------- Redis
class PrivateRedis:
    """A redis-server child process on a free port."""

    def __init__(self, root: Path, *, persistent: bool = True) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.persistent = persistent
        self.port = free_port()
        self.log = root / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        durability = (["--appendonly", "yes", "--appendfsync", "always"] if self.persistent
                      else ["--appendonly", "no"])
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                   "--dir", str(self.root), "--save", "", "--daemonize", "no",
                   "--logfile", str(self.log), *durability]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        try:
            wait_for_port(self.port, STARTUP_TIMEOUT, "redis-server")
            if self.process.poll() is not None:  # the port was taken meanwhile: not ours
                raise RuntimeError(f"redis-server exited {self.process.returncode}")
        except RuntimeError as error:
            self.kill()
            raise RuntimeError(f"{error}\n{tail(self.log)}") from None
        return self

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def restart(self) -> float:
        """SIGKILL and start again on the same port and directory; returns the downtime."""
        began = time.monotonic()
        self.kill()
        self.start()
        self.restarts += 1
        return time.monotonic() - began

    def close(self) -> None:
        self.kill()


# ---------------------------------------------------------------- RabbitMQ
RABBIT_BIN = Path(os.environ.get("SASFLOW_TEST_RABBIT_BIN", "/usr/lib/rabbitmq/bin"))


class PrivateRabbit:
    """A RabbitMQ node of its own; the guest user works from 127.0.0.1 as usual."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.node = f"sasflow-test-{self.port}@localhost"
        self.epmd_port = free_port()
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"  # the node's and rabbitmqctl's, nobody else's
        cookie.write_text(os.urandom(16).hex())
        cookie.chmod(0o400)
        plugins = root / "enabled_plugins"
        plugins.write_text("[].\n")
        (root / "rabbitmq-env.conf").write_text("")  # not the machine's NODENAME & co.
        self.log = root / "server.out"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(home),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq"),  # none: the defaults
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
            "RABBITMQ_PID_FILE": str(root / "rabbit.pid"),
            # no busy-waiting schedulers: on a small machine they take the CPU the
            # workers need (the machine's own node runs with the same flags)
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ("-kernel inet_dist_use_interface {127,0,0,1}"
                                                    " +sbwt none +sbwtdcpu none +sbwtdio none"),
            # an epmd of its own: the node never registers with the machine's
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        })
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def ctl(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return _run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.node, *args], timeout=timeout,
                    env=self.env)

    def start(self) -> PrivateRabbit:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self.env,
                                            cwd=self.root, stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            # await_startup fails at once while the node has not registered with epmd yet
            try:
                self.ctl("await_startup", "--timeout", "60", timeout=75)
                break
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ node {self.node} did not start: {error}\n"
                                       f"{tail(self.log)}") from None
                time.sleep(0.2)
        wait_for_port(self.port, 10, "RabbitMQ")
        return self

    def kill(self) -> None:
        """SIGKILL the node (the script, the Erlang VM and its helpers: one process group)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None
        # the VM may have been in its own group (exec'ed by the script): the pid file says
        pid_file = self.root / "rabbit.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _listening(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self, *, crash: bool = True) -> float:
        """Crash (SIGKILL) or stop the node, then boot it on the same data; the downtime."""
        began = time.monotonic()
        if crash:
            self.kill()
        else:
            self.ctl("stop")
            if self.process is not None:
                self.process.wait(timeout=30)
                self.process = None
        self.start()
        self.restarts += 1
        return time.monotonic() - began

    def close(self) -> None:
        try:
            self.kill()
        finally:
            # the node's own epmd (started by the VM, detached): ask it to go
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["epmd", "-port", str(self.epmd_port), "-kill"],
                               capture_output=True, timeout=10, env=self.env, check=False)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False
