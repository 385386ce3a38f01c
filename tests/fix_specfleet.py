"""The spec page's Go side of the wire (``tests/interop/specfleet``), built for the suite.

``specfleet`` is the path of its binary: the spec's enqueuer ``publishRow`` and
its consumer, on go-redis v9 from the Go module proxy, built with ``go build``
into a cache outside the tree (``OUTBOX_INTEROP_CACHE``, else
``~/.cache/outbox-dispatcher/specfleet-<hash of its sources>``) and reused
while the sources are unchanged. Never skipped: without Go the fixture fails,
saying so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "interop" / "specfleet"


def _cache_dir() -> Path:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    base = os.environ.get("OUTBOX_INTEROP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "outbox-dispatcher"
    )
    return Path(base) / f"specfleet-{digest.hexdigest()[:16]}"


@pytest.fixture(scope="session")
def specfleet() -> Path:
    binary = _cache_dir() / "specfleet"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        pytest.fail("the interop tests build the spec's Go fleet: install Go >= 1.26 (go.dev/dl)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"specfleet.{os.getpid()}")
    flags = f"{os.environ.get('GOFLAGS', '')} -mod=mod -trimpath -buildvcs=false".strip()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": flags}
    built = subprocess.run(
        [go, "build", "-o", str(partial), "."],
        cwd=SOURCE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if built.returncode != 0:
        pytest.fail(f"go build of {SOURCE} failed:\n{built.stderr[-3000:]}")
    partial.replace(binary)  # atomic: a parallel session sees the whole binary or none
    return binary
