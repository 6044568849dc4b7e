"""A process serving one call of a process-isolated agent, which hangs: a test SIGKILLs it.

``python isolatedagent.py FOLDER``: the call notes its worker process's pid in
FOLDER/hung.pid and sleeps; were it ever to wake, it would write FOLDER/shipped.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from sasflow.agent import AgentRequest
from sasflow.isolation import FunctionRef, ProcessPool
from sasflow.messages import Request
from sasflow.model import Phase, idempotency_key


def hang(req: AgentRequest) -> None:
    folder = Path(req.input["folder"])
    noted = folder / "hung.partial"
    noted.write_text(str(os.getpid()))
    noted.replace(folder / "hung.pid")
    time.sleep(3600)
    (folder / "shipped").write_text("late\n")


async def serve(folder: str) -> None:
    pool = ProcessPool("shipping", 1)
    request = Request(task_id="parcel-9", step="ship", phase=Phase.DO, agent="shipping",
                      epoch=1, input={"folder": folder}, results={},
                      idempotency_key=idempotency_key("parcel-9", "ship"),
                      complete_by=time.time() + 3600, reply_to="sasflow.reply.chaos")
    await pool.call(FunctionRef.of(hang, agent="shipping"), request, 1)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
