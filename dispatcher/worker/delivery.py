"""What happens to one delivered entry: parse, dedup, run the handler, settle.

The outcomes, in the order they are decided:

- malformed fields → dead letter (reason ``malformed``), ack;
- the attempt is already done → ack without running (a suppressed duplicate);
- another run holds the attempt's lease → leave it pending (reclaimed later);
- delivered more than ``max_deliveries`` times → dead letter (reason
  ``max_deliveries``, carrying the last handler error this worker saw), ack;
- the handler succeeds → done mark, ack (XACK+XDEL);
- the handler raises → release the lease, leave it pending: the reclaim loop
  runs it again after ``reclaim_idle``.

The lease check comes before the delivery-count check on purpose: an entry
whose attempt is running elsewhere is not poison. But every reclaim still
raises its delivery count, so an entry of a crashed worker whose lease
outlives ``reclaim_idle x max_deliveries`` is dead-lettered without a run
(``WorkerConfig.caveats`` warns about such settings).
"""

from __future__ import annotations

import enum
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.protocol import Message
from dispatcher.worker.dead_letter import ErrorMemory, describe_error, write_dead_letter
from dispatcher.worker.dedup import AttemptGuard, Claim
from dispatcher.worker.handler import Handler, invoke
from dispatcher.worker.metrics import WorkerMetrics

__all__ = ["Deliveries", "Outcome"]

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    HANDLED = "handled"
    FAILED = "failed"
    DUPLICATE = "duplicate"
    BUSY = "busy"
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliveries:
    """Settles deliveries for one worker; shared by all its stream loops."""

    client: RedisClient
    handler: Handler
    guard: AttemptGuard
    metrics: WorkerMetrics
    errors: ErrorMemory
    max_deliveries: int
    executor: Executor | None = None

    async def process(self, consumer: RedisStreamConsumer, queue: str, message: Message) -> Outcome:
        try:
            task = TaskMessage.from_fields(message.fields)
        except MalformedMessage as exc:
            await self._dead_letter(
                consumer, queue, message, error=f"malformed message: {exc}", reason="malformed"
            )
            return Outcome.DEAD_LETTERED
        claim = await self.guard.claim(task.dedup_key)
        if claim is Claim.DONE:
            await consumer.ack(message.id)
            self.errors.forget(message)
            self.metrics.duplicates.labels(queue).inc()
            return Outcome.DUPLICATE
        if claim is Claim.BUSY:
            self.metrics.lease_busy.labels(queue).inc()
            return Outcome.BUSY
        if message.delivery_count > self.max_deliveries:
            error = self._give_up_reason(message)
            await self._dead_letter(consumer, queue, message, error=error, reason="max_deliveries")
            await self.guard.release(task.dedup_key)
            return Outcome.DEAD_LETTERED
        return await self._run(consumer, queue, message, task)

    async def _run(
        self, consumer: RedisStreamConsumer, queue: str, message: Message, task: TaskMessage
    ) -> Outcome:
        started = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            async with self.guard.renewed(task.dedup_key):
                await invoke(self.handler, task, executor=self.executor)
        except Exception as exc:
            return await self._failed(queue, message, task, exc)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.latency.labels(queue).observe(time.perf_counter() - started)
        await self.guard.mark_done(task.dedup_key)
        await consumer.ack(message.id)
        self.errors.forget(message)
        self.metrics.handled.labels(queue).inc()
        return Outcome.HANDLED

    async def _failed(
        self, queue: str, message: Message, task: TaskMessage, exc: Exception
    ) -> Outcome:
        error = describe_error(exc)
        self.errors.remember(message, error)
        self.metrics.failed.labels(queue).inc()
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
        self,
        consumer: RedisStreamConsumer,
        queue: str,
        message: Message,
        *,
        error: str,
        reason: str,
    ) -> None:
        dead_id = await write_dead_letter(self.client, queue=queue, message=message, error=error)
        await consumer.ack(message.id)
        self.errors.forget(message)
        self.metrics.dead_lettered.labels(queue, reason).inc()
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


def _log_fields(message: Message, task: TaskMessage) -> dict[str, object]:
    return {
        "stream": message.stream,
        "entry_id": message.id,
        "task_id": task.task_id,
        "attempt": task.attempt,
        "delivery_count": message.delivery_count,
    }
