"""Kubernetes fixtures: kmock's emulator with API-server bookkeeping, and a live operator.

``KubeEmulator`` is kmock's ``KubernetesEmulator`` plus what a real API server
adds and kopf relies on: ``uid``, ``resourceVersion``, ``generation`` (bumped
when the spec changes), ``creationTimestamp`` and names from ``generateName``; and,
for Deployments, what the API server and the Deployment controller do: quantities
written in canonical form (``1024Mi`` is stored as ``1Gi``) and a rollout that
completes at once (``status`` at the new generation,
every replica available). It also stands in for the Job controller: a Job is
stored as finished with ``job_outcome`` ("Complete" by default, "Failed", or None
to leave it running until the test writes its status).
``operator`` runs the real kopf operator (``dispatcher.controller.handlers.register``) in
the test's event loop against it, with an injected clock for the autoscaler.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kmock
import kopf
import pytest
from kmock._internal import dicts as kmock_dicts
from kmock._internal import rendering
from kubernetes_asyncio.client import Configuration

from dispatcher.controller.conditions import OutboxDispatcherStatus
from dispatcher.controller.handlers import register
from dispatcher.controller.kubeclient import KubeClient
from dispatcher.controller.operator import Operator
from dispatcher.controller.operator_config import OperatorConfig
from tests.suite_servers import postgres_admin_url

NAMESPACE = "default"
NAME = "orders"  # the dispatcher the operator tests apply
CR_URL = f"/apis/dispatch.composer.dev/v1alpha1/namespaces/{NAMESPACE}/outboxdispatchers"
SECRETS_URL = f"/api/v1/namespaces/{NAMESPACE}/secrets"
CR_RESOURCE = "dispatch.composer.dev/v1alpha1/outboxdispatchers"
DEPLOYMENTS = "apps/v1/deployments"
PDBS = "policy/v1/poddisruptionbudgets"
JOBS = "batch/v1/jobs"
SECRETS = "v1/secrets"
EVENTS = "v1/events"
VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}


class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with metadata bookkeeping done before it stores a write."""

    _versions = itertools.count(1)
    job_outcome: str | None = "Complete"

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and isinstance(request.data, dict):
            if request.action == kmock.action.CREATE:
                self._on_create(request)
            elif request.action == kmock.action.UPDATE and request.name is not None:
                self._on_update(request)
        return await super()._handle(request)

    def _on_create(self, request: rendering.Request) -> None:
        meta = request.data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if request.namespace is not None:
            meta.setdefault("namespace", request.namespace)
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = 1
        now = datetime.datetime.now(datetime.UTC)
        meta["creationTimestamp"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        if request.resource == kmock.resource(DEPLOYMENTS):
            _canonical_quantities(request.data)
            self._roll_out(request.data, request.data)
        if request.resource == kmock.resource(JOBS) and self.job_outcome is not None:
            request.data["status"] = job_status(self.job_outcome)

    def _on_update(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        found = dict(self.objects.items()).get(key)  # type: ignore[arg-type]
        if found is None or found.deleted:
            return
        old = found.raw
        new = kmock_dicts.patch_dict(old, request.data)
        meta = request.data.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        if request.subresource is None and new.get("spec") != old.get("spec"):
            meta["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1
        if request.resource == kmock.resource(DEPLOYMENTS) and request.subresource is None:
            _canonical_quantities(request.data)
            new = kmock_dicts.patch_dict(old, request.data)
            new.setdefault("metadata", {}).update(meta)
            self._roll_out(request.data, new)

    def _roll_out(self, data: dict[str, Any], new: dict[str, Any]) -> None:
        """The Deployment controller: the rollout of ``new`` completes."""
        meta = new.get("metadata", {})
        replicas = int(new.get("spec", {}).get("replicas", 1))
        data["status"] = {
            "observedGeneration": int(meta.get("generation", 1)),
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        }

    # -- test conveniences ----------------------------------------------------------------

    def live(self, resource: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        """The current state of an object, or None if absent or deleted."""
        wanted = kmock.resource(resource)
        for (res, ns, objname), obj in self.objects.items():
            if res == wanted and ns == namespace and objname == name and not obj.deleted:
                return obj.raw
        return None

    def all(self, resource: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        wanted = kmock.resource(resource)
        return [
            obj.raw
            for (res, ns, _), obj in self.objects.items()
            if res == wanted and ns == namespace and not obj.deleted
        ]

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.all(EVENTS) if reason is None or e.get("reason") == reason]

    async def send(self, method: str, url: str, body: Any = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "patch" else {}
        async with self.request(method, url, json=body, headers=headers) as response:
            data: dict[str, Any] = await response.json()
            assert response.status < 400, data
            return data


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _canonical(value: Any) -> Any:
    """A binary quantity as the API server stores it: the largest suffix that keeps it whole."""
    if not isinstance(value, str) or value[-2:] not in _BINARY or not value[:-2].isdigit():
        return value
    amount = int(value[:-2]) * _BINARY[value[-2:]]
    for suffix, factor in reversed(_BINARY.items()):
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return value


def _canonical_quantities(deployment: dict[str, Any]) -> None:
    pod = deployment.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers") or []:
        for part in (container.get("resources") or {}).values():
            if isinstance(part, dict):
                part.update({k: _canonical(v) for k, v in part.items()})


def _declare_resources(kube: KubeEmulator) -> None:
    info = kmock.ResourceInfo
    kube.resources[CR_RESOURCE] = info(
        kind="OutboxDispatcher",
        singular="outboxdispatcher",
        namespaced=True,
        verbs=VERBS,
        shortnames={"obd"},
        subresources={"status"},
    )
    kube.resources[DEPLOYMENTS] = info(
        kind="Deployment", namespaced=True, verbs=VERBS, subresources={"status", "scale"}
    )
    kube.resources[PDBS] = info(kind="PodDisruptionBudget", namespaced=True, verbs=VERBS)
    kube.resources[JOBS] = info(kind="Job", namespaced=True, verbs=VERBS, subresources={"status"})
    kube.resources[SECRETS] = info(kind="Secret", namespaced=True, verbs=VERBS)
    kube.resources[EVENTS] = info(kind="Event", namespaced=True, verbs=VERBS)
    # kopf's backbone: looked up at startup even when scanning is disabled.
    kube.resources["v1/namespaces"] = info(kind="Namespace", namespaced=False, verbs=VERBS)
    kube.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", namespaced=False, verbs=VERBS
    )


@pytest.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    """A fresh in-memory Kubernetes API on a loopback port."""
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        _declare_resources(emulator)
        yield emulator


@dataclass
class FakeClock:
    """The autoscaler's clock: moves only when a test says so."""

    now: datetime.datetime = field(
        default_factory=lambda: datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    )

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@contextlib.asynccontextmanager
async def running_operator(
    kube: KubeEmulator, clock: FakeClock, *, liveness: str | None = None, **config_: Any
) -> AsyncIterator[Operator]:
    """The real kopf operator, running in this loop against ``kube``, until the block ends.

    ``liveness``: serve kopf's liveness endpoint at this URL (its probes run on each GET).
    """
    config = OperatorConfig(
        autoscale_interval=0.2,
        retry_base=0.1,
        retry_cap=0.5,
        redis_timeout=2.0,
        migration_poll=0.1,
        clock=clock,
        **config_,
    )
    registry = kopf.OperatorRegistry()
    connection = Configuration(host=str(kube.url).rstrip("/"))
    running = register(registry, Operator(config, client=KubeClient.at(connection)))

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(kube.url).rstrip("/"), default_namespace=NAMESPACE)

    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = [0.1, 0.2]
    settings.posting.default_backoffs = [0.1]
    settings.watching.reconnect_backoff = 0.1
    settings.queueing.idle_timeout = 1.0
    settings.scanning.disabled = True  # the namespace and CRD lists of a cluster are not here
    async with kopf_running(registry, settings, namespace=NAMESPACE, liveness=liveness):
        yield running


@contextlib.asynccontextmanager
async def kopf_running(
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings,
    *,
    namespace: str,
    liveness: str | None = None,
    seconds: float = 30,
) -> AsyncIterator[None]:
    """kopf with ``registry``'s handlers, watching ``namespace``, until the block ends."""
    stop, ready = asyncio.Event(), asyncio.Event()
    # spawn_tasks + run_tasks instead of kopf.operator(): at the end kopf cancels every task
    # born after its start, and pytest-asyncio's teardown is one of those.
    before = asyncio.all_tasks()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=settings,
        standalone=True,
        namespaces=[namespace],
        liveness_endpoint=liveness,
        stop_flag=stop,
        ready_flag=ready,
    )
    await asyncio.wait_for(ready.wait(), seconds)
    try:
        yield
    finally:
        stop.set()
        ignored = before | {t for t in asyncio.all_tasks() if not spawned_by_kopf(t)}
        await asyncio.wait_for(kopf.run_tasks(tasks, ignored=ignored), seconds)


@pytest.fixture
async def operator(kube: KubeEmulator, clock: FakeClock) -> AsyncIterator[Operator]:
    async with running_operator(kube, clock) as running:
        yield running


def spawned_by_kopf(task: asyncio.Task[Any]) -> bool:
    """kopf's own tasks (the only ones its shutdown should wait for or cancel)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/kopf/" in code.co_filename


def secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


def job_status(outcome: str) -> dict[str, Any]:
    """A finished Job's status as the Job controller writes it ("Complete" or "Failed")."""
    condition: dict[str, Any] = {"type": outcome, "status": "True"}
    if outcome == "Failed":
        condition.update(
            reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit"
        )
        return {"failed": 5, "conditions": [condition]}
    return {"succeeded": 1, "conditions": [condition]}


def dispatcher(name: str = NAME, **spec: Any) -> dict[str, Any]:
    """An ``OutboxDispatcher`` with two queues, reading the ``pg`` and ``rd`` Secrets."""
    body: dict[str, Any] = {
        "shards": 2,
        "postgres": {"secretRef": {"name": "pg", "key": "url"}},
        "redis": {"secretRef": {"name": "rd", "key": "url"}},
        "queues": [
            {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5},
            {"name": "invoices", "handler": "billing:render", "minReplicas": 0},
        ],
    }
    body.update(spec)
    return {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }


async def post_secrets(kube: KubeEmulator, redis_url: str = "", **urls: str) -> None:
    """Secrets holding a ``url``, one per keyword (``rd_worker=`` posts ``rd-worker``); with
    ``redis_url``, first the ``pg`` (the machine's PostgreSQL) and ``rd`` ``dispatcher()`` reads."""
    if redis_url:
        urls = {"pg": postgres_admin_url(), "rd": redis_url, **urls}
    for name, url in urls.items():
        await kube.send("post", SECRETS_URL, secret(name.replace("_", "-"), url=url))


def status_of(kube: KubeEmulator, name: str = NAME) -> OutboxDispatcherStatus:
    """The dispatcher's status as the operator last wrote it (empty before the first pass)."""
    cr = kube.live(CR_RESOURCE, name) or {}
    return OutboxDispatcherStatus.model_validate(cr.get("status") or {})


def condition_of(kube: KubeEmulator, type_: str) -> tuple[str, str] | None:
    """A condition of the status as ``(status, reason)``, None while it is absent."""
    found = status_of(kube).condition(type_)
    return None if found is None else (found.status, found.reason)
