"""The console's web server: the page's files, its JSON API, the guard in front of actions.

``build_app`` wires a ``Sampler`` (what the page polls), the on-demand views
and the actions into an aiohttp application; ``serve`` runs it until SIGTERM.
Every response carries a strict Content-Security-Policy (the page loads only
its own files) and the API never returns a connection string.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web
from psycopg_pool import AsyncConnectionPool

from dispatcher.console.actions import ACTIONS, Backends
from dispatcher.console.guard import CSRF_COOKIE, SESSION_COOKIE, Guard, Refused
from dispatcher.console.run_search import run_tasks
from dispatcher.console.sampler import Sampler, one_line
from dispatcher.console.views import dead_letter_page, dead_letter_payload, outbox_dlq_page
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream.naming import validate_queue

__all__ = ["ConsoleConfig", "build_app", "serve"]

log = logging.getLogger("dispatcher.console")

STATIC = {
    "index.html": "text/html",
    "console.css": "text/css",
    "console.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleConfig:
    database_url: str
    redis_url: str
    redis_cluster: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    group: str = "workers"
    fallback_shards: int = 4
    refresh: float = 2.0
    discover_every: float = 60.0


def _static_files() -> dict[str, tuple[bytes, str]]:
    root = resources.files(__package__).joinpath("static")
    return {name: (root.joinpath(name).read_bytes(), kind) for name, kind in STATIC.items()}


def _json(doc: Any, *, status: int = 200) -> web.Response:
    return web.json_response(doc, status=status, dumps=lambda d: json.dumps(d, default=str))


def _secure(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "") == "https"


@web.middleware
async def _headers(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except Refused as exc:
        response = _json({"error": str(exc)}, status=exc.status)
    except ValueError as exc:  # bad input: one line, nothing done
        response = _json({"error": str(exc)}, status=400)
    response.headers.update(HEADERS)
    return response


class _Console:
    def __init__(
        self, *, sampler: Sampler, guard: Guard, backends: Backends, pool: AsyncConnectionPool[Any]
    ) -> None:
        self.sampler, self.guard, self.backends, self.pool = sampler, guard, backends, pool
        self.files = _static_files()

    async def page(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in self.files:
            raise web.HTTPNotFound()
        body, kind = self.files[name]
        return web.Response(body=body, content_type=kind, charset="utf-8")

    def _session(self, request: web.Request) -> dict[str, Any]:
        return {
            "read_only": self.guard.read_only,
            "signed_in": self.guard.signed_in(request.cookies),
            "refresh": self.sampler.refresh,
        }

    async def overview(self, request: web.Request) -> web.Response:
        sample = await self.sampler.latest()
        return _json(
            {
                **self._session(request),
                "error": self.sampler.error,
                "sample": None if sample is None else sample.to_json(),
            }
        )

    async def history(self, request: web.Request) -> web.Response:
        await self.sampler.latest()
        return _json({"points": list(self.sampler.history)})

    async def dead_letters(self, request: web.Request) -> web.Response:
        queue = request.query.get("queue") or None
        before = request.query.get("before") or None
        limit = int(request.query.get("limit", "50"))
        if queue is None:
            return _json(await outbox_dlq_page(self.pool, before=before, limit=limit))
        page = await dead_letter_page(
            self.backends.redis, validate_queue(queue), before=before, limit=limit
        )
        return _json(page)

    async def payload(self, request: web.Request) -> web.Response:
        if not self.guard.signed_in(request.cookies):
            raise Refused("payloads are shown to a signed-in user only (the console's --token)")
        queue = request.query.get("queue") or None
        entry_id = request.query.get("id", "")
        try:
            found = await dead_letter_payload(
                client=self.backends.redis,
                pool=self.pool,
                queue=None if queue is None else validate_queue(queue),
                entry_id=entry_id,
            )
        except KeyError:
            return _json(
                {"error": f"no dead letter {entry_id!r} (replayed or deleted?)"}, status=404
            )
        log.info("console: payload of %s shown (%s)", entry_id, queue or "outbox_dlq")
        return _json({"id": entry_id, "payload": found})

    async def run(self, request: web.Request) -> web.Response:
        run_id = request.query.get("run_id", "")
        if not run_id:
            raise ValueError("run_id: the run to look up")
        cursor = request.query.get("cursor") or None
        found = await run_tasks(
            client=self.backends.redis, pool=self.pool, run_id=run_id, cursor=cursor
        )
        return _json(found)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise ValueError("the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return body

    async def login(self, request: web.Request) -> web.Response:
        self.guard.check_origin(request.headers)
        token = (await self._body(request)).get("token")
        session, csrf = self.guard.sign_in(token if isinstance(token, str) else "")
        response = _json({"signed_in": True})
        secure = _secure(request)
        response.set_cookie(
            SESSION_COOKIE, session, httponly=True, samesite="Strict", secure=secure, path="/"
        )
        response.set_cookie(CSRF_COOKIE, csrf, samesite="Strict", secure=secure, path="/")
        log.info("console: signed in from %s", request.remote)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        self.guard.check_origin(request.headers)
        response = _json({"signed_in": False})
        response.del_cookie(SESSION_COOKIE, path="/")
        response.del_cookie(CSRF_COOKIE, path="/")
        return response

    async def act(self, request: web.Request) -> web.Response:
        action = ACTIONS.get(request.match_info["action"])
        if action is None:
            raise web.HTTPNotFound()
        self.guard.check_action(request.headers, request.cookies)
        body = await self._body(request)
        try:
            message = await action(self.backends, body)
        except ValueError:
            raise
        except Exception as exc:  # a server down: say so in one line
            log.warning("console action failed: %s", one_line(exc))
            return _json({"error": one_line(exc)}, status=502)
        self.sampler.rediscover()
        return _json({"message": message})


def build_app(
    *,
    sampler: Sampler,
    guard: Guard,
    backends: Backends,
    pool: AsyncConnectionPool[Any],
) -> web.Application:
    console = _Console(sampler=sampler, guard=guard, backends=backends, pool=pool)
    app = web.Application(middlewares=[_headers], client_max_size=256 * 1024)
    app.add_routes(
        [
            web.get("/", console.page),
            web.get("/static/{name}", console.page),
            web.get("/api/overview", console.overview),
            web.get("/api/history", console.history),
            web.get("/api/dead-letters", console.dead_letters),
            web.get("/api/dead-letters/payload", console.payload),
            web.get("/api/run", console.run),
            web.post("/api/login", console.login),
            web.post("/api/logout", console.logout),
            web.post("/api/actions/{action}", console.act),
        ]
    )
    return app


@contextlib.asynccontextmanager
async def _backends(config: ConsoleConfig) -> Any:
    redis: RedisClient = connect_redis(
        config.redis_url, cluster=config.redis_cluster, socket_timeout=10
    )
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        config.database_url,
        min_size=1,
        max_size=3,
        open=False,
        timeout=10,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=False)
    try:
        yield redis, pool
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pool.close(), 5)
        await redis.aclose()


async def serve(config: ConsoleConfig, *, ready: asyncio.Event | None = None) -> None:
    """Serve the console until SIGTERM/SIGINT (or until cancelled)."""
    async with _backends(config) as (redis, pool):
        sampler = Sampler(
            redis=redis,
            pool=pool,
            group=config.group,
            fallback_shards=config.fallback_shards,
            refresh=config.refresh,
            discover_every=config.discover_every,
        )
        backends = Backends(
            dsn=config.database_url, redis=redis, fallback_shards=config.fallback_shards
        )
        app = build_app(sampler=sampler, guard=Guard(config.token), backends=backends, pool=pool)
        # A request still running at SIGTERM gets a few seconds, not aiohttp's default minute.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
        await runner.setup()
        sampling = asyncio.create_task(sampler.run())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await web.TCPSite(runner, config.host, config.port).start()
            mode = "read-only" if config.token is None else "actions need the token"
            log.info("console on http://%s:%d/ (%s)", config.host, config.port, mode)
            print(f"console: http://{config.host}:{config.port}/ ({mode})", flush=True)
            if ready is not None:
                ready.set()
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await runner.cleanup()
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
