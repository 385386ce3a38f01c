"""Start and stop one local cluster: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, and a real node (containerd, kubelet, kube-proxy; ``node.py``).

Everything lives in one state directory: the certificates, etcd's data, one log per
process, the node's files, ``kubeconfig`` (the admin's) and ``state.json`` (the processes'
ids, for ``stop`` from another process). The API server listens on the bridge's host
address, which the Pods reach too (directly, or as the ``kubernetes`` Service through
kube-proxy's rules); etcd on loopback. One node runs on a machine at a time (the kubelet's
cgroups and iptables chains are the machine's): ``MACHINE_RECORD`` names the state
directory of the one that runs and the process it belongs to, so that a start after a
SIGKILLed test session stops that session's cluster and sweeps what it left first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.waiting import eventually_sync
from tools.cluster import leftovers, network, node, processes
from tools.cluster.binaries import binaries, images
from tools.cluster.pki import Pki, make_pki

__all__ = ["MACHINE_RECORD", "NODE_NAME", "Cluster", "start", "stop"]

NODE_NAME = node.NODE_NAME
SERVICE_CIDR = "10.0.0.0/24"  # the kubernetes Service is 10.0.0.1, served through kube-proxy
MACHINE_RECORD = Path("/run/outbox-dispatcher/cluster")  # the running cluster's state dir
# stopping order: the node first (nothing restarts a Pod then), etcd last
_ORDER = (
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "containerd",
    "etcd",
)


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

    def container_pids(self, namespace: str, pod: str, container: str) -> list[int]:
        """The host's pids of a container's processes (from the node's cgroups), for a test
        that kills one from outside, as a crash would."""
        found = json.loads(self.run("kubectl", "-n", namespace, "get", "pod", pod, "-o", "json"))
        (status,) = [s for s in found["status"]["containerStatuses"] if s["name"] == container]
        container_id = status["containerID"].split("://", 1)[1]
        pids: set[int] = set()
        hierarchy = Path("/sys/fs/cgroup/pids") / leftovers.CGROUP_ROOT
        for cgroup in hierarchy.rglob(f"*{container_id}*"):
            pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
        return sorted(pids)

    def import_image(self, archive: Path) -> None:
        """Load an image archive (``docker-archive``) into the node's containerd."""
        node.import_archives(node.NodePaths(self.state_dir / "node"), [archive])

    def tag_image(self, source: str, target: str) -> None:
        """Give an image the node has a second name (a test's "new version" of an image)."""
        node.tag_image(node.NodePaths(self.state_dir / "node"), source, target)

    def run_status(self, tool: str, *args: str) -> int:
        """The exit status of ``kubectl`` or ``helm`` against this cluster (output dropped)."""
        return subprocess.run(
            [str(self.bin_dir / tool), *args], capture_output=True, env=self.env(), check=False
        ).returncode


def _write_kubeconfig(path: Path, *, server: str, ca: Path, cert: Path, key: Path) -> None:
    cluster = {"server": server, "certificate-authority": str(ca)}
    user = {"client-certificate": str(cert), "client-key": str(key)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
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
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # kubectl logs/exec: the API server calls the kubelet as the admin
        f"--kubelet-client-certificate={pki.admin_cert}",
        f"--kubelet-client-key={pki.admin_key}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--profiling=false",
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


def _machine_record() -> tuple[Path, int | None] | None:
    """The state directory of the machine's cluster and the pid of the process it belongs to
    (None: ``make cluster``'s, which outlives its command), or None without a record."""
    try:
        record = json.loads(MACHINE_RECORD.read_text())
    except (FileNotFoundError, ValueError):
        return None
    owner = record.get("owner")
    return Path(record["state_dir"]), (int(owner) if owner is not None else None)


def _claim_machine(state_dir: Path, *, owner: int | None) -> None:
    """Record ``state_dir`` as the machine's cluster (of the process ``owner``), after removing
    what an earlier one left: a cluster whose owner was killed (its processes run on, in
    sessions of their own) is stopped; one still wanted is refused (the node's cgroups and
    chains are the machine's)."""
    found = _machine_record()
    if found is not None:
        previous, previous_owner = found
        running = load(previous)
        runs = running is not None and any(
            processes.runs(pid, needle=str(previous)) for pid in running.pids.values()
        )
        owned = previous_owner is not None and processes.alive(previous_owner)
        if runs and (previous_owner is None or owned):
            raise RuntimeError(
                f"a local cluster runs already (its files in {previous}); stop it first: "
                f"python -m tools.cluster down --state-dir {previous}"
            )
        stop(previous)  # its processes, if any, and everything it left
    leftovers.sweep(state_dir)
    MACHINE_RECORD.parent.mkdir(parents=True, exist_ok=True)
    MACHINE_RECORD.write_text(json.dumps({"state_dir": str(state_dir), "owner": owner}))


# A unix socket's path is at most 107 bytes on Linux; containerd refuses a ttrpc one over
# 104 (its limit on every platform).
SOCKET_PATH_MAX = 104


def _check_socket_paths(state_dir: Path) -> None:
    """Refuse a state dir too deep for containerd's sockets before anything starts."""
    longest = node.NodePaths(state_dir.absolute() / "node").socket.with_suffix(".sock.ttrpc")
    if len(str(longest).encode()) > SOCKET_PATH_MAX:
        raise ValueError(
            f"the state dir {state_dir} is too deep for containerd: its socket {longest} would be "
            f"{len(str(longest).encode())} bytes, over {SOCKET_PATH_MAX}; choose a shorter path "
            "(python -m tools.cluster up --state-dir DIR)"
        )


def start(state_dir: Path, *, bin_dir: Path | None = None, owner: int | None = None) -> Cluster:
    """Start a cluster with its files in ``state_dir`` (emptied first) and wait for its Node.

    ``owner``: the pid of the process the cluster belongs to (a test session): if it is
    killed, the next start stops this cluster and sweeps what it left. Without one the
    cluster is meant to outlive its command (``make cluster``) and the next start refuses."""
    _check_socket_paths(state_dir)
    if (state_dir / "state.json").exists():
        stop(state_dir)
    bin_dir = bin_dir or binaries()
    archives = images()
    _claim_machine(state_dir, owner=owner)
    shutil.rmtree(state_dir, ignore_errors=True)
    logs = state_dir / "logs"
    logs.mkdir(parents=True)
    network.ensure_bridge()
    pki = make_pki(
        state_dir / "pki",
        ips=[network.HOST_IP, "127.0.0.1", "10.0.0.1"],
        dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        node=NODE_NAME,
    )
    etcd_port, peer_port = processes.free_port("127.0.0.1"), processes.free_port("127.0.0.1")
    etcd = f"http://127.0.0.1:{etcd_port}"
    api_port = processes.free_port(network.HOST_IP)
    server = f"https://{network.HOST_IP}:{api_port}"
    kubeconfig, node_kubeconfig = state_dir / "kubeconfig", state_dir / "node.kubeconfig"
    _write_kubeconfig(
        kubeconfig, server=server, ca=pki.ca_cert, cert=pki.admin_cert, key=pki.admin_key
    )
    _write_kubeconfig(
        node_kubeconfig, server=server, ca=pki.ca_cert, cert=pki.node_cert, key=pki.node_key
    )
    pids: dict[str, int] = {}
    cluster = Cluster(state_dir=state_dir, bin_dir=bin_dir, server=server, pids=pids)
    paths = node.NodePaths(state_dir / "node")
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
        # containerd starts (and imports the images) while the API server comes up.
        network.write_cni_config(paths.cni_conf, ipam_dir=paths.root / "cni" / "ipam")
        paths.containerd.mkdir(parents=True, exist_ok=True)
        (paths.containerd / "config.toml").write_text(node.containerd_config(paths))
        pids["containerd"] = processes.spawn(
            "containerd", ["containerd", f"--config={paths.containerd / 'config.toml'}"], logs
        )
        _save(cluster)

        def containerd_ready() -> bool:
            _check(pids, state_dir)
            return paths.socket.exists()

        eventually_sync(containerd_ready, within=60, interval=0.2, what="containerd's socket")
        node.import_archives(paths, sorted(archives.glob("*.tar")))

        def api_ready() -> bool:
            _check(pids, state_dir)
            return _kubectl_ok(bin_dir, kubeconfig, "get", "--raw", "/readyz")

        eventually_sync(api_ready, within=120, interval=0.5, what="kube-apiserver /readyz")
        pids["kube-controller-manager"] = processes.spawn(
            "kube-controller-manager",
            _controller_manager_argv(bin_dir, pki=pki, kubeconfig=kubeconfig),
            logs,
        )
        pids["kube-scheduler"] = processes.spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--profiling=false",
            ],
            logs,
        )
        kubelet_config = node.kubelet_config(
            paths,
            pki=pki,
            port=processes.free_port(network.HOST_IP),
            healthz_port=processes.free_port("127.0.0.1"),
        )
        paths.kubelet.mkdir(parents=True, exist_ok=True)
        node.make_cgroup_root()
        (paths.root / "kubelet.json").write_text(json.dumps(kubelet_config, indent=2))
        pids["kubelet"] = processes.spawn(
            "kubelet",
            [
                str(bin_dir / "kubelet"),
                f"--config={paths.root / 'kubelet.json'}",
                f"--kubeconfig={node_kubeconfig}",
                f"--root-dir={paths.kubelet}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={network.HOST_IP}",
            ],
            logs,
        )
        proxy_config = node.kube_proxy_config(
            kubeconfig=kubeconfig,
            metrics_port=processes.free_port("127.0.0.1"),
            healthz_port=processes.free_port("127.0.0.1"),
        )
        (paths.root / "kube-proxy.json").write_text(json.dumps(proxy_config, indent=2))
        pids["kube-proxy"] = processes.spawn(
            "kube-proxy",
            [str(bin_dir / "kube-proxy"), f"--config={paths.root / 'kube-proxy.json'}"],
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
    """Stop the cluster of ``state_dir`` and remove everything it left on the machine (its
    Pods are killed: delete them first for their grace periods); keep its files."""
    cluster = load(state_dir)
    if cluster is not None:
        for name in _ORDER:
            # A recorded pid counts while its process names this cluster's files (a cluster
            # killed long ago may have left pids that belong to other processes now).
            if name in cluster.pids and processes.runs(cluster.pids[name], needle=str(state_dir)):
                processes.terminate(cluster.pids[name], grace=15)
        (state_dir / "state.json").unlink()
    leftovers.sweep(state_dir)
    with contextlib.suppress(FileNotFoundError, OSError):
        found = _machine_record()
        if found is not None and found[0] == state_dir:
            MACHINE_RECORD.unlink()
            MACHINE_RECORD.parent.rmdir()
