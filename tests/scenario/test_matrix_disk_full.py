"""Fault matrix row 3: the disk fills up under the store while tasks run (SPEC R6, S10).

The store's files live on a small tmpfs the test mounts (it runs as root): the
SQLite file (in-process transport, one worker with every role), or a private
PostgreSQL cluster's whole data directory, WAL included (in-process transport).
A filler file takes every free byte while orders run; the worker must say why it
cannot go on (the log names the full disk), then, once the filler is deleted,
finish every order with every invariant (matrix.Run.conclude): nothing lost, no
effect twice, compensations once, no hot loop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow.examples.orders.remote import RemoteService
from support.matrix import LONG, RECOVERY, lingering, open_run, wait_started
from support.scenario import Cluster, Worker
from support.servers import PrivatePostgres
from support.services import require_root

pytestmark = pytest.mark.chaos

ORDERS = 60
DISK_FULL = ("database or disk is full", "No space left on device", "disk full")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `path` (needs root), unmounted afterwards."""
    require_root("mounting a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with one file; returns it (delete it to free)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 1 << 10, 16):  # big blocks, then what is left in small ones
            with contextlib.suppress(OSError):  # ENOSPC: full at this size
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def says_disk_full(worker: Worker) -> bool:
    text = worker.log.read_text(errors="replace")
    return any(phrase in text for phrase in DISK_FULL)


def fill_while_running(cluster: Cluster, worker: Worker, disk: Path, done: int) -> Path:
    """Once `done` orders are terminal, fill the disk; returns when the worker said so."""
    cluster.wait_for(f"{done} orders terminal",
                     lambda: sum((cluster.states() or Counter())[s]
                                 for s in ("processed", "compensated")) >= done, timeout=RECOVERY)
    filler = fill(disk)
    cluster.wait_for("the worker to say the disk is full", lambda: says_disk_full(worker),
                     timeout=RECOVERY)
    return filler


@pytest.mark.timeout(240)
def test_sqlite_disk_full_reports_and_resumes_once_freed(tmp_path: Path,
                                                         remote: RemoteService) -> None:
    """SQLite on a full disk: the worker logs the full disk; once space is freed every
    order completes, nothing lost, no effect twice."""
    with tmpfs(tmp_path / "disk", "8m") as disk, \
            open_run(tmp_path, f"sqlite:///{disk / 'store.db'}", None, remote) as run:
        run.submit(1)
        worker = run.cluster.spawn("worker", "scheduler,agent,supervisor")
        wait_started(run.cluster, [worker])
        run.submit(ORDERS, lingering)  # open while the disk fills, however fast they run
        filler = fill_while_running(run.cluster, worker, disk, 5)
        open_orders = run.submitted - sum((run.cluster.states() or Counter())[s]
                                          for s in ("processed", "compensated", "error"))
        filler.unlink()
        print(f"\ndisk full with {open_orders} orders open; the worker logged:"
              f" {first_line(worker, DISK_FULL)}")
        run.wait_all_terminal()
        run.conclude(quiet=[worker])


@pytest.mark.timeout(300)
@LONG  # a cluster of its own on the tmpfs: initdb and a minute's run
def test_postgres_disk_full_reports_and_resumes_once_freed(tmp_path: Path,
                                                           remote: RemoteService) -> None:
    """PostgreSQL whose data directory (WAL included) is on a full disk: the worker logs
    the server's 'No space left on device'; once space is freed (and the server started
    again, if it shut down) every order completes, nothing lost, no effect twice."""
    # not under pytest's tmp_path: the postgres user must reach the data directory
    mount_point = Path(tempfile.mkdtemp(prefix="sasflow-diskfull-pg-"))
    with tmpfs(mount_point, "128m") as disk:
        server = PrivatePostgres(disk, initdb_options=("--wal-segsize=1",))
        if os.geteuid() == 0:
            os.chown(disk, *_postgres_ids())
        try:
            server.start()
            url = server.create_database("diskfull")
            with open_run(tmp_path, url, None, remote) as run:
                run.submit(1)
                workers = [run.cluster.spawn("worker", "scheduler,agent"),
                           run.cluster.spawn("sup-1", "supervisor")]
                wait_started(run.cluster, workers)
                run.submit(ORDERS, lingering)
                filler = fill_while_running(run.cluster, workers[0], disk, 5)
                filler.unlink()
                restarted = not server.running()
                if restarted:  # it shut down for want of space: the operator starts it
                    server.start()
                print(f"\nthe worker logged: {first_line(workers[0], DISK_FULL)};"
                      f" server {'shut down, started again' if restarted else 'stayed up'}")
                run.wait_all_terminal()
                run.conclude(quiet=workers)
        finally:
            server.close()
    mount_point.rmdir()


def _postgres_ids() -> tuple[int, int]:
    import pwd

    user = pwd.getpwnam("postgres")
    return user.pw_uid, user.pw_gid


def first_line(worker: Worker, phrases: tuple[str, ...]) -> str:
    for line in worker.log.read_text(errors="replace").splitlines():
        if any(p in line for p in phrases):
            return line.strip()[:300]
    return "(nothing)"
