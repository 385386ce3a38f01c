"""One pass over one dispatcher: observe, decide, apply; the result as a ``Pass``.

``reconcile_once`` is the whole job of the operator for one ``OutboxDispatcher``:
read its Secrets (every one a pod or Job references must exist, so a missing
one is a condition rather than pods stuck in ``CreateContainerConfigError``),
check PostgreSQL, measure Redis in one round trip (with the operator's own
credentials), make sure this dispatcher owns the database's shard key (else
``RedisConflict``, and nothing else is written: ``dispatcher.controller.shard_owner``), publish the
shard count, run the migration Job for the
enqueuer's image, render and apply the enqueuer (once migrated) and worker
Deployments (with the autoscaler's replica counts) and their
PodDisruptionBudgets, drain the workers of removed queues, and read the
Deployments' rollout state. It never raises for anything a user can
fix: problems come back in ``Pass.problem`` and become conditions. The
writes to the API are ``dispatcher.controller.effects``; the status made of the result is
``dispatcher.controller.report``.

Live Deployments, PodDisruptionBudgets and Jobs come from the operator's watch cache
(``dispatcher.controller.cache``), not from GETs; every write puts the API's answer back into the
cache, and nothing is written when the render matches what is live. Secrets come from
``dispatcher.controller.secrets`` (one GET per Secret per ``secret_ttl``). In a steady state
(nothing changed) a pass therefore makes no API call but those Secret reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pydantic

from dispatcher.controller.api_requests import APIError, KubeApi, SecretMissing
from dispatcher.controller.autoscale import autoscale_queue
from dispatcher.controller.cache import Cache
from dispatcher.controller.conditions import (
    SHARDS_DRAINING,
    OutboxDispatcherStatus,
    Reason,
    Rollout,
    rollout,
)
from dispatcher.controller.effects import apply_budgets, apply_owned, drain_queues, migrate
from dispatcher.controller.glance import at_a_glance
from dispatcher.controller.identity import QUEUE_LABEL, Owner, worker_name
from dispatcher.controller.limits_spec import publish_limits
from dispatcher.controller.model import MAX_NAME, OutboxDispatcherSpec, SecretRef
from dispatcher.controller.pods import WorkloadDefaults
from dispatcher.controller.redis_access import Measurement, RedisProblem, measure, redis_message
from dispatcher.controller.render import build_enqueuer_deployment, build_worker_deployment
from dispatcher.controller.report import Failure, Pass
from dispatcher.controller.secrets import SecretCache
from dispatcher.controller.shard_owner import ownership_problem
from dispatcher.controller.shard_policy import ShardDecision, decide_shards, draining_shards
from dispatcher.controller.unschedulable import pod_selector, unschedulable
from dispatcher.redis_client import RedisClient
from dispatcher.stream.discovery import existing_shards
from dispatcher.stream.shard_count import publish_shard_count

__all__ = [
    "Context",
    "parse_spec",
    "parse_status",
    "reconcile_once",
]

log = logging.getLogger("dispatcher.controller")
Key = tuple[str, str]


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


def secrets_digest(*values: tuple[SecretRef, str]) -> str:
    """A digest of Secret values: it changes when one rotates, and reveals none of them."""
    digest = hashlib.sha256()
    for ref, value in values:
        digest.update(f"{ref.name}\0{ref.key}\0{value}\0".encode())
    return digest.hexdigest()[:16]


@dataclass(kw_only=True)
class Context:
    """What one pass works with (built by the operator)."""

    api: KubeApi
    cache: Cache
    secrets: SecretCache
    owner: Owner
    spec: OutboxDispatcherSpec
    status: OutboxDispatcherStatus
    defaults: WorkloadDefaults
    now: datetime.datetime
    redis: Callable[[str], RedisClient]  # the pooled client for a URL
    postgres_problem: Callable[[str], Any]  # awaitable: None or why PostgreSQL does not answer
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    scaled: list[str] = field(default_factory=list)


async def reconcile_once(ctx: Context) -> Pass:
    """One pass; problems in the result, never raised. Whatever it got to, the status
    fields of ``kubectl get obd`` say what the cache and the measurement show."""
    result = await _reconcile(ctx)
    glance = at_a_glance(
        queues=[q.name for q in ctx.spec.queues],
        enqueuers=ctx.cache.owned(ctx.owner, "enqueuer"),
        workers=ctx.cache.owned(ctx.owner, "worker"),
        enqueuer_replicas=ctx.spec.enqueuer.replicas,
        rows=result.queues,
    )
    return dataclasses.replace(result, glance=glance)


async def _reconcile(ctx: Context) -> Pass:
    spec, owner = ctx.spec, ctx.owner
    try:
        values = await _secret_values(ctx)
    except SecretMissing as exc:
        return Pass(problem=Failure(Reason.SECRET_MISSING, str(exc)))
    except APIError as exc:
        return Pass(problem=Failure(Reason.API_ERROR, f"Kubernetes API: {exc}"))
    problem: Failure | None = None
    pg = await ctx.postgres_problem(values[spec.postgres.secret_ref])
    if pg is not None:
        problem = Failure(Reason.POSTGRES_UNAVAILABLE, pg)
    redis_url = values[spec.redis.secret_for("operator")]
    draining_queues = _draining_queues(ctx)
    measured, redis_problem = await _measure(ctx, url=redis_url, draining=draining_queues)
    problem = redis_problem or problem
    if measured is not None:
        conflict = await ownership_problem(
            ctx.redis(redis_url), api=ctx.api, me=owner, marker=measured.owner
        )
        if conflict is not None:
            return Pass(problem=conflict)
    decision = (
        await _shards(ctx, url=redis_url, measured=measured) if measured is not None else None
    )
    shards = decision.shards if decision is not None else (ctx.status.shards or spec.shards)
    if measured is not None:  # Redis answered: the queues' limits as the spec says
        with contextlib.suppress(*RedisProblem):
            await publish_limits(ctx.redis(redis_url), spec.queues, events=ctx.events)
    try:
        migration = await migrate(
            api=ctx.api,
            cache=ctx.cache,
            spec=spec,
            owner=owner,
            migrated_image=ctx.status.migrated_image,
            defaults=ctx.defaults,
        )
    except APIError as exc:
        api_failure = Failure(Reason.API_ERROR, f"Kubernetes API: {exc}")
        return Pass(problem=api_failure, decision=decision, shards=shards)
    manifests, rows = _desired(ctx, measured, values=values, enqueuer=migration.done)
    try:
        for manifest in manifests:
            await apply_owned(api=ctx.api, cache=ctx.cache, owner=owner, manifest=manifest)
        await apply_budgets(api=ctx.api, cache=ctx.cache, spec=spec, owner=owner)
        draining = await drain_queues(
            api=ctx.api,
            cache=ctx.cache,
            owner=owner,
            draining=draining_queues,
            measured=measured,
            events=ctx.events,
        )
    except Failure as failure:
        return Pass(
            problem=failure, decision=decision, shards=shards, queues=rows, migration=migration
        )
    except APIError as exc:
        api_failure = Failure(Reason.API_ERROR, f"Kubernetes API: {exc}")
        return Pass(
            problem=api_failure, decision=decision, shards=shards, queues=rows, migration=migration
        )
    if migration.phase == "failed":
        _, reason, message = migration.condition()
        problem = Failure(reason, message)  # the one a user must act on first
    owned = ctx.cache.owned(owner, "enqueuer") + ctx.cache.owned(owner, "worker")
    return Pass(
        problem=problem,
        decision=decision,
        shards=shards,
        queues=rows,
        rollout=await _why_unavailable(ctx, owned),
        draining=draining,
        events=ctx.events,
        migration=migration,
        applied=True,
        measured=measured is not None,
        scaled=ctx.scaled,
    )


async def _why_unavailable(ctx: Context, owned: list[dict[str, Any]]) -> Rollout:
    """The rollout, and for each unavailable Deployment whose Pods no node takes, the
    scheduler's reason (one Pod list per unavailable Deployment; none when all are available)."""
    found = rollout(owned)
    why = []
    for deployment in owned:
        name = str(deployment.get("metadata", {}).get("name"))
        if name not in found.unavailable:
            continue
        try:
            pods, _ = await ctx.api.list_objects(
                "Pod", namespace=ctx.owner.namespace, selector=pod_selector(deployment)
            )
        except APIError as exc:  # the Deployment's word stands; the reason is a bonus
            log.debug("listing the Pods of %s: %s", name, exc)
            continue
        if (message := unschedulable(pods)) is not None:
            why.append((name, message))
    return replace(found, unschedulable=tuple(why))


