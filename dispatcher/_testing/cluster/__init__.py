"""A real Kubernetes control plane on this machine, without Docker, for the end-to-end tests.

etcd, kube-apiserver and kube-controller-manager (built from Go modules by
``tools/cluster/build.sh`` into a cache outside the tree) run as local
processes; a process kubelet of our own (``kubelet/``) registers one Node and
runs each Pod's containers as local processes, each Pod in a network namespace
of its own on a bridge whose addresses this package assigns. ``make cluster``
(``python -m dispatcher._testing.cluster up``) starts it all with its state in
``.cluster/``; ``make cluster-down`` stops it. The tests start it through one
session fixture (``tests/fix_cluster.py``).

Needs root (network namespaces), ``ip`` (iproute2), ``openssl`` and Go to build.
"""

from __future__ import annotations

from dispatcher._testing.cluster.control_plane import Cluster, start, stop
from dispatcher._testing.cluster.network import HOST_IP

__all__ = ["HOST_IP", "Cluster", "start", "stop"]
