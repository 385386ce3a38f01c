"""The Secrets the dispatchers reference, read at most once per name per ``ttl`` seconds.

A pass needs the value of every Secret key a pod, the migration Job or the operator itself
reads (a missing one is a condition, not pods stuck in ``CreateContainerConfigError``).
Reading them with a GET each per pass was most of the operator's API load; here a Secret is
fetched once for all its keys, and kept for ``ttl`` seconds for every dispatcher of its
namespace. A rotated value is therefore seen within ``ttl`` (the pods roll then, their
template carrying a digest of the values). A Secret that is missing is never kept: the
next pass asks again. Values are decoded here and never logged.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dispatcher.controller.api_requests import KubeApi, SecretMissing
from dispatcher.controller.model import SecretRef
from dispatcher.logs import hide

__all__ = ["SecretCache"]

Key = tuple[str, str]  # namespace, name


@dataclass
class SecretCache:
    """Secrets' data by (namespace, name), each with the time it was read."""

    ttl: float
    clock: Callable[[], float] = time.monotonic
    _held: dict[Key, tuple[float, dict[str, str]]] = field(default_factory=dict)

    async def values(
        self, api: KubeApi, *, namespace: str, refs: Iterable[SecretRef]
    ) -> dict[SecretRef, str]:
        """The decoded value of every ref; ``SecretMissing`` names the first that is missing."""
        found: dict[SecretRef, str] = {}
        for ref in dict.fromkeys(refs):
            data, kept = await self._data(api, namespace=namespace, name=ref.name)
            try:
                found[ref] = _decode(data, namespace=namespace, ref=ref)
            except SecretMissing:
                if not kept:
                    raise
                # What was kept lacks it: the Secret may have been fixed since; ask again.
                self._held.pop((namespace, ref.name), None)
                data, _ = await self._data(api, namespace=namespace, name=ref.name)
                found[ref] = _decode(data, namespace=namespace, ref=ref)
        return found

    async def _data(
        self, api: KubeApi, *, namespace: str, name: str
    ) -> tuple[dict[str, str], bool]:
        """The Secret's data, and whether it was kept from an earlier read."""
        key = (namespace, name)
        held = self._held.get(key)
        now = self.clock()
        if held is not None and now - held[0] < self.ttl:
            return held[1], True
        # Nothing stale stays in memory (a deleted dispatcher's Secrets among them).
        for stale in [k for k, (at, _) in self._held.items() if now - at >= self.ttl]:
            del self._held[stale]
        data = await api.secret_data(namespace=namespace, name=name)
        self._held[key] = (now, data)
        return data, False


def _decode(data: dict[str, str], *, namespace: str, ref: SecretRef) -> str:
    encoded = data.get(ref.key)
    if encoded is None:
        raise SecretMissing(f"Secret {namespace}/{ref.name} has no key {ref.key!r}")
    try:
        value = base64.b64decode(encoded, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        raise SecretMissing(
            f"Secret {namespace}/{ref.name} key {ref.key!r} is not valid UTF-8 text"
        ) from None
    hide(value, encoded)  # never in a log line, whoever would write it
    return value
