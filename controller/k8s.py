"""The one thin layer that talks to the Kubernetes API.

It rides on kopf's own API client (``kopf._cogs.clients.api``): the same
authenticated session, re-login on 401 and retries with backoff on 5xx and
timeouts as kopf's watchers, with no second client library. That module is
private to kopf, which is why kopf is pinned to one minor version; nothing
else in ``controller/`` imports it.

Writes are JSON merge patches of the rendered manifests, sent only when the
live object does not already contain what we render, quantities compared as
numbers (the API server rewrites ``1024Mi`` as ``1Gi``). Secret values are
decoded here and handed back, never logged. Events are posted here too (the
operator's own loop runs outside kopf's handlers, where ``kopf.info`` works).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import logging
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote, urlencode

import kopf
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors

from controller.model import SecretRef
from controller.quantity import same_quantity
from controller.resource import API_GROUP, API_VERSION, KIND, PLURAL

__all__ = ["APIConflictError", "APIError", "KubeApi", "SecretMissing", "contains", "object_url"]

APIError = kopf_errors.APIError
APIConflictError = kopf_errors.APIConflictError
# Where the API server stores quantities in canonical form.
_QUANTITY_KEYS = frozenset({"requests", "limits", "sizeLimit"})
COMPONENT = "outbox-dispatcher-operator"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
Logger = logging.Logger | logging.LoggerAdapter[Any]


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


# The namespaced kinds the operator owns besides Deployments: API path prefix and plural.
_KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Job": ("/apis/batch/v1", "jobs"),
    KIND: (f"/apis/{API_GROUP}/{API_VERSION}", PLURAL),  # read: who owns a shard key
}


def object_url(kind: str, *, namespace: str, name: str | None = None) -> str:
    prefix, plural = _KINDS[kind]
    url = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
    return url if name is None else f"{url}/{quote(name)}"


def _deployments(namespace: str, name: str | None = None) -> str:
    url = f"/apis/apps/v1/namespaces/{quote(namespace)}/deployments"
    return url if name is None else f"{url}/{quote(name)}"


class KubeApi:
    """The API calls the operator makes, on kopf's authenticated session."""

    def __init__(self, *, settings: kopf.OperatorSettings, logger: Logger) -> None:
        self._settings = settings
        self._logger = logger

    async def _call(self, method: str, url: str, *, payload: object | None = None) -> Any:
        kwargs: dict[str, Any] = {"settings": self._settings, "logger": self._logger}
        if method == "get":
            return await kopf_api.get(url, **kwargs)
        if method == "post":
            return await kopf_api.post(url, payload=payload, **kwargs)
        if method == "patch":
            return await kopf_api.patch(url, payload=payload, headers=MERGE_PATCH, **kwargs)
        return await kopf_api.delete(url, **kwargs)

    async def secret_value(self, *, namespace: str, ref: SecretRef) -> str:
        """The decoded value of ``ref``; ``SecretMissing`` names what is missing."""
        url = f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(ref.name)}"
        try:
            secret = await self._call("get", url)
        except kopf_errors.APINotFoundError:
            raise SecretMissing(f"Secret {namespace}/{ref.name} does not exist") from None
        encoded = (secret.get("data") or {}).get(ref.key)
        if encoded is None:
            raise SecretMissing(f"Secret {namespace}/{ref.name} has no key {ref.key!r}")
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8").strip()
        except (binascii.Error, UnicodeDecodeError):
            raise SecretMissing(
                f"Secret {namespace}/{ref.name} key {ref.key!r} is not valid UTF-8 text"
            ) from None

    async def create_deployment(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create it; ``APIConflictError`` if the name is taken."""
        url = _deployments(manifest["metadata"]["namespace"])
        created: dict[str, Any] = await self._call("post", url, payload=manifest)
        return created

    async def patch_deployment(
        self, *, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        patched: dict[str, Any] = await self._call(
            "patch", _deployments(namespace, name), payload=patch
        )
        return patched

    async def delete_deployment(self, *, namespace: str, name: str) -> None:
        with contextlib.suppress(kopf_errors.APINotFoundError):
            await self._call("delete", _deployments(namespace, name))

    async def patch_status(self, *, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource of an ``OutboxDispatcher``."""
        url = (
            f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{quote(namespace)}/"
            f"{PLURAL}/{quote(name)}/status"
        )
        await self._call("patch", url, payload={"status": status})

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
            "reportingInstance": self._settings.posting.reporting_instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
        }
        try:
            await self._call("post", f"/api/v1/namespaces/{quote(namespace)}/events", payload=event)
        except APIError as exc:
            self._logger.warning("cannot post Event %s: %s", reason, exc)

    # -- any owned kind (PodDisruptionBudgets, Jobs) -------------------------------------------

    async def get_object(self, kind: str, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._call(
                "get", object_url(kind, namespace=namespace, name=name)
            )
        except kopf_errors.APINotFoundError:
            return None
        return found

    async def create_object(self, manifest: dict[str, Any]) -> dict[str, Any]:
        namespace = manifest["metadata"]["namespace"]
        created: dict[str, Any] = await self._call(
            "post", object_url(manifest["kind"], namespace=namespace), payload=manifest
        )
        return created

    async def apply_object(
        self, manifest: dict[str, Any]
    ) -> Literal["created", "updated", "unchanged"]:
        """Create the object, or merge-patch it if it differs from ``manifest``."""
        kind, meta = manifest["kind"], manifest["metadata"]
        live = await self.get_object(kind, namespace=meta["namespace"], name=meta["name"])
        if live is None:
            await self.create_object(manifest)
            return "created"
        if contains(live, manifest):
            return "unchanged"
        await self._call(
            "patch",
            object_url(kind, namespace=meta["namespace"], name=meta["name"]),
            payload=manifest,
        )
        return "updated"

    async def list_objects(
        self, kind: str, *, namespace: str, selector: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects of ``kind`` carrying every label of ``selector`` (checked here too)."""
        query = urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
        listing = await self._call("get", f"{object_url(kind, namespace=namespace)}?{query}")
        items: list[dict[str, Any]] = listing.get("items") or []
        return [
            o
            for o in items
            if selector.items() <= (o.get("metadata", {}).get("labels") or {}).items()
        ]

    async def delete_object(self, kind: str, *, namespace: str, name: str) -> None:
        with contextlib.suppress(kopf_errors.APINotFoundError):
            await self._call("delete", object_url(kind, namespace=namespace, name=name))

    async def served(self, *, group: str, version: str, plural: str) -> bool:
        """Whether API discovery lists ``plural`` in ``group/version`` (a CRD established)."""
        try:
            found = await self._call("get", f"/apis/{quote(group)}/{quote(version)}")
        except (kopf_errors.APINotFoundError, kopf_errors.APIForbiddenError):
            return False
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])
