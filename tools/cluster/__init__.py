"""A real Kubernetes cluster on this machine, without Docker or a registry, for the end-to-end
tests and for a look by hand (``make cluster``).

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from Go modules by
``build.sh`` into a cache outside the tree) run as local processes; one real node runs
beside them: containerd and runc from Debian, the kubelet and kube-proxy from the same
Kubernetes module, the CNI bridge plugin on a bridge of its own. The node runs the project's
images as built from its Dockerfile (``tools/images/build.sh``, imported into containerd:
nothing is pulled). ``python -m tools.cluster up`` starts it all with its state in
``.cluster/``; ``down`` stops it and removes what it left on the machine. The tests start it
through one session fixture (``tests/fix_cluster.py``).

Not part of the wheel: this is the project's test tooling. Needs root, Go, ``ip``,
``openssl``, iptables and Debian's containerd, runc and CNI plugins (``tools/services.sh``).
"""

from __future__ import annotations

from tools.cluster.control_plane import Cluster, start, stop
from tools.cluster.network import HOST_IP

__all__ = ["HOST_IP", "Cluster", "start", "stop"]
