"""The node: containerd and runc (Debian's), the kubelet and kube-proxy (built from the same
``k8s.io/kubernetes`` module as the control plane), their configuration, and the images.

Everything a node keeps lives under ``<state>/node``: containerd's root, state and socket
(its network namespaces too: ``netns_mounts_under_state_dir``), runc's state, the CNI
configuration and address leases, the kubelet's root directory and the Pods' logs. Nothing
is pulled: containerd imports the archives ``tools/images/build.sh`` wrote (the project's
three images and a pause image), and the kubelet never collects them as garbage.

This host: cgroup v1 (``failCgroupV1: false``), root without ``CAP_SYS_RESOURCE`` (containerd
must not raise a process's OOM score adjustment or rlimits: ``restrict_oom_score_adj``; the
containers keep the host's limits), no systemd (the ``cgroupfs`` driver).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tools.cluster import network
from tools.cluster.leftovers import CGROUP_ROOT
from tools.cluster.pki import Pki

__all__ = [
    "NODE_NAME",
    "PAUSE_IMAGE",
    "NodePaths",
    "containerd_config",
    "import_archives",
    "kube_proxy_config",
    "kubelet_config",
    "make_cgroup_root",
    "tag_image",
]

NODE_NAME = "local"
PAUSE_IMAGE = "localhost/outbox-dispatcher-pause:3.10"


@dataclass(frozen=True)
class NodePaths:
    """Where the node's parts keep their files."""

    root: Path

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"


def _toml(value: object) -> str:
    return json.dumps(value)  # TOML's basic strings, numbers and booleans are JSON's


def containerd_config(paths: NodePaths) -> str:
    """containerd 1.6's configuration (version 2) for this node."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f"root = {_toml(str(paths.containerd / 'root'))}",
        f"state = {_toml(str(paths.containerd / 'state'))}",
        "[grpc]",
        f"  address = {_toml(str(paths.socket))}",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_toml(str(paths.containerd / 'opt'))}",
        f"[{cri}]",
        f"  sandbox_image = {_toml(PAUSE_IMAGE)}",
        "  restrict_oom_score_adj = true",
        "  disable_apparmor = true",
        "  netns_mounts_under_state_dir = true",
        '  stream_server_address = "127.0.0.1"',
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        f"  BinaryName = {_toml(runc)}",
        f"  Root = {_toml(str(paths.root / 'runc'))}",
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        '  bin_dir = "/usr/lib/cni"',
        f"  conf_dir = {_toml(str(paths.cni_conf))}",
    ]
    return "\n".join(lines) + "\n"


def kubelet_config(
    paths: NodePaths, *, pki: Pki, port: int, healthz_port: int
) -> dict[str, object]:
    """The KubeletConfiguration (JSON is YAML) of this node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this host is on cgroup v1 (hybrid)
        "cgroupDriver": "cgroupfs",  # no systemd
        "cgroupRoot": f"/{CGROUP_ROOT}",  # every Pod's cgroup in one of ours
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "address": network.HOST_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(pki.serving_cert),
        "tlsPrivateKeyFile": str(pki.serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(paths.pod_logs),
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        # The images cannot be pulled again: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": True,
    }


def kube_proxy_config(
    *, kubeconfig: Path, metrics_port: int, healthz_port: int
) -> dict[str, object]:
    """kube-proxy in iptables mode, touching no sysctl (conntrack limits stay as they are)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": network.HOST_IP,
        "clusterCIDR": network.POD_CIDR,
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "nodePortAddresses": [f"{network.HOST_IP}/32"],
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "syncPeriod": "10s"},
    }


def make_cgroup_root() -> None:
    """The kubelet's cgroup root in every v1 hierarchy (it must exist before the kubelet
    starts); a cpuset gets its parent's CPUs and memory nodes, as a new one has none."""
    base = Path("/sys/fs/cgroup")
    for hierarchy in base.iterdir():
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        root = hierarchy / CGROUP_ROOT
        root.mkdir(exist_ok=True)
        for key in ("cpuset.cpus", "cpuset.mems"):
            if (root / key).exists() and not (root / key).read_text().strip():
                (root / key).write_text((hierarchy / key).read_text())


def import_archives(paths: NodePaths, files: list[Path]) -> list[str]:
    """Import image archives into containerd's ``k8s.io`` namespace (the kubelet's), in
    parallel; the archives' names."""
    if not files:
        raise RuntimeError("no image archives to import: run `make images`")

    def one(path: Path) -> str:
        done = subprocess.run(
            ["ctr", f"--address={paths.socket}", "-n", "k8s.io", "images", "import",
             str(path)],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"ctr images import {path.name}: {done.stderr.strip()[-400:]}")
        return path.stem

    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        return list(pool.map(one, files))


def tag_image(paths: NodePaths, source: str, target: str) -> None:
    """``ctr images tag``: ``target`` names the image ``source`` names (replacing a target)."""
    done = subprocess.run(
        ["ctr", f"--address={paths.socket}", "-n", "k8s.io", "images", "tag", "--force",
         source, target],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"ctr images tag {source} {target}: {done.stderr.strip()[-400:]}")
