"""What the kopf handlers do: reconcile a dispatcher, autoscale its workers.

Each step decides in a pure function (``render``, ``shards``, ``scaling``,
``status``) and acts through ``KubeApi`` or Redis. Status goes into kopf's
``patch`` (applied by kopf after the handler, even when it fails). Every
failure a user can fix ends as a ``Degraded`` condition, an Event and a
``kopf.TemporaryError`` with exponential backoff: the operator never crashes.

The operator reads the Redis URL from the Secret the resource references for
it (``redis.operatorSecretRef``, else the shared ``redis.secretRef``), so it
needs ``get`` on Secrets in the watched namespaces; it also checks that every
other referenced Secret exists, so a missing one is a ``SecretMissing``
condition instead of pods stuck in ``CreateContainerConfigError``. One Redis
client is kept per resource, and replaced when the URL changes.

Before the enqueuer runs an image, a Job runs ``dispatcher migrate`` with it
(``controller.migration``); the ``Migrated`` condition shows where that stands.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import pydantic
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from controller.k8s import APIError, KubeApi, Logger, SecretMissing
from controller.metrics import OperatorMetrics
from controller.migration import MIGRATED, MigrationState, migration_state
from controller.model import (
    API_GROUP,
    API_VERSION,
    MAX_NAME,
    PLURAL,
    Condition,
    OutboxDispatcherSpec,
    OutboxDispatcherStatus,
    QueueSpec,
    QueueStatus,
    SecretRef,
)
from controller.render import (
    Owner,
    build_enqueuer_deployment,
    build_enqueuer_pdb,
    build_migration_job,
    build_worker_deployment,
    build_worker_pdb,
    instance_labels,
    migration_job_name,
    worker_name,
)
from controller.scaling import ScalePolicy, ScaleState, clamp, decide
from controller.shards import ShardDecision, read_published, reconcile_shards
from controller.status import (
    DEGRADED,
    READY,
    Reason,
    condition_dicts,
    iso,
    set_condition,
)
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream.naming import queue_streams
from dispatcher.stream.shards import InvalidShardCount
from dispatcher.stream.stats import streams_stats

__all__ = ["Failure", "Operator", "OperatorConfig", "RedisPool", "utcnow"]

log = logging.getLogger("controller")
WORKER_GROUP = "workers"  # the consumer group the enqueuer creates and workers read


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """Knobs of the operator process (not of a dispatcher: those are in the spec)."""

    autoscale_interval: float = 15.0
    retry_base: float = 5.0  # first retry after a failure, doubled up to retry_cap
    retry_cap: float = 300.0
    redis_timeout: float = 5.0
    migration_poll: float = 5.0  # how often to look at a running migration Job
    clock: Callable[[], datetime.datetime] = utcnow

    def backoff(self, retry: int) -> float:
        return float(min(self.retry_cap, self.retry_base * 2 ** min(retry, 20)))


class Failure(Exception):
    """A reconcile failure with the condition reason it is reported under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class RedisPool:
    """One Redis client per dispatcher, replaced when its URL changes."""

    timeout: float
    _clients: dict[tuple[str, str], tuple[str, RedisClient]] = field(default_factory=dict)

    def client(self, key: tuple[str, str], *, url: str, cluster: bool) -> RedisClient:
        fingerprint = hashlib.sha256(f"{cluster}|{url}".encode()).hexdigest()
        held = self._clients.get(key)
        if held is not None and held[0] == fingerprint:
            return held[1]
        client = connect_redis(url, cluster=cluster, socket_timeout=self.timeout)
        self._clients[key] = (fingerprint, client)
        return client

    async def drop(self, key: tuple[str, str]) -> None:
        held = self._clients.pop(key, None)
        if held is not None:
            await held[1].aclose()

    async def close(self) -> None:
        for key in list(self._clients):
            await self.drop(key)


def parse_spec(spec: Mapping[str, Any], *, name: str) -> OutboxDispatcherSpec:
    """The validated spec, or ``Failure(InvalidSpec)`` with every problem in one line."""
    if len(name) > MAX_NAME:
        raise Failure(Reason.INVALID_SPEC, f"metadata.name must be at most {MAX_NAME} characters")
    try:
        return OutboxDispatcherSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise Failure(Reason.INVALID_SPEC, f"invalid spec: {problems}") from None


def parse_status(status: Mapping[str, Any]) -> OutboxDispatcherStatus:
    try:
        return OutboxDispatcherStatus.model_validate(dict(status))
    except pydantic.ValidationError:
        return OutboxDispatcherStatus()


