"""Start and stop one local cluster: etcd, kube-apiserver, kube-controller-manager, kubelet.

Everything lives in one state directory: the certificates, etcd's data, one log
per process, ``kubeconfig`` (the admin's) and ``state.json`` (the processes'
ids, for ``stop`` from another process). The API server listens on the
bridge's host address, which the Pods reach too; etcd on loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dispatcher._testing.cluster import network, processes
from dispatcher._testing.cluster.binaries import binaries
from dispatcher._testing.cluster.kubelet.logs import container_log_path, pod_file
from dispatcher._testing.cluster.pki import Pki, make_pki
from dispatcher._testing.waiting import eventually_sync

__all__ = ["NODE_NAME", "Cluster", "start", "stop"]

NODE_NAME = "local"
SERVICE_CIDR = "10.0.0.0/24"  # a value the API requires; no Service address is ever contacted
_ORDER = ("kubelet", "kube-controller-manager", "kube-apiserver", "etcd")  # stopping order


@dataclass(frozen=True)
class Cluster:
    """A running cluster: where its files are and how to reach it."""

    state_dir: Path
    bin_dir: Path
    server: str
    pids: dict[str, int]

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    def env(self) -> dict[str, str]:
        """The environment in which kubectl and helm talk to this cluster."""
        path = f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def run(self, tool: str, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
        """``kubectl`` or ``helm`` against this cluster: its output, or an error with both
        streams."""
        done = subprocess.run(
            [str(self.bin_dir / tool), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"{tool} {' '.join(args)}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def run_status(self, tool: str, *args: str) -> int:
        """The exit status of ``kubectl`` or ``helm`` against this cluster (output dropped)."""
        return subprocess.run(
            [str(self.bin_dir / tool), *args], capture_output=True, env=self.env(), check=False
        ).returncode

    def pod_kubeconfig(self, namespace: str, pod: str) -> Path | None:
        """The kubeconfig the kubelet gave a Pod (its ServiceAccount's token)."""
        return pod_file(self.state_dir / "pods", namespace, pod, "kubeconfig")

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container of a Pod printed (the kubelet keeps it in the Pod's directory)."""
        path = container_log_path(self.state_dir / "pods", namespace, pod, container)
        return path.read_text(errors="replace") if path else ""


def _write_kubeconfig(path: Path, *, server: str, pki: Pki) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(pki.admin_cert),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }
    path.write_text(json.dumps(config, indent=2))


def _apiserver_argv(bin_dir: Path, *, pki: Pki, port: int, etcd: str) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd}",
        f"--bind-address={network.HOST_IP}",
        f"--advertise-address={network.HOST_IP}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # kubectl logs: the API server calls the kubelet as the admin (the kubelet checks the CA)
        f"--kubelet-client-certificate={pki.admin_cert}",
        f"--kubelet-client-key={pki.admin_key}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--profiling=false",
        "--endpoint-reconciler-type=none",
    ]


def _controller_manager_argv(bin_dir: Path, *, pki: Pki, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--use-service-account-credentials",
        "--controllers=*",
        "--leader-elect=false",
        "--secure-port=0",
        "--profiling=false",
    ]


def _kubectl_ok(bin_dir: Path, kubeconfig: Path, *args: str) -> bool:
    done = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return done.returncode == 0


