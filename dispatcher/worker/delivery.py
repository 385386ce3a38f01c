"""What happens to a batch of delivered entries: parse, dedup, run the handler, settle.

One round trip claims the leases, counts the runs and reads the done marks of
the whole batch (``AttemptGuard.claim_many``, joined with the claims of
batches read at the same time); then each entry goes its own way,
concurrently, and is settled through the worker's ``Settler`` (grouped acks).
The outcomes of one entry, in the order they are decided:

- malformed fields (anything that makes parsing raise) → dead letter
  (reason ``malformed``), ack;
- the attempt is already done → ack without running (a suppressed duplicate);
- another run holds the attempt's lease → leave it pending, count nothing
  (reclaimed later);
- taking the lease would start run ``max_runs + 1`` (the earlier runs'
  workers died, or the last one could not dead-letter) → dead letter
  (reason ``max_runs``), ack;
- the handler succeeds → done mark, then ack (XACK+XDEL);
- the handler raises or outlives ``handler_timeout`` → on run ``max_runs``,
  dead letter (reason ``max_runs``, with the error); before that, release
  the lease and leave the entry pending: a reclaim loop runs it again after
  ``reclaim_idle``.

A run is a handler start, counted in Redis when its lease is taken, so a
reclaim that finds a live run (its lease held) never counts, and the
delivery count (which every reclaim raises) decides nothing. While a handler
runs its lease is renewed and its entry kept fresh (``leases.py``).

Every per-entry step runs inside a guard: a Redis error leaves that entry
pending, any other exception makes that entry alone a ``malformed`` dead
letter; the rest of the batch goes on.

A sync handler runs in a thread that cannot be interrupted. Past
``handler_timeout`` its result is ignored and its entry let go, but its lease
is kept until the thread returns, so the attempt is not run again meanwhile.
A run cancelled by shutdown keeps its lease and its entry fresh until the
thread returns or the process ends (``threads`` says how many are left).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.entries import Message
from dispatcher.tracing import carries_trace, child_span
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dead_letter import describe_error, write_dead_letter
from dispatcher.worker.dedup import AttemptGuard, Claim
from dispatcher.worker.handler import Handler, HandlerTimeout, is_async, thread_call
from dispatcher.worker.leases import LeaseKeeper
from dispatcher.worker.metrics import QueueMetrics, WorkerMetrics
from dispatcher.worker.settle import Settler

__all__ = ["Deliveries", "Freed", "Outcome"]

log = logging.getLogger(__name__)

Freed = Callable[[Message], None]

# Claim.DONE and Claim.BUSY as plain ints: compared for every entry.
_DONE, _BUSY = int(Claim.DONE), int(Claim.BUSY)


class Outcome(enum.Enum):
    HANDLED = "handled"
    FAILED = "failed"
    DUPLICATE = "duplicate"
    BUSY = "busy"
    DEAD_LETTERED = "dead_lettered"
    UNSETTLED = "unsettled"  # a Redis error: the entry stays pending


@dataclass(frozen=True, slots=True)
class _Source:
    """Where a batch came from, the metrics of its queue, and whom to tell of free slots."""

    consumer: RedisStreamConsumer
    queue: str
    metrics: QueueMetrics
    freed: Freed


@dataclass(frozen=True, slots=True)
class _Task:
    """A parsed entry and its dedup key, computed once (it is on the hot path)."""

    message: TaskMessage
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliveries:
    """Settles deliveries for one worker; shared by all its stream loops.

    ``handler_timeout`` 0 means none.
    """

    client: RedisClient
    handler: Handler
    guard: AttemptGuard
    claims: Coalescer[str, int]  # guard.claim_many, joined across concurrent batches
    leases: LeaseKeeper
    settler: Settler
    metrics: WorkerMetrics
    max_runs: int
    handler_timeout: float = 0.0
    executor: Executor | None = None
    # Sync handler threads that have not returned yet.
    threads: set[concurrent.futures.Future[Any]] = field(default_factory=set)
    _async: bool = field(init=False)  # the async-or-sync question, answered once
    _plain: bool = field(init=False)  # async and no timeout: awaited as is

    def __post_init__(self) -> None:
        object.__setattr__(self, "_async", is_async(self.handler))
        object.__setattr__(self, "_plain", self._async and not self.handler_timeout)

    async def process(
        self,
        consumer: RedisStreamConsumer,
        queue: str,
        messages: Sequence[Message],
        *,
        freed: Freed,
    ) -> list[Outcome]:
        """Settle one read batch; the outcomes come in the order of ``messages``.

        ``freed(message)`` says the message's handler slot may be reused: once
        its handler returned (the ack may still be in flight), or once it was
        decided without a run. It may be called again for the same message
        later; only the first call counts.
        """
        source = _Source(consumer, queue, self.metrics.for_queue(queue), freed)
        parsed = [_parse(message) for message in messages]
        keys = [task.key for task in parsed if isinstance(task, _Task)]
        try:
            claims = await self.claims.submit(keys)
        except Exception as exc:  # the batch's claim, not one entry's fault: retried later
            for message in messages:
                _left_pending(message, exc)
                freed(message)
            return [Outcome.UNSETTLED] * len(messages)
        steps = [
            self._guarded(source, message, self._step(source, message, task, claim))
            for message, task, claim in zip(messages, parsed, _aligned(parsed, claims), strict=True)
        ]
        if len(steps) == 1:
            return [await steps[0]]
        return list(await asyncio.gather(*steps))

    async def _step(
        self,
        source: _Source,
        message: Message,
        task: _Task | MalformedMessage,
        claim: int | None,
    ) -> Outcome:
        if isinstance(task, MalformedMessage) or claim is None:
            error = f"malformed message: {task}"
            return await self._dead_letter(source, message, error=error, reason="malformed")
        if claim == _DONE:
            await self.settler.settle(source.consumer, message.id)
            source.metrics.duplicates.inc()
            return Outcome.DUPLICATE
        if claim == _BUSY:
            source.metrics.lease_busy.inc()
            return Outcome.BUSY
        if claim > self.max_runs:
            error = (
                f"exceeded max runs ({self.max_runs}): the last run ended without a result "
                "(its worker stopped or died)"
            )
            await self._dead_letter(source, message, error=error, reason="max_runs", runs=claim - 1)
            await self.guard.forget(task.key)
            return Outcome.DEAD_LETTERED
        return await self._run(source, message, task, run=claim)

    async def _guarded(
        self, source: _Source, message: Message, step: Awaitable[Outcome]
    ) -> Outcome:
        try:
            return await step
        except (RedisError, OSError) as exc:
            _left_pending(message, exc)
        except Exception as exc:
            log.exception("cannot process an entry", extra={"entry_id": message.id})
            error = f"malformed message: cannot process it: {describe_error(exc)}"
            try:
                return await self._dead_letter(source, message, error=error, reason="malformed")
            except Exception as again:
                _left_pending(message, again)
        finally:
            source.freed(message)
        return Outcome.UNSETTLED

    async def _run(self, source: _Source, message: Message, task: _Task, run: int) -> Outcome:
        started = time.perf_counter()
        lease = self.leases.hold(task.key, source.consumer, message.id)
        self.metrics.running += 1
        failure: Exception | None = None
        try:
            if self._plain and not carries_trace(message.fields):
                try:
                    await self.handler(task.message)  # no span, deadline or thread: the hot path
                except Exception as exc:
                    failure = exc
                finally:
                    self.leases.drop(lease)
            elif self._async:
                failure = await self._call_async(message, task.message, lease)
            else:
                failure = await self._call_in_thread(message, task.message, lease)
        finally:
            self.metrics.running -= 1
            source.metrics.latency.observe(time.perf_counter() - started)
            source.freed(message)
        if failure is not None:
            return await self._failed(source, message, task, failure, run=run)
        await self.settler.settle(source.consumer, message.id, done=task.key)
        source.metrics.handled.inc()
        return Outcome.HANDLED

    async def _call_async(
        self, message: Message, task: TaskMessage, lease: int
    ) -> Exception | None:
        """Run an async handler in its span and within the handler timeout (if any).

        Its error (or ``HandlerTimeout``); None on success.
        """
        deadline = None
        try:
            with _span(message):
                if not self.handler_timeout:
                    await self.handler(task)
                    return None
                async with asyncio.timeout(self.handler_timeout) as deadline:
                    await self.handler(task)
        except TimeoutError as exc:
            expired = deadline is not None and deadline.expired()
            return _timed_out(self.handler_timeout) if expired else exc
        except Exception as exc:
            return exc
        finally:
            self.leases.drop(lease)
        return None

    async def _call_in_thread(
        self, message: Message, task: TaskMessage, lease: int
    ) -> Exception | None:
        """Run a sync handler in a thread; the lease goes only when the thread returns."""
        loop = asyncio.get_running_loop()
        with _span(message):
            thread = _submit(self.executor, thread_call(self.handler, task))
            self.threads.add(thread)
            thread.add_done_callback(
                lambda _: _call_soon(loop, self._thread_returned, thread, lease)
            )
            returned = asyncio.wrap_future(thread)
            returned.add_done_callback(_retrieve)  # abandoned at shutdown: no "never retrieved"
            finished, _ = await asyncio.wait({returned}, timeout=self.handler_timeout or None)
            if not finished:
                self.leases.let_entry_go(lease)
                log.warning(
                    "handler still running after the handler timeout (%gs): it counts as a "
                    "failed run and its result will be ignored; its lease is kept until its "
                    "thread returns",
                    self.handler_timeout,
                    extra=_log_fields(message, task),
                )
                await asyncio.wait({returned})
        self.leases.drop(lease)
        if returned.cancelled():
            raise asyncio.CancelledError
        if not finished:
            return _timed_out(self.handler_timeout)
        if (exc := returned.exception()) is not None:
            return exc if isinstance(exc, Exception) else RuntimeError(describe_error(exc))
        result = returned.result()
        if inspect.isawaitable(result):  # a sync factory that returned a coroutine
            try:
                await result
            except Exception as exc:
                return exc
        return None

    def _thread_returned(self, thread: concurrent.futures.Future[Any], lease: int) -> None:
        self.threads.discard(thread)
        self.leases.drop(lease)

    async def _failed(
        self, source: _Source, message: Message, task: _Task, exc: Exception, *, run: int
    ) -> Outcome:
        error = describe_error(exc)
        source.metrics.failed.inc()
        if run >= self.max_runs:
            reason = f"failed {run} runs (max runs {self.max_runs}); last error: {error}"
            log.warning("handler failed", extra=_log_fields(message, task.message), exc_info=exc)
            await self._dead_letter(source, message, error=reason, reason="max_runs", runs=run)
            await self.guard.forget(task.key)
            return Outcome.DEAD_LETTERED
        log.warning(
            "handler failed (run %d of at most %d); the entry stays pending and is retried "
            "after reclaim-idle",
            run,
            self.max_runs,
            extra=_log_fields(message, task.message) | {"error": error},
            exc_info=exc,
        )
        await self.guard.release(task.key)
        return Outcome.FAILED

    async def _dead_letter(
        self, source: _Source, message: Message, *, error: str, reason: str, runs: int = 0
    ) -> Outcome:
        dead_id = await write_dead_letter(
            self.client, queue=source.queue, message=message, error=error, runs=runs
        )
        await self.settler.settle(source.consumer, message.id)
        self.metrics.dead_lettered.labels(source.queue, reason).inc()
        log.error(
            "dead-lettered: %s",
            error,
            extra={
                "stream": message.stream,
                "entry_id": message.id,
                "delivery_count": message.delivery_count,
                "runs": runs,
                "dead_letter_id": dead_id,
                "reason": reason,
            },
        )
        return Outcome.DEAD_LETTERED


def _parse(message: Message) -> _Task | MalformedMessage:
    """The entry as a task, or why it cannot be one (whatever parsing raised)."""
    try:
        task = TaskMessage.from_fields(message.fields)
        return _Task(task, task.dedup_key)
    except MalformedMessage as exc:
        return exc
    except Exception as exc:
        return MalformedMessage(f"cannot parse it: {describe_error(exc)}")


@contextlib.contextmanager
def _span(message: Message) -> Any:
    """The handler's span when the entry carries a trace; nothing (cheaply) otherwise."""
    if not carries_trace(message.fields):
        yield
        return
    with child_span(
        message.fields, "handle task", kind="CONSUMER", **{"messaging.source.name": message.stream}
    ):
        yield


def _submit(executor: Executor | None, call: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    if executor is None:
        raise RuntimeError("a sync handler needs an executor")
    return executor.submit(call)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to tell
        loop.call_soon_threadsafe(callback, *args)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _timed_out(seconds: float) -> HandlerTimeout:
    return HandlerTimeout(f"handler still running after the handler timeout ({seconds:g}s)")


def _aligned(parsed: list[_Task | MalformedMessage], claims: list[int]) -> list[int | None]:
    """The claim of each parsed entry (None for a malformed one, which was not claimed)."""
    found = iter(claims)
    return [next(found) if isinstance(task, _Task) else None for task in parsed]


def _left_pending(message: Message, exc: BaseException) -> None:
    log.warning(
        "could not settle an entry; it stays pending: %s",
        exc,
        extra={"stream": message.stream, "entry_id": message.id},
    )


def _log_fields(message: Message, task: TaskMessage) -> dict[str, object]:
    return {
        "stream": message.stream,
        "entry_id": message.id,
        "task_id": task.task_id,
        "attempt": task.attempt,
        "delivery_count": message.delivery_count,
    }