class Operator:
    """The reconcile and autoscale steps, with their shared clients."""

    def __init__(
        self, config: OperatorConfig | None = None, *, registry: CollectorRegistry | None = None
    ) -> None:
        self.config = config or OperatorConfig()
        self.settings = kopf.OperatorSettings()
        self.redis = RedisPool(timeout=self.config.redis_timeout)
        self.metrics = OperatorMetrics(registry if registry is not None else CollectorRegistry())
        self.crd_served_at_start: bool | None = None  # None: not checked yet

    def api(self, logger: Logger) -> KubeApi:
        return KubeApi(settings=self.settings, logger=logger)

    async def _redis(
        self, api: KubeApi, spec: OutboxDispatcherSpec, *, namespace: str, name: str
    ) -> RedisClient:
        url = await api.secret_value(namespace=namespace, ref=spec.redis.secret_for("operator"))
        return self.redis.client((namespace, name), url=url, cluster=spec.redis.cluster)

    # -- reconcile --------------------------------------------------------------------------

    async def reconcile(
        self,
        *,
        body: kopf.Body,
        spec: Mapping[str, Any],
        status: Mapping[str, Any],
        name: str,
        namespace: str,
        uid: str,
        generation: int | None,
        retry: int,
        patch: kopf.Patch,
        logger: Logger,
    ) -> None:
        """Create/update/resume: shard key, enqueuer, one worker per queue, stale cleanup."""
        now = self.config.clock()
        current = parse_status(status)
        conditions = current.conditions
        try:
            with self.metrics.reconcile_seconds.time():
                decision, migration = await self._reconcile(
                    spec,
                    owner=Owner(name=name, namespace=namespace, uid=uid),
                    migrated_image=current.migrated_image,
                    logger=logger,
                )
        except Failure as failure:
            self.metrics.reconciles.labels("failed").inc()
            conditions = set_condition(
                conditions, type_=READY, status="False", reason=failure.reason,
                message=failure.message, now=now, generation=generation,
            )  # fmt: skip
            conditions = set_condition(
                conditions, type_=DEGRADED, status="True", reason=failure.reason,
                message=failure.message, now=now, generation=generation,
            )  # fmt: skip
            patch.status["conditions"] = condition_dicts(conditions)
            kopf.warn(body, reason=failure.reason, message=failure.message)
            raise kopf.TemporaryError(failure.message, delay=self.config.backoff(retry)) from None
        blocked = decision.action == "block"
        conditions = set_condition(
            conditions, type_=READY, status="True", reason=Reason.RECONCILED,
            message=f"enqueuer and workers applied; {decision.message}", now=now,
            generation=generation,
        )  # fmt: skip
        conditions = set_condition(
            conditions, type_=DEGRADED, status="True" if blocked else "False",
            reason=Reason.SHARD_DECREASE_BLOCKED if blocked else Reason.AS_EXPECTED,
            message=decision.message if blocked else "", now=now, generation=generation,
        )  # fmt: skip
        conditions = _migration_condition(conditions, migration, now=now, generation=generation)
        patch.status["conditions"] = condition_dicts(conditions)
        patch.status["observedGeneration"] = generation
        patch.status["shards"] = decision.shards
        if migration.phase == "succeeded":
            patch.status["migratedImage"] = migration.image
        self._count_reconcile(blocked=blocked, migration=migration)
        if blocked:
            kopf.warn(body, reason=Reason.SHARD_DECREASE_BLOCKED, message=decision.message)
            raise kopf.TemporaryError(decision.message, delay=self.config.backoff(retry))
        if decision.action == "set":
            kopf.info(body, reason="ShardsPublished", message=decision.message)
        if not migration.done:
            self._migration_pending(body, migration, retry=retry)

    def _count_reconcile(self, *, blocked: bool, migration: MigrationState) -> None:
        outcome = "blocked" if blocked else "applied" if migration.done else "migrating"
        self.metrics.reconciles.labels(outcome).inc()

    def _migration_pending(self, body: kopf.Body, migration: MigrationState, *, retry: int) -> None:
        """Look again soon while the Job runs; back off (and warn) once it failed."""
        _, reason, message = migration.condition()
        if migration.phase == "failed":
            kopf.warn(body, reason=reason, message=message)
            raise kopf.TemporaryError(message, delay=self.config.backoff(retry))
        raise kopf.TemporaryError(message, delay=self.config.migration_poll)

    async def _reconcile(
        self,
        raw_spec: Mapping[str, Any],
        *,
        owner: Owner,
        migrated_image: str | None = None,
        logger: Logger,
    ) -> tuple[ShardDecision, MigrationState]:
        spec = parse_spec(raw_spec, name=owner.name)
        api = self.api(logger)
        try:
            for ref in _pod_secrets(spec):
                await api.secret_value(namespace=owner.namespace, ref=ref)
            client = await self._redis(api, spec, namespace=owner.namespace, name=owner.name)
            decision = await self._shards(client, spec)
            migration = await self._migrate(api, spec, owner=owner, migrated_image=migrated_image)
            await self._apply(
                api, spec, owner=owner, shards=decision.shards, enqueuer=migration.done
            )
            await self._prune(api, spec, owner=owner)
            await self._budgets(api, spec, owner=owner)
        except SecretMissing as exc:
            raise Failure(Reason.SECRET_MISSING, str(exc)) from None
        except APIError as exc:
            raise Failure(Reason.API_ERROR, f"Kubernetes API: {exc}") from None
        return decision, migration

    async def _migrate(
        self, api: KubeApi, spec: OutboxDispatcherSpec, *, owner: Owner, migrated_image: str | None
    ) -> MigrationState:
        """The migration state for the enqueuer's image; creates its Job when there is none."""
        image = spec.enqueuer.image
        name = migration_job_name(owner, image)
        needed = spec.migrate and migrated_image != image
        job = await api.get_object("Job", namespace=owner.namespace, name=name) if needed else None
        state = migration_state(
            enabled=spec.migrate, image=image, migrated_image=migrated_image, job_name=name, job=job
        )
        if needed and job is None:
            await api.create_object(build_migration_job(spec, owner=owner))
            log.info(
                "%s/%s: created Job %s (dispatcher migrate)", owner.namespace, owner.name, name
            )
        return state

    async def _budgets(self, api: KubeApi, spec: OutboxDispatcherSpec, *, owner: Owner) -> None:
        """The enqueuer's PodDisruptionBudget, and one per queue that can run several workers."""
        await api.apply_object(build_enqueuer_pdb(owner))
        wanted = set()
        for queue in spec.queues:
            budget = build_worker_pdb(queue, owner=owner)
            if budget is not None:
                wanted.add(budget["metadata"]["name"])
                await api.apply_object(budget)
        for found in await api.list_objects(
            "PodDisruptionBudget",
            namespace=owner.namespace,
            selector=instance_labels(owner, "worker"),
        ):
            meta = found.get("metadata", {})
            ours = any(ref.get("uid") == owner.uid for ref in meta.get("ownerReferences") or [])
            if ours and meta.get("name") not in wanted:
                await api.delete_object(
                    "PodDisruptionBudget", namespace=owner.namespace, name=meta["name"]
                )

    async def crd_probe(self, logger: Logger) -> str:
        """kopf's liveness probe: fail while the CRD is not served, or was not at start-up.

        With scanning off, kopf discovers the resource once at start-up: an operator started
        before its CRD was established never watches, so it must restart.
        """
        api = self.api(logger)
        served = await api.served(group=API_GROUP, version=API_VERSION, plural=PLURAL)
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

    async def _shards(self, client: RedisClient, spec: OutboxDispatcherSpec) -> ShardDecision:
        try:
            return await reconcile_shards(
                client, desired=spec.shards, queues=[q.name for q in spec.queues]
            )
        except (RedisError, OSError, InvalidShardCount) as exc:
            raise Failure(Reason.REDIS_UNAVAILABLE, _redis_message(client, exc)) from None

    async def _apply(
        self,
        api: KubeApi,
        spec: OutboxDispatcherSpec,
        *,
        owner: Owner,
        shards: int,
        enqueuer: bool = True,
    ) -> None:
        """The Deployments; the enqueuer's only when ``enqueuer`` (its image is migrated)."""
        manifests = (
            [build_enqueuer_deployment(spec, owner=owner, shards=shards)] if enqueuer else []
        )
        for queue in spec.queues:
            name = worker_name(owner, queue.name)
            live = await api.get_deployment(namespace=owner.namespace, name=name)
            current = (live or {}).get("spec", {}).get("replicas")
            policy = _policy(queue_spec=queue)
            replicas = policy.min_replicas if current is None else clamp(int(current), policy)
            manifests.append(
                build_worker_deployment(spec, queue, owner=owner, shards=shards, replicas=replicas)
            )
        for manifest in manifests:
            outcome = await api.apply_deployment(manifest)
            if outcome != "unchanged":
                message = f"{outcome} Deployment {manifest['metadata']['name']}"
                log.info("%s/%s: %s", owner.namespace, owner.name, message)

    async def _prune(self, api: KubeApi, spec: OutboxDispatcherSpec, *, owner: Owner) -> None:
        """Delete worker Deployments of queues no longer in the spec (ours only)."""
        wanted = {worker_name(owner, q.name) for q in spec.queues}
        for deployment in await api.list_deployments(
            namespace=owner.namespace, selector=instance_labels(owner, "worker")
        ):
            meta = deployment.get("metadata", {})
            ours = any(ref.get("uid") == owner.uid for ref in meta.get("ownerReferences") or [])
            if ours and meta.get("name") not in wanted:
                await api.delete_deployment(namespace=owner.namespace, name=meta["name"])
                log.info("%s/%s: deleted Deployment %s", owner.namespace, owner.name, meta["name"])

    # -- autoscale --------------------------------------------------------------------------

    async def autoscale(
        self,
        *,
        body: kopf.Body,
        spec: Mapping[str, Any],
        status: Mapping[str, Any],
        name: str,
        namespace: str,
        uid: str,
        patch: kopf.Patch,
        logger: Logger,
    ) -> None:
        """One autoscaler tick: measure each queue's backlog, scale its Deployment."""
        try:
            parsed = parse_spec(spec, name=name)
        except Failure:
            return  # reconcile reports it
        now = self.config.clock()
        owner = Owner(name=name, namespace=namespace, uid=uid)
        current = parse_status(status)
        api = self.api(logger)
        client, shards, problem = await self._measure_target(api, parsed, owner=owner)
        rows = []
        for queue in parsed.queues:
            backlog, pending = (None, None)
            if client is not None and problem is None:
                backlog, pending = await _backlog(client, queue.name, shards)
                if backlog is None:
                    problem = "cannot read the queue streams from Redis"
            row = await self._scale(api, body, owner, queue.name, parsed, current, backlog, now)
            if row is not None:
                rows.append({**row, "pending": pending} if pending is not None else row)
        patch.status["queues"] = rows
        self.metrics.autoscale_ticks.labels("ok" if problem is None else "redis_unavailable").inc()
        for row in rows:
            self.metrics.queue(
                namespace=namespace, dispatcher=name, queue=row["name"],
                backlog=row.get("backlog"), replicas=int(row.get("replicas") or 0),
            )  # fmt: skip
        self.metrics.forget(
            namespace=namespace, dispatcher=name, keep=frozenset(q.name for q in parsed.queues)
        )
        self._redis_condition(body, current, patch, problem=problem, now=now)

    async def _measure_target(
        self, api: KubeApi, spec: OutboxDispatcherSpec, *, owner: Owner
    ) -> tuple[RedisClient | None, int, str | None]:
        """The Redis client and the shard count to measure, or why there is none."""
        try:
            client = await self._redis(api, spec, namespace=owner.namespace, name=owner.name)
        except (SecretMissing, APIError) as exc:
            return None, spec.shards, str(exc)
        try:
            published = await read_published(client)
        except (RedisError, OSError, InvalidShardCount) as exc:
            return client, spec.shards, _redis_message(client, exc)
        # While a decrease is blocked the old shards still count.
        return client, max(published or spec.shards, spec.shards), None

    async def _scale(
        self,
        api: KubeApi,
        body: kopf.Body,
        owner: Owner,
        queue: str,
        spec: OutboxDispatcherSpec,
        status: OutboxDispatcherStatus,
        backlog: int | None,
        now: datetime.datetime,
    ) -> dict[str, Any] | None:
        queue_spec = spec.queue(queue)
        assert queue_spec is not None
        name = worker_name(owner, queue)
        live = await api.get_deployment(namespace=owner.namespace, name=name)
        if live is None:
            return None  # reconcile creates it
        replicas = int(live.get("spec", {}).get("replicas") or 0)
        before = status.queue(queue) or QueueStatus(name=queue)
        decision = decide(
            current=replicas,
            backlog=backlog,
            policy=_policy(queue_spec=queue_spec),
            state=_state(before),
            now=now.timestamp(),
        )
        last_scale = before.last_scale_time
        if decision.changes(replicas):
            await api.scale_deployment(
                namespace=owner.namespace, name=name, replicas=decision.replicas
            )
            last_scale = now
            self.metrics.scale_events.labels("up" if decision.replicas > replicas else "down").inc()
            message = (
                f"scaled {name} from {replicas} to {decision.replicas} replicas "
                f"(queue {queue}: backlog {backlog})"
            )
            kopf.info(body, reason="Scaled", message=message)
        after = QueueStatus(
            name=queue,
            backlog=backlog,
            replicas=decision.replicas,
            desired_replicas=decision.recommended,
            last_scale_time=last_scale,
            scale_down_since=_moment(decision.state.down_since),
            scale_down_to=decision.state.down_to,
        )
        return _queue_row(after)

    def _redis_condition(
        self,
        body: kopf.Body,
        status: OutboxDispatcherStatus,
        patch: kopf.Patch,
        *,
        problem: str | None,
        now: datetime.datetime,
    ) -> None:
        """Raise or clear ``Degraded/RedisUnavailable``; leave other reasons to reconcile."""
        degraded = status.condition(DEGRADED)
        if problem is not None and (degraded is None or degraded.status != "True"):
            conditions = set_condition(
                status.conditions, type_=DEGRADED, status="True",
                reason=Reason.REDIS_UNAVAILABLE, message=problem, now=now,
            )  # fmt: skip
            patch.status["conditions"] = condition_dicts(conditions)
            kopf.warn(body, reason=Reason.REDIS_UNAVAILABLE, message=problem)
        elif (
            problem is None and degraded is not None and degraded.reason == Reason.REDIS_UNAVAILABLE
        ):
            conditions = set_condition(
                status.conditions, type_=DEGRADED, status="False",
                reason=Reason.AS_EXPECTED, message="", now=now,
            )  # fmt: skip
            patch.status["conditions"] = condition_dicts(conditions)


