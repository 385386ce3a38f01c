"""The operator's own loop: one task per ``OutboxDispatcher``, woken by what it watches.

kopf feeds two watch caches (handlers in ``controller.handlers``): the
dispatchers and the Deployments they own. Each dispatcher gets one task that
runs ``reconcile_once`` every ``autoscale_interval`` seconds and whenever its
resource or one of its Deployments changes (so a deleted or edited Deployment
is restored within seconds, and ``Ready`` follows rollouts). Reconcile and
autoscale are one pass, so neither can undo the other.

None of this uses kopf's per-object handlers (timers, daemons, change
handlers): those need a finalizer on the resource, which makes deleting it
wait for a running operator. Here, nothing is ever left to finalize: the
Deployments go with their owner by garbage collection, and deleting a
dispatcher needs no operator at all.

The status is written whole after each pass, only when it changed, always with
``observedGeneration``. A failing pass is retried with exponential backoff.

Its twin by name, ``dispatcher.cli.operator``, is the command layer that
starts this (``dispatcher operator``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import psycopg
from prometheus_client import CollectorRegistry
from psycopg.conninfo import conninfo_to_dict

from controller.conditions import (
    DEGRADED,
    PROGRESSING,
    QUEUES_DRAINING,
    READY,
    SHARDS_DRAINING,
    OutboxDispatcherStatus,
    Reason,
    condition_dicts,
    set_condition,
)
from controller.k8s import KubeApi
from controller.metrics import OperatorMetrics
from controller.migration import MIGRATED
from controller.reconcile import (
    Cache,
    Context,
    Failure,
    NotYetKnown,
    Pass,
    parse_spec,
    parse_status,
    reconcile_once,
)
from controller.redis_access import RedisPool
from controller.render import DEFAULT_WORKLOADS, Owner, WorkloadDefaults
from controller.resource import API_GROUP, API_VERSION, KIND, PLURAL

__all__ = ["Operator", "OperatorConfig", "conditions", "utcnow"]

log = logging.getLogger("controller")
Key = tuple[str, str]


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else None


def default_workloads() -> WorkloadDefaults:
    """The images of this operator's own version, unless its environment names others."""
    return WorkloadDefaults(
        enqueuer_image=os.environ.get("DISPATCHER_ENQUEUER_IMAGE")
        or DEFAULT_WORKLOADS.enqueuer_image,
        worker_image=os.environ.get("DISPATCHER_WORKER_IMAGE") or DEFAULT_WORKLOADS.worker_image,
        run_as_user=_env_int("DISPATCHER_RUN_AS_USER"),
        run_as_group=_env_int("DISPATCHER_RUN_AS_GROUP"),
        fs_group=_env_int("DISPATCHER_FS_GROUP"),
    )


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """Knobs of the operator process (not of a dispatcher: those are in the spec)."""

    autoscale_interval: float = 15.0
    retry_base: float = 5.0  # first retry after a failure, doubled up to retry_cap
    retry_cap: float = 300.0
    redis_timeout: float = 5.0
    postgres_timeout: float = 5.0
    postgres_interval: float = 30.0  # between two connection checks of one unchanged URL
    migration_poll: float = 5.0  # how often to look at a running migration Job
    clock: Callable[[], datetime.datetime] = utcnow
    enqueuer_image: str | None = None  # None: default_workloads()
    worker_image: str | None = None

    def backoff(self, retry: int) -> float:
        return float(min(self.retry_cap, self.retry_base * 2 ** min(retry, 20)))

    def workloads(self) -> WorkloadDefaults:
        found = default_workloads()
        return WorkloadDefaults(
            enqueuer_image=self.enqueuer_image or found.enqueuer_image,
            worker_image=self.worker_image or found.worker_image,
            run_as_user=found.run_as_user,
            run_as_group=found.run_as_group,
            fs_group=found.fs_group,
        )


@dataclass
class _Probe:
    """When PostgreSQL was last asked, at which URL, and what it said."""

    fingerprint: int
    at: float
    problem: str | None


