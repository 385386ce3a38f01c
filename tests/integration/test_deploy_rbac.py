"""The operator's Role grants every API call the operator makes, and nothing more.

The real operator (``tests.fix_kube.running_operator``) runs against kmock behind a gate that
answers 403 to any request the Role of ``deploy/base/rbac.yaml`` does not allow, as the API
server would for the operator's ServiceAccount (the chart's Role is the same object: see
``test_deploy_kustomize``). A scenario that creates, changes and shrinks an ``OutboxDispatcher``
must then succeed with no request refused, and must use every verb the Role grants (a second
dispatcher on the same Redis database makes the operator read the first one's resource).

The gate also plays the OwnerReferencesPermissionEnforcement admission plugin (on by default on
OpenShift): writing an object whose ownerReferences set ``blockOwnerDeletion`` needs ``update``
on the owner's ``finalizers`` subresource. The scenario starts from a dispatcher that an older
operator left a kopf finalizer on, which the operator must release.

Discovery (``/api``, ``/apis``, ``/version``) is not a resource request: every authenticated
user may read it (``system:discovery``), so the gate lets it through. kopf's scanning of
namespaces and CRDs is off in this fixture; in a cluster it is on and refused by this Role, and
kopf then falls back to the ``--namespace`` names (``test_kopf_tolerates_refused_scanning``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import pytest
import yaml
from kmock._internal import rendering

from dispatcher._testing.waiting import eventually
from tests.fix_kube import (
    DEPLOYMENTS,
    NAMESPACE,
    PDBS,
    FakeClock,
    KubeEmulator,
    _declare_resources,
    running_operator,
    secret,
)
from tests.suite_servers import postgres_admin_url

ROOT = Path(__file__).resolve().parents[2]
CR_URL = f"/apis/dispatch.composer.dev/v1alpha1/namespaces/{NAMESPACE}/outboxdispatchers"
SECRETS_URL = f"/api/v1/namespaces/{NAMESPACE}/secrets"
OPERATOR = "outbox-dispatcher-operator"  # its Role (the other one is its Lease's)
ADMIN = "X-Test-Admin"  # requests of the test itself (kubectl's role), not of the operator


@dataclass(frozen=True)
class Attributes:
    """What RBAC authorizes a resource request by."""

    verb: str
    group: str
    resource: str  # plural, or plural/subresource
    namespace: str | None


def _role_rules() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "base" / "rbac.yaml").read_text())
    (role,) = (d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == OPERATOR)
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def _verb(request: rendering.Request) -> str:
    method = str(request.method.value if request.method else "GET").upper()
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    if method == "DELETE" and not request.name:
        return "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]


def _attributes(request: rendering.Request) -> Attributes | None:
    if request.resource is None or not request.resource.plural:
        return None  # discovery (/api/v1, /apis/group/version) and other non-resource URLs
    plural = request.resource.plural
    return Attributes(
        verb=_verb(request),
        group=request.resource.group or "",
        resource=f"{plural}/{request.subresource}" if request.subresource else plural,
        namespace=request.namespace,
    )


def allowed(attrs: Attributes, rules: list[dict[str, Any]], *, namespace: str) -> bool:
    """A Role's decision: namespaced requests in its namespace that some rule matches."""
    if attrs.namespace != namespace:
        return False
    return any(
        attrs.group in rule["apiGroups"]
        and attrs.resource in rule["resources"]
        and attrs.verb in rule["verbs"]
        for rule in rules
    )


PLURALS = {"OutboxDispatcher": "outboxdispatchers"}


def _owner_checks(request: rendering.Request) -> list[Attributes]:
    """What OwnerReferencesPermissionEnforcement asks of a create/update with owner refs."""
    if request.action not in (kmock.action.CREATE, kmock.action.UPDATE):
        return []
    if not isinstance(request.data, dict):
        return []
    refs = (request.data.get("metadata") or {}).get("ownerReferences") or []
    return [
        Attributes(
            verb="update",
            group=str(ref["apiVersion"]).rpartition("/")[0],
            resource=f"{PLURALS.get(ref['kind'], ref['kind'].lower() + 's')}/finalizers",
            namespace=request.namespace,
        )
        for ref in refs
        if ref.get("blockOwnerDeletion")
    ]


