"""One Pod on the process kubelet: its network, its containers as processes, its status.

``PodRunner.run`` sets the Pod up, starts every container (``command`` and
``args`` from this Python environment's bin directory first on PATH, inside
the Pod's network namespace), restarts them as ``restartPolicy`` says, probes
readiness, and writes the status whenever it changes. ``terminate`` is the
deletion: SIGTERM, SIGKILL after the grace period, then the Pod is removed.
A failed livenessProbe restarts the container. Init containers and volumes are not handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dispatcher._testing.cluster.kubelet import env as envs
from dispatcher._testing.cluster.kubelet.api import ApiClient, ApiError
from dispatcher._testing.cluster.kubelet.images import image_stage
from dispatcher._testing.cluster.kubelet.inputs import container_env, token_kubeconfig
from dispatcher._testing.cluster.kubelet.probes import probe_once
from dispatcher._testing.cluster.kubelet.status import ContainerState, now, pod_status
from dispatcher._testing.cluster.network import HOST_IP, PodNetwork

__all__ = ["PodRunner", "grace_of"]

log = logging.getLogger("kubelet")
_BACKOFF_MAX = 30.0


_Check = Callable[[dict[str, Any]], Awaitable[bool]]


def grace_of(pod: dict[str, Any]) -> float:
    return float(pod["spec"].get("terminationGracePeriodSeconds", 30))


async def _stop_processes(processes: list[asyncio.subprocess.Process], *, grace: float) -> None:
    """SIGTERM to each process group, SIGKILL to those still there after ``grace`` seconds."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(p.wait() for p in processes)), timeout=max(grace, 0.1)
        )
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    await asyncio.gather(*(p.wait() for p in processes))


def _record_pid(path: Path, pid: int | None) -> None:
    """A running container's pid, for ``cluster down`` after a kubelet that was killed."""
    if pid is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(str(pid))