@dataclass
class Operator:
    """The watch caches, one loop per dispatcher, and the clients they share."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    settings: kopf.OperatorSettings = field(default_factory=kopf.OperatorSettings)
    cache: Cache = field(default_factory=Cache)
    dispatchers: dict[Key, dict[str, Any]] = field(default_factory=dict)
    _written: dict[Key, dict[str, Any]] = field(default_factory=dict)
    _wakes: dict[Key, asyncio.Event] = field(default_factory=dict)
    _tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    _probes: dict[Key, _Probe] = field(default_factory=dict)
    _locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    _migrating: set[Key] = field(default_factory=set)
    _closing: bool = False
    # Where the operator's metrics go (the process registry in `dispatcher operator`).
    registry: CollectorRegistry | None = None
    crd_served_at_start: bool | None = None  # None: not checked yet

    def __post_init__(self) -> None:
        self.redis = RedisPool(timeout=self.config.redis_timeout)
        self.workloads = self.config.workloads()
        self.metrics = OperatorMetrics(
            self.registry if self.registry is not None else CollectorRegistry()
        )

    def api(self, logger: logging.Logger | logging.LoggerAdapter[Any] = log) -> KubeApi:
        return KubeApi(settings=self.settings, logger=logger)

    # -- what the watches report ------------------------------------------------------------

    async def dispatcher_seen(self, body: Mapping[str, Any], *, deleted: bool) -> None:
        meta = body.get("metadata", {})
        key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
        if deleted or meta.get("deletionTimestamp"):
            self.dispatchers.pop(key, None)
            self._written.pop(key, None)
            self._probes.pop(key, None)
            self._locks.pop(key, None)
            task = self._tasks.pop(key, None)
            if task is not None:
                task.cancel()
            self._wakes.pop(key, None)
            self._migrating.discard(key)
            self.metrics.forget(namespace=key[0], dispatcher=key[1])
            await self.redis.drop(key)
            return
        old = self.dispatchers.get(key)
        self.dispatchers[key] = dict(body)
        if old is None or old.get("metadata", {}).get("generation") != meta.get("generation"):
            self.wake(key)
        if old is not None and old.get("metadata", {}).get("uid") != meta.get("uid"):
            self._written.pop(key, None)  # deleted and created again: a new resource

    def deployment_seen(self, body: Mapping[str, Any], *, deleted: bool) -> None:
        if deleted:
            self.cache.drop(body)
        else:
            self.cache.put(body)
        meta = body.get("metadata", {})
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == KIND and ref.get("controller"):
                self.wake((str(meta.get("namespace")), str(ref.get("name"))), quiet=True)

    def wake(self, key: Key, *, quiet: bool = False) -> None:
        """Run a pass for ``key`` soon; start its loop if it has none (unless ``quiet``)."""
        if key not in self.dispatchers or self._closing:
            return
        event = self._wakes.setdefault(key, asyncio.Event())
        event.set()
        if key not in self._tasks and not quiet:
            self._tasks[key] = asyncio.create_task(self._loop(key), name=f"dispatcher {key}")

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.redis.close()

    # -- the loop -------------------------------------------------------------------------

    async def _loop(self, key: Key) -> None:
        retry = 0
        while key in self.dispatchers and not self._closing:
            wake = self._wakes.setdefault(key, asyncio.Event())
            wake.clear()
            try:
                healthy = await self.sync(key)
            except NotYetKnown as exc:
                log.debug("%s/%s: %s, not in the watch cache yet", *key, exc)
                healthy = False
            except Exception:  # a bug must not stop the loop of this dispatcher
                log.exception("%s/%s: reconcile failed", *key)
                healthy = False
            delay = self.config.autoscale_interval if healthy else self.config.backoff(retry)
            if healthy and key in self._migrating:
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
        async with self._locks.setdefault(key, asyncio.Lock()):
            return await self._sync(key)

    async def _sync(self, key: Key) -> bool:
        body = self.dispatchers.get(key)
        if body is None:
            return True
        meta = body.get("metadata", {})
        owner = Owner(name=key[1], namespace=key[0], uid=str(meta.get("uid")))
        generation = meta.get("generation")
        before = self._written.get(key, body.get("status") or {})
        status = parse_status(before)
        now = self.config.clock()
        api = self.api()
        try:
            spec = parse_spec(body.get("spec") or {}, name=owner.name)
        except Failure as failure:
            result = Pass(problem=failure)
        else:
            ctx = Context(
                api=api,
                cache=self.cache,
                owner=owner,
                spec=spec,
                status=status,
                defaults=self.workloads,
                now=now,
                redis=lambda url: self.redis.client(key, url=url, cluster=spec.redis.cluster),
                postgres_problem=lambda url: self._postgres_problem(key, url),
            )
            with self.metrics.reconcile_seconds.time():
                result = await reconcile_once(ctx)
        self._count(key, result)
        after = _status(status, result, now=now, generation=generation)
        if "queues" not in after and "queues" in before:  # nothing measured: keep what was
            after["queues"] = before["queues"]
        involved = {"name": owner.name, "namespace": owner.namespace, "uid": owner.uid}
        for reason, message, warning in [*_transitions(status, after), *result.events]:
            await api.post_event(involved=involved, reason=reason, message=message, warning=warning)
        if after != before and key in self.dispatchers:
            await api.patch_status(namespace=owner.namespace, name=owner.name, status=after)
            self._written[key] = after
        return result.problem is None

    def _count(self, key: Key, result: Pass) -> None:
        """The pass in the operator's metrics: it both reconciles and autoscales."""
        migration = result.migration
        if migration is not None and migration.phase == "running":
            self._migrating.add(key)
        else:
            self._migrating.discard(key)
        if not result.applied:
            outcome = "failed"
        elif migration is not None and not migration.done:
            outcome = "migrating"
        else:
            outcome = "applied"
        self.metrics.reconciles.labels(outcome).inc()
        if not result.applied:
            return
        self.metrics.autoscale_ticks.labels("ok" if result.measured else "redis_unavailable").inc()
        for direction in result.scaled:
            self.metrics.scale_events.labels(direction).inc()
        namespace, name = key
        for row in result.queues:
            self.metrics.queue(
                namespace=namespace, dispatcher=name, queue=row["name"],
                backlog=row.get("backlog"), replicas=int(row.get("replicas") or 0),
            )  # fmt: skip
        self.metrics.forget(
            namespace=namespace, dispatcher=name, keep=frozenset(r["name"] for r in result.queues)
        )

    async def crd_probe(self, logger: logging.Logger | logging.LoggerAdapter[Any]) -> str:
        """kopf's liveness probe: fail while the CRD is not served, or was not at start-up.

        With scanning off, kopf discovers the resource once at start-up: an operator started
        before its CRD was established never watches, so it must restart.
        """
        served = await self.api(logger).served(group=API_GROUP, version=API_VERSION, plural=PLURAL)
        if self.crd_served_at_start is None:
            self.crd_served_at_start = served
        if not self.crd_served_at_start:
            raise kopf.PermanentError(
                f"{PLURAL}.{API_GROUP} was not served when the operator started: "
                "nothing is watched until it restarts"
            )
        if not served:
            raise kopf.PermanentError(f"{PLURAL}.{API_GROUP} is not served (CRD missing)")
        return "served"

    async def _postgres_problem(self, key: Key, url: str) -> str | None:
        """Why PostgreSQL does not answer at ``url``, or None; asked at most once every
        ``postgres_interval`` (and at once when the URL changes): a connection per pass
        would load the database for nothing."""
        probe = self._probes.get(key)
        fingerprint = hash(url)
        fresh = time.monotonic() - self.config.postgres_interval
        if probe is not None and probe.fingerprint == fingerprint and probe.at > fresh:
            return probe.problem
        problem = await _ask_postgres(url, seconds=self.config.postgres_timeout)
        self._probes[key] = _Probe(fingerprint=fingerprint, at=time.monotonic(), problem=problem)
        return problem


