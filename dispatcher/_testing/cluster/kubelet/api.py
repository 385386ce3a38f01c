"""A small asyncio client of the Kubernetes API, from a kubeconfig with client-certificate files."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["ApiClient", "ApiError"]


class ApiError(RuntimeError):
    """A response of status 400 or above; ``status`` is its HTTP status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


class ApiClient:
    """JSON requests and watches against one API server."""

    def __init__(self, kubeconfig: Path) -> None:
        config = json.loads(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server: str = cluster["server"]
        self.ca_file = Path(cluster["certificate-authority"])
        self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        self._ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=32)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with self.session.request(
            method, self.server + path, data=data, params=params, headers=headers
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, text)
            return json.loads(text) if text else None

    async def get(self, path: str, **params: str) -> Any:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, body: Any) -> Any:
        return await self.request(
            "PATCH", path, body=body, content_type="application/merge-patch+json"
        )

    async def delete(self, path: str, body: Any = None) -> Any:
        return await self.request("DELETE", path, body=body)

    async def watch(self, path: str, *, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Events of a watch from ``resource_version`` until the server ends it."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "300",
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=360)
        async with self.session.get(self.server + path, params=params, timeout=timeout) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.text())
            async for line in response.content:
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    yield event
