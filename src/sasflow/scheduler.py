"""The Scheduler: claims tasks and runs their steps in order (SPEC S2, E3, E6, M1, M4).

For each claimed task a driver sends the current unit's request to its agent
and waits for the reply until the unit's complete-by. A reply becomes a
Transition (the planner, plan/) applied with the fence `locked_by = me AND epoch = mine`:
if the task was taken away meanwhile, nothing is written and the driver lets
go. No reply by the complete-by: the driver simply stops (E7); the supervisor
will find the task and release it. A restarted or different instance resumes
any task at its first unfinished step, since the store, not memory, says where
each task stands (M4).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping

from sasflow import tracing
from sasflow.deadlines import Deadlines
from sasflow.errors import PayloadError, StoreError
from sasflow.handover import NO_HANDOVER, NO_WAITERS, Waiters
from sasflow.logs import log_context, log_step
from sasflow.loop_calls import tell
from sasflow.messages import Reply, Request, decode_reply, encode_within
from sasflow.model import Phase, Task, TaskState, terminal
from sasflow.outage import Repeats
from sasflow.plan import Plan
from sasflow.store.interfaces import ClaimRule, Store
from sasflow.testing import failpoints
from sasflow.transition import Transition, applied
from sasflow.transport.base import ImmediateHandler, Transport, agent_queue, reply_queue
from sasflow.transport.dead_letter import decoded

__all__ = ["Scheduler"]

log = logging.getLogger("sasflow.scheduler")

_FIRST_POLL = 0.005  # seconds before the first claim attempt of an idle spell
_IDLE_POLL_MAX = 0.25  # seconds between claim attempts when there is no work
# ... when the store tells of new work (PostgreSQL's NOTIFY): polling is then
# only the safety net, not how work is found
_IDLE_POLL_MAX_WATCHED = 2.0
# When tasks arrive one by one faster than one per _BUSY_GAP, each claim would be a
# transaction of its own: wait _GATHER_S and claim what came meanwhile in one go.
# A task arriving after a quiet spell is still claimed at once.
_BUSY_GAP = 0.001
_GATHER_S = 0.002


class Scheduler:
    def __init__(self, store: Store, transport: Transport, plans: Mapping[str, Plan], *,
                 instance_id: str, concurrency: int = 64,
                 on_applied: Callable[[Transition], None] = lambda t: None,
                 on_released: Callable[[Transition], None] | None = None,
                 waiters: Waiters = NO_WAITERS) -> None:
        self.store = store
        self.transport = transport
        self.plans = plans
        self.instance_id = instance_id
        self.concurrency = concurrency
        # the metrics' count, of a transition that let its task go (locked_by None)
        self.on_applied, self.on_released = on_applied, on_released
        # the clients of this process waiting for the tasks it drives: told what it
        # drives and lets go of, and handed each task as its end is written (signals.py)
        self.waiters = waiters
        self.reply_queue = reply_queue(instance_id)
        self._held: dict[str, Task] = {}  # the tasks this instance drives, by id
        self._waiting: dict[str, tuple[int, str, Phase, asyncio.Future[Reply | None]]] = {}
        self._drivers: dict[str, asyncio.Task[None]] = {}  # by task id: one a task
        self._promised = 0  # slots promised to submissions that claim for this instance
        self._promising = threading.Lock()  # submitters ask from any thread
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._short_of_slots = False  # the last claim may have left work for want of slots
        # a lost broker fails every driver at once: one line per cause, not a traceback each
        self._failures = Repeats(log, "task driver failed; its task is left to the supervisor")
        self._tracing = tracing.configured()  # None unless a tracer provider is set up
        # RabbitMQ's confirm may come after the reply: the reply, or a failed publish, ends a wait
        self._publish_soon: Callable[[str, bytes], asyncio.Future[None]] | None = getattr(
            transport, "publish_soon", None)

    def wake(self) -> None:
        """Look for work now (a task was submitted or released in this process)."""
        self._wake.set()

    def wake_at(self, at: float) -> None:
        """Look for work at the store time `at` (the store heard of work for then)."""
        delay = at - self.store.now()
        if delay <= 0:
            self._wake.set()
        else:
            asyncio.get_running_loop().call_later(delay, self._wake.set)

    @property
    def in_flight(self) -> int:
        return len(self._drivers)

    # ------------------------------------------------ tasks claimed as they are submitted
    def promise(self, workflow: str, version: str) -> ClaimRule | None:
        """A slot for a task this process submits and claims for this instance in the
        submission's own transaction (Store.submit_claimed), and the rule to claim it
        by; None if this instance does not run that version or has no slot free. Any
        thread may ask; the submitter then calls `adopt` (on this scheduler's loop) or
        `unpromise`."""
        plan = self.plans.get(workflow)
        if not self._running or plan is None or plan.version != version:
            return None
        with self._promising:
            if len(self._drivers) + self._promised >= self.concurrency:
                return None
            self._promised += 1
        return plan

    def unpromise(self) -> None:
        """The promised slot is not needed (the task existed, or its write failed): any
        thread."""
        with self._promising:
            self._promised -= 1
        loop = self._loop
        if self._short_of_slots and loop is not None:  # the claim loop may wait for it
            tell(loop, self._wake.set)  # (False: its loop closed, it stopped)

    def adopt(self, task: Task) -> None:
        """Drive `task`, claimed for this instance with its submission, in the promised
        slot (on this scheduler's loop). Stopped meanwhile, it hands the task back at
        once, as a stop does."""
        with self._promising:
            self._promised -= 1
        if self._running:
            self._start(task)
            return
        handing_back = asyncio.ensure_future(self.store.apply(self._release(task)))
        # (if that fails too, the supervisor releases the task at its complete-by)
        handing_back.add_done_callback(lambda done: done.cancelled() or done.exception())

    def _start(self, task: Task) -> None:
        # held from now on, not from when its driver first runs (a shutdown in between
        # still hands it back); one driver a task, the last claim's
        self._held[task.task_id] = task
        self.waiters.driving(task.task_id)
        if stale := self._drivers.get(task.task_id):  # waits on an attempt since released
            stale.cancel()
        driver = self._drivers[task.task_id] = asyncio.create_task(self._drive(task))
        # (when the driver ends, even cancelled before it ran)
        driver.add_done_callback(functools.partial(self._driver_done, task.task_id))

    async def run(self) -> None:
        consumer = asyncio.create_task(self.transport.consume(
            self.reply_queue, ImmediateHandler(self._on_reply), prefetch=max(64, self.concurrency)))
        watcher = asyncio.create_task(self.store.watch(self.wake_at))
        self._loop = asyncio.get_running_loop()
        self._deadlines = Deadlines(self._loop)  # the drivers' waits for replies
        self._running = True
        try:
            await self._claim_loop(watcher)
        finally:
            self._running = False
            consumer.cancel()
            watcher.cancel()
            for driver in list(self._drivers.values()):
                driver.cancel()
            await asyncio.gather(consumer, watcher, *self._drivers.values(),
                                 return_exceptions=True)
            await self._release_held()

    async def _release_held(self) -> None:
        """On shutdown, hand held tasks back at once instead of letting them expire."""
        transitions = [self._release(t) for t in self._held.values()
                       if t.locked_by == self.instance_id]
        self._held.clear()
        if transitions:
            results = await asyncio.gather(*(self.store.apply(t) for t in transitions),
                                           return_exceptions=True)
            log.info("released %d task(s) on shutdown", sum(r is True for r in results))

    def _release(self, task: Task) -> Transition:
        """Handing `task` back now, as a stop does (no failure counted)."""
        return self.plans[task.workflow].release(task, self.instance_id, self.store.now())

    async def _claim_loop(self, watcher: asyncio.Task[None]) -> None:
        loop = asyncio.get_running_loop()
        idle = _FIRST_POLL
        last_claim = 0.0
        while True:
            # cleared before looking, so a wake-up that comes while we look is kept
            self._wake.clear()
            free = self.concurrency - len(self._drivers) - self._promised
            self._short_of_slots = free <= 0
            if free > 0:
                try:
                    claimed = await self._claim(free)
                except StoreError as error:  # the store logs its outage itself
                    log.warning("claim failed: %s", error)
                    await asyncio.sleep(_IDLE_POLL_MAX)
                    continue
                except Exception:  # the store hiccupped: try again after a pause
                    log.exception("claim failed")
                    await asyncio.sleep(_IDLE_POLL_MAX)
                    continue
                for task in claimed:
                    self._start(task)
                if claimed:
                    if watcher.done():
                        # nothing tells of new work: look again soon. When the store
                        # does tell, an early look after each claim only finds nothing,
                        # a round trip to the store in the middle of the tasks it claimed
                        idle = _FIRST_POLL
                    if len(claimed) == free:
                        self._short_of_slots = True
                        continue  # there may be more: come back when a slot frees
                    previous, last_claim = last_claim, loop.time()
                    if last_claim - previous < _BUSY_GAP:
                        # busy: let a few more tasks arrive and claim them in one go
                        await asyncio.sleep(_GATHER_S)
                        continue
            try:
                async with asyncio.timeout(idle):
                    await self._wake.wait()  # work submitted or released here, or a free slot
            except TimeoutError:
                idle = min(idle * 2, _IDLE_POLL_MAX_WATCHED if not watcher.done()
                           else _IDLE_POLL_MAX)

    async def _claim(self, limit: int) -> list[Task]:
        """Claim up to `limit` tasks; what a claim took is held even if this is cancelled.

        A stop can arrive while the claim is on its way back from the store, after
        it committed: its tasks must still be handed back on shutdown, not left
        locked until their complete-by passes.
        """
        claiming = asyncio.ensure_future(self.store.claim(self.instance_id, limit, self.plans))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                for task in await claiming:
                    self._held[task.task_id] = task
            raise

    def _driver_done(self, task_id: str, driver: asyncio.Task[None]) -> None:
        if self._drivers.get(task_id) is driver:  # not a stale one (_start)
            del self._drivers[task_id]
            self.waiters.let_go(task_id)
        error = None if driver.cancelled() else driver.exception()
        if error is not None:  # its task is left to the supervisor (see _drive)
            self._failures.failed(error)
        if self._short_of_slots:
            # a slot is free, and work may be waiting for one. Otherwise the last claim
            # took all there was, and new work wakes the loop itself: looking now would
            # cost a claim per task for nothing
            self._wake.set()

    async def _drive(self, task: Task) -> None:
        """Run the task's units one after another while this instance holds it."""
        if failpoints.ARMED: await failpoints.hit("scheduler.after_claim")  # noqa: E701
        plan = self.plans[task.workflow]
        loop = asyncio.get_running_loop()
        try:
            # every record logged while it drives, by it, the store or the transport,
            # names the task, its epoch and the step (logs.py)
            with log_context(task_id=task.task_id, epoch=task.epoch):
                await self._run_units(task, plan, loop)
        except Exception:
            # A failed driver (the transport or the store raised) forgets its task and
            # leaves it to expire: the supervisor then releases it and counts a failure
            # (S8), which bounds retries of a lasting fault. Handing it back at once
            # would claim and fail again in a hot loop, and could start a request
            # already published a second time before its complete-by.
            self._held.pop(task.task_id, None)
            raise
        finally:
            held = self._held.get(task.task_id)
            if held is None or held.locked_by != self.instance_id:
                self._held.pop(task.task_id, None)

    async def _run_units(self, task: Task, plan: Plan, loop: asyncio.AbstractEventLoop) -> None:
        # tracing off, or the task's trace dropped by the sampler (asked once a drive),
        # a step pays one check here and two more like it (in _run_unit)
        traced = self._tracing if self._tracing and self._tracing.kept(task.task_id) else None
        while task.locked_by == self.instance_id and task.state in (
                TaskState.PROCESSING, TaskState.COMPENSATING):
            request = self._request(task)
            log_step(request.step)
            attempt = None if traced is None else traced.attempt_span(task, request)
            if attempt is None:
                after = await self._run_unit(task, request, plan, loop, None)
            else:
                with attempt:
                    after = await self._run_unit(task, request, plan, loop, attempt)
            if after is None:
                return
            task = after

    async def _run_unit(self, task: Task, request: Request, plan: Plan,
                        loop: asyncio.AbstractEventLoop,
                        attempt: tracing.Attempt | None) -> Task | None:
        """One attempt at the task's current unit: the task once its reply is applied,
        or None when this instance lets go of it."""
        try:
            body = encode_within(request, self.transport.max_message_bytes, what="request")
        except PayloadError as error:
            # the input and the results it carries outgrew a message: sending it
            # again cannot help, so the unit fails for good, as an agent's
            # permanent error would make it (R3, U7)
            log.error("%s/%s: %s", request.task_id, request.step, error)
            reply: Reply | None = Reply.refusal(request, str(error))
        else:
            reply = await self._exchange(request, body, loop)
        if attempt is not None:
            attempt.replied(reply)
        if reply is None:  # E7: the record stays as it is, expired; the supervisor acts
            self._held.pop(task.task_id, None)
            return None
        if failpoints.ARMED: await failpoints.hit("scheduler.before_apply_reply")  # noqa: E701
        transition = plan.reply(task, self.instance_id, reply.ok, reply.result, reply.error,
                                self.store.now(), permanent=reply.permanent)
        # held as it will be once the write applies: a stop that comes while the write
        # is on its way (and commits) releases the task from there
        task = self._held[task.task_id] = applied(task, transition)
        handover = self.waiters.ending(task.task_id) if terminal(transition.state) else NO_HANDOVER
        try:
            written = await self.store.apply(transition)
        except BaseException:
            handover.dropped()
            raise
        if not written:
            handover.dropped()
            if attempt is not None:
                attempt.taken_away()
            log.info("task %s was taken away (epoch %s): letting go", task.task_id,
                     transition.epoch)
            self._held.pop(task.task_id, None)
            return None
        handover.written(task)
        if transition.locked_by is None and self.on_released is not None:
            self.on_released(transition)
        self.on_applied(transition)
        return task

    async def _exchange(self, request: Request, body: bytes,
                        loop: asyncio.AbstractEventLoop) -> Reply | None:
        """Send a unit's request; its reply, or None once its complete-by passed."""
        future: asyncio.Future[Reply | None] = loop.create_future()
        self._waiting[request.task_id] = (request.epoch, request.step, request.phase, future)
        # ended with None once its complete-by passed, with no timer of its own (deadlines.py)
        deadline = self._deadlines.add(request.complete_by - self.store.now(), future)
        sent: asyncio.Future[None] | None = None
        try:
            if failpoints.ARMED: await failpoints.hit("scheduler.before_publish")  # noqa: E701
            if self._publish_soon is None:
                await self.transport.publish(agent_queue(request.agent), body)
            else:
                sent = self._publish_soon(agent_queue(request.agent), body)
                sent.add_done_callback(functools.partial(_unless_replied, future))
            return await future
        finally:
            self._deadlines.discard(deadline, future)
            # its own wait only, never a later driver's of the task (_start)
            if (waiting := self._waiting.get(request.task_id)) and waiting[3] is future:
                del self._waiting[request.task_id]
            if sent is not None and future.cancelled():
                sent.cancel()  # the driver stops: a request still waiting is not sent

    def _request(self, task: Task) -> Request:
        record = task.steps[task.cursor]
        undo = task.phase is Phase.UNDO
        unit = record.compensation if undo and record.compensation else record
        assert unit.complete_by is not None
        results = {s.name: s.result for s in task.steps[:task.cursor]} if not undo else {
            s.name: s.result for s in task.steps}
        return Request(task_id=task.task_id, step=record.name, phase=task.phase,
                       agent=record.agent, epoch=task.epoch, input=task.input, results=results,
                       idempotency_key=unit.idempotency_key, complete_by=unit.complete_by,
                       reply_to=self.reply_queue, result=record.result if undo else None)

    def _on_reply(self, body: bytes) -> None:
        # never waits: the transport may run it as the reply is read (ImmediateHandler)
        # a body that is no reply is a dead letter at once (R3), never redelivered
        reply = decoded(decode_reply, body, "reply")
        waiting = self._waiting.get(reply.task_id)
        if waiting is None:
            return  # a reply for a task this instance no longer drives
        epoch, step, phase, future = waiting
        if (reply.epoch, reply.step, reply.phase) != (epoch, step, phase) or future.done():
            return  # stale: from an earlier claim, or a duplicate delivery
        future.set_result(reply)


def _unless_replied(future: asyncio.Future[Reply | None], sent: asyncio.Future[None]) -> None:
    """A request's publish ended: had it failed, the wait ends with its error, unless
    the reply is in (then the request evidently arrived)."""
    error = None if sent.cancelled() else sent.exception()  # (read: never reported lost)
    if error is not None and not future.done():
        future.set_exception(error)
