"""How an entry ends when it does not simply succeed in a batch: its own Redis writes.

A run that ended on its own (outside its batch's grouped ack) is settled
alone; a failed run releases its lease and stays pending until reclaim-idle,
or is dead-lettered once it was run ``max_runs`` times; an entry whose runs
were all used up by workers that died, or that cannot be parsed, is
dead-lettered at once. A dead letter is written before its entry is acked,
and an attempt dead-lettered for its runs forgets its run count (a replay
starts afresh). Each of these is guarded: a Redis error leaves the entry
pending, any other exception makes it a ``malformed`` dead letter.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from redis.exceptions import RedisError

from dispatcher.models import TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream.entries import Message
from dispatcher.worker.calls import log_fields
from dispatcher.worker.dead_letter import describe_error, write_dead_letter
from dispatcher.worker.dedup import AttemptGuard
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.settle import Settler
from dispatcher.worker.worker_metrics import WorkerMetrics

__all__ = ["Verdicts", "left_pending"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdicts:
    """Writes the outcomes of single entries for one worker."""

    client: RedisClient
    guard: AttemptGuard
    settler: Settler
    metrics: WorkerMetrics
    max_runs: int

    async def guarded(self, reader: StreamReader, message: Message, step: Awaitable[None]) -> None:
        """Await ``step``; on failure leave the entry pending, or dead-letter it as malformed."""
        try:
            await step
        except (RedisError, OSError) as exc:
            left_pending(message.stream, message.id, exc)
        except Exception as exc:
            await self.cannot_process(reader, message, exc)

    async def cannot_process(self, reader: StreamReader, message: Message, exc: Exception) -> None:
        log.error("cannot process an entry", extra={"entry_id": message.id}, exc_info=exc)
        error = f"malformed message: cannot process it: {describe_error(exc)}"
        try:
            await self._dead_letter(reader, message, error=error, reason="malformed")
        except Exception as again:
            left_pending(message.stream, message.id, again)

    def malformed(self, reader: StreamReader, message: Message, error: str) -> Awaitable[None]:
        letter = self._dead_letter(reader, message, error=error, reason="malformed")
        return self.guarded(reader, message, letter)

    def exceeded(
        self, reader: StreamReader, message: Message, task: TaskMessage, *, runs: int
    ) -> Awaitable[None]:
        """Its runs were used up by runs that never ended (their workers stopped or died)."""
        return self.guarded(reader, message, self._exceeded(reader, message, task, runs=runs))

    def failed(
        self,
        reader: StreamReader,
        message: Message,
        task: TaskMessage,
        exc: BaseException,
        *,
        run: int,
    ) -> Awaitable[None]:
        step = self._failed(reader, message, task, exc, key=task.dedup_key, run=run)
        return self.guarded(reader, message, step)

    async def ended(
        self,
        reader: StreamReader,
        message: Message,
        task: TaskMessage,
        failure: BaseException | None,
        *,
        key: str,
        run: int,
    ) -> None:
        """Settle a run that ended alone: its done mark and ack, or its failure."""
        if failure is not None:
            await self._failed(reader, message, task, failure, key=key, run=run)
            return
        await self.settler.settle(reader.consumer, message.id, done=key)
        self.metrics.for_queue(reader.queue).handled.inc()

    async def give_back(self, reader: StreamReader, keys: list[str]) -> None:
        """Let go of claimed attempts that will not start here: their runs are not counted."""
        try:
            await self.guard.unclaim_many(keys)
        except (RedisError, OSError) as exc:
            log.warning(
                "could not give back %d entries (their runs stay counted): %s",
                len(keys),
                exc,
                extra={"stream": reader.stream},
            )

    async def _exceeded(
        self, reader: StreamReader, message: Message, task: TaskMessage, *, runs: int
    ) -> None:
        error = (
            f"exceeded max runs ({self.max_runs}): the last run ended without a result "
            "(its worker stopped or died)"
        )
        await self._dead_letter(reader, message, error=error, reason="max_runs", runs=runs)
        await self.guard.forget(task.dedup_key)

    async def _failed(
        self,
        reader: StreamReader,
        message: Message,
        task: TaskMessage,
        exc: BaseException,
        *,
        key: str,
        run: int,
    ) -> None:
        error = describe_error(exc)
        self.metrics.for_queue(reader.queue).failed.inc()
        if run >= self.max_runs:
            reason = f"failed {run} runs (max runs {self.max_runs}); last error: {error}"
            log.warning("handler failed", extra=log_fields(message, task), exc_info=exc)
            await self._dead_letter(reader, message, error=reason, reason="max_runs", runs=run)
            await self.guard.forget(key)
            return
        log.warning(
            "handler failed (run %d of at most %d); the entry stays pending and is retried "
            "after reclaim-idle",
            run,
            self.max_runs,
            extra=log_fields(message, task) | {"error": error},
            exc_info=exc,
        )
        await self.guard.release(key)

    async def _dead_letter(
        self, reader: StreamReader, message: Message, *, error: str, reason: str, runs: int = 0
    ) -> None:
        dead_id = await write_dead_letter(
            self.client, queue=reader.queue, message=message, error=error, runs=runs
        )
        await self.settler.settle(reader.consumer, message.id)
        self.metrics.dead_lettered.labels(reader.queue, reason).inc()
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


def left_pending(stream: str, entry_id: str, exc: BaseException) -> None:
    log.warning(
        "could not settle an entry; it stays pending: %s",
        exc,
        extra={"stream": stream, "entry_id": entry_id},
    )
