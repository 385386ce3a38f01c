"""``python -m tools.cluster up|down`` (``make cluster`` / ``make cluster-down``).

``up`` builds the binaries and the images if the caches lack them, starts the
cluster with its state in ``.cluster/`` (or ``--state-dir``), and prints how to
use it; the processes keep running after it returns. ``down`` stops them and
removes what the node left on the machine (also after a cluster that was killed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.cluster.binaries import ROOT
from tools.cluster.control_plane import load, start, stop


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster", description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=ROOT / ".cluster")
    args = parser.parse_args()
    state_dir: Path = args.state_dir.resolve()
    if args.action == "down":
        running = load(state_dir)
        stop(state_dir)  # also sweeps what a killed cluster left
        print("stopped" if running else f"no cluster was running in {state_dir}")
        return
    try:
        cluster = start(state_dir)
    except RuntimeError as exc:
        sys.exit(f"cluster: {exc}")
    print(f"API server   {cluster.server}")
    print(f"binaries     {cluster.bin_dir}")
    print(f"logs         {state_dir / 'logs'} (kubectl logs for the Pods')")
    print(f"\nexport KUBECONFIG={cluster.kubeconfig} PATH={cluster.bin_dir}:$PATH")


if __name__ == "__main__":
    main()
