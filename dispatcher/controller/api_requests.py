"""The one thin layer that names the operator's Kubernetes API calls.

Each method is one request through ``dispatcher.controller.api_connection.KubeClient`` (the official
asyncio client, counted). Owned objects (Deployments, PodDisruptionBudgets) are written
with server-side apply under one field manager, ``FIELD_MANAGER``: the applied manifest is
the whole of what the operator owns, so a field it stops rendering is removed, and fields
other managers own (an HPA's ``replicas``, a user's annotation) are left alone. An apply
is sent without ``force`` first; a conflict means another manager took over a field the
operator renders (``kubectl edit`` of the image), and only then is it sent again forced,
with the conflict logged: the fields in the manifest are the operator's by definition.

Secrets are read here and handed back raw (``dispatcher.controller.secrets`` decodes and caches
them), never logged. Events are posted here too (the operator's own loop runs outside
kopf's handlers).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

from dispatcher.controller.api_connection import (
    FIELD_MANAGER,
    APIConflictError,
    APIError,
    APIGoneError,
    APINotFoundError,
    KubeClient,
)
from dispatcher.controller.quantity import same_quantity
from dispatcher.controller.resource import API_GROUP, API_VERSION, KIND, PLURAL

__all__ = [
    "OWNED_KINDS",
    "APIConflictError",
    "APIError",
    "APIGoneError",
    "APINotFoundError",
    "KubeApi",
    "SecretMissing",
    "contains",
    "object_url",
]

# Where the API server stores quantities in canonical form.
_QUANTITY_KEYS = frozenset({"requests", "limits", "sizeLimit"})
COMPONENT = "outbox-dispatcher-operator"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML
Logger = logging.Logger | logging.LoggerAdapter[Any]

# The namespaced kinds the operator owns: API path prefix and plural.
OWNED_KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Job": ("/apis/batch/v1", "jobs"),
}
# What the operator addresses by URL: its owned kinds, and its resource (read: who owns a
# Redis database's shard key, controller.shard_owner).
# Pods are only read: why an unavailable Deployment's Pods do not run (controller.unschedulable).
_KINDS = {
    **OWNED_KINDS,
    KIND: (f"/apis/{API_GROUP}/{API_VERSION}", PLURAL),
    "Pod": ("/api/v1", "pods"),
}


class SecretMissing(Exception):
    """A referenced Secret or key does not exist (or is not a valid value)."""


def contains(live: Any, wanted: Any, *, quantities: bool = False) -> bool:
    """Whether ``live`` already holds everything in ``wanted`` (defaults may add more)."""
    if isinstance(wanted, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and contains(live[k], v, quantities=quantities or k in _QUANTITY_KEYS)
            for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(live, list)
            and len(live) == len(wanted)
            and all(
                contains(a, b, quantities=quantities) for a, b in zip(live, wanted, strict=True)
            )
        )
    if quantities and same_quantity(live, wanted):
        return True
    return bool(live == wanted)


def object_url(kind: str, *, namespace: str | None, name: str | None = None) -> str:
    """The path of an owned object, of its kind in a namespace, or (no namespace) everywhere."""
    prefix, plural = _KINDS[kind]
    url = (
        f"{prefix}/{plural}"
        if namespace is None
        else (f"{prefix}/namespaces/{quote(namespace)}/{plural}")
    )
    return url if name is None else f"{url}/{quote(name)}"


class KubeApi:
    """The API calls the operator makes, on one counted ``KubeClient``."""

    def __init__(self, *, client: KubeClient, logger: Logger, reporting_instance: str) -> None:
        self._client = client
        self._logger = logger
        self._instance = reporting_instance

    async def secret_data(self, *, namespace: str, name: str) -> dict[str, str]:
        """The (base64) ``data`` of a Secret; ``SecretMissing`` if there is none."""
        url = f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}"
        try:
            secret = await self._client.request("get", url)
        except APINotFoundError:
            raise SecretMissing(f"Secret {namespace}/{name} does not exist") from None
        data = (secret or {}).get("data") or {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply ``manifest`` (creates it if absent); the object as stored."""
        meta = manifest["metadata"]
        url = object_url(manifest["kind"], namespace=meta["namespace"], name=meta["name"])
        query: dict[str, str | int | bool] = {"fieldManager": FIELD_MANAGER}
        try:
            applied = await self._client.request(
                "patch", url, query=query, body=manifest, content_type=APPLY_PATCH
            )
        except APIConflictError as exc:
            self._logger.info(
                "%s %s: taking back fields another manager changed (%s)",
                manifest["kind"], meta["name"], exc,
            )  # fmt: skip
            query["force"] = True
            applied = await self._client.request(
                "patch", url, query=query, body=manifest, content_type=APPLY_PATCH
            )
        return dict(applied)

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create it; ``APIConflictError`` if the name is taken."""
        url = object_url(manifest["kind"], namespace=manifest["metadata"]["namespace"])
        query = {"fieldManager": FIELD_MANAGER}
        return dict(await self._client.request("post", url, query=query, body=manifest))

    async def get(self, kind: str, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = await self._client.request(
                "get", object_url(kind, namespace=namespace, name=name)
            )
        except APINotFoundError:
            return None
        return dict(found)

    async def patch(
        self, kind: str, *, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch an object; None if it is gone."""
        url = object_url(kind, namespace=namespace, name=name)
        query = {"fieldManager": FIELD_MANAGER}
        try:
            return dict(
                await self._client.request(
                    "patch", url, query=query, body=patch, content_type=MERGE_PATCH
                )
            )
        except APINotFoundError:
            return None

    async def delete(self, kind: str, *, namespace: str, name: str) -> None:
        with contextlib.suppress(APINotFoundError):
            await self._client.request("delete", object_url(kind, namespace=namespace, name=name))

    async def list_objects(
        self, kind: str, *, namespace: str | None, selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        """Objects of ``kind`` matching the label ``selector`` (server-side), and the list's
        ``resourceVersion`` (a watch from there misses nothing)."""
        listing = await self._client.request(
            "get", object_url(kind, namespace=namespace), query={"labelSelector": selector}
        )
        # A list's items carry no apiVersion and kind; the watch's objects and applies do.
        head = {"apiVersion": listing.get("apiVersion"), "kind": kind}
        items = [{**head, **o} for o in (listing.get("items") or [])]
        return items, str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self, kind: str, *, namespace: str | None, selector: str, version: str, seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of ``kind`` matching ``selector`` after ``version``, for ``seconds``."""
        query = {"labelSelector": selector, "resourceVersion": version}
        query["allowWatchBookmarks"] = "true"
        return self._client.watch(
            object_url(kind, namespace=namespace), query=query, seconds=seconds
        )

    async def patch_status(self, *, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource of an ``OutboxDispatcher``."""
        url = (
            f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{quote(namespace)}/"
            f"{PLURAL}/{quote(name)}/status"
        )
        query = {"fieldManager": FIELD_MANAGER}
        await self._client.request(
            "patch", url, query=query, body={"status": status}, content_type=MERGE_PATCH
        )

    async def post_event(
        self,
        *,
        involved: Mapping[str, str],
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        """An Event on an ``OutboxDispatcher`` (``involved``: its name, namespace, uid); an
        Event that cannot be posted is logged and dropped, never a reason to fail."""
        now = datetime.datetime.now(datetime.UTC).isoformat()
        namespace = involved["namespace"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": KIND,
                "name": involved["name"],
                "namespace": namespace,
                "uid": involved["uid"],
            },
            "action": "Reconcile",
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
        }
        url = f"/api/v1/namespaces/{quote(namespace)}/events"
        try:
            await self._client.request("post", url, body=event)
        except APIError as exc:
            self._logger.warning("cannot post Event %s: %s", reason, exc)

    async def served(self, *, group: str, version: str, plural: str) -> bool:
        """Whether API discovery lists ``plural`` in ``group/version`` (a CRD established)."""
        try:
            found = await self._client.request("get", f"/apis/{quote(group)}/{quote(version)}")
        except APIError as exc:
            if exc.status in (403, 404):
                return False
            raise
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])
