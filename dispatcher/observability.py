"""What a process shows of itself: its Prometheus metrics, ``/metrics``, ``/healthz``, ``/readyz``.

``PrefixedMetrics`` declares one component's metrics in the registry it is given, each named
with the component's prefix: the process registry that ``ObservabilityServer`` serves, or a
fresh one in tests and embedders, so several components can live in one process. Liveness
and readiness are callables the component provides, so the probes report real state
(listener connected, Redis reachable) instead of "the process answers HTTP".
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["ObservabilityServer", "PrefixedMetrics"]

log = logging.getLogger(__name__)

# True when healthy; a coroutine function when the answer needs a request of its own.
Probe = Callable[[], bool | Awaitable[bool]]


class PrefixedMetrics:
    """Declares metrics named ``prefix + name`` in ``registry``."""

    def __init__(self, registry: CollectorRegistry, *, prefix: str) -> None:
        self.registry = registry
        self.prefix = prefix

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(self.prefix + name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(self.prefix + name, documentation, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> Histogram:
        return Histogram(
            self.prefix + name, documentation, labels, buckets=buckets, registry=self.registry
        )


class ObservabilityServer:
    """Serves metrics and probes on ``port`` (0 = disabled) until ``stop()``."""

    def __init__(
        self,
        *,
        port: int,
        live: Probe = lambda: True,
        ready: Probe = lambda: True,
        registry: CollectorRegistry = REGISTRY,
        host: str = "0.0.0.0",
    ) -> None:
        self.port = port
        self.host = host
        self._live = live
        self._ready = ready
        self._registry = registry
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        if self.port == 0:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._probe(self._live))
        app.router.add_get("/readyz", self._probe(self._ready))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("serving /metrics, /healthz and /readyz on port %d", self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @staticmethod
    def _probe(check: Probe) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(_request: web.Request) -> web.StreamResponse:
            answer = check()
            ok = await answer if inspect.isawaitable(answer) else answer
            return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not ok\n")

        return handler
