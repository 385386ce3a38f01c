"""The operator in a Pod finds the API server as client-go does: from the environment."""

from __future__ import annotations

from dispatcher.controller.handlers import in_cluster_server


def test_the_kubernetes_service_address_comes_from_the_environment() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://10.0.0.1:443"


def test_an_ipv6_service_address_is_bracketed() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(env) == "https://[fd00::1]:6443"


def test_outside_a_pod_there_is_none() -> None:
    assert in_cluster_server({}) is None
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
