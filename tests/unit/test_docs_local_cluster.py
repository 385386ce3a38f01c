"""docs/kubernetes.md's set-up of PostgreSQL and Redis for the local cluster's Pods names the
bridge the cluster makes: its host address, and the Pods' range in the ``pg_hba.conf`` line."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from tools.cluster.network import HOST_IP, POD_CIDR

DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def section() -> str:
    text = DOC.read_text()
    return text[text.index("## Try it on a local cluster") : text.index("## Local loop")]


def test_the_pg_hba_line_lets_the_pods_range_in_with_a_password() -> None:
    (line,) = re.findall(r"^\s*host\s+all\s+all\s+(\S+)\s+(\S+)\s*$", section(), re.M)
    assert ipaddress.ip_network(line[0]) == ipaddress.ip_network(POD_CIDR)
    assert line[1] == "scram-sha-256"  # the Secret's URL carries the password


def test_both_servers_listen_on_the_bridges_host_address() -> None:
    text = section()
    assert f"listen_addresses = 'localhost,{HOST_IP}'" in text
    assert f"--bind 127.0.0.1 {HOST_IP}" in text
    assert f"@{HOST_IP}:5432/" in text
    assert f"@{HOST_IP}:6379/" in text
    assert ipaddress.ip_address(HOST_IP) in ipaddress.ip_network(POD_CIDR)
