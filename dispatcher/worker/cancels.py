"""Cancelled runs, as one worker sees them: no run of them starts, running ones are cancelled.

The worker keeps the set of cancelled run ids in memory (``RunCancels.runs``),
read from Redis (``dispatcher.stream.cancel_keys``) at start, again whenever an
entry arrives on the signal stream the enqueuer appends to (``watch``: one
blocking ``XREAD`` at a time), and every ``RELOAD_EVERY`` seconds (runs whose
window ended drop out; a signal lost with Redis is made up for). So checking
an entry costs a set lookup, not a round trip. Then:

- an entry of a cancelled run is acked without a run, before its claim or,
  if the cancel arrived meanwhile, just before its handler would start (the
  claim given back: no run counted); counted in
  ``dispatcher_worker_cancelled_total``, never dead-lettered;
- an async handler of a run cancelled while it runs is cancelled: it sees
  ``CancelledError`` where it waits. Its run ends as cancelled (lease let go,
  entry acked, counted), whatever the handler then does;
- a sync handler cannot be interrupted. It may ask (``cancel_requested``) and
  return early; if it raises once its run is cancelled, its entry is acked as
  cancelled rather than retried; if it succeeds, it is done as usual.

What a cancel does not do: stop a sync handler; reach a worker that cannot
read Redis (it starts nothing then either: claims need Redis); outlive the
dedup window. While a worker drains at shutdown it reads no more signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Sequence
from contextvars import ContextVar

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from dispatcher.config import ConfigError
from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.observability import PrefixedMetrics
from dispatcher.outage import Outage
from dispatcher.stream.cancel_keys import cancelled_runs, wait_for_signal
from dispatcher.stream.entries import Message
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.verdicts import Verdicts

__all__ = ["LOAD_LIMIT", "RELOAD_EVERY", "RunCancelled", "RunCancels", "cancel_requested"]

log = logging.getLogger(__name__)

# Cancelled runs a worker holds at most (the ones cancelled last): a bound on its memory
# whatever the set holds.
LOAD_LIMIT = 100_000
# Seconds between two reads of the set without a signal.
RELOAD_EVERY = 30.0

_CURRENT: ContextVar[RunCancels | None] = ContextVar("dispatcher_run_cancels", default=None)


def cancel_requested(task: TaskMessage) -> bool:
    """Whether the run of ``task`` was cancelled, as the worker running this handler knows it.

    For handlers, sync ones above all (a thread cannot be interrupted): poll it
    between steps and return early. False outside a worker.
    """
    cancels = _CURRENT.get()
    return cancels is not None and task.run_id in cancels.runs


class RunCancelled(Exception):
    """The run of this attempt was cancelled while its handler ran."""


class RunCancels:
    """The cancelled runs of one worker and the async handler runs of each run."""

    def __init__(self, verdicts: Verdicts, *, outage: Outage, block_ms: int = 1000) -> None:
        """Writes go through the worker's ``verdicts`` (its client, attempt keys, settler);
        Redis being down is reported to ``outage`` (the worker's)."""
        self._outage = outage
        self._client = verdicts.client
        self._guard = verdicts.guard
        self._settler = verdicts.settler
        self._block_ms = block_ms
        self.runs: frozenset[str] = frozenset()
        self._running: dict[str, set[asyncio.Task[object]]] = {}
        self._cancelled: set[asyncio.Task[object]] = set()
        registry = verdicts.metrics.registry
        self.cancelled = PrefixedMetrics(registry, prefix="dispatcher_worker_").counter(
            "cancelled",
            "Entries of cancelled runs acked without a run, or whose run was cancelled.",
            ["queue"],
        )

    def activate(self) -> None:
        """Make ``cancel_requested`` answer from this worker in this context and its tasks."""
        _CURRENT.set(self)

    # -- the set ----------------------------------------------------------------

    async def check(self) -> None:
        """Read the set once at start; ``ConfigError`` if the worker's ACL forbids it.

        Any other refusal (the key is not a sorted set, say) is logged and the
        worker starts: ``watch`` reads it again until it can.
        """
        try:
            await self.load()
        except NoPermissionError as exc:
            raise ConfigError(
                "the worker's Redis user may not read the cancelled runs: add "
                f"%R~workflow.cancel.* +zrange +xread to its ACL (see docs/security.md): {exc}"
            ) from None
        except ResponseError as exc:
            log.error("cannot read the cancelled runs (no run counts as cancelled yet): %s", exc)

    async def load(self) -> None:
        runs = await cancelled_runs(self._client, limit=LOAD_LIMIT)
        if len(runs) >= LOAD_LIMIT:
            log.warning("%d cancelled runs or more: only the last %d count", LOAD_LIMIT, LOAD_LIMIT)
        self.apply(runs)

    def apply(self, runs: Iterable[str]) -> None:
        """Make ``runs`` the cancelled runs; cancel the async handler runs of the new ones."""
        new = frozenset(runs)
        added, self.runs = new - self.runs, new
        for run_id in added & self._running.keys():
            for task in self._running[run_id] - self._cancelled:
                self._cancelled.add(task)
                task.cancel()

    async def watch(self, stopping: asyncio.Event) -> None:
        """Read the set on every signal and every ``RELOAD_EVERY`` s, until ``stopping``."""
        after, read_at = "0-0", time.monotonic()
        while not stopping.is_set():
            try:
                last = await wait_for_signal(self._client, after=after, block_ms=self._block_ms)
                if last is not None or time.monotonic() - read_at >= RELOAD_EVERY:
                    await self.load()
                    after, read_at = last or after, time.monotonic()
            except Exception as exc:
                if not (
                    isinstance(exc, RedisError | OSError)
                    and self._outage.failed(exc, what="reading cancelled runs")
                ):
                    log.warning("cannot read the cancelled runs (retried): %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 1.0)

    # -- entries and runs ---------------------------------------------------------

    async def drop(
        self,
        reader: StreamReader,
        messages: Sequence[Message],
        tasks: list[TaskMessage | MalformedMessage],
    ) -> tuple[Sequence[Message], list[TaskMessage | MalformedMessage]]:
        """The entries and tasks of runs not cancelled; the others' entries are acked here."""
        runs = self.runs
        kept_messages, kept_tasks, cancelled = [], [], []
        for message, task in zip(messages, tasks, strict=True):
            if type(task) is TaskMessage and task.run_id in runs:
                cancelled.append(message.id)
            else:
                kept_messages.append(message)
                kept_tasks.append(task)
        if not cancelled:
            return messages, tasks
        reader.settled(cancelled)
        await self.skip(reader, cancelled)
        return kept_messages, kept_tasks

    async def skip(
        self, reader: StreamReader, entry_ids: Sequence[str], *, claimed: Sequence[str] = ()
    ) -> None:
        """Ack entries of cancelled runs that did not run; give back their ``claimed`` attempts."""
        try:
            if claimed:
                await self._guard.unclaim_many(claimed)
            await self._settler.settle_many(reader.consumer, entry_ids, done=[])
        except (RedisError, OSError) as exc:
            log.warning(
                "could not ack %d entries of cancelled runs; they stay pending: %s",
                len(entry_ids),
                exc,
                extra={"stream": reader.stream},
            )
            return
        self.cancelled.labels(reader.queue).inc(len(entry_ids))

    def give_back(self, reader: StreamReader, entry_id: str, task: TaskMessage) -> Awaitable[None]:
        """Ack the entry of a task whose run was cancelled after its claim; give the claim back."""
        return self.skip(reader, [entry_id], claimed=[task.dedup_key])

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
        """A run cancelled while it ran (``Verdicts.ended``'s twin for ``RunCancelled``): let go
        of its lease (the run counts), ack its entry."""
        await self._guard.release(key)
        await self._settler.settle(reader.consumer, message.id)
        self.cancelled.labels(reader.queue).inc()

    async def outcome(
        self, run_id: str, running: Awaitable[BaseException | None], *, cancellable: bool
    ) -> BaseException | None:
        """The failure of ``running`` (None: success), or ``RunCancelled``.

        ``cancellable`` (an async handler): while it runs, a cancel of ``run_id``
        cancels this task; the handler sees ``CancelledError``. Otherwise a
        failure of a run cancelled meanwhile is ``RunCancelled``.
        """
        if not cancellable:
            failure = await running
            if failure is not None and run_id in self.runs:
                return RunCancelled(f"run {run_id!r} was cancelled")
            return failure
        task = asyncio.current_task()
        assert task is not None
        tasks = self._running.setdefault(run_id, set())
        tasks.add(task)
        try:
            failure = await running
        except asyncio.CancelledError:
            if task not in self._cancelled:
                raise
        finally:
            tasks.discard(task)
            if not tasks:
                self._running.pop(run_id, None)
        if task in self._cancelled:
            self._cancelled.discard(task)
            if task.uncancel() > 0:  # cancelled by the worker's shutdown too
                raise asyncio.CancelledError
            return RunCancelled(f"run {run_id!r} was cancelled while its handler ran")
        return failure