def _pod_secrets(spec: OutboxDispatcherSpec) -> list[SecretRef]:
    """Every Secret key a pod or Job of ``spec`` reads (each checked once)."""
    refs = [
        spec.postgres.secret_ref,
        spec.redis.secret_for("enqueuer"),
        spec.redis.secret_for("worker"),
    ]
    if spec.migrate:
        refs.append(spec.postgres.migration())
    return list(dict.fromkeys(refs))


def _migration_condition(
    conditions: list[Condition],
    migration: MigrationState,
    *,
    now: datetime.datetime,
    generation: int | None,
) -> list[Condition]:
    status, reason, message = migration.condition()
    return set_condition(
        conditions, type_=MIGRATED, status=status, reason=reason, message=message, now=now,
        generation=generation,
    )  # fmt: skip


def _policy(*, queue_spec: QueueSpec) -> ScalePolicy:
    return ScalePolicy(
        min_replicas=queue_spec.min_replicas,
        max_replicas=queue_spec.max_replicas,
        target_backlog_per_replica=queue_spec.target_backlog_per_replica,
        stabilization_seconds=queue_spec.scale_down_stabilization_seconds,
    )


def _state(queue: QueueStatus) -> ScaleState:
    since = queue.scale_down_since
    return ScaleState(
        down_since=None if since is None else since.timestamp(), down_to=queue.scale_down_to
    )


