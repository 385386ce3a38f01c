"""Handlers a worker process can load by path (``--handler dispatcher._testing.handlers:noop``)."""

from __future__ import annotations

from dispatcher.models import TaskMessage

__all__ = ["noop"]


async def noop(message: TaskMessage) -> None:
    """Do nothing: the worker's own cost, measured by the benchmarks."""
