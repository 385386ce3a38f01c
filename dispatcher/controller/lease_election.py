"""Leader election on a ``coordination.k8s.io/v1`` Lease: only the leader runs passes.

Several operator replicas may run (the chart's ``operator.replicas``); each watches
every dispatcher (kopf keeps its caches warm), and only the holder of the Lease runs
reconcile passes. ``dispatcher.controller.leadership.Leadership`` is the state the operator's
loops wait on; ``LeaseElector`` drives it through the Lease, on the operator's one
``dispatcher.controller.api_connection.KubeClient`` (``kubernetes_asyncio``), as client-go's leader
election does:

- the Lease lasts ``duration`` (15 s); its holder renews it every ``renew_every``
  (5 s); a candidate reads it every ``retry_every`` (1 s);
- a candidate takes the Lease when it has no holder, or when the record has not
  changed for ``duration`` by the candidate's *own* clock since it saw it change
  (``renewTime`` written by another machine is never compared with ours, so clock
  skew cannot hand the Lease over early). A process that starts counts from its
  start, so a crashed leader's peer, which saw the last renewal earlier, takes over
  before the crashed one's restarted container can: within ``duration`` + twice
  ``retry_every`` of the last renewal (a read to see it, a read to find it expired);
- the holder steps down at once when a renewal finds another holder, or when no
  renewal succeeded for ``renew_deadline`` (10 s, less than ``duration``: it stops
  before anyone may take over); a running pass is cancelled then;
- on shutdown (SIGTERM) the holder clears ``holderIdentity`` so a peer takes over
  within ``retry_every``.

Why not the official client's elector (``kubernetes_asyncio.leaderelection``, 36.1, read
2026-12-05): it never gives the Lease up (``LeaderElection.run`` has no release path, and
nothing in the package clears ``holderIdentity``), so a rolling update waits a whole Lease
duration for the next leader; a candidate that reads an empty holder still waits out the
duration (``try_acquire_or_renew``: any holder other than itself, ``""`` included, counts
until ``observed_time + lease_duration``); it measures that time on the wall clock
(``time.time()``), which may jump; and its ``LeaseLock`` creates the Lease without an
ownerReference, so ``helm uninstall`` would leave it behind. Each of these is a guarantee of
this module (above) that the e2e tests prove (``tests/e2e/test_leader_election.py``,
``test_operator_ha.py``), so the elector stays ours, on the same ``KubeClient``.

Every write is an update at the ``resourceVersion`` read (optimistic concurrency), so
two candidates never both win one term. Identity: the pod's name (``POD_NAME``).

The Lease belongs to the operator's installation: it carries the operator's labels and,
with ``owner`` (the operator's Deployment, in the Lease's namespace: the chart and
``deploy/base`` pass it), an ownerReference to that Deployment, so the garbage collector
deletes the Lease with it (``helm uninstall``). A Lease is created only while that
Deployment exists (read at each creation: a replica still stopping after the uninstall
creates none), and one created by an earlier version gets the reference at its next write.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from dispatcher.controller.api_connection import (
    APIConflictError,
    APIError,
    APINotFoundError,
    KubeClient,
)
from dispatcher.controller.leadership import Leadership

__all__ = [
    "LEASE_LABELS",
    "LeaseConfig",
    "LeaseElector",
    "LeaseRecord",
    "decide",
    "identity",
]

log = logging.getLogger("dispatcher.controller.lease_election")
Action = Literal["create", "renew", "take", "wait"]
# What the Lease is: a part of the operator, written by the operator (not by Helm).
LEASE_LABELS = {
    "app.kubernetes.io/name": "outbox-dispatcher",
    "app.kubernetes.io/component": "operator",
    "app.kubernetes.io/part-of": "outbox-dispatcher",
    "app.kubernetes.io/managed-by": "outbox-dispatcher-operator",
}


def identity() -> str:
    """This replica's name: the pod's (``POD_NAME``, from the downward API), else the host's."""
    return os.environ.get("POD_NAME") or socket.gethostname()


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    """The Lease's spec as read, with the version it was read at."""

    holder: str | None
    duration: float
    transitions: int
    resource_version: str
    acquired: str | None = None  # acquireTime, as written
    labels: Mapping[str, str] = field(default_factory=dict)  # kept by every write
    owners: tuple[Mapping[str, Any], ...] = ()  # its ownerReferences, kept likewise

    @classmethod
    def from_api(cls, lease: Any) -> LeaseRecord:
        """From the Lease as the API server returned it (JSON); ``ValueError`` if malformed."""
        spec = lease.get("spec") if isinstance(lease, Mapping) else None
        meta = lease.get("metadata") if isinstance(lease, Mapping) else None
        if not isinstance(spec or {}, Mapping) or not isinstance(meta, Mapping):
            raise ValueError(f"not a Lease: {lease!r:.80}")
        spec = spec or {}
        acquired = spec.get("acquireTime")
        try:
            return cls(
                holder=str(spec.get("holderIdentity") or "") or None,
                duration=float(spec.get("leaseDurationSeconds") or 0),
                transitions=int(spec.get("leaseTransitions") or 0),
                resource_version=str(meta.get("resourceVersion") or ""),
                acquired=None if acquired is None else str(acquired),
                labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
                owners=tuple(dict(r) for r in meta.get("ownerReferences") or ()),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a Lease with a malformed spec: {exc}") from None


def decide(
    record: LeaseRecord | None, *, me: str, leading: bool, now: float, observed_at: float
) -> Action:
    """What a candidate does with the Lease it just read (``now``/``observed_at``: its clock)."""
    if record is None:
        return "create"
    if record.holder == me and leading:
        return "renew"
    if record.holder is None or now - observed_at >= record.duration:
        return "take"
    return "wait"


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    duration: float = 15.0
    renew_every: float = 5.0
    renew_deadline: float = 10.0
    retry_every: float = 1.0
    request_timeout: float = 5.0
    owner: str | None = None  # the operator's Deployment, in ``namespace``: the Lease's owner


def _micro(moment: datetime.datetime) -> str:
    """The API's MicroTime form (exactly six fraction digits, UTC)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _names(ref: Mapping[str, Any], deployment: str) -> bool:
    return ref.get("kind") == "Deployment" and ref.get("name") == deployment


class LeaseElector:
    """Keeps ``leadership`` true exactly while this replica holds the Lease."""

    def __init__(
        self,
        config: LeaseConfig,
        *,
        client: KubeClient,
        leadership: Leadership,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.leadership = leadership
        self._client = client
        self._url = f"/apis/coordination.k8s.io/v1/namespaces/{quote(config.namespace)}/leases"
        self._clock = clock
        self._seen: tuple[str, float] | None = None  # resourceVersion, when it changed (ours)
        self._watchdog: asyncio.TimerHandle | None = None  # steps down unless renewed in time

    async def run(self) -> None:
        """Acquire, renew; never returns (cancel it, then ``release``)."""
        while True:
            held = False
            try:
                held = await self.step()
            except (APIError, ValueError) as exc:
                log.warning("lease %s: %s", self.config.name, exc)
            # A failed renewal is retried soon: the watchdog ends leadership at the deadline.
            await asyncio.sleep(self.config.renew_every if held else self.config.retry_every)

    async def step(self) -> bool:
        """Read the Lease once and act on it; whether this replica holds it (renewed) now."""
        started = asyncio.get_running_loop().time()
        record = await self._read()
        now = self._clock()
        if record is not None and (self._seen is None or self._seen[0] != record.resource_version):
            self._seen = (record.resource_version, now)
        observed_at = self._seen[1] if self._seen is not None else now
        leading = self.leadership.leading
        action = decide(
            record, me=self.config.identity, leading=leading, now=now, observed_at=observed_at
        )
        if leading and action != "renew":
            holder = record.holder if record is not None else None
            self._step_down(f"the Lease names {holder or 'no holder'}")
            return False
        if action == "wait":
            return False
        if not await self._write(action, record):
            if leading:  # the Lease changed since we read it: someone else wrote it
                self._step_down("the Lease changed under a renewal")
            return False
        if not leading:
            log.info("lease %s: leading as %s", self.config.name, self.config.identity)
        self._arm(started)
        self.leadership.gain()
        return True

    def _arm(self, started: float) -> None:
        """Step down ``renew_deadline`` after ``started`` (before the read that led to this
        renewal: no peer can have seen it earlier) unless renewed again by then."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        deadline = self.config.renew_deadline
        self._watchdog = asyncio.get_running_loop().call_at(
            started + deadline, self._step_down, f"not renewed for {deadline:g} s"
        )

    async def release(self) -> None:
        """Step down and clear the holder, so a peer takes over at its next try."""
        if not self.leadership.leading:
            return
        self._step_down("shutting down")
        try:
            record = await self._read()
            if record is not None and record.holder == self.config.identity:
                body = self._body(record, holder=None, duration=1, transitions=record.transitions)
                await self._call("put", body, name=self.config.name)
                log.info("lease %s: released", self.config.name)
        except (APIError, ValueError) as exc:
            log.warning("lease %s: not released: %s", self.config.name, exc)

    def _step_down(self, why: str) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.leadership.leading:
            log.warning("lease %s: no longer leading: %s", self.config.name, why)
            self.leadership.lose()

    async def _read(self) -> LeaseRecord | None:
        try:
            lease = await self._call("get", None, name=self.config.name)
        except APINotFoundError:
            return None
        return LeaseRecord.from_api(lease)

    async def _write(self, action: Action, record: LeaseRecord | None) -> bool:
        """Create, renew or take; False when another replica wrote first (409), or when the
        Lease is absent and so is the Deployment that would own it (being uninstalled)."""
        owner, gone = await self._owner_reference(record)
        if record is None and gone:
            log.warning(
                "lease %s: not created: Deployment %s is gone", self.config.name, self.config.owner
            )
            return False
        try:
            if record is None:
                body = self._body(None, holder=self.config.identity, transitions=0, owner=owner)
                await self._call("post", body)
            else:
                transitions = record.transitions + (action == "take")
                body = self._body(
                    record, holder=self.config.identity, transitions=transitions, owner=owner
                )
                if action == "renew" and record.acquired is not None:
                    body["spec"]["acquireTime"] = record.acquired
                await self._call("put", body, name=self.config.name)
        except APIConflictError:
            return False
        return True

    async def _owner_reference(
        self, record: LeaseRecord | None
    ) -> tuple[dict[str, Any] | None, bool]:
        """The ownerReference to add (None: none to add), and whether the owner is gone.

        Read for a creation (is the Deployment still there?) and for a Lease without it. An
        owner that cannot be read (no ``get`` on it) only costs the reference: leading must
        not depend on it.
        """
        name = self.config.owner
        if not name or (record is not None and any(_names(ref, name) for ref in record.owners)):
            return None, False
        url = f"/apis/apps/v1/namespaces/{quote(self.config.namespace)}/deployments/{quote(name)}"
        try:
            found = await self._client.request(
                "get", url, seconds=self.config.request_timeout, retries=()
            )
        except APINotFoundError:
            return None, True
        except APIError as exc:
            log.warning("lease %s: cannot read its owner %s: %s", self.config.name, name, exc)
            return None, False
        uid = str(found["metadata"]["uid"])
        return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": uid}, False

    def _body(
        self,
        record: LeaseRecord | None,
        *,
        holder: str | None,
        transitions: int,
        duration: float | None = None,
        owner: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The whole Lease to write: an update replaces the object, so the labels and owners
        it had are written back, with ours (and ``owner``) added."""
        now = _micro(datetime.datetime.now(datetime.UTC))
        metadata: dict[str, Any] = {"name": self.config.name, "namespace": self.config.namespace}
        owners = [*(record.owners if record is not None else ()), *([owner] if owner else [])]
        metadata["labels"] = {**(record.labels if record is not None else {}), **LEASE_LABELS}
        if owners:
            metadata["ownerReferences"] = [dict(ref) for ref in owners]
        if record is not None:
            metadata["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": round(duration or self.config.duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    async def _call(self, method: str, body: object | None, *, name: str | None = None) -> Any:
        """One request, not repeated (the next step reads the Lease again anyway)."""
        url = self._url if name is None else f"{self._url}/{quote(name)}"
        return await self._client.request(
            method, url, body=body, seconds=self.config.request_timeout, retries=()
        )
