"""Handler runs that end on their own: sync handlers, traced entries, inline runs that waited.

A sync handler runs in a thread that cannot be interrupted. Past
``handler_timeout`` its result is ignored and its entry let go, but its lease
is kept until the thread returns, so the attempt is not run again meanwhile.
A run cancelled by shutdown keeps its lease and its entry fresh until the
thread returns or the process ends (``threads`` says how many are left).
An entry that carries a trace runs its handler inside the span it continues.
Each call returns the handler's error (or ``HandlerTimeout``), None on success.
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
from dispatcher.worker.dead_letter import describe_error
from dispatcher.worker.eager import Suspended
from dispatcher.worker.handler import Handler, HandlerTimeout, thread_call
from dispatcher.worker.leases import LeaseKeeper

__all__ = ["HandlerCalls", "log_fields", "timed_out"]

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

    async def call_async(self, message: Message, task: TaskMessage, lease: int) -> Exception | None:
        """Run an async handler in its span and within the handler timeout (if any)."""
        bound = self.handler_timeout or None
        return await self._bounded(self.handler(task), bound, lease=lease, span=_span(message))

    async def resume(self, suspended: Suspended, *, started: float, lease: int) -> Exception | None:
        """The rest of an async run that waited in its first step, within what is left of the
        handler timeout (if any); ``started`` is its ``perf_counter`` at its start."""
        bound = None
        if self.handler_timeout:
            bound = max(self.handler_timeout - (time.perf_counter() - started), 0.0)
        return await self._bounded(suspended, bound, lease=lease, span=contextlib.nullcontext())

    async def _bounded(
        self,
        run: Awaitable[Any],
        seconds: float | None,
        *,
        lease: int,
        span: contextlib.AbstractContextManager[Any],
    ) -> Exception | None:
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
        except Exception as exc:
            return exc
        finally:
            self.leases.drop(lease)
        return None

    async def call_in_thread(
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
                    extra=log_fields(message, task),
                )
                await asyncio.wait({returned})
        self.leases.drop(lease)
        if returned.cancelled():
            raise asyncio.CancelledError
        if not finished:
            return timed_out(self.handler_timeout)
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
