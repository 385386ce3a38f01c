"""The kubelet's loop: list and watch every Pod, bind the unscheduled ones to this node, run
the ones bound here (``PodRunner``), and stop them when they are deleted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher._testing.cluster.kubelet import node
from dispatcher._testing.cluster.kubelet.api import ApiClient, ApiError
from dispatcher._testing.cluster.kubelet.images import entrypoints
from dispatcher._testing.cluster.kubelet.logs import serve_logs
from dispatcher._testing.cluster.kubelet.pod import PodRunner, grace_of
from dispatcher._testing.cluster.network import HOST_IP

__all__ = ["Kubelet", "Serving"]

log = logging.getLogger("kubelet")
_PODS = "/api/v1/pods"
_SHUTDOWN_GRACE = 30.0  # at most this per Pod when the kubelet itself is stopped


@dataclass(frozen=True)
class Serving:
    """Where the kubelet serves ``kubectl logs`` to the API server, and with which keys."""

    port: int
    cert: Path
    key: Path
    client_ca: Path


class Kubelet:
    def __init__(
        self,
        *,
        kubeconfig: Path,
        pods_dir: Path,
        node_name: str,
        dockerfile: Path,
        serving: Serving,
    ) -> None:
        self.api = ApiClient(kubeconfig)
        self.serving = serving
        self.pods_dir = pods_dir
        self.node_name = node_name
        self.entrypoints = entrypoints(dockerfile)
        self.runners: dict[str, PodRunner] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.terminating: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logs = await serve_logs(
            pods_dir=self.pods_dir,
            running=self._running,
            host=HOST_IP,
            port=self.serving.port,
            cert=self.serving.cert,
            key=self.serving.key,
            client_ca=self.serving.client_ca,
        )
        await node.register(self.api, self.node_name, logs_port=self.serving.port)
        log.info("node %s registered", self.node_name)
        background = [
            asyncio.create_task(node.heartbeat(self.api, self.node_name)),
            asyncio.create_task(self._watch_forever()),
        ]
        await stop.wait()
        log.info("stopping: every pod gets its grace period (at most %ss)", _SHUTDOWN_GRACE)
        for task in background:
            task.cancel()
        await asyncio.gather(
            *(self._stop(r, min(grace_of(r.pod), _SHUTDOWN_GRACE)) for r in self.runners.values())
        )
        await logs.cleanup()
        await self.api.close()

    def _running(self, namespace: str, name: str) -> bool:
        return any(
            r.namespace == namespace and r.name == name and r.processes
            for r in self.runners.values()
        )

    async def _watch_forever(self) -> None:
        while True:
            try:
                listing = await self.api.get(_PODS)
                for pod in listing["items"]:
                    await self._handle("ADDED", pod)
                version = listing["metadata"]["resourceVersion"]
                async for event in self.api.watch(_PODS, resource_version=version):
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    if event["type"] != "BOOKMARK":
                        await self._handle(event["type"], event["object"])
            except (TimeoutError, ApiError, OSError) as exc:
                log.warning("watch of pods: %s; listing again", exc)
                await asyncio.sleep(1)
            except Exception:  # a bug of ours on one Pod must not stop every other Pod's care
                log.exception("handling a pod failed; listing again")
                await asyncio.sleep(1)

    async def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        bound = spec.get("nodeName")
        if not bound:
            if not meta.get("deletionTimestamp") and kind != "DELETED":
                await self._bind(pod)
            return
        if bound != self.node_name:
            return
        runner = self.runners.get(uid)
        if kind == "DELETED":
            if runner is not None and uid not in self.terminating:
                self.terminating[uid] = asyncio.create_task(self._stop(runner, 0))
            return
        if meta.get("deletionTimestamp"):
            if uid in self.terminating:
                return
            if runner is None:  # deleted before it started here
                with contextlib.suppress(ApiError):
                    await self.api.delete(
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                    )
                return
            grace = float(meta.get("deletionGracePeriodSeconds", grace_of(pod)))
            self.terminating[uid] = asyncio.create_task(self._stop(runner, grace, remove=True))
            return
        if runner is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            runner = PodRunner(
                api=self.api,
                pod=pod,
                node_name=self.node_name,
                pods_dir=self.pods_dir,
                entrypoints=self.entrypoints,
            )
            self.runners[uid] = runner
            self.tasks[uid] = asyncio.create_task(runner.run())
            log.info("pod %s/%s started", meta["namespace"], meta["name"])

    async def _bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding"
        try:
            await self.api.post(path, binding)
        except ApiError as exc:
            if exc.status != 409:  # 409: bound already (we saw an older version)
                log.warning("binding %s/%s: %s", meta["namespace"], meta["name"], exc)

    async def _stop(self, runner: PodRunner, grace: float, *, remove: bool = False) -> None:
        log.info("pod %s/%s stopping (grace %ss)", runner.namespace, runner.name, grace)
        await runner.terminate(grace)
        task = self.tasks.pop(runner.uid, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if remove:
            await runner.remove()
        self.runners.pop(runner.uid, None)
        self.terminating.pop(runner.uid, None)
