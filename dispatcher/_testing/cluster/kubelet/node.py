"""The kubelet's Node: registered Ready with its capacity, and its Lease renewed (the node
lifecycle controller takes a Node whose Lease goes stale for dead and evicts its Pods)."""

from __future__ import annotations

import asyncio
import datetime
import platform
from typing import Any

from dispatcher._testing.cluster.kubelet.api import ApiClient, ApiError
from dispatcher._testing.cluster.kubelet.status import now
from dispatcher._testing.cluster.network import HOST_IP

__all__ = ["heartbeat", "register"]

_LEASE_SECONDS = 40
_RENEW_EVERY = 10.0


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_status(*, logs_port: int, version: str) -> dict[str, Any]:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "250", "ephemeral-storage": "100Gi"}
    stamp = now()
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [{"type": "InternalIP", "address": HOST_IP}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": logs_port}},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "process kubelet is posting ready status",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
        ],
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": platform.release(),
            "osImage": "process kubelet",
            "containerRuntimeVersion": "process://1",
            "kubeletVersion": version,  # the control plane's: one release
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


async def register(api: ApiClient, name: str, *, logs_port: int) -> None:
    """Create the Node (or find it from an earlier run) and mark it Ready."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
    }
    try:
        await api.post("/api/v1/nodes", node)
    except ApiError as exc:
        if exc.status != 409:
            raise
    version = str((await api.get("/version"))["gitVersion"])
    status = node_status(logs_port=logs_port, version=version)
    await api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})


async def heartbeat(api: ApiClient, name: str) -> None:
    """Renew the Node's Lease every few seconds, for ever."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    while True:
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": _LEASE_SECONDS,
            "renewTime": _micro_now(),
        }
        try:
            try:
                await api.merge_patch(path, {"spec": spec})
            except ApiError as exc:
                if exc.status != 404:
                    raise
                lease = {"metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec}
                await api.post(path.rsplit("/", 1)[0], lease)
        except (ApiError, OSError) as exc:
            print(f"kubelet: lease renewal failed: {exc}", flush=True)
        await asyncio.sleep(_RENEW_EVERY)