class PodRunner:
    """Runs one Pod bound to this node until it ends or is deleted."""

    def __init__(
        self,
        *,
        api: ApiClient,
        pod: dict[str, Any],
        node_name: str,
        pods_dir: Path,
        entrypoints: dict[str, list[str]],
    ) -> None:
        meta = pod["metadata"]
        self.api, self.pod, self.node_name = api, pod, node_name
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = pods_dir / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.entrypoints = entrypoints
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.containers = [
            ContainerState(name=c["name"], image=c.get("image", "")) for c in spec["containers"]
        ]
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.network: PodNetwork | None = None
        self.stopping = False
        self.changed = asyncio.Event()
        self.start_time = now()
        self.transitions: dict[str, tuple[str, str]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    # -- the life of the Pod ---------------------------------------------------------------

    async def run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        writer = asyncio.create_task(self._write_status())
        try:
            self.network = await asyncio.to_thread(PodNetwork.create, self.uid)
            (self.dir / "netns").write_text(self.network.netns)
            self.changed.set()
            kubeconfig = await token_kubeconfig(self.api, self.pod, self.dir / "kubeconfig")
            self.tasks = [
                asyncio.create_task(self._container(i, c, kubeconfig))
                for i, c in enumerate(self.pod["spec"]["containers"])
            ]
            await asyncio.gather(*self.tasks, return_exceptions=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s/%s failed to start", self.namespace, self.name)
        finally:
            await self._flush()
            writer.cancel()
            if self.network is not None and not self.processes:
                await asyncio.to_thread(self.network.remove)

    def _set(self, index: int, **changes: Any) -> None:
        self.containers[index] = dataclasses.replace(self.containers[index], **changes)
        self.changed.set()

    async def _container(self, index: int, spec: dict[str, Any], kubeconfig: Path | None) -> None:
        """Start, supervise and restart one container as ``restartPolicy`` says."""
        backoff = 1.0
        while not self.stopping:
            try:
                assert self.network is not None
                env = await container_env(
                    self.api,
                    self.pod,
                    spec,
                    pod_ip=self.network.ip,
                    node_name=self.node_name,
                    home=self.dir,
                    kubeconfig=kubeconfig,
                )
                stage = image_stage(spec.get("image", ""))
                argv = envs.command_line(spec, env, entrypoint=self.entrypoints.get(stage or ""))
            except (LookupError, ValueError, ApiError) as exc:
                self._set(index, waiting="CreateContainerConfigError", message=str(exc))
                await asyncio.sleep(2)
                continue
            assert self.network is not None
            with (self.dir / f"{spec['name']}.log").open("ab") as output:
                process = await asyncio.create_subprocess_exec(
                    *self.network.prefix(),
                    *argv,
                    env=env,
                    cwd=self.dir,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            self.processes[spec["name"]] = process
            pid_file = self.dir / f"{spec['name']}.pid"
            _record_pid(pid_file, process.pid)
            self._set(index, pid=process.pid, started_at=now(), exit_code=None, waiting=None)
            self._set(index, message=None)
            prober = asyncio.create_task(self._probe(index, spec, env))
            code = await process.wait()
            code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as runtimes say
            prober.cancel()
            del self.processes[spec["name"]]
            _record_pid(pid_file, None)
            self._set(index, pid=None, exit_code=code, finished_at=now(), ready=False)
            log.info("%s/%s %s exited %s", self.namespace, self.name, spec["name"], code)
            restart = self.restart_policy == "Always" or (
                self.restart_policy == "OnFailure" and code != 0
            )
            if not restart or self.stopping:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)
            ended = self.containers[index]
            self._set(index, restarts=ended.restarts + 1, last=ended.terminated())

    async def _probe(self, index: int, spec: dict[str, Any], env: dict[str, str]) -> None:
        """Readiness: after the startupProbe (if any) passed, the readinessProbe's verdicts."""
        assert self.network is not None
        network = self.network

        async def passes(probe: dict[str, Any]) -> bool:
            return await probe_once(
                probe, spec, pod_ip=network.ip, exec_prefix=network.prefix(), env=env
            )

        if startup := spec.get("startupProbe"):
            await asyncio.sleep(float(startup.get("initialDelaySeconds", 0)))
            while True:
                if await passes(startup):
                    break
                await asyncio.sleep(float(startup.get("periodSeconds", 10)))
        await asyncio.gather(
            self._readiness(index, spec.get("readinessProbe"), passes),
            self._liveness(spec, spec.get("livenessProbe"), passes),
        )

    async def _readiness(self, index: int, probe: dict[str, Any] | None, passes: _Check) -> None:
        if probe is None:
            self._set(index, ready=True)
            return
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        failures = successes = 0
        while True:
            if await passes(probe):
                successes, failures = successes + 1, 0
                if successes >= int(probe.get("successThreshold", 1)):
                    self._set(index, ready=True)
            else:
                failures, successes = failures + 1, 0
                if failures >= int(probe.get("failureThreshold", 3)):
                    self._set(index, ready=False)
            await asyncio.sleep(float(probe.get("periodSeconds", 10)))

    async def _liveness(
        self, spec: dict[str, Any], probe: dict[str, Any] | None, passes: _Check
    ) -> None:
        """failureThreshold failures in a row: the container is stopped (and restarted as
        ``restartPolicy`` says), as a kubelet does."""
        if probe is None:
            return
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        failures = 0
        while failures < int(probe.get("failureThreshold", 3)):
            await asyncio.sleep(float(probe.get("periodSeconds", 10)))
            failures = 0 if await passes(probe) else failures + 1
        process = self.processes.get(spec["name"])
        if process is not None:
            log.info("%s/%s %s failed its liveness probe", self.namespace, self.name, spec["name"])
            await _stop_processes([process], grace=grace_of(self.pod))

    async def terminate(self, grace: float) -> None:
        """SIGTERM every container, SIGKILL after ``grace`` seconds; the network goes."""
        self.stopping = True
        await _stop_processes(list(self.processes.values()), grace=grace)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.network is not None:
            await asyncio.to_thread(self.network.remove)

    async def remove(self) -> None:
        """Delete the Pod from the API now that nothing of it runs (grace 0, this uid only)."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        with contextlib.suppress(ApiError):
            await self.api.delete(self.path, body)

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return pod_status(
            self.containers,
            restart_policy=self.restart_policy,
            pod_ip=self.network.ip if self.network else None,
            host_ip=HOST_IP,
            start_time=self.start_time,
            transitions=self.transitions,
        )

    def finished(self) -> bool:
        return self.status()["phase"] in ("Succeeded", "Failed")

    async def _write_status(self) -> None:
        while True:
            await self.changed.wait()
            await asyncio.sleep(0.2)  # coalesce a burst of changes into one write
            await self._flush()

    async def _flush(self) -> None:
        self.changed.clear()
        try:
            await self.api.merge_patch(f"{self.path}/status", {"status": self.status()})
        except ApiError as exc:
            if exc.status not in (404, 409, 422):
                log.warning("status of %s/%s: %s", self.namespace, self.name, exc)
