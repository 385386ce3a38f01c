"""The operator's connection to the Kubernetes API: the official async client, counted.

Every request the operator makes (its passes, its caches' lists and watches; kopf's own
watch of the ``OutboxDispatcher`` resources aside) goes through one ``KubeClient``: the
authenticated session of ``kubernetes_asyncio`` (the official client's asyncio sibling),
configured in a pod from its ServiceAccount (the token file re-read as the kubelet rotates
it) and elsewhere from the kubeconfig, exactly as ``kubectl`` would.

Why the asyncio client and not the sync ``kubernetes`` one in a thread pool: the operator
is one event loop, and so is kopf; ``kubernetes_asyncio`` rides on aiohttp, which kopf
already brings, so a cancelled pass cancels its request instead of leaving a thread
blocked on a socket, a watch is a stream on the loop rather than a thread per watch, and
there is no second HTTP stack (urllib3, requests) to configure.

The operator speaks JSON to known URL paths (``ApiClient.call_api`` with the ``object``
response type): its manifests are dicts rendered by pure builders, and a server-side apply
sends what was rendered, not a model that would add ``null`` fields. Errors come back as
``APIError`` with the HTTP status (0: no answer at all). ``calls`` counts the requests by
verb, which the operator's tests and benchmark read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch

__all__ = [
    "FIELD_MANAGER",
    "APIConflictError",
    "APIError",
    "APIGoneError",
    "APINotFoundError",
    "KubeClient",
]

# The one field manager of every write; its server-side applies own the fields they send.
FIELD_MANAGER = "outbox-dispatcher-operator"
_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_JSON_TYPES = {200: "object", 201: "object", 202: "object"}
Query = Mapping[str, str | int | bool]
RETRIES = (0.5, 1.0, 2.0)  # seconds before each new try of an unanswered request
_TRANSIENT = frozenset({0, 429, 500, 502, 503, 504})


class APIError(Exception):
    """A request the API server refused (``status``), or that got no answer (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status or 'no answer'}: {message}" if status else message)
        self.status = status


class APINotFoundError(APIError):
    pass


class APIConflictError(APIError):
    pass


class APIGoneError(APIError):
    """A watch or list from a ``resourceVersion`` the API server no longer has."""


_ERRORS: dict[int, type[APIError]] = {404: APINotFoundError, 409: APIConflictError}
_ERRORS[410] = APIGoneError


def _error(status: int, body: Any) -> APIError:
    message = str(body or "")
    with contextlib.suppress(ValueError, AttributeError):
        message = str(json.loads(message).get("message") or message)
    return _ERRORS.get(status, APIError)(status, message[:500])


