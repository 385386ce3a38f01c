"""What a node leaves on the host after its processes are gone, found by what it made.

A kubelet, kube-proxy and containerd stopped (or SIGKILLed) leave: the Pods' processes
(their shims and containers keep running), mounts (the kubelet's bind mount of its root
directory, each Pod's volumes, each container's root filesystem and each sandbox's
``/dev/shm``), network namespaces and veth links, cgroups under the kubelet's cgroup root,
iptables chains (``KUBE-*`` in filter, nat and mangle, of the kubelet and kube-proxy, in
whichever iptables backend they chose), the CNI plugins' cache, ``/var/log/containers`` links
and containerd's shim sockets under ``/run/containerd``. Each is found here by an identity
the node cannot fail to have given it (the state directory in a path, the node's cgroup root,
the bridge a link is a port of, the ``KUBE-`` prefix, the CNI network's name), never by a
file a killed process may not have written, and removed. Every step is idempotent: ``sweep``
runs after every stop and before every start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tools.cluster import network

__all__ = ["CGROUP_ROOT", "inventory", "sweep"]

CGROUP_ROOT = "outbox-dispatcher-node"  # the kubelet's cgroupRoot: every Pod's cgroup is in it
_CGROUPS = Path("/sys/fs/cgroup")
_TABLES = ("filter", "nat", "mangle")
_IPTABLES = ("iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy")


def _cgroup_dirs() -> list[Path]:
    """The node's cgroups in every hierarchy, deepest first."""
    found: list[Path] = []
    for hierarchy in _CGROUPS.iterdir() if _CGROUPS.is_dir() else []:
        top = hierarchy / CGROUP_ROOT
        if top.is_dir():
            found.extend(p for p in top.rglob("*") if p.is_dir())
            found.append(top)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _kill_cgroup_members() -> None:
    """SIGKILL every process in the node's cgroups (the containers and their init)."""
    for _ in range(50):
        pids: set[int] = set()
        for cgroup in _cgroup_dirs():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _processes_naming(needle: str) -> list[int]:
    """The processes whose command line names ``needle`` (the node's processes and the shims
    name files in the state directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            if needle in cmdline.decode(errors="replace"):
                found.append(int(proc.name))
    return found


def _kill_processes_naming(needle: str) -> None:
    """SIGKILL every process whose command line names ``needle``."""
    for pid in _processes_naming(needle):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _mounts_under(prefix: str) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix.rstrip("/") + "/"):
            points.append(point)
    return points


def _unmount_under(prefixes: list[str]) -> None:
    """Lazily unmount every mount point under one of ``prefixes``, deepest first."""
    for _ in range(5):
        points = [point for prefix in prefixes for point in _mounts_under(prefix)]
        if not points:
            return
        for point in sorted(set(points), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _remove_cgroups() -> None:
    for cgroup in _cgroup_dirs():
        for _ in range(20):
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the kernel still tears a member down
                time.sleep(0.1)


def _kube_chains_removed(dump: str) -> str | None:
    """``dump`` (iptables-save of one table) without the ``KUBE-`` chains and every rule that
    is in one or jumps to one; None when it has none."""
    kept, changed = [], False
    for line in dump.splitlines():
        if line.startswith(":KUBE-") or (
            line.startswith("-A ") and ("KUBE-" in line.split()[1] or " -j KUBE-" in line)
        ):
            changed = True
            continue
        kept.append(line)
    return "\n".join(kept) + "\n" if changed else None


def _kube_chains() -> dict[tuple[str, str], str]:
    """Each (iptables backend, table) that holds ``KUBE-`` chains or rules: its cleaned dump."""
    found = {}
    for tool in _IPTABLES:
        if shutil.which(tool) is None:
            continue
        for table in _TABLES:
            saved = subprocess.run(
                [f"{tool}-save", "-t", table], capture_output=True, text=True, check=False
            )
            cleaned = _kube_chains_removed(saved.stdout) if saved.returncode == 0 else None
            if cleaned is not None:
                found[tool, table] = cleaned
    return found


def _remove_kube_chains() -> None:
    for (tool, _), cleaned in _kube_chains().items():
        subprocess.run(
            [f"{tool}-restore", "-w", "5"], input=cleaned, text=True, check=True,
            capture_output=True,
        )  # fmt: skip


def _remove_files(state_dir: Path) -> None:
    # The CNI library's cache of results, one file per attachment of our network.
    for cached in Path("/var/lib/cni/results").glob(f"{network.CNI_NETWORK}-*"):
        cached.unlink(missing_ok=True)
    # The kubelet's links to each container's log (their targets are in the state directory).
    for link in Path("/var/log/containers").glob("*.log"):
        with contextlib.suppress(OSError):
            if link.is_symlink() and str(state_dir) in os.readlink(link):
                link.unlink()
    # The kubelet's device plugin socket (a path it does not take from its root directory).
    Path("/var/lib/kubelet/device-plugins/kubelet.sock").unlink(missing_ok=True)
    for made in ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet", "/var/lib/cni/results",
                 "/var/lib/cni", "/var/log/containers"):  # fmt: skip
        with contextlib.suppress(OSError):  # only when empty: nothing of anyone else's goes
            Path(made).rmdir()
    # The shims' sockets and fifos: only while no containerd of the machine's own serves there.
    run = Path("/run/containerd")
    if not (run / "containerd.sock").exists():
        for name in ("s", "fifo", "runc"):
            shutil.rmtree(run / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            run.rmdir()


def inventory(state_dir: Path) -> list[str]:
    """What a node whose files are in ``state_dir`` (or any node: the machine-wide parts) left
    on the machine, one line each; empty when the machine is clean."""
    left = [f"process {pid} naming {state_dir}" for pid in _processes_naming(str(state_dir))]
    left += [f"mount {point}" for point in _mounts_under(str(state_dir))]
    left += [f"cgroup {cgroup}" for cgroup in _cgroup_dirs()]
    left += [f"iptables chains in {tool} {table}" for tool, table in _kube_chains()]
    if Path(f"/sys/class/net/{network.BRIDGE}").exists():
        left.append(f"bridge {network.BRIDGE}")
    left += [f"file {p}" for p in Path("/var/lib/cni/results").glob(f"{network.CNI_NETWORK}-*")]
    left += [f"path {p}" for p in ("/run/containerd", "/var/lib/kubelet") if Path(p).exists()]
    return left


def sweep(state_dir: Path) -> None:
    """Remove everything a node whose files are in ``state_dir`` left on the host (its
    processes must be stopped first; the Pods' are killed here)."""
    _kill_processes_naming(str(state_dir))  # what stop did not end, and the shims
    _kill_cgroup_members()
    network.remove_pod_namespaces()
    _unmount_under([str(state_dir)])  # the netns mounts too: containerd keeps them there
    _remove_cgroups()
    _remove_kube_chains()
    network.remove_bridge()
    _remove_files(state_dir)