async def _secret_values(ctx: Context) -> dict[SecretRef, str]:
    """The value of every Secret key a pod, the migration Job or the operator reads."""
    spec = ctx.spec
    refs = [
        spec.postgres.secret_ref,
        spec.redis.secret_for("operator"),
        spec.redis.secret_for("enqueuer"),
        spec.redis.secret_for("worker"),
    ]
    if spec.migrate:
        refs.append(spec.postgres.migration())
    return await ctx.secrets.values(ctx.api, namespace=ctx.owner.namespace, refs=refs)


def _desired(
    ctx: Context,
    measured: Measurement | None,
    *,
    values: Mapping[SecretRef, str],
    enqueuer: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Deployments to apply (with the autoscaler's replicas) and the queues' status rows;
    the enqueuer's only when ``enqueuer`` (its image is migrated): one already running keeps
    its old image until then."""
    spec, owner = ctx.spec, ctx.owner
    worker_ref = spec.redis.secret_for("worker")
    redis_digest = secrets_digest((worker_ref, values[worker_ref]))
    enqueuer_refs = (spec.postgres.secret_ref, spec.redis.secret_for("enqueuer"))
    both_digest = secrets_digest(*((ref, values[ref]) for ref in enqueuer_refs))
    manifests = []
    if enqueuer:
        manifests.append(
            build_enqueuer_deployment(
                spec, owner=owner, defaults=ctx.defaults, secrets_hash=both_digest
            )
        )
    rows = []
    for queue in spec.queues:
        backlog = measured.queue(queue.name) if measured is not None else None
        live = ctx.cache.deployments.get((owner.namespace, worker_name(owner, queue.name)))
        step = autoscale_queue(
            queue,
            live_replicas=None if live is None else live.get("spec", {}).get("replicas"),
            measured=backlog,
            before=ctx.status.queue(queue.name),
            now=ctx.now,
        )
        if step.event is not None:
            was = int((live or {}).get("spec", {}).get("replicas") or 0)
            ctx.scaled.append("up" if (step.replicas or 0) > was else "down")
            name = worker_name(owner, queue.name)
            ctx.events.append(("Scaled", f"{name} (queue {queue.name}) {step.event}", False))
        rows.append(step.row)
        manifests.append(
            build_worker_deployment(
                spec,
                queue,
                owner=owner,
                replicas=step.replicas,
                defaults=ctx.defaults,
                secrets_hash=redis_digest,
            )
        )
    return manifests, rows


def _draining_queues(ctx: Context) -> dict[str, dict[str, Any]]:
    """Our worker Deployments whose queue left the spec, by queue name."""
    wanted = {q.name for q in ctx.spec.queues}
    found = {}
    for deployment in ctx.cache.owned(ctx.owner, "worker"):
        queue = (deployment.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL)
        if queue and queue not in wanted:
            found[queue] = deployment
    return found


async def _measure(
    ctx: Context, *, url: str, draining: Mapping[str, Any]
) -> tuple[Measurement | None, Failure | None]:
    client = ctx.redis(url)
    queues = [q.name for q in ctx.spec.queues] + list(draining)
    # Right after a decrease the previous count still bounds what the removed shards hold.
    shards = max(ctx.spec.shards, ctx.status.shards or 0)
    try:
        if _shards_draining(ctx.status):
            # Later passes find the removed shards themselves (a SCAN: only while draining).
            for queue in queues:
                shards = max(shards, 1 + max(await existing_shards(client, queue), default=-1))
        return await measure(client, queues=queues, shards=shards), None
    except RedisProblem as exc:
        return None, Failure(Reason.REDIS_UNAVAILABLE, redis_message(client, exc))


async def _shards(ctx: Context, *, url: str, measured: Measurement) -> ShardDecision | None:
    queues = [q.name for q in ctx.spec.queues]
    desired = ctx.spec.shards
    left = draining_shards(measured.streams, queues=queues, shards=desired)
    decision = decide_shards(desired=desired, published=measured.published, draining=left)
    if decision.action == "set":
        try:
            await publish_shard_count(ctx.redis(url), decision.shards)
        except RedisProblem:
            return None  # the next pass tries again; measuring worked, so it is transient
        ctx.events.append(("ShardsPublished", decision.message, False))
    return decision


def _shards_draining(status: OutboxDispatcherStatus) -> bool:
    found = status.condition(SHARDS_DRAINING)
    return found is not None and found.status == "True"
