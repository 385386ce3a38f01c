"""``python -m dispatcher._testing.cluster.kubelet``: the process kubelet (``up`` starts it)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from dispatcher._testing.cluster.binaries import ROOT
from dispatcher._testing.cluster.kubelet.kubelet import Kubelet, Serving


def main() -> None:
    parser = argparse.ArgumentParser(prog="kubelet", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True, help="the Pods' directories")
    parser.add_argument("--node-name", default="local")
    parser.add_argument("--dockerfile", type=Path, default=ROOT / "Dockerfile")
    parser.add_argument("--port", type=int, required=True, help="for kubectl logs (HTTPS)")
    parser.add_argument("--tls-cert", type=Path, required=True)
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument("--client-ca", type=Path, required=True, help="the API server's CA")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kubelet = Kubelet(
        kubeconfig=args.kubeconfig,
        pods_dir=args.state_dir,
        node_name=args.node_name,
        dockerfile=args.dockerfile,
        serving=Serving(
            port=args.port, cert=args.tls_cert, key=args.tls_key, client_ca=args.client_ca
        ),
    )
    asyncio.run(kubelet.run())


if __name__ == "__main__":
    main()
