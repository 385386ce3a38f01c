"""A Pod's status from its containers' states: pure, so the phase rules are tested alone."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ContainerState", "now", "phase", "pod_status"]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ContainerState:
    """What the kubelet knows of one container."""

    name: str
    image: str
    pid: int | None = None  # set while it runs
    started_at: str | None = None
    exit_code: int | None = None  # set once it exited (and is not restarted yet)
    finished_at: str | None = None
    ready: bool = False
    restarts: int = 0
    waiting: str | None = None  # a reason while it waits to (re)start
    message: str | None = None
    last: dict[str, Any] | None = None  # the terminated state of the run before a restart

    def terminated(self) -> dict[str, Any]:
        return {
            "exitCode": self.exit_code,
            "reason": "Completed" if self.exit_code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }

    def state(self) -> dict[str, Any]:
        if self.exit_code is not None:
            terminated = self.terminated()
            if self.message:
                terminated["message"] = self.message
            return {"terminated": terminated}
        if self.pid is not None:
            return {"running": {"startedAt": self.started_at}}
        waiting = {"reason": self.waiting or "ContainerCreating"}
        return {"waiting": {**waiting, **({"message": self.message} if self.message else {})}}

    def as_status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": f"process://{self.pid}" if self.pid else "",
            "ready": self.ready,
            "started": self.pid is not None,
            "restartCount": self.restarts,
            "state": self.state(),
            "lastState": {"terminated": self.last} if self.last else {},
        }


def phase(containers: Sequence[ContainerState], *, restart_policy: str) -> str:
    """Pending, Running, Succeeded or Failed, as the kubelet decides it."""
    if any(c.pid is not None for c in containers):
        return "Running"
    if containers and all(c.exit_code is not None for c in containers):
        codes = [c.exit_code for c in containers]
        if restart_policy == "Always":
            return "Running"
        if all(code == 0 for code in codes):
            return "Succeeded"
        return "Running" if restart_policy == "OnFailure" else "Failed"
    if any(c.restarts for c in containers):
        return "Running"
    return "Pending"


def pod_status(
    containers: Sequence[ContainerState],
    *,
    restart_policy: str,
    pod_ip: str | None,
    host_ip: str,
    start_time: str,
    transitions: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    """The ``status`` to write; ``transitions`` keeps each condition's (status, time) across
    calls so lastTransitionTime moves only when the status does."""
    current = phase(containers, restart_policy=restart_policy)
    all_ready = bool(containers) and all(c.ready for c in containers)
    wanted = {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True" if all_ready and current == "Running" else "False",
        "Ready": "True" if all_ready and current == "Running" else "False",
    }
    conditions = []
    for type_, value in wanted.items():
        if transitions.get(type_, ("", ""))[0] != value:
            transitions[type_] = (value, now())
        conditions.append(
            {"type": type_, "status": value, "lastTransitionTime": transitions[type_][1]}
        )
    status: dict[str, Any] = {
        "phase": current,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.as_status() for c in containers],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
