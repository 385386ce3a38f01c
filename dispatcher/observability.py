"""The HTTP side of a process: Prometheus ``/metrics``, ``/healthz`` and ``/readyz``.

Liveness and readiness are callables the component provides, so the probes
report real state (listener connected, Redis reachable) instead of "the
process answers HTTP".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

__all__ = ["ObservabilityServer"]

log = logging.getLogger(__name__)

Probe = Callable[[], bool]


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
            ok = check()
            return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not ok\n")

        return handler