class RbacGate(KubeEmulator):
    """kmock that refuses, with 403 like the API server, what the Role does not grant."""

    def __init__(self, rules: list[dict[str, Any]]) -> None:
        super().__init__()
        self.rules = rules
        self.granted: set[Attributes] = set()
        self.refused: set[Attributes] = set()

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        attrs = _attributes(request)
        if attrs is not None and ADMIN not in request.headers:
            for needed in (attrs, *_owner_checks(request)):
                if not allowed(needed, self.rules, namespace=NAMESPACE):
                    self.refused.add(needed)
                    return aiohttp.web.json_response(
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "reason": "Forbidden",
                            "code": 403,
                            "message": f"forbidden: {needed}",
                        },
                        status=403,
                    )
                self.granted.add(needed)
        return await super()._handle(request)

    async def send(self, method: str, url: str, body: Any = None) -> dict[str, Any]:
        headers = {ADMIN: "1"}
        if method == "patch":
            headers["Content-Type"] = "application/merge-patch+json"
        async with self.request(method, url, json=body, headers=headers) as response:
            data: dict[str, Any] = await response.json()
            assert response.status < 400, data
            return data


@pytest.fixture
async def gate() -> AsyncIterator[RbacGate]:
    async with RbacGate(_role_rules()) as emulator, kmock.Server(emulator):
        _declare_resources(emulator)
        yield emulator


def _dispatcher(queues: list[dict[str, Any]], *, name: str = "orders") -> dict[str, Any]:
    return {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "shards": 2,
            "postgres": {"secretRef": {"name": "pg", "key": "url"}},
            "redis": {"secretRef": {"name": "rd", "key": "url"}},
            "queues": queues,
        },
    }


def _ready(gate: RbacGate) -> bool:
    cr = gate.live("dispatch.composer.dev/v1alpha1/outboxdispatchers", "orders") or {}
    conditions = (cr.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def test_role_grants_exactly_what_the_operator_uses(
    gate: RbacGate, clock: FakeClock, redis_url: str
) -> None:
    emails = {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5}
    invoices = {"name": "invoices", "handler": "billing:render", "minReplicas": 0}
    async with running_operator(gate, clock):
        await gate.send("post", SECRETS_URL, secret("pg", url=postgres_admin_url()))
        await gate.send("post", SECRETS_URL, secret("rd", url=redis_url))
        older = _dispatcher([emails, invoices])
        older["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
        await gate.send("post", CR_URL, older)

        async def created() -> bool:
            cr = gate.live("dispatch.composer.dev/v1alpha1/outboxdispatchers", "orders") or {}
            return (
                _ready(gate)
                and gate.live(DEPLOYMENTS, "orders-worker-invoices") is not None
                and gate.live(DEPLOYMENTS, "orders-enqueuer") is not None
                and not cr["metadata"].get("finalizers")
            )

        await eventually(created, within=20)
        # A second dispatcher on the same Redis database: the operator reads whether the
        # owner of its shard key still exists (get), and reports the conflict.
        await gate.send("post", CR_URL, _dispatcher([emails], name="payments"))

        async def conflict() -> bool:
            cr = gate.live("dispatch.composer.dev/v1alpha1/outboxdispatchers", "payments") or {}
            conditions = (cr.get("status") or {}).get("conditions") or []
            return any(c["reason"] == "RedisConflict" for c in conditions)

        await eventually(conflict, within=20)
        # Someone loosens a budget by hand: the next reconcile patches it back.
        budget_url = (
            f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/orders-worker-emails"
        )
        await gate.send("patch", budget_url, {"spec": {"maxUnavailable": 3}})
        changed = {**emails, "handler": "app.tasks:send_v2"}
        await gate.send("patch", f"{CR_URL}/orders", {"spec": {"queues": [changed]}})

        async def pruned() -> bool:
            worker = gate.live(DEPLOYMENTS, "orders-worker-emails") or {}
            args = worker.get("spec", {}).get("template", {}).get("spec", {})
            return gate.live(DEPLOYMENTS, "orders-worker-invoices") is None and (
                "--handler=app.tasks:send_v2" in str(args)
            )

        await eventually(pruned, within=20)

        async def budgets() -> bool:
            emails_budget = gate.live(PDBS, "orders-worker-emails") or {}
            return gate.live(PDBS, "orders-worker-invoices") is None and (
                emails_budget.get("spec", {}).get("maxUnavailable") == 1
            )

        await eventually(budgets, within=20)

        async def posted() -> bool:  # kopf posts Events in the background
            return bool(gate.events())

        await eventually(posted, within=10)

    assert not gate.refused, f"the Role lacks: {sorted(map(str, gate.refused))}"
    used = {(a.group, a.resource, a.verb) for a in gate.granted}
    granted = {
        (group, resource, verb)
        for rule in _role_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted - used == set(), "granted but never used"


def test_kopf_tolerates_refused_scanning() -> None:
    """Without namespace/CRD list+watch, kopf 1.45 warns and serves the given namespaces."""
    from kopf._core.reactor import observation

    for observer in (observation.namespace_observer, observation.resource_observer):
        assert "except errors.APIForbiddenError" in inspect.getsource(observer), observer
