"""The cluster's certificates and keys, made with ``openssl`` when the cluster starts.

One CA signs the API server's serving certificate (the kubelet serves with it
too: both listen on the bridge's host address), the admin client certificate
(group ``system:masters``) and the node's (``system:node:<name>`` in
``system:nodes``, what the Node authorizer expects of a kubelet); a separate RSA
key signs service account tokens. Nothing here is secret beyond the throwaway cluster it guards.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]

_DAYS = "30"


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files of one cluster."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    node_cert: Path
    node_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-400:]}")


def _sign(pki_dir: Path, *, name: str, subject: str, ext: str, ca: tuple[Path, Path]) -> None:
    key, csr, crt = (pki_dir / f"{name}.{s}" for s in ("key", "csr", "crt"))
    ext_file = pki_dir / f"{name}.ext"
    ext_file.write_text(ext)
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    _openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1])),
        *("-CAcreateserial", "-days", _DAYS, "-sha256", "-extfile", str(ext_file)),
        *("-out", str(crt)),
    )


def make_pki(pki_dir: Path, *, ips: list[str], dns: list[str], node: str) -> Pki:
    """Generate every certificate and key into ``pki_dir`` (overwriting an older set)."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca = (pki_dir / "ca.crt", pki_dir / "ca.key")
    _openssl("genrsa", "-out", str(ca[1]), "2048")
    _openssl(
        *("req", "-x509", "-new", "-key", str(ca[1]), "-days", _DAYS, "-sha256"),
        *("-subj", "/CN=outbox-dispatcher-local-ca", "-out", str(ca[0])),
    )
    alt = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in dns)])
    _sign(
        pki_dir,
        name="apiserver",
        subject="/CN=kube-apiserver",
        ext=f"subjectAltName={alt}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
        ca=ca,
    )
    _sign(
        pki_dir,
        name="admin",
        subject="/O=system:masters/CN=admin",
        ext="extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
        ca=ca,
    )
    _sign(
        pki_dir,
        name="node",
        subject=f"/O=system:nodes/CN=system:node:{node}",
        ext="extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
        ca=ca,
    )
    _openssl("genrsa", "-out", str(pki_dir / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki_dir / "sa.key"), "-pubout", "-out", str(pki_dir / "sa.pub"))
    return Pki(
        ca_cert=ca[0],
        ca_key=ca[1],
        serving_cert=pki_dir / "apiserver.crt",
        serving_key=pki_dir / "apiserver.key",
        admin_cert=pki_dir / "admin.crt",
        admin_key=pki_dir / "admin.key",
        node_cert=pki_dir / "node.crt",
        node_key=pki_dir / "node.key",
        sa_key=pki_dir / "sa.key",
        sa_pub=pki_dir / "sa.pub",
    )
