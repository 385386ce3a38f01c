"""Where the cluster's binaries and images are: built once by ``tools/cluster/build.sh`` and
``tools/images/build.sh``, then cached outside the tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["BUILD_SCRIPT", "IMAGES_SCRIPT", "ROOT", "binaries", "images"]

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tools" / "cluster" / "build.sh"
IMAGES_SCRIPT = ROOT / "tools" / "images" / "build.sh"


def _cached(script: Path) -> Path:
    """Run a build script (it returns at once when its cache is current); the directory it
    prints last."""
    if not script.exists():
        raise RuntimeError(f"no {script}: the local cluster runs from a source checkout")
    done = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{script.relative_to(ROOT)} failed (exit {done.returncode}); see above")
    return Path(done.stdout.strip().splitlines()[-1])


def binaries() -> Path:
    """The bin directory with the control plane's, the node's and the clients' binaries (a
    cold build takes many minutes)."""
    return _cached(BUILD_SCRIPT)


def images() -> Path:
    """The directory of the image archives the node imports (``make images``)."""
    return _cached(IMAGES_SCRIPT)
