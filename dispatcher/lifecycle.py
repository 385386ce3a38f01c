"""Run a long-lived component until SIGTERM/SIGINT, then stop it gracefully.

The first signal asks the component to stop (stop claiming or reading, finish
what is in hand); the component's own grace timeout bounds that. A second
signal cancels it outright.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

__all__ = ["run_until_signalled"]

log = logging.getLogger(__name__)


async def run_until_signalled(
    run: Callable[[], Awaitable[None]], request_stop: Callable[[], None]
) -> None:
    """Await ``run()``; first SIGTERM/SIGINT: ``request_stop()``; second: cancel."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(run())
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        name = signal.Signals(signum).name
        if signals_seen == 1:
            log.info("%s received: finishing work in hand, then exiting", name)
            request_stop()
        else:
            log.warning("%s received again: cancelling now", name)
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await task
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
