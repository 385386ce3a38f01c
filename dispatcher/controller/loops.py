"""The operator's own loop: one task per ``OutboxDispatcher``, woken by what it watches.

kopf watches the dispatchers (handlers in ``dispatcher.controller.handlers``); the objects they
own (Deployments, PodDisruptionBudgets, Jobs) are listed and watched, label-selected, by
``dispatcher.controller.informer`` into ``dispatcher.controller.cache``, with every API call on
one ``dispatcher.controller.api_connection.KubeClient`` (the official asyncio client). Each
dispatcher gets one task that runs ``reconcile_once`` every ``autoscale_interval`` seconds
(jittered by a tenth, so dispatchers drift apart) and whenever its resource or one of its
objects changes (so a deleted or edited Deployment is restored within seconds, and ``Ready``
follows rollouts). Reconcile and autoscale are one pass, so neither can undo the other.

None of this uses kopf's per-object handlers (timers, daemons, change
handlers): those need a finalizer on the resource, which makes deleting it
wait for a running operator. Here, nothing is ever left to finalize: the
Deployments go with their owner by garbage collection, and deleting a
dispatcher needs no operator at all.

The status is written whole after each pass, only when it changed, always with
``observedGeneration``. A failing pass is retried with exponential backoff.

With several replicas, passes run only while ``leadership`` says this replica leads
(``dispatcher.controller.lease_election``): the loops wait until then, and a pass is cancelled
when the Lease is lost. The watches keep running on every replica.

``dispatcher.cli.operator`` is the command layer that starts this (``dispatcher operator``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from dispatcher.controller.api_connection import APIError, KubeClient
from dispatcher.controller.api_requests import KubeApi
from dispatcher.controller.cache import Cache
from dispatcher.controller.effects import NotYetKnown
from dispatcher.controller.identity import Owner
from dispatcher.controller.informer import Informers
from dispatcher.controller.leadership import Leadership, NotLeading
from dispatcher.controller.lease_election import identity
from dispatcher.controller.operator_config import OperatorConfig
from dispatcher.controller.operator_metrics import OperatorMetrics
from dispatcher.controller.probes import CrdProbe, PostgresProbe
from dispatcher.controller.reconcile import Context, parse_spec, parse_status, reconcile_once
from dispatcher.controller.redis_access import RedisPool
from dispatcher.controller.report import Failure, Pass, console_url, degraded_events, status_after
from dispatcher.controller.resource import KIND
from dispatcher.controller.secrets import SecretCache
from dispatcher.controller.shard_owner import in_conflict, release_marker

__all__ = ["Operator", "WatchEvent", "Watched"]

log = logging.getLogger("dispatcher.controller")

# Liveness answers within the kubelet's probe timeout (5 s in the manifests): an API server that
# has not answered whether the CRD is served by then leaves the operator live.
LIVENESS_ASK_SECONDS = 3.0
Key = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class WatchEvent:
    """What a watch reported about one object: its body now, and whether it is gone."""

    body: Mapping[str, Any]
    deleted: bool

    @classmethod
    def from_kopf(cls, kwargs: Mapping[str, Any]) -> WatchEvent:
        """From the keyword arguments kopf passes an event handler (``body``, ``type``)."""
        return cls(body=kwargs["body"], deleted=kwargs.get("type") == "DELETED")

    @property
    def meta(self) -> Mapping[str, Any]:
        meta: Mapping[str, Any] = self.body.get("metadata", {})
        return meta


@dataclass(eq=False)
class Watched:
    """One dispatcher the operator watches: its resource as last seen, the status last
    written, and its loop. Dropped whole when the resource goes (``Operator._forget``)."""

    body: dict[str, Any]
    written: dict[str, Any] | None = None  # None: nothing written yet (this term, this uid)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # passes never overlap
    loop: asyncio.Task[None] | None = None
    migrating: bool = False  # its migration Job ran at the last pass: look again sooner

    def status(self) -> dict[str, Any]:
        """The status as the operator knows it: what it wrote, else what the resource says."""
        if self.written is not None:
            return self.written
        status: dict[str, Any] = self.body.get("status") or {}
        return status


@dataclass
class Operator:
    """The watch caches, one loop per dispatcher, and the clients they share."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    # None until ``start`` connects as the pod's ServiceAccount or the kubeconfig says.
    client: KubeClient | None = None
    cache: Cache = field(default_factory=Cache)
    dispatchers: dict[Key, Watched] = field(default_factory=dict)
    _closing: bool = False
    # Where the operator's metrics go (the process registry in `dispatcher operator`).
    registry: CollectorRegistry | None = None
    crd: CrdProbe = field(default_factory=CrdProbe)
    # Raised by kopf once its start-up activities finished (``kopf.operator(ready_flag=...)``).
    started: asyncio.Event = field(default_factory=asyncio.Event)
    _first_probe: asyncio.Task[None] | None = None
    leadership: Leadership = field(default_factory=Leadership.always)

    def __post_init__(self) -> None:
        self.redis = RedisPool(timeout=self.config.redis_timeout)
        self.postgres = PostgresProbe(
            timeout=self.config.postgres_timeout, interval=self.config.postgres_interval
        )
        self.workloads = self.config.workloads()
        self.metrics = OperatorMetrics(
            self.registry if self.registry is not None else CollectorRegistry()
        )
        self.secrets = SecretCache(ttl=self.config.secret_ttl)
        self.informers: Informers | None = None
        self.instance = identity()  # the reporting instance of its Events

    async def start(self) -> None:
        """Connect (unless given a client) and get ready to fill the cache."""
        if self.client is None:
            self.client = await KubeClient.connect()
        self.informers = Informers(
            api=self.api(),
            cache=self.cache,
            on_change=self.owned_changed,
            resync=self.config.resync_interval,
            retry=self.config.retry_base,
        )

    def connected(self) -> KubeClient:
        """The one API client (the Lease's calls go through it too)."""
        if self.client is None:
            raise RuntimeError("the operator is not started: no API client yet")
        return self.client

    def api(self, logger: logging.Logger | logging.LoggerAdapter[Any] = log) -> KubeApi:
        return KubeApi(client=self.connected(), logger=logger, reporting_instance=self.instance)

    async def live(self) -> bool:
        """Liveness (``/healthz``): kopf's start-up finished, and the CRD was served then and
        is now (``dispatcher.controller.probes.CrdProbe``). Why not is logged. An API server
        that does not answer (within ``LIVENESS_ASK_SECONDS``) leaves the operator live: a
        restart would not bring it back."""
        if not self.started.is_set():
            return False
        try:
            async with asyncio.timeout(LIVENESS_ASK_SECONDS):
                problem = await self.crd.problem(self.api())
        except (APIError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {LIVENESS_ASK_SECONDS:g} s"
            log.warning("liveness: the API server did not say whether the CRD is served: %s", why)
            return True
        if problem is not None:
            log.warning("not live: %s", problem)
        return problem is None

    def starting(self) -> None:
        """From kopf's start-up handler, after ``start``: the CRD is asked once kopf started."""
        self._first_probe = asyncio.create_task(self._probe_crd_once(), name="first CRD probe")

    async def _probe_crd_once(self) -> None:
        await self.started.wait()
        while self.crd.served_at_start is None and not self._closing:
            try:
                problem = await self.crd.problem(self.api())
            except APIError as exc:  # no answer: say so, and ask again
                log.warning("cannot ask the API server whether the CRD is served: %s", exc)
                await asyncio.sleep(self.config.retry_base)
            else:
                if problem is not None:
                    log.warning("%s", problem)

    def ready(self) -> bool:
        """Readiness: kopf's start-up finished (its watches start then),
        the CRD was served then, and the operator is not shutting down.

        Leading is no part of it: a standby replica waiting for the lease is ready too.
        """
        return self.started.is_set() and not self._closing and self.crd.served_at_start is True

    # -- what the watches report ------------------------------------------------------------

    async def dispatcher_seen(self, event: WatchEvent) -> None:
        meta = event.meta
        key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
        if event.deleted or meta.get("deletionTimestamp"):
            await self._forget(key)
            return
        watched = self.dispatchers.get(key)
        old = watched.body.get("metadata", {}) if watched is not None else None
        if watched is None:
            watched = self.dispatchers[key] = Watched(body=dict(event.body))
        else:
            watched.body = dict(event.body)
        if self.informers is not None:
            self.informers.start(key[0])
        if old is None or old.get("generation") != meta.get("generation"):
            self.wake(key)
        if old is not None and old.get("uid") != meta.get("uid"):
            watched.written = None  # deleted and created again: a new resource

    def owned_changed(self, kind: str, body: Mapping[str, Any]) -> None:
        """An object the operator owns appeared, changed or went: its dispatcher looks."""
        meta = body.get("metadata", {})
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == KIND and ref.get("controller"):
                self.wake((str(meta.get("namespace")), str(ref.get("name"))), quiet=True)

    async def _forget(self, key: Key) -> None:
        watched = self.dispatchers.pop(key, None)
        if watched is not None and watched.loop is not None:
            watched.loop.cancel()
        # What other parts hold per dispatcher: its database probe, metrics, Redis client.
        self.postgres.forget(key)
        self.metrics.forget(namespace=key[0], dispatcher=key[1])
        client = self.redis.held(key)
        if watched is not None and client is not None and self.leadership.leading:
            uid = str(watched.body.get("metadata", {}).get("uid"))
            if await release_marker(client, me=Owner(name=key[1], namespace=key[0], uid=uid)):
                for other, found in list(self.dispatchers.items()):  # one may own it now
                    if in_conflict(found.status()):
                        self.wake(other)
        await self.redis.drop(key)

    def wake(self, key: Key, *, quiet: bool = False) -> None:
        """Run a pass for ``key`` soon; start its loop if it has none (unless ``quiet``)."""
        watched = self.dispatchers.get(key)
        if watched is None or self._closing:
            return
        watched.wake.set()
        if watched.loop is None and not quiet:
            watched.loop = asyncio.create_task(self._loop(key), name=f"dispatcher {key}")

    async def close(self) -> None:
        self._closing = True
        loops = [w.loop for w in self.dispatchers.values() if w.loop is not None]
        tasks = [*loops, *([self._first_probe] if self._first_probe else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.redis.close()
        if self.informers is not None:
            await self.informers.close()
        if self.client is not None:
            await self.client.close()

    # -- the loop -------------------------------------------------------------------------

    async def _loop(self, key: Key) -> None:
        retry, term = 0, self.leadership.term
        while (watched := self.dispatchers.get(key)) is not None and not self._closing:
            await self.leadership.wait()
            if self.leadership.term != term:  # another replica led meanwhile: its status
                term = self.leadership.term
                watched.written = None
            wake = watched.wake
            wake.clear()
            try:
                healthy = await self.leadership.run(self.sync(key))
            except NotLeading:
                continue
            except NotYetKnown as exc:
                log.debug("%s/%s: %s, not in the watch cache yet", *key, exc)
                healthy = False
            except Exception:  # a bug must not stop the loop of this dispatcher
                log.exception("%s/%s: reconcile failed", *key)
                healthy = False
            delay = self.config.autoscale_interval if healthy else self.config.backoff(retry)
            delay *= random.uniform(0.9, 1.0)
            if healthy and watched.migrating:
                delay = min(delay, self.config.migration_poll)
            retry = 0 if healthy else retry + 1
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the event is set, and the loop would outlive the operator.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await wake.wait()

    async def sync(self, key: Key) -> bool:
        """One pass for one dispatcher; whether it found nothing to retry.

        Passes of one dispatcher never overlap, so a caller (a test stepping an injected
        clock) may run one at any time besides the loop.
        """
        watched = self.dispatchers.get(key)
        if watched is None:
            return True
        async with watched.lock:
            return await self._sync(key, watched)

    async def _sync(self, key: Key, watched: Watched) -> bool:
        body = watched.body
        meta = body.get("metadata", {})
        owner = Owner(name=key[1], namespace=key[0], uid=str(meta.get("uid")))
        before = watched.status()
        status = parse_status(before)
        now = self.config.clock()
        api = self.api()
        if self.informers is None or not await self.informers.synced(key[0], within=30):
            raise NotYetKnown(f"the owned objects of namespace {key[0]}")
        try:
            spec = parse_spec(body.get("spec") or {}, name=owner.name)
        except Failure as failure:
            result = Pass(problem=failure)
        else:
            ctx = Context(
                api=api,
                cache=self.cache,
                secrets=self.secrets,
                owner=owner,
                spec=spec,
                status=status,
                defaults=self.workloads,
                now=now,
                redis=lambda url: self.redis.client(key, url=url, cluster=spec.redis.cluster),
                postgres_problem=lambda url: self.postgres.problem(key, url),
            )
            with self.metrics.reconcile_seconds.time():
                result = await reconcile_once(ctx)
        self._count(key, watched, result)
        after = status_after(
            status, result, now=now, generation=meta.get("generation"), console=console_url(meta)
        )
        if "queues" not in after and "queues" in before:  # nothing measured: keep what was
            after["queues"] = before["queues"]
        involved = {"name": owner.name, "namespace": owner.namespace, "uid": owner.uid}
        for reason, message, warning in [*degraded_events(status, after), *result.events]:
            await api.post_event(involved=involved, reason=reason, message=message, warning=warning)
        if after != before and self.dispatchers.get(key) is watched:  # still the same resource
            await api.patch_status(namespace=owner.namespace, name=owner.name, status=after)
            watched.written = after
        return result.problem is None

    def _count(self, key: Key, watched: Watched, result: Pass) -> None:
        """A running migration Job is looked at more often; the pass goes into the metrics."""
        migration = result.migration
        watched.migrating = migration is not None and migration.phase == "running"
        self.metrics.count_pass(namespace=key[0], dispatcher=key[1], result=result)
