"""What a container gets from the API: its env (with the Secrets and ConfigMaps it reads) and
a kubeconfig holding a token of the Pod's ServiceAccount (the TokenRequest API, bound to the
Pod), which ``KUBECONFIG`` points to instead of the usual mounted token."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from dispatcher._testing.cluster.kubelet import env as envs
from dispatcher._testing.cluster.kubelet.api import ApiClient, ApiError
from dispatcher._testing.cluster.network import HOST_IP

__all__ = ["container_env", "token_kubeconfig"]

_TOKEN_SECONDS = 86_400


async def _refs(api: ApiClient, namespace: str, spec: dict[str, Any]) -> envs.Refs:
    """The referenced Secrets and ConfigMaps that exist (the env resolution says what lacks)."""
    secret_names, configmap_names = envs.references(spec)
    base = f"/api/v1/namespaces/{namespace}"
    secrets, configmaps = {}, {}
    for name in secret_names:
        with contextlib.suppress(ApiError):
            secrets[name] = envs.Refs.secret_data(await api.get(f"{base}/secrets/{name}"))
    for name in configmap_names:
        with contextlib.suppress(ApiError):
            found = await api.get(f"{base}/configmaps/{name}")
            configmaps[name] = dict(found.get("data") or {})
    return envs.Refs(secrets=secrets, configmaps=configmaps)


async def container_env(
    api: ApiClient,
    pod: dict[str, Any],
    spec: dict[str, Any],
    *,
    pod_ip: str,
    node_name: str,
    home: Path,
    kubeconfig: Path | None,
) -> dict[str, str]:
    """The container's env: this venv's bin first on PATH (and the kubelet's PYTHONPATH, if
    set), then what the spec resolves to."""
    namespace = pod["metadata"]["namespace"]
    resolved = envs.resolve_env(
        pod,
        spec,
        refs=await _refs(api, namespace, spec),
        pod_ip=pod_ip,
        host_ip=HOST_IP,
        node_name=node_name,
    )
    bin_dir = str(Path(sys.executable).parent)
    system = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "HOSTNAME": pod["metadata"]["name"],
        "TMPDIR": str(home),
    }
    if kubeconfig is not None:
        system["KUBECONFIG"] = str(kubeconfig)
    if os.environ.get("PYTHONPATH"):  # a checkout put before this venv's install runs in Pods too
        system["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**system, **resolved}


async def _token(api: ApiClient, pod: dict[str, Any], account: str) -> str:
    meta = pod["metadata"]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": _TOKEN_SECONDS,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }
    path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token"
    while True:  # a new namespace's default account appears a moment after it
        try:
            return str((await api.post(path, request))["status"]["token"])
        except ApiError as exc:
            if exc.status != 404:
                raise
            await asyncio.sleep(1)


def _write_kubeconfig(path: Path, *, server: str, ca_file: Path, token: str, account: str,
                      namespace: str) -> None:  # fmt: skip
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    context = {"cluster": "local", "user": account, "namespace": namespace}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": context}],
        "current-context": "pod",
    }
    path.touch(mode=0o600)
    path.write_text(json.dumps(config))


async def token_kubeconfig(api: ApiClient, pod: dict[str, Any], path: Path) -> Path | None:
    """Write the Pod's kubeconfig to ``path`` (None when the Pod opts out of a token)."""
    spec = pod["spec"]
    if spec.get("automountServiceAccountToken") is False:
        return None
    account = spec.get("serviceAccountName") or "default"
    token = await _token(api, pod, account)
    _write_kubeconfig(
        path,
        server=api.server,
        ca_file=api.ca_file,
        token=token,
        account=account,
        namespace=pod["metadata"]["namespace"],
    )
    return path
