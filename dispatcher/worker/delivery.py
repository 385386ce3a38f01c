"""What happens to a read batch: parse, claim, run the handler, settle, in one task.

The batch's entries are parsed together (``parse_tasks``); one round trip
claims their leases, counts their runs and reads their done marks
(``AttemptGuard.claim_many``, joined with the claims of batches read at the
same time). Then each entry, in order, is decided:

- unreadable (not UTF-8) or malformed fields → dead letter (reason
  ``malformed``), ack;
- the attempt is already done → ack without running (a suppressed duplicate);
- its run is cancelled → ack without running, the claim given back (``cancels.py``);
- another run holds the attempt's lease → leave it pending, count nothing
  (it is reclaimed later);
- its runs exceed ``max_runs`` → dead letter (reason ``max_runs``), ack;
- otherwise run the handler: success → done mark, ack; failure (whatever it
  raised, ``BaseException`` included) → release the lease and leave it pending
  (retried after reclaim-idle), or dead-letter it once this was run ``max_runs``.

An async handler starts inline (``eager.py``): the handlers that finish at
once cost no task, future or loop turn each, and the batch is settled by one
grouped write (``settle.py``) once all of them were decided. When a handler
waits, this task goes on awaiting it (holding its lease and its slot,
``leases.py``) and the rest of the batch continues in a new task, so a slow
handler never holds up the others or the free slots. Sync handlers and
entries that carry a trace run one task each (``calls.py``).

Every entry's slot is freed (``StreamReader.settled``) once its handler has
returned or it was decided without a run. Each entry is guarded: a Redis
error leaves that entry pending, any other exception makes that entry alone
a ``malformed`` dead letter; the rest of the batch goes on.

The decision above is one state machine over one batch (which entry runs,
which waits for a slot, which is settled); its states live here together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from dispatcher.models import MalformedMessage, TaskMessage, parse_tasks
from dispatcher.stream.entries import Message
from dispatcher.tracing import carries_trace
from dispatcher.worker.calls import HandlerCalls, failure_of
from dispatcher.worker.cancels import RunCancelled, RunCancels
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dead_letter import describe_error
from dispatcher.worker.dedup import Claim, aligned
from dispatcher.worker.eager import Suspended, start
from dispatcher.worker.handler import is_async
from dispatcher.worker.limit_gate import LimitGate
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.task_set import HandlingSet
from dispatcher.worker.verdicts import Verdicts, left_pending
from dispatcher.worker.worker_metrics import QueueMetrics, WorkerMetrics, observe_many

__all__ = ["Deliveries"]

log = logging.getLogger(__name__)

# Claim.DONE and Claim.BUSY as plain ints: compared for every entry.
_DONE, _BUSY = int(Claim.DONE), int(Claim.BUSY)


@dataclass(slots=True)
class _Batch:
    """A read batch on its way: where it is, and what its decided entries need."""

    reader: StreamReader
    metrics: QueueMetrics
    messages: Sequence[Message]
    tasks: list[TaskMessage | MalformedMessage]
    keys: list[str | None]  # each task's dedup key (None: malformed)
    claims: list[int | None]
    at: int = 0  # the next entry to decide
    handled: list[str] = field(default_factory=list)  # entry ids, acked after their done marks
    done: list[str] = field(default_factory=list)  # the dedup keys of ``handled``
    duplicates: list[str] = field(default_factory=list)  # entry ids, acked without a run
    busy: int = 0
    times: list[float] = field(default_factory=list)  # run times of the inline runs
    later: list[Awaitable[None]] = field(default_factory=list)  # dead letters, failed runs
    freed: list[str] = field(default_factory=list)  # entry ids done with here
    started: asyncio.Future[None] | None = None  # set once every entry started or was decided
    slot: bool = False  # this task holds a handler slot for the next inline run
    waited: bool = False  # a handler of the batch did not finish in its first step


@dataclass(frozen=True, slots=True)
class _Waiting:
    """An inline run that suspended: awaited by the batch's task, which then settles it."""

    suspended: Suspended
    started: float  # perf_counter at its start
    index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliveries:
    """Settles the read batches of one worker; shared by all its stream loops."""

    claims: Coalescer[str, int]  # AttemptGuard.claim_many, joined across concurrent batches
    calls: HandlerCalls
    verdicts: Verdicts
    cancels: RunCancels
    metrics: WorkerMetrics
    max_runs: int
    handling: HandlingSet  # the worker's tasks settling batches (waited for on shutdown)
    limits: LimitGate | None = None  # queue limits: claims take slots, entries may wait
    _inline: bool = field(init=False)  # an async handler: started inline

    def __post_init__(self) -> None:
        object.__setattr__(self, "_inline", is_async(self.calls.handler))

    async def take(self, reader: StreamReader, batch: Sequence[Message]) -> None:
        """Settle a batch a reader read in a task of its own; return once each entry of it
        started or was decided. An entry already in hand (read twice) is skipped."""
        in_hand = reader.in_hand
        todo = [m for m in batch if m.id not in in_hand] if in_hand else list(batch)
        if not todo:
            return
        in_hand.update([m.id for m in todo])
        await self.take_waiting(reader, todo)

    async def take_waiting(self, reader: StreamReader, batch: Sequence[Message]) -> None:
        """``take`` for entries already in hand: those that waited for their queue's limits."""
        started = asyncio.get_running_loop().create_future()
        self.handling.start(self.process(reader, batch, started), f"batch {batch[0].id}")
        await started

    async def process(
        self, reader: StreamReader, messages: Sequence[Message], started: asyncio.Future[None]
    ) -> None:
        """Settle one read batch; ``started`` is set once each entry started or was decided."""
        try:
            await self._process(reader, messages, started)
        finally:
            if not started.done():
                started.set_result(None)

    async def _process(
        self, reader: StreamReader, messages: Sequence[Message], started: asyncio.Future[None]
    ) -> None:
        tasks = _tasks_of(messages)
        if self.cancels.runs:  # entries of cancelled runs are acked, never claimed
            messages, tasks = await self.cancels.drop(reader, messages, tasks)
        keys = [task.dedup_key if type(task) is TaskMessage else None for task in tasks]
        try:
            if self.limits is not None and self.limits.binds(reader.queue):
                claims, messages, tasks, keys = await self.limits.claim(
                    reader, messages, tasks, keys
                )
            else:
                claims = aligned(keys, await self.claims.submit([k for k in keys if k is not None]))
        except Exception as exc:  # the batch's claim, not one entry's fault: retried later
            log.warning(
                "could not claim %d entries; they stay pending: %s",
                len(messages),
                exc,
                extra={"stream": reader.stream},
            )
            reader.settled([message.id for message in messages])
            return
        metrics = self.metrics.for_queue(reader.queue)
        batch = _Batch(reader, metrics, messages, tasks, keys, claims)
        batch.started = started
        await self._go_on(batch)

    async def _go_on(self, batch: _Batch) -> None:
        """Decide the batch's entries from ``batch.at`` on, then settle them together."""
        messages = batch.messages
        while batch.at < len(messages):
            index = batch.at
            if not batch.slot and self._runs(batch, index) and not await self._slot(batch):
                break  # stopping: the entries not started are given back
            batch.at += 1
            try:
                waiting = self._decide(batch, index)
            except Exception as exc:
                batch.later.append(self.verdicts.cannot_process(batch.reader, messages[index], exc))
                batch.freed.append(messages[index].id)
                continue
            if waiting is not None:
                _free(batch)
                self.handling.start(self._go_on(batch), f"batch {messages[batch.at - 1].id}+")
                message = messages[waiting.index]
                await self.verdicts.guarded(batch.reader, message, self._finish(batch, waiting))
                return
        _free(batch)
        if batch.slot:
            batch.reader.slots.release()
            batch.slot = False
        batch.reader.inline = not batch.waited
        if batch.started is not None and not batch.started.done():
            batch.started.set_result(None)
        await self._settle(batch)

    def _runs(self, batch: _Batch, index: int) -> bool:
        """Whether deciding the entry may start its handler (then it needs a slot)."""
        claim = batch.claims[index]
        return claim is not None and 0 < claim <= self.max_runs

    async def _slot(self, batch: _Batch) -> bool:
        """Take a handler slot for the batch's next run; False if stopping first.

        While it waits, the leases of the entries not started yet are kept and
        their entries kept fresh. If the worker stops first, those entries are
        given back (their leases released, their runs not counted) and stay pending.
        """
        reader = batch.reader
        if reader.slots.take(1):
            batch.slot = True
            return True
        held = self._not_started(batch)
        handles = [self.calls.leases.hold(key, reader.consumer, entry_id) for key, entry_id in held]
        try:
            batch.slot = await reader.slots.acquire_unless(reader.stopping)
        finally:
            for handle in handles:
                self.calls.leases.drop(handle)
        if not batch.slot:
            await self.verdicts.give_back(reader, [key for key, _entry_id in held])
            batch.freed += [message.id for message in batch.messages[batch.at :]]
        return batch.slot

    def _not_started(self, batch: _Batch) -> list[tuple[str, str]]:
        """(dedup key, entry id) of the entries whose leases are ours and that did not start."""
        return [
            (key, batch.messages[i].id)
            for i in range(batch.at, len(batch.messages))
            if (key := batch.keys[i]) is not None and (batch.claims[i] or 0) > 0
        ]

    def _decide(self, batch: _Batch, index: int) -> _Waiting | None:
        """Decide one entry: None once it is done with here, or its run that waits."""
        message, task, claim = batch.messages[index], batch.tasks[index], batch.claims[index]
        if type(task) is not TaskMessage or claim is None:
            error = f"malformed message: {task}"
            batch.later.append(self.verdicts.malformed(batch.reader, message, error))
        elif claim == _DONE:
            batch.duplicates.append(message.id)
        elif claim == _BUSY:
            batch.busy += 1
        elif task.run_id in self.cancels.runs:  # cancelled since the claim: give it back
            batch.later.append(self.cancels.give_back(batch.reader, message.id, task))
        elif claim > self.max_runs:
            batch.later.append(self.verdicts.exceeded(batch.reader, message, task, runs=claim - 1))
        elif not self._inline or carries_trace(message.fields):
            run = self.verdicts.guarded(
                batch.reader, message, self._called(batch, message, task, claim)
            )
            self.handling.start(run, f"run {message.id}")
            batch.slot, batch.waited = False, True  # the slot goes with that task
            return None  # that task says when it is done with the entry
        else:
            return self._start(batch, index, task, claim)
        batch.freed.append(message.id)
        return None

    def _start(self, batch: _Batch, index: int, task: TaskMessage, run: int) -> _Waiting | None:
        """Start the handler inline; None once it finished (its outcome is noted in ``batch``)."""
        message = batch.messages[index]
        started = time.perf_counter()
        leases = self.calls.leases
        leases.inline = task.dedup_key  # held by no keeper entry: a blocked loop renews it
        try:
            suspended = start(self.calls.handler, task)
        except BaseException as exc:  # SystemExit too: the handler's, not the worker's
            leases.inline = None
            failure = failure_of(exc)
            batch.later.append(self.verdicts.failed(batch.reader, message, task, failure, run=run))
        else:
            leases.inline = None
            if suspended is not None:
                batch.slot, batch.waited = False, True  # the slot stays with the handler
                return _Waiting(suspended, started, index)
            batch.handled.append(message.id)
            batch.done.append(batch.keys[index] or "")
        batch.times.append(time.perf_counter() - started)
        batch.freed.append(message.id)
        return None

    def _finish(self, batch: _Batch, waiting: _Waiting) -> Awaitable[None]:
        """The rest of a run that waited in its first step, then its outcome."""
        message, task = batch.messages[waiting.index], batch.tasks[waiting.index]
        key, run = batch.keys[waiting.index] or "", batch.claims[waiting.index] or 0
        assert type(task) is TaskMessage
        lease = self.calls.leases.hold(key, batch.reader.consumer, message.id)
        running = self.calls.resume(waiting.suspended, started=waiting.started, lease=lease)
        return self._alone(batch, message, task, running, key=key, run=run, started=waiting.started)

    def _called(
        self, batch: _Batch, message: Message, task: TaskMessage, run: int
    ) -> Awaitable[None]:
        """One run in a task of its own (a sync handler, or a traced entry), then its outcome."""
        started = time.perf_counter()
        key = task.dedup_key
        lease = self.calls.leases.hold(key, batch.reader.consumer, message.id)
        call = self.calls.call_async if self._inline else self.calls.call_in_thread
        return self._alone(
            batch, message, task, call(message, task, lease), key=key, run=run, started=started
        )

    async def _alone(
        self,
        batch: _Batch,
        message: Message,
        task: TaskMessage,
        running: Awaitable[BaseException | None],
        *,
        key: str,
        run: int,
        started: float,
    ) -> None:
        """Await a run that ends outside its batch's grouped ack; free its slot; settle it."""
        reader, metrics = batch.reader, batch.metrics
        self.metrics.running += 1
        try:
            failure = await self.cancels.outcome(task.run_id, running, cancellable=self._inline)
        finally:
            self.metrics.running -= 1
            metrics.latency.observe(time.perf_counter() - started)
            reader.slots.release()
            reader.settled([message.id])
        ended = self.cancels.ended if type(failure) is RunCancelled else self.verdicts.ended
        await ended(reader, message, task, failure, key=key, run=run)

    async def _settle(self, batch: _Batch) -> None:
        """Ack what the batch decided in one grouped write, beside its dead letters and failures."""
        metrics = batch.metrics
        if batch.times:
            observe_many(metrics.latency, batch.times)
        if batch.busy:
            metrics.lease_busy.inc(batch.busy)
        later = batch.later
        if batch.handled or batch.duplicates:
            later.append(self._ack(batch))
        if len(later) == 1:
            await later[0]
        elif later:
            await asyncio.gather(*later)

    async def _ack(self, batch: _Batch) -> None:
        consumer, metrics = batch.reader.consumer, batch.metrics
        try:
            await self.verdicts.settler.settle_many(
                consumer, [*batch.handled, *batch.duplicates], done=batch.done
            )
        except (RedisError, OSError) as exc:
            for entry_id in [*batch.handled, *batch.duplicates]:
                left_pending(consumer.stream, entry_id, exc)
            return
        if batch.handled:
            metrics.handled.inc(len(batch.handled))
        if batch.duplicates:
            metrics.duplicates.inc(len(batch.duplicates))


def _free(batch: _Batch) -> None:
    if batch.freed:
        batch.reader.settled(batch.freed)
        batch.freed = []


def _tasks_of(messages: Sequence[Message]) -> list[TaskMessage | MalformedMessage]:
    """The batch's tasks; an unreadable or unparseable entry is its own ``MalformedMessage``."""
    try:
        tasks = parse_tasks([message.fields for message in messages])
    except Exception:  # whatever the batch parse raised: find the culprits one by one
        tasks = [_parsed_alone(message) for message in messages]
    for index, message in enumerate(messages):
        if message.error is not None:
            tasks[index] = MalformedMessage(f"cannot read it: {message.error}")
    return tasks


def _parsed_alone(message: Message) -> TaskMessage | MalformedMessage:
    try:
        return TaskMessage.from_fields(message.fields)
    except MalformedMessage as exc:
        return exc
    except Exception as exc:
        return MalformedMessage(f"cannot parse it: {describe_error(exc)}")
