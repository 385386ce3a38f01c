"""Schema migrations before the enqueuer: the state of ``dispatcher migrate`` for one image.

The operator runs ``dispatcher migrate`` as a Job per enqueuer image and applies (or upgrades)
the enqueuer Deployment only once that Job succeeded; an enqueuer already running keeps its old
image meanwhile. The image whose migration succeeded is remembered in
``status.migratedImage``, so a finished Job can be deleted without migrating again.
``migration_state`` is the pure decision; the ``Migrated`` condition reports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["MIGRATED", "MigrationState", "job_outcome", "migration_state"]

MIGRATED = "Migrated"
Phase = Literal["disabled", "succeeded", "running", "failed"]


@dataclass(frozen=True, slots=True)
class MigrationState:
    phase: Phase
    image: str
    job: str | None = None
    detail: str = ""

    @property
    def done(self) -> bool:
        """Whether the enqueuer may run ``image`` (migrated, or migrations are not ours)."""
        return self.phase in ("disabled", "succeeded")

    def condition(self) -> tuple[Literal["True", "False", "Unknown"], str, str]:
        """``(status, reason, message)`` of the ``Migrated`` condition."""
        if self.phase == "disabled":
            return "Unknown", "Disabled", "spec.migrate is false: run `dispatcher migrate` yourself"
        if self.phase == "succeeded":
            return "True", "Succeeded", f"`dispatcher migrate` succeeded for {self.image}"
        if self.phase == "running":
            return (
                "False",
                "Running",
                f"Job {self.job} runs `dispatcher migrate` for {self.image}; "
                "the enqueuer starts (or is upgraded) when it succeeds",
            )
        return (
            "False",
            "MigrationFailed",
            f"Job {self.job} failed to migrate for {self.image}: {self.detail or 'see its pods'}; "
            f"fix the cause, then `kubectl delete job {self.job}` to run it again",
        )


def job_outcome(
    job: Mapping[str, Any] | None,
) -> tuple[Literal["absent", "running", "succeeded", "failed"], str]:
    """What a Job's status says: absent, running, succeeded or failed (with its message)."""
    if job is None:
        return "absent", ""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "succeeded", ""
        if condition.get("type") == "Failed":
            return "failed", str(condition.get("message") or condition.get("reason") or "")
    if int(status.get("succeeded") or 0) > 0:
        return "succeeded", ""
    return "running", ""


def migration_state(
    *,
    enabled: bool,
    image: str,
    migrated_image: str | None,
    job_name: str,
    job: Mapping[str, Any] | None,
) -> MigrationState:
    """Where the migration for ``image`` stands, given the live Job (None: none exists)."""
    if not enabled:
        return MigrationState(phase="disabled", image=image)
    if migrated_image == image:
        return MigrationState(phase="succeeded", image=image)
    outcome, detail = job_outcome(job)
    if outcome == "absent":
        outcome = "running"  # the caller creates it
    return MigrationState(phase=outcome, image=image, job=job_name, detail=detail)