def _moment(timestamp: float | None) -> datetime.datetime | None:
    return None if timestamp is None else datetime.datetime.fromtimestamp(timestamp, datetime.UTC)


def _queue_row(queue: QueueStatus) -> dict[str, Any]:
    row = queue.model_dump(by_alias=True, exclude_none=True)
    for key in ("lastScaleTime", "scaleDownSince"):
        if isinstance(row.get(key), datetime.datetime):
            row[key] = iso(row[key])
    return row


async def _backlog(client: RedisClient, queue: str, shards: int) -> tuple[int | None, int | None]:
    """Entries not yet completed (stream lengths) and delivered-unacked ones, or unknown."""
    try:
        stats = await streams_stats(client, queue_streams([queue], shards), WORKER_GROUP)
    except (RedisError, OSError):
        return None, None
    return sum(s.length for s in stats), sum(s.pending for s in stats)


def _redis_message(client: RedisClient, exc: BaseException) -> str:
    """One line naming the host (never the URL: it may carry a password)."""
    pool = getattr(client, "connection_pool", None)
    kwargs: Mapping[str, Any] = getattr(pool, "connection_kwargs", {})
    where = f" at {kwargs['host']}:{kwargs.get('port', 6379)}" if kwargs.get("host") else ""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot reach Redis{where}: {detail}"
