"""One login: kopf is handed the credentials the operator's API client logged in with.

In a Pod, the official client's in-cluster login (the ``kubernetes`` Service's address from the
environment, as client-go reads it, and the ServiceAccount's token, read again once rotated);
elsewhere the kubeconfig's server, CA and client certificate or token.
"""

from __future__ import annotations

import base64
from pathlib import Path

from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import load_kube_config_from_dict
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from dispatcher.controller.handlers import connection_info

_FILES = ("ca_path", "certificate_path", "private_key_path")


def _read(path: object) -> str | None:
    return None if path is None else Path(str(path)).read_text()


def _in_pod(tmp_path: Path, host: str, port: str) -> tuple[Configuration, Path]:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("first-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    configuration = Configuration()
    InClusterConfigLoader(str(token), str(ca), environ=env).load_and_set(configuration)
    return configuration, token


async def test_in_a_pod_kopf_gets_the_service_address_and_the_service_account_token(
    tmp_path: Path,
) -> None:
    configuration, _ = _in_pod(tmp_path, "10.0.0.1", "443")
    info = await connection_info(configuration)
    assert info.server == "https://10.0.0.1:443"
    assert (info.scheme, info.token) == ("Bearer", "first-token")
    assert info.ca_path == str(tmp_path / "ca.crt")
    assert info.insecure is None
    assert info.certificate_path is None
    assert info.private_key_path is None


async def test_an_ipv6_service_address_is_bracketed(tmp_path: Path) -> None:
    configuration, _ = _in_pod(tmp_path, "fd00::1", "6443")
    assert (await connection_info(configuration)).server == "https://[fd00::1]:6443"


async def test_a_rotated_token_reaches_kopf_when_it_logs_in_again(tmp_path: Path) -> None:
    """kubelet rewrites a projected token about hourly, and the client's refresh hook rereads
    it; kopf logs in again after a 401 and must get the token the hook read, not a copy."""
    configuration, _ = _in_pod(tmp_path, "10.0.0.1", "443")
    assert (await connection_info(configuration)).token == "first-token"

    def rotated(configuration: Configuration) -> None:  # what the hook does once it rereads
        configuration.api_key["BearerToken"] = "Bearer second-token"

    configuration.refresh_api_key_hook = rotated
    assert (await connection_info(configuration)).token == "second-token"


async def test_outside_a_pod_kopf_gets_the_kubeconfigs_client_certificate() -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "local",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": "https://127.0.0.1:6443",
                    "certificate-authority-data": b64("the CA"),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": b64("the certificate"),
                    "client-key-data": b64("the key"),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
    }
    configuration = Configuration()
    await load_kube_config_from_dict(kubeconfig, client_configuration=configuration)
    info = await connection_info(configuration)
    files = {name: _read(getattr(info, name)) for name in _FILES}
    assert info.server == "https://127.0.0.1:6443"
    assert info.token is None
    assert info.scheme is None
    assert files == {
        "ca_path": "the CA",
        "certificate_path": "the certificate",
        "private_key_path": "the key",
    }