async def _ask_postgres(url: str, *, seconds: float) -> str | None:
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the PostgreSQL URL in the Secret is not a valid connection string"
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    try:
        async with asyncio.timeout(seconds + 1):
            conn = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(seconds)))
    except (psycopg.Error, OSError, TimeoutError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"cannot reach PostgreSQL at {where}: {detail}".replace(url, "<url>")
    await conn.close()
    return None


def _transitions(
    status: OutboxDispatcherStatus, after: Mapping[str, Any]
) -> list[tuple[str, str, bool]]:
    """A Warning Event when ``Degraded`` turns true or changes reason (not on every retry)."""
    old = status.condition(DEGRADED)
    new = next((c for c in after["conditions"] if c["type"] == DEGRADED), None)
    if new is None or new["status"] != "True":
        return []
    if old is not None and old.status == "True" and old.reason == new["reason"]:
        return []
    return [(new["reason"], new.get("message", ""), True)]


def conditions(
    status: OutboxDispatcherStatus,
    result: Pass,
    *,
    now: datetime.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The conditions after a pass (see ``controller.conditions`` for what each means)."""
    found = status.conditions

    def put(type_: str, value: bool, reason: str, message: str = "") -> None:
        nonlocal found
        found = set_condition(
            found, type_=type_, status="True" if value else "False", reason=reason,
            message=message, now=now, generation=generation,
        )  # fmt: skip

    problem, decision = result.problem, result.decision
    if problem is not None:
        put(READY, False, problem.reason, problem.message)
    elif result.migration is not None and not result.migration.done:
        put(READY, False, Reason.MIGRATING, result.migration.condition()[2])
    elif result.rollout.unavailable:
        put(READY, False, Reason.DEPLOYMENTS_UNAVAILABLE,
            "not available yet: " + ", ".join(result.rollout.unavailable))  # fmt: skip
    else:
        shards = "" if decision is None else f"; {decision.message}"
        put(READY, True, Reason.RECONCILED, f"every Deployment is available{shards}")
    if result.rollout.rolling:
        put(PROGRESSING, True, Reason.ROLLING_OUT,
            "rolling out: " + ", ".join(result.rollout.rolling))  # fmt: skip
    else:
        put(PROGRESSING, False, Reason.ROLLOUT_COMPLETE)
    if problem is not None:
        put(DEGRADED, True, problem.reason, problem.message)
    else:
        put(DEGRADED, False, Reason.AS_EXPECTED)
    if decision is not None:  # measured: what is left on removed shards is known
        reason = Reason.REMOVED_SHARDS_NOT_EMPTY if decision.draining else Reason.AS_EXPECTED
        put(SHARDS_DRAINING, bool(decision.draining), reason, decision.draining_message)
    if result.draining:
        left = "; ".join(f"{q}: {what}" for q, what in sorted(result.draining.items()))
        put(QUEUES_DRAINING, True, Reason.DRAINING, f"removed queues still hold work: {left}")
    elif problem is None:
        put(QUEUES_DRAINING, False, Reason.DRAINED)
    if result.migration is not None:
        migrated, reason, message = result.migration.condition()
        found = set_condition(
            found, type_=MIGRATED, status=migrated, reason=reason, message=message, now=now,
            generation=generation,
        )  # fmt: skip
    return condition_dicts(found)


def _status(
    status: OutboxDispatcherStatus,
    result: Pass,
    *,
    now: datetime.datetime,
    generation: int | None,
) -> dict[str, Any]:
    """The whole status after a pass: what it could not measure keeps its last value."""
    written: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions(status, result, now=now, generation=generation),
    }
    shards = result.shards if result.shards is not None else status.shards
    if shards is not None:
        written["shards"] = shards
    if result.queues or result.problem is None:
        written["queues"] = result.queues
    migration = result.migration
    if migration is not None and migration.phase == "succeeded":
        written["migratedImage"] = migration.image
    elif status.migrated_image is not None:
        written["migratedImage"] = status.migrated_image
    return written
