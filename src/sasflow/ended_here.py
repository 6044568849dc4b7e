"""The tasks that schedulers of this process ended in a final state, or that a
waiter of this process read in one, kept so that a client that comes to wait for
one after its end is answered without a read.

A final state (processed, compensated, cancelled: `model.FINAL_TASK_STATES`) has
no way out: no planner rule and no operator action moves the task again, and
nothing deletes it. The task as its ending write left it (`transition.applied`
of the scheduler's snapshot, field for field the row: handover.py) is therefore
what every later read of it returns, from any process. Answering from here is
exact, not a cache that may go stale. A task that ended in error is not kept:
an operator may retry it (E8), and a waiter must then see the retry.

A waiter's read keeps what it found for the same reason, and it closes a gap:
a waiter that came while the ending write was on its way reads the store, and
may find the end there before the scheduler that wrote it has kept it (SQLite's
writer tells the waiters as it commits, ahead of that scheduler's next turn); a
client that comes to wait after that waiter was answered would read again.

What it saves is the read a client makes when it waits for a task that ended
before it came: an application that submits a batch and then waits for each
(the peers' protocol), or a web app that answers a status request after the
end. On PostgreSQL that read is a round trip; on SQLite, a query on the loop
the schedulers need.

The ends are kept encoded (msgpack bytes: the garbage collector does not
traverse them, and each answer decodes a copy of its own) within a byte budget,
the oldest let go first: a client that comes long after the end reads the
store, as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import msgspec

from sasflow.model import Task, final

__all__ = ["DEFAULT_BUDGET_BYTES", "EndedHere", "decode_task", "encode_task"]

# about 15,000 ends of a three-step task with small results (about 1 KB each
# encoded): several seconds of a busy process's ends
DEFAULT_BUDGET_BYTES = 16 << 20
# what one kept end costs beside its bytes: its key, the bytes' header, the entry
_ENTRY_OVERHEAD = 200

encode_task = msgspec.msgpack.Encoder().encode
decode_task = msgspec.msgpack.Decoder(Task).decode


class EndedHere:
    """The final ends written by this process's schedulers, newest kept."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self._budget = budget_bytes
        self._lock = threading.Lock()  # kept from a scheduler's loop, read from any thread
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def keep(self, task: Task, encoded: bytes) -> None:
        """`task`'s end was written (as `encoded`): kept if its state is final."""
        if not final(task.state):
            return
        size = len(encoded) + _ENTRY_OVERHEAD
        with self._lock:
            # (a task ends once: a second end of one id is not written, but stay exact)
            before = self._kept.pop(task.task_id, None)
            if before is not None:
                self._bytes -= len(before) + _ENTRY_OVERHEAD
            self._kept[task.task_id] = encoded
            self._bytes += size
            while self._bytes > self._budget and self._kept:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= len(dropped) + _ENTRY_OVERHEAD

    def keep_read(self, task: Task) -> None:
        """`task` as a read of the store found it: kept if its state is final."""
        if final(task.state):
            self.keep(task, encode_task(task))

    def get(self, task_id: str) -> Task | None:
        """A copy of the task if this process ended it in a final state (and still
        keeps it), else None: then only the store can say."""
        encoded = self._kept.get(task_id)  # one lookup: atomic, no lock needed
        return None if encoded is None else decode_task(encoded)

    def __len__(self) -> int:
        return len(self._kept)
