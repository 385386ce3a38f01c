"""Where the control plane's binaries are: built once by ``tools/cluster/build.sh``, then cached."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["BUILD_SCRIPT", "ROOT", "binaries"]

ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = ROOT / "tools" / "cluster" / "build.sh"


def binaries() -> Path:
    """The bin directory with etcd, kube-apiserver, kube-controller-manager, kubectl and helm.

    Runs the build script, which returns at once when the cache already holds this
    release; a cold build takes many minutes.
    """
    if not BUILD_SCRIPT.exists():
        raise RuntimeError(f"no {BUILD_SCRIPT}: the local cluster runs from a source checkout")
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (exit {done.returncode}); see above")
    return Path(done.stdout.strip().splitlines()[-1])
