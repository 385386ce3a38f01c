"""The Pods' network: a bridge on the host and a network namespace per Pod on a veth pair.

The host side of the bridge holds ``HOST_IP``; the API server and the test
servers listen there, so a Pod reaches them at that address. Each Pod gets an
address of ``POD_CIDR`` that this module assigns, its loopback, and a route to
``POD_CIDR`` only: IP forwarding stays as it is (off), so a Pod's traffic goes
to the host's own addresses or to another Pod, never further.
"""

from __future__ import annotations

import ipaddress
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BRIDGE",
    "HOST_IP",
    "POD_CIDR",
    "PodNetwork",
    "ensure_bridge",
    "remove_pod_networks",
]

BRIDGE = "odk8s0"
HOST_IP = "10.213.0.1"
POD_CIDR = "10.213.0.0/16"
_PREFIX = POD_CIDR.split("/")[1]
_NETNS_PREFIX = "odpod-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def ensure_bridge() -> None:
    """Create the bridge with ``HOST_IP`` unless it is there already (idempotent)."""
    # Another cluster starting at the same moment may win either step: then it is there.
    if _ip("link", "show", BRIDGE, check=False).returncode:
        _ip("link", "add", BRIDGE, "type", "bridge", check=False)
    if HOST_IP not in _ip("-o", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", f"{HOST_IP}/{_PREFIX}", "dev", BRIDGE, check=False)
    _ip("link", "set", BRIDGE, "up")


def _used_addresses() -> set[str]:
    listing = _ip("-o", "netns", "list", check=False).stdout.split()
    used = {HOST_IP}
    for name in (n for n in listing if n.startswith(_NETNS_PREFIX)):
        shown = _ip("-n", name, "-o", "-4", "addr", "show", check=False).stdout
        used.update(w.split("/")[0] for w in shown.split() if w.startswith("10.213."))
    return used


@dataclass(frozen=True)
class PodNetwork:
    """The namespace and address of one Pod."""

    netns: str
    ip: str

    @classmethod
    def create(cls, uid: str) -> PodNetwork:
        """A new namespace for the Pod ``uid`` with a free address on the bridge."""
        network = ipaddress.ip_network(POD_CIDR)
        used = _used_addresses()
        while True:  # the /16 has 65,000 addresses; a cluster runs a few dozen Pods
            ip = str(network[random.randrange(256, network.num_addresses - 1)])
            if ip not in used:
                break
        netns, host_end = f"{_NETNS_PREFIX}{uid[:8]}", f"odv{uid[:8]}"
        _ip("netns", "add", netns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", host_end, "master", BRIDGE, "up")
        _ip("-n", netns, "addr", "add", f"{ip}/{_PREFIX}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return cls(netns=netns, ip=ip)

    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.netns]

    def remove(self) -> None:
        # Deleting the namespace deletes its veth end, and with it the host end.
        _ip("netns", "del", self.netns, check=False)


def remove_pod_networks(pods_dir: Path) -> None:
    """Remove the Pod namespaces a kubelet made (each Pod's directory names its own): a
    kubelet that was killed leaves them. Another cluster's, sharing the bridge, stay."""
    for recorded in pods_dir.glob("*/netns"):
        name = recorded.read_text().strip()
        if name.startswith(_NETNS_PREFIX):
            _ip("netns", "del", name, check=False)
