"""The operator process's own settings, and the workload defaults it gives every dispatcher.

``OperatorConfig`` holds what is not in any spec: how often each dispatcher is revisited, how
failures back off, how long PostgreSQL and Redis may take to answer, the clock, and the
enqueuer and worker images of this operator's version (the ``DISPATCHER_*_IMAGE`` and
``DISPATCHER_RUN_AS_*``/``DISPATCHER_FS_GROUP`` environment of its Deployment may override
them, and ``dispatcher operator``'s flags override that).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.controller.pods import DEFAULT_WORKLOADS, WorkloadDefaults
from dispatcher.options import option

__all__ = ["OperatorConfig", "default_workloads", "utcnow"]


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

    autoscale_interval: float = option(
        15.0, minimum=0, above=True, help="seconds between backlog measurements per resource"
    )
    retry_base: float = 5.0  # first retry after a failure, doubled up to retry_cap
    retry_cap: float = 300.0
    redis_timeout: float = 5.0
    postgres_timeout: float = 5.0
    postgres_interval: float = 30.0  # between two connection checks of one unchanged URL
    migration_poll: float = 5.0  # how often to look at a running migration Job
    resync_interval: float = 300.0  # between two LISTs of each owned kind (jittered)
    secret_ttl: float = 60.0  # how long a Secret read serves every pass (a rotation shows then)
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
