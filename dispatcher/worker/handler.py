"""The user's task handler: load it from ``module:function`` and call it.

A handler takes one ``TaskMessage``. An ``async def`` handler runs on the
event loop; a plain function runs in a worker thread so a blocking handler
never stalls reading, acking or lease renewal. A handler signals failure by
raising; its return value is ignored.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from dispatcher.models import TaskMessage

__all__ = [
    "Handler",
    "HandlerImportError",
    "HandlerTimeout",
    "Invoke",
    "invoker",
    "is_async",
    "load_handler",
    "thread_call",
]

Handler = Callable[[TaskMessage], Any] | Callable[[TaskMessage], Awaitable[Any]]


class HandlerImportError(ValueError):
    """The handler path does not name an importable callable; the message says why."""


class HandlerTimeout(Exception):
    """A run outlived ``--handler-timeout``: it counts as a failed run."""


def load_handler(path: str) -> Handler:
    """Import ``module:function`` (the function may be dotted: ``mod:Class.method``)."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise HandlerImportError(f"handler must look like 'module:function', got {path!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerImportError(
            f"cannot import handler module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc  # its traceback (file and line) at DEBUG
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerImportError(
                f"handler {path!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if not callable(target):
        raise HandlerImportError(f"handler {path!r} is not callable")
    return target  # type: ignore[no-any-return]


def is_async(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - async __call__ objects
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


Invoke = Callable[[TaskMessage], Awaitable[None]]


def invoker(handler: Handler, *, executor: Executor | None) -> Invoke:
    """A callable running ``handler(message)``: awaited if async, in ``executor`` if sync.

    The async-or-sync question is answered once, here, not per message.
    """
    if is_async(handler):
        return handler  # an async handler is its own invoker

    async def run_in_thread(message: TaskMessage) -> None:
        call = thread_call(handler, message)
        result = await asyncio.get_running_loop().run_in_executor(executor, call)
        if inspect.isawaitable(result):  # a sync factory that returned a coroutine
            await result

    return run_in_thread


def thread_call(handler: Handler, message: TaskMessage) -> Callable[[], Any]:
    """``handler(message)`` for a thread, run in a copy of this context (it sees the span)."""
    return functools.partial(contextvars.copy_context().run, handler, message)
