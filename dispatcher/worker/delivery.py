"""What happens to a batch of delivered entries: parse, dedup, run the handler, settle.

One round trip claims the leases and reads the done marks of the whole batch
(``AttemptGuard.claim_many``, joined with the claims of batches read at the
same time); then each entry goes its own way, concurrently,
and is settled through the worker's ``Settler`` (grouped acks). The outcomes
of one entry, in the order they are decided:

- malformed fields → dead letter (reason ``malformed``), ack;
- the attempt is already done → ack without running (a suppressed duplicate);
- another run holds the attempt's lease → leave it pending (reclaimed later);
- delivered more than ``max_deliveries`` times → dead letter (reason
  ``max_deliveries``, carrying the last handler error this worker saw), ack;
- the handler succeeds → done mark, then ack (XACK+XDEL);
- the handler raises → release the lease, leave it pending: the reclaim loop
  runs it again after ``reclaim_idle``.

The lease check comes before the delivery-count check on purpose: an entry
whose attempt is running elsewhere is not poison. But every reclaim still
raises its delivery count, so an entry of a crashed worker whose lease
outlives ``reclaim_idle x max_deliveries`` is dead-lettered without a run
(``WorkerConfig.caveats`` warns about such settings).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.protocol import Message
from dispatcher.tracing import carries_trace, child_span
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dead_letter import ErrorMemory, describe_error, write_dead_letter
from dispatcher.worker.dedup import AttemptGuard, Claim
from dispatcher.worker.handler import Handler, Invoke, invoker
from dispatcher.worker.leases import LeaseKeeper
from dispatcher.worker.metrics import QueueMetrics, WorkerMetrics
from dispatcher.worker.settle import Settler

__all__ = ["Deliveries", "Freed", "Outcome"]

log = logging.getLogger(__name__)

Freed = Callable[[Message], None]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliveries:
    """Settles deliveries for one worker; shared by all its stream loops."""

    client: RedisClient
    handler: Handler
    guard: AttemptGuard
    claims: Coalescer[str, Claim]  # guard.claim_many, joined across concurrent batches
    leases: LeaseKeeper
    settler: Settler
    metrics: WorkerMetrics
    errors: ErrorMemory
    max_deliveries: int
    executor: Executor | None = None
    _invoke: Invoke = field(init=False)  # the handler, async or sync, resolved once

    def __post_init__(self) -> None:
        object.__setattr__(self, "_invoke", invoker(self.handler, executor=self.executor))

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
        parsed = [(message, _parse(message)) for message in messages]
        keys = [task.dedup_key for _, task in parsed if isinstance(task, TaskMessage)]
        try:
            claims = await self.claims.submit(keys)
        except (RedisError, OSError) as exc:
            for message in messages:
                _left_pending(message, exc)
                freed(message)
            return [Outcome.UNSETTLED] * len(messages)
        steps = [
            self._guarded(source, message, self._step(source, message, task, claim))
            for (message, task), claim in zip(parsed, _aligned(parsed, claims), strict=True)
        ]
        if len(steps) == 1:
            return [await steps[0]]
        return list(await asyncio.gather(*steps))

    async def _step(
        self,
        source: _Source,
        message: Message,
        task: TaskMessage | MalformedMessage,
        claim: Claim | None,
    ) -> Outcome:
        if isinstance(task, MalformedMessage):
            error = f"malformed message: {task}"
            return await self._dead_letter(source, message, error=error, reason="malformed")
        if claim is Claim.DONE:
            await self.settler.settle(source.consumer, message.id)
            self.errors.forget(message)
            source.metrics.duplicates.inc()
            return Outcome.DUPLICATE
        if claim is Claim.BUSY:
            source.metrics.lease_busy.inc()
            return Outcome.BUSY
        if message.delivery_count > self.max_deliveries:
            error = self._give_up_reason(message)
            await self._dead_letter(source, message, error=error, reason="max_deliveries")
            await self.guard.release(task.dedup_key)
            return Outcome.DEAD_LETTERED
        return await self._run(source, message, task)

    async def _guarded(
        self, source: _Source, message: Message, step: Awaitable[Outcome]
    ) -> Outcome:
        try:
            return await step
        except (RedisError, OSError) as exc:
            _left_pending(message, exc)
        except Exception:
            log.exception("unexpected error settling an entry", extra={"entry_id": message.id})
        finally:
            source.freed(message)
        return Outcome.UNSETTLED

    async def _run(self, source: _Source, message: Message, task: TaskMessage) -> Outcome:
        started = time.perf_counter()
        lease = self.leases.hold(task.dedup_key)
        self.metrics.running += 1
        failure: Exception | None = None
        try:
            if carries_trace(message.fields):
                source_attr = {"messaging.source.name": message.stream}
                with child_span(message.fields, "handle task", kind="CONSUMER", **source_attr):
                    await self._invoke(task)
            else:  # no span to open: skip the context manager on the hot path
                await self._invoke(task)
        except Exception as exc:
            failure = exc
        finally:
            self.leases.drop(lease)
            self.metrics.running -= 1
            source.metrics.latency.observe(time.perf_counter() - started)
            source.freed(message)
        if failure is not None:
            return await self._failed(source, message, task, failure)
        await self.settler.settle(source.consumer, message.id, done=task.dedup_key)
        self.errors.forget(message)
        source.metrics.handled.inc()
        return Outcome.HANDLED

    async def _failed(
        self, source: _Source, message: Message, task: TaskMessage, exc: Exception
    ) -> Outcome:
        error = describe_error(exc)
        self.errors.remember(message, error)
        source.metrics.failed.inc()
        log.warning(
            "handler failed; the entry stays pending and is retried after reclaim-idle",
            extra=_log_fields(message, task) | {"error": error},
            exc_info=exc,
        )
        await self.guard.release(task.dedup_key)
        return Outcome.FAILED

    def _give_up_reason(self, message: Message) -> str:
        reason = f"exceeded max deliveries ({self.max_deliveries})"
        last = self.errors.recall(message)
        return f"{reason}; last error: {last}" if last else reason

    async def _dead_letter(
        self, source: _Source, message: Message, *, error: str, reason: str
    ) -> Outcome:
        dead_id = await write_dead_letter(
            self.client, queue=source.queue, message=message, error=error
        )
        await self.settler.settle(source.consumer, message.id)
        self.errors.forget(message)
        self.metrics.dead_lettered.labels(source.queue, reason).inc()
        log.error(
            "dead-lettered: %s",
            error,
            extra={
                "stream": message.stream,
                "entry_id": message.id,
                "delivery_count": message.delivery_count,
                "dead_letter_id": dead_id,
                "reason": reason,
            },
        )
        return Outcome.DEAD_LETTERED


def _parse(message: Message) -> TaskMessage | MalformedMessage:
    try:
        return TaskMessage.from_fields(message.fields)
    except MalformedMessage as exc:
        return exc


def _aligned(
    parsed: list[tuple[Message, TaskMessage | MalformedMessage]], claims: list[Claim]
) -> list[Claim | None]:
    """The claim of each parsed entry (None for a malformed one, which was not claimed)."""
    found = iter(claims)
    return [next(found) if isinstance(task, TaskMessage) else None for _, task in parsed]


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
