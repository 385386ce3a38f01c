"""Handler runs that end on their own: sync handlers, traced entries, inline runs that waited.

A sync handler runs in a thread that cannot be interrupted. Past
``handler_timeout`` its result is ignored and its entry let go, but its lease
is kept until the thread returns, so the attempt is not run again meanwhile.
A run cancelled by shutdown keeps its lease and its entry fresh until the
thread returns or the process ends (``threads`` says how many are left).
A sync callable that returns a coroutine (or any awaitable) keeps its lease
while that runs on the loop, within what is left of the handler timeout.
An entry that carries a trace runs its handler inside the span it continues.
Each call returns the handler's error (or ``HandlerTimeout``), None on success.
Whatever a handler raises is its error, ``BaseException`` included (a
``SystemExit`` of a handler fails its run, never the worker): only the
worker's own cancellation of a run propagates (``failure_of``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from dispatcher.models import TaskMessage
from dispatcher.stream.entries import Message
from dispatcher.tracing import carries_trace, child_span
from dispatcher.worker.eager import Suspended
from dispatcher.worker.handler import Handler, HandlerTimeout, thread_call
from dispatcher.worker.leases import LeaseKeeper

__all__ = ["HandlerCalls", "failure_of", "log_fields", "timed_out"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerCalls:
    """Calls ``handler`` for one entry at a time; ``handler_timeout`` 0 means none."""

    handler: Handler
    leases: LeaseKeeper
    handler_timeout: float = 0.0
    executor: Executor | None = None
    # Sync handler threads that have not returned yet.
    threads: set[concurrent.futures.Future[Any]] = field(default_factory=set)

    async def call_async(
        self, message: Message, task: TaskMessage, lease: int
    ) -> BaseException | None:
        """Run an async handler in its span and within the handler timeout (if any)."""
        bound = self.handler_timeout or None
        return await self._bounded(self.handler(task), bound, lease=lease, span=_span(message))

    async def resume(
        self, suspended: Suspended, *, started: float, lease: int
    ) -> BaseException | None:
        """The rest of an async run that waited in its first step, within what is left of the
        handler timeout (if any); ``started`` is its ``perf_counter`` at its start."""
        left = self._left(started)
        return await self._bounded(suspended, left, lease=lease, span=contextlib.nullcontext())

    def _left(self, started: float) -> float | None:
        """What is left of the handler timeout of a run started at ``started`` (None: no bound)."""
        if not self.handler_timeout:
            return None
        return max(self.handler_timeout - (time.perf_counter() - started), 0.0)

    async def _bounded(
        self,
        run: Awaitable[Any],
        seconds: float | None,
        *,
        lease: int,
        span: contextlib.AbstractContextManager[Any],
    ) -> BaseException | None:
        """Await ``run`` inside ``span`` for at most ``seconds`` (None: no bound); its error."""
        deadline = None
        try:
            with span:
                if seconds is None:
                    await run
                    return None
                async with asyncio.timeout(seconds) as deadline:
                    await run
        except TimeoutError as exc:
            expired = deadline is not None and deadline.expired()
            return timed_out(self.handler_timeout) if expired else exc
        except BaseException as exc:
            return failure_of(exc)
        finally:
            self.leases.drop(lease)
        return None

    async def call_in_thread(
        self, message: Message, task: TaskMessage, lease: int
    ) -> BaseException | None:
        """Run a sync handler in a thread; the lease goes only when the thread returns (and
        what it returned to await, if anything, ended)."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        with _span(message):
            thread = _submit(self.executor, thread_call(self.handler, task))
            self.threads.add(thread)
            thread.add_done_callback(lambda _: _call_soon(loop, self.threads.discard, thread))
            returned = asyncio.wrap_future(thread)
            returned.add_done_callback(_retrieve)  # abandoned at shutdown: no "never retrieved"
            try:
                return await self._thread_ended(message, task, returned, lease, started=started)
            finally:
                if thread.done():
                    self.leases.drop(lease)
                else:  # cancelled by shutdown: the lease stays until the thread returns
                    thread.add_done_callback(lambda _: _call_soon(loop, self.leases.drop, lease))

    async def _thread_ended(
        self,
        message: Message,
        task: TaskMessage,
        returned: asyncio.Future[Any],
        lease: int,
        *,
        started: float,
    ) -> BaseException | None:
        """The outcome of a sync handler's thread, and of the awaitable it returned, if any."""
        finished, _ = await asyncio.wait({returned}, timeout=self.handler_timeout or None)
        if not finished:
            self.leases.let_entry_go(lease)
            log.warning(
                "handler still running after the handler timeout (%gs): it counts as a "
                "failed run and its result will be ignored; its lease is kept until its "
                "thread returns",
                self.handler_timeout,
                extra=log_fields(message, task),
            )
            await asyncio.wait({returned})
        if returned.cancelled():
            raise asyncio.CancelledError
        if not finished:
            _discard(returned.result() if returned.exception() is None else None)
            return timed_out(self.handler_timeout)
        if (exc := returned.exception()) is not None:
            return exc
        result = returned.result()
        if not inspect.isawaitable(result):
            return None
        # A sync factory that returned a coroutine: it runs here, on the loop, in what is
        # left of the handler timeout.
        return await self._bounded(
            result, self._left(started), lease=lease, span=contextlib.nullcontext()
        )


def failure_of(exc: BaseException) -> BaseException:
    """``exc``, raised by a handler, as its run's failure; re-raised if it is the worker
    cancelling the run (its task was asked to cancel), which is not the handler's failure."""
    if isinstance(exc, asyncio.CancelledError) and _cancelling():
        raise exc
    return exc


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _discard(result: object) -> None:
    """Close a coroutine a timed-out thread returned: it will never run."""
    if inspect.iscoroutine(result):
        result.close()


def timed_out(seconds: float) -> HandlerTimeout:
    return HandlerTimeout(f"handler still running after the handler timeout ({seconds:g}s)")


def log_fields(message: Message, task: TaskMessage) -> dict[str, object]:
    return {
        "stream": message.stream,
        "entry_id": message.id,
        "task_id": task.task_id,
        "attempt": task.attempt,
        "delivery_count": message.delivery_count,
    }


@contextlib.contextmanager
def _span(message: Message) -> Iterator[None]:
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
