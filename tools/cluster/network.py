"""The Pods' network: a bridge on the host, the CNI configuration that puts Pods on it, and the
removal of what that network leaves behind.

The host side of the bridge holds ``HOST_IP``; the API server, the kubelet and the test
servers listen there, so a Pod reaches them at that address. containerd runs the CNI
``bridge`` plugin (Debian's ``containernetworking-plugins``) with ``host-local`` addresses of
``POD_CIDR`` and a default route through ``HOST_IP``: traffic to a Service address reaches
the host, where kube-proxy's rules rewrite it to the Service's endpoint. IP forwarding stays as
it is (off) and nothing is masqueraded, so a Pod's traffic goes to the host's own addresses or
to another Pod, never further.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

__all__ = [
    "BRIDGE",
    "CNI_NETWORK",
    "HOST_IP",
    "POD_CIDR",
    "ensure_bridge",
    "remove_bridge",
    "remove_pod_namespaces",
    "write_cni_config",
]

BRIDGE = "odk8s0"
HOST_IP = "10.213.0.1"
POD_CIDR = "10.213.0.0/16"
CNI_NETWORK = "outbox-dispatcher-pods"
_PREFIX = POD_CIDR.split("/")[1]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def ensure_bridge() -> None:
    """Create the bridge with ``HOST_IP`` unless it is there already (idempotent); the API
    server binds to that address before the first Pod makes the CNI plugin look at it."""
    if _ip("link", "show", BRIDGE, check=False).returncode:
        _ip("link", "add", BRIDGE, "type", "bridge")
    if HOST_IP not in _ip("-o", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", f"{HOST_IP}/{_PREFIX}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def remove_bridge() -> None:
    _ip("link", "del", BRIDGE, check=False)


def write_cni_config(conf_dir: Path, *, ipam_dir: Path) -> None:
    """The one network containerd gives every Pod (addresses kept in ``ipam_dir``)."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    bridge = {
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": True,
        "isDefaultGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": POD_CIDR, "gateway": HOST_IP, "rangeStart": "10.213.1.1"}]],
            "dataDir": str(ipam_dir),
        },
    }
    conflist = {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [bridge]}
    (conf_dir / "10-outbox-dispatcher.conflist").write_text(json.dumps(conflist, indent=2))


def _namespaces() -> dict[int, str]:
    """The named network namespaces by their id as seen from the host (``ip netns list``)."""
    found: dict[int, str] = {}
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        words = line.replace("(", " ").replace(")", " ").split()
        if "id:" in words:
            found[int(words[words.index("id:") + 1])] = words[0]
    return found


def remove_pod_namespaces() -> list[str]:
    """Delete every network namespace with a link on the bridge, and those links: the Pods'
    namespaces are found by what was made (their veth's host end is a port of ``BRIDGE``), not
    by a record that a killed process may not have written. Returns the namespaces deleted."""
    links = json.loads(_ip("-j", "link", "show", "master", BRIDGE, check=False).stdout or "[]")
    by_id = _namespaces()
    removed = []
    for link in links:
        netns = by_id.get(int(link.get("link_netnsid", -1)))
        if netns is not None:
            _ip("netns", "del", netns, check=False)
            removed.append(netns)
        _ip("link", "del", link["ifname"], check=False)
    return removed