class KubeClient:
    """One authenticated session to the API server, and how many requests went through it."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self.calls: Counter[str] = Counter()  # by verb ("apply": a server-side apply)
        self.requests: Counter[tuple[str, str]] = Counter()  # by ("group/resource", verb)
        self.refused: Counter[tuple[str, str]] = Counter()  # those answered 403 Forbidden

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubeClient:
        """In a pod its ServiceAccount; elsewhere ``kubeconfig`` (or ``$KUBECONFIG``, or
        ``~/.kube/config``)."""
        configuration = client.Configuration()
        if kubeconfig is None and _in_pod():
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
            await config.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False
            )
        return cls.at(configuration)

    @classmethod
    def at(cls, configuration: client.Configuration) -> KubeClient:
        api = client.ApiClient(configuration)
        api.user_agent = FIELD_MANAGER
        return cls(api)

    @property
    def configuration(self) -> client.Configuration:
        """What it logged in with (kopf is handed the same: ``handlers.connection_info``)."""
        return self._api.configuration

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: object | None = None,
        content_type: str = "application/json",
        seconds: float = 60,
        retries: Sequence[float] = RETRIES,
    ) -> Any:
        """One request; its decoded JSON answer. ``APIError`` if refused or unanswered.

        A request the API server did not answer, or answered "busy" (429, 5xx), is sent
        again after each pause of ``retries`` (each write the operator makes can be repeated:
        an apply or a patch to the same content, or a create that then finds the name taken;
        the Lease's calls pass none: its loop reads again on its own schedule).
        """
        for pause in (*retries, None):
            try:
                return await self._request_once(
                    method, path, query=query, body=body, content_type=content_type, seconds=seconds
                )
            except APIError as exc:
                if pause is None or exc.status not in _TRANSIENT:
                    raise
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def _request_once(
        self,
        method: str,
        path: str,
        *,
        query: Query | None,
        body: object | None,
        content_type: str,
        seconds: float,
    ) -> Any:
        verb = _verb(method, path, content_type)
        self.calls[verb] += 1
        key = (_resource(path), verb)
        self.requests[key] += 1
        try:
            return await self._api.call_api(
                path,
                method.upper(),
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                response_types_map=_JSON_TYPES,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=seconds,
            )
        except client.ApiException as exc:
            if exc.status == 403:
                self.refused[key] += 1
            raise _error(int(exc.status or 0), exc.body) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise APIError(0, f"no answer from the API server: {type(exc).__name__}") from None

    async def watch(
        self, path: str, *, query: Query, seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch of ``path`` (``{"type": ..., "object": ...}``) until the API
        server ends it after ``seconds``; an ``ERROR`` event is raised as ``APIError``.

        The official client's ``Watch`` reads the stream (lines up to the 2 MiB its reader
        allows, above etcd's 1.5 MiB object limit); whatever it cannot read as an event (not
        JSON, no ``type``/``object``) ends the watch as a cut one (``APIError`` 0), so the
        informer lists again instead of acting on it.
        """
        self.calls["watch"] += 1
        key = (_resource(path), "watch")
        self.requests[key] += 1
        timeout = aiohttp.ClientTimeout(connect=30, sock_read=seconds + 30)

        async def open_stream(**kwargs: Any) -> Any:
            params = {**query, "watch": "true", "timeoutSeconds": kwargs["timeout_seconds"]}
            response = await self._api.call_api(
                path,
                "GET",
                query_params=list(params.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
            if response.status >= 400:  # refused: the body is a Status, not a stream
                async with response:
                    if response.status == 403:
                        self.refused[key] += 1
                    raise _error(response.status, await response.text())
            return response

        stream = watch.Watch()
        try:
            async with stream.stream(open_stream, timeout_seconds=seconds) as events:
                async for event in events:
                    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
                        raise APIError(0, "watch stream: an event that is not a JSON object")
                    yield {"type": event["type"], "object": event["raw_object"]}
        except client.ApiException as exc:  # an ERROR event (410: the version is too old)
            raise _error(int(exc.status or 0), exc.reason) from None
        except (aiohttp.ClientError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            raise APIError(0, f"watch cut: {type(exc).__name__}") from None
        except APIError:
            raise
        except Exception as exc:  # the client's own "Malformed JSON response" and the like
            raise APIError(0, f"watch stream: {exc}") from None


def _in_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(_TOKEN)


def _verb(method: str, path: str, content_type: str) -> str:
    """The Kubernetes verb of a request, for counting (a GET on a collection is a list)."""
    method = method.lower()
    if method == "patch":
        return "apply" if content_type.startswith("application/apply-patch") else "patch"
    if method == "get":
        return "list" if _collection(path) else "get"
    return {"post": "create", "delete": "delete", "put": "update"}.get(method, method)


def _resource(path: str) -> str:
    """``group/plural[/subresource]`` of a resource path ("" group for the core API)."""
    parts = path.split("?")[0].strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2 if parts[0] == "api" else 3 :]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    return "/".join([group, rest[0], *rest[2:3]]) if rest else group


def _collection(path: str) -> bool:
    """Whether ``path`` names a collection: ``.../namespaces/NS/PLURAL`` or ``/apis/G/V/PLURAL``."""
    parts = path.strip("/").split("/")
    start = 2 if parts[0] == "api" else 3
    rest = parts[start:]
    if rest[:1] == ["namespaces"]:
        rest = rest[2:]
    return len(rest) == 1