def _check(pids: dict[str, int], state_dir: Path) -> None:
    for name, pid in pids.items():
        if not processes.alive(pid):
            tail = (state_dir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited at start; the end of its log:\n{tail}")


def start(state_dir: Path, *, bin_dir: Path | None = None) -> Cluster:
    """Start a cluster with its files in ``state_dir`` (emptied first) and wait for its Node."""
    if (state_dir / "state.json").exists():
        stop(state_dir)
    bin_dir = bin_dir or binaries()
    shutil.rmtree(state_dir, ignore_errors=True)
    logs = state_dir / "logs"
    logs.mkdir(parents=True)
    network.ensure_bridge()
    pki = make_pki(
        state_dir / "pki",
        ips=[network.HOST_IP, "127.0.0.1", "10.0.0.1"],
        dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
    )
    etcd_port, peer_port = processes.free_port("127.0.0.1"), processes.free_port("127.0.0.1")
    etcd = f"http://127.0.0.1:{etcd_port}"
    api_port, kubelet_port = (
        processes.free_port(network.HOST_IP),
        processes.free_port(network.HOST_IP),
    )
    server = f"https://{network.HOST_IP}:{api_port}"
    kubeconfig = state_dir / "kubeconfig"
    _write_kubeconfig(kubeconfig, server=server, pki=pki)
    pids: dict[str, int] = {}
    cluster = Cluster(state_dir=state_dir, bin_dir=bin_dir, server=server, pids=pids)
    try:
        pids["etcd"] = processes.spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                f"--data-dir={state_dir / 'etcd'}",
                f"--listen-client-urls={etcd}",
                f"--advertise-client-urls={etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            logs,
        )
        pids["kube-apiserver"] = processes.spawn(
            "kube-apiserver", _apiserver_argv(bin_dir, pki=pki, port=api_port, etcd=etcd), logs
        )
        _save(cluster)

        def api_ready() -> bool:
            _check(pids, state_dir)
            return _kubectl_ok(bin_dir, kubeconfig, "get", "--raw", "/readyz")

        eventually_sync(api_ready, within=120, interval=0.5, what="kube-apiserver /readyz")
        pids["kube-controller-manager"] = processes.spawn(
            "kube-controller-manager",
            _controller_manager_argv(bin_dir, pki=pki, kubeconfig=kubeconfig),
            logs,
        )
        pids["kubelet"] = processes.spawn(
            "kubelet",
            [
                sys.executable,
                *("-m", "dispatcher._testing.cluster.kubelet"),
                *("--kubeconfig", str(kubeconfig), "--state-dir", str(state_dir / "pods")),
                *("--node-name", NODE_NAME, "--port", str(kubelet_port)),
                *("--tls-cert", str(pki.serving_cert), "--tls-key", str(pki.serving_key)),
                *("--client-ca", str(pki.ca_cert)),
            ],
            logs,
        )
        _save(cluster)

        def node_ready() -> bool:
            _check(pids, state_dir)
            return _kubectl_ok(
                bin_dir,
                kubeconfig,
                "wait",
                "--for=condition=Ready",
                f"node/{NODE_NAME}",
                "--timeout=5s",
            )

        eventually_sync(node_ready, within=120, interval=1, what=f"node {NODE_NAME} Ready")
        # Pods are refused until the service account controller made a namespace's account.
        eventually_sync(
            lambda: _kubectl_ok(bin_dir, kubeconfig, "get", "serviceaccount", "default"),
            within=60,
            interval=0.5,
            what="the default ServiceAccount",
        )
    except BaseException:
        stop(state_dir)
        raise
    return cluster


def _save(cluster: Cluster) -> None:
    state = {"server": cluster.server, "bin_dir": str(cluster.bin_dir), "pids": cluster.pids}
    (cluster.state_dir / "state.json").write_text(json.dumps(state, indent=2))


def load(state_dir: Path) -> Cluster | None:
    """The cluster whose state is in ``state_dir``, or None if none was started there."""
    try:
        state = json.loads((state_dir / "state.json").read_text())
    except FileNotFoundError:
        return None
    return Cluster(
        state_dir=state_dir,
        bin_dir=Path(state["bin_dir"]),
        server=state["server"],
        pids={k: int(v) for k, v in state["pids"].items()},
    )


def stop(state_dir: Path) -> None:
    """Stop the cluster of ``state_dir`` (the kubelet stops its Pods first); keep its files."""
    cluster = load(state_dir)
    if cluster is not None:
        for name in _ORDER:
            if name in cluster.pids:
                # The kubelet gives each Pod its grace period; the rest stop at once.
                processes.terminate(cluster.pids[name], grace=60 if name == "kubelet" else 15)
        (state_dir / "state.json").unlink()
    processes.kill_leftover_containers(state_dir / "pods")
    network.remove_pod_networks(state_dir / "pods")
