"""One probe of a container, as the readinessProbe/startupProbe spec says: httpGet, tcpSocket
or exec. A probe that cannot connect or times out has failed; it never raises."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp

__all__ = ["probe_once"]


def _port(port: Any, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise LookupError(f"no port named {port!r}")


async def probe_once(
    probe: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    exec_prefix: list[str],
    env: Mapping[str, str],
) -> bool:
    """True if the probe succeeds within its timeoutSeconds."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        return await asyncio.wait_for(
            _probe(probe, container, pod_ip=pod_ip, exec_prefix=exec_prefix, env=env), timeout
        )
    except (TimeoutError, OSError, LookupError, aiohttp.ClientError):
        return False


async def _probe(
    probe: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    exec_prefix: list[str],
    env: Mapping[str, str],
) -> bool:
    if "httpGet" in probe:
        get = probe["httpGet"]
        scheme = str(get.get("scheme", "HTTP")).lower()
        host = get.get("host") or pod_ip
        url = f"{scheme}://{host}:{_port(get['port'], container)}{get.get('path', '/')}"
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers, ssl=False, allow_redirects=False) as response,
        ):
            return 200 <= response.status < 400
    if "tcpSocket" in probe:
        port = _port(probe["tcpSocket"]["port"], container)
        _, writer = await asyncio.open_connection(probe["tcpSocket"].get("host") or pod_ip, port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    if "exec" in probe:
        process = await asyncio.create_subprocess_exec(
            *exec_prefix,
            *probe["exec"]["command"],
            env=dict(env),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            return await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
    raise LookupError(f"probe {sorted(probe)} is not supported")
