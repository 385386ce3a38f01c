"""The kubelet's HTTPS endpoint for ``kubectl logs``: the API server proxies
``/containerLogs/<namespace>/<pod>/<container>`` here (the Node's
``daemonEndpoints``), authenticating with a client certificate of the cluster's CA.
``tailLines``, ``limitBytes`` and ``follow`` are honoured; nothing else is served."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

__all__ = ["container_log_path", "pod_file", "serve_logs"]

_FOLLOW_POLL = 0.5


def pod_file(pods_dir: Path, namespace: str, pod: str, name: str) -> Path | None:
    """A file the kubelet keeps for a Pod (of its newest run under that name)."""
    found = sorted(pods_dir.glob(f"{namespace}_{pod}_*/{name}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def container_log_path(pods_dir: Path, namespace: str, pod: str, container: str) -> Path | None:
    """The file of what a container printed."""
    return pod_file(pods_dir, namespace, pod, f"{container}.log")


def _tail(data: bytes, lines: int) -> bytes:
    kept = data.splitlines(keepends=True)
    return b"".join(kept[-lines:]) if lines > 0 else b""


def _app(pods_dir: Path, running: Callable[[str, str], bool]) -> web.Application:
    async def container_logs(request: web.Request) -> web.StreamResponse:
        namespace, pod, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        path = container_log_path(pods_dir, namespace, pod, container)
        if path is None:
            raise web.HTTPNotFound(text=f"no container {container} of pod {namespace}/{pod} here")
        data = path.read_bytes()
        if "tailLines" in request.query:
            data = _tail(data, int(request.query["tailLines"]))
        if "limitBytes" in request.query:
            data = data[: int(request.query["limitBytes"])]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        if request.query.get("follow") == "true":
            offset = path.stat().st_size
            while running(namespace, pod):
                await asyncio.sleep(_FOLLOW_POLL)
                with path.open("rb") as log:
                    log.seek(offset)
                    more = log.read()
                offset += len(more)
                if more:
                    await response.write(more)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/containerLogs/{ns}/{pod}/{container}", container_logs)
    return app


async def serve_logs(
    *,
    pods_dir: Path,
    running: Callable[[str, str], bool],
    host: str,
    port: int,
    cert: Path,
    key: Path,
    client_ca: Path,
) -> web.AppRunner:
    """Start serving; the caller cleans the returned runner up."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_REQUIRED
    runner = web.AppRunner(_app(pods_dir, running), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    return runner
