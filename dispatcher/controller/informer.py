"""The lists and watches that fill the operator's cache of what it owns.

For every namespace with a dispatcher in it, and every kind the operator owns
(Deployments, PodDisruptionBudgets, Jobs), one task LISTs the objects carrying the
operator's ``managed-by`` label (selected by the API server: nobody else's objects
travel), puts the result in ``dispatcher.controller.cache`` in place of what it held (relist
semantics: what is not listed is gone, so a DELETED event lost with a cut watch leaves no
ghost), then watches from the list's ``resourceVersion``. The watch asks the API server
to end it after a jittered ``resync`` period, and the next LIST is the periodic resync;
a watch that breaks or whose version expired (410) relists at once, after a backoff
if the API server does not answer.

Every object that appeared, changed or went is reported to ``on_change`` (the operator
wakes the dispatcher that owns it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.controller.api_requests import OWNED_KINDS, APIError, APIGoneError, KubeApi
from dispatcher.controller.cache import Cache
from dispatcher.controller.identity import MANAGED_BY

__all__ = ["SELECTOR", "Informers"]

log = logging.getLogger("dispatcher.controller")
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"


@dataclass
class Informers:
    """One list-and-watch task per (kind, namespace), started on first need."""

    api: KubeApi
    cache: Cache
    on_change: Callable[[str, Mapping[str, Any]], None]
    resync: float = 300.0
    retry: float = 1.0
    _tasks: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)

    def start(self, namespace: str) -> None:
        """Fill and follow the cache for ``namespace`` (a no-op when already running)."""
        for kind in OWNED_KINDS:
            if (kind, namespace) not in self._tasks:
                task = asyncio.create_task(self._run(kind, namespace), name=f"{kind} {namespace}")
                self._tasks[(kind, namespace)] = task

    async def synced(self, namespace: str, *, within: float) -> bool:
        """Start the namespace's tasks; whether all its kinds were listed ``within`` seconds."""
        self.start(namespace)
        events = [self.cache.synced(kind, namespace) for kind in OWNED_KINDS]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                for event in events:
                    await event.wait()
        return all(event.is_set() for event in events)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _seconds(self) -> int:
        """A resync period, jittered by up to a fifth so namespaces and kinds drift apart."""
        return max(1, round(self.resync * random.uniform(0.8, 1.0)))

    async def _run(self, kind: str, namespace: str) -> None:
        failures = 0
        while True:
            try:
                await self._list_and_watch(kind, namespace)
                failures = 0
            except APIGoneError:
                failures = 0  # the version expired: list again at once
            except APIError as exc:
                failures += 1
                delay = min(30.0, self.retry * 2 ** min(failures, 5))
                log.warning("%s in %s: %s; listing again in %.0fs", kind, namespace, exc, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            except Exception:  # a bug must not stop the cache of this kind
                log.exception("%s in %s: watch failed", kind, namespace)
                await asyncio.sleep(self.retry * 10)

    async def _list_and_watch(self, kind: str, namespace: str) -> None:
        api = self.api
        items, version = await api.list_objects(kind, namespace=namespace, selector=SELECTOR)
        for body in self.cache.replace(kind, namespace, items):
            self.on_change(kind, body)
        self.cache.synced(kind, namespace).set()
        stream = api.watch(
            kind, namespace=namespace, selector=SELECTOR, version=version, seconds=self._seconds()
        )
        async for event in stream:
            body = event.get("object") or {}
            if event.get("type") == "BOOKMARK":
                continue
            if event.get("type") == "DELETED":
                self.cache.drop(body, kind)
            else:
                self.cache.put(body, kind)
            self.on_change(kind, body)
