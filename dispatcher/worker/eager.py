"""An async handler started without a task of its own: its first step runs inline.

A handler that does not wait on anything (a no-op, CPU-only work, a cache
hit) finishes in its first step, so a read batch runs many of them in one
task, with no task, future or event-loop turn each. A handler that does wait
is awaited from where it stopped (``Suspended``) by the task that ran its
first step: ``asyncio.current_task()``, ``asyncio.timeout()`` and
cancellation inside the handler see one task for its whole run, as if it had
been awaited directly. Each run has its own copy of the context, as it would
in a task of its own, so context variables one handler sets never reach the
next.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Suspended", "start"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Suspended:
    """A handler run that suspended in its first step; awaiting this finishes it."""

    coro: Coroutine[Any, Any, Any]
    yielded: Any  # what its first step yielded to the event loop (a future, or None)
    context: contextvars.Context

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, run, value = self.coro, self.context.run, self.yielded
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation thrown into the awaiting task
                try:
                    value = run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value


def start(call: Callable[[T], Awaitable[Any]], arg: T) -> Suspended | None:
    """Run ``call(arg)`` up to where it first waits: None if it finished; raise what it raised."""
    context = contextvars.copy_context()
    awaitable = context.run(call, arg)
    coro = awaitable if inspect.iscoroutine(awaitable) else _awaiting(awaitable)
    try:
        yielded = context.run(coro.send, None)
    except StopIteration:
        return None
    return Suspended(coro, yielded, context)


async def _awaiting(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
