"""The operator's caches: a relist replaces what a namespace held; Secrets read once per TTL."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from dispatcher.controller.api_connection import _resource, _verb
from dispatcher.controller.api_requests import SecretMissing
from dispatcher.controller.cache import Cache
from dispatcher.controller.model import SecretRef
from dispatcher.controller.secrets import SecretCache


def obj(name: str, version: int, namespace: str = "ns") -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(version)}
    return {"metadata": meta}


def test_a_relist_drops_what_it_did_not_find_and_reports_every_difference() -> None:
    cache = Cache()
    for body in (obj("a", 1), obj("b", 2), obj("c", 3), obj("a", 9, namespace="other")):
        cache.put(body)
    changed = cache.replace("Deployment", "ns", [obj("a", 1), obj("c", 7), obj("d", 8)])
    assert sorted(cache.deployments) == [("ns", "a"), ("ns", "c"), ("ns", "d"), ("other", "a")]
    # b went (its owner must re-create it), c changed, d appeared; a is as it was.
    assert sorted(b["metadata"]["name"] for b in changed) == ["b", "c", "d"]


def test_an_older_event_never_replaces_a_newer_version() -> None:
    cache = Cache()
    cache.put(obj("a", 5), "Job")
    cache.put(obj("a", 4), "Job")
    assert cache.get("Job", "ns", "a") == obj("a", 5)


class Secrets:
    """What ``SecretCache`` asks of ``KubeApi``: counts the reads."""

    def __init__(self, **data: dict[str, str]) -> None:
        self.data = data
        self.reads: list[str] = []

    async def secret_data(self, *, namespace: str, name: str) -> dict[str, str]:
        self.reads.append(name)
        if name not in self.data:
            raise SecretMissing(f"Secret {namespace}/{name} does not exist")
        return {k: base64.b64encode(v.encode()).decode() for k, v in self.data[name].items()}


async def test_a_secret_is_read_once_per_ttl_for_all_its_keys() -> None:
    now = [0.0]
    cache = SecretCache(ttl=60, clock=lambda: now[0])
    api = Secrets(pg={"url": "postgresql://x", "owner": "postgresql://y"})
    refs = [SecretRef(name="pg", key="url"), SecretRef(name="pg", key="owner")]
    for _ in range(3):
        found = await cache.values(api, namespace="ns", refs=refs)
    assert found == {refs[0]: "postgresql://x", refs[1]: "postgresql://y"}
    assert api.reads == ["pg"]
    now[0] = 61
    api.data["pg"]["url"] = "postgresql://rotated"
    found = await cache.values(api, namespace="ns", refs=refs)
    assert found[refs[0]] == "postgresql://rotated"
    assert api.reads == ["pg", "pg"]


async def test_a_key_missing_from_a_kept_secret_is_asked_for_again() -> None:
    cache = SecretCache(ttl=60, clock=lambda: 0.0)
    api = Secrets(rd={"url": "redis://x"})
    await cache.values(api, namespace="ns", refs=[SecretRef(name="rd", key="url")])
    with pytest.raises(SecretMissing, match="has no key 'worker'"):
        await cache.values(api, namespace="ns", refs=[SecretRef(name="rd", key="worker")])
    assert api.reads == ["rd", "rd"]
    with pytest.raises(SecretMissing, match="does not exist"):
        await cache.values(api, namespace="ns", refs=[SecretRef(name="gone", key="url")])


def test_requests_are_counted_by_resource_and_verb() -> None:
    named = "/apis/apps/v1/namespaces/ns/deployments/w"
    assert (_resource(named), _verb("patch", named, "application/apply-patch+yaml")) == (
        "apps/deployments",
        "apply",
    )
    listing = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"
    assert (_resource(listing), _verb("get", listing, "")) == (
        "policy/poddisruptionbudgets",
        "list",
    )
    secret = "/api/v1/namespaces/ns/secrets/pg"
    assert (_resource(secret), _verb("get", secret, "")) == ("/secrets", "get")
    status = "/apis/dispatch.composer.dev/v1alpha1/namespaces/ns/outboxdispatchers/o/status"
    assert _resource(status) == "dispatch.composer.dev/outboxdispatchers/status"
