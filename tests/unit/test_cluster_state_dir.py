"""A state dir too deep for containerd's sockets is refused before anything of a cluster starts.

containerd dies at start-up on a ttrpc socket path over 104 bytes, after etcd and the API
server already run; pytest's tmp_path of a long test name is such a path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.cluster import start
from tools.cluster.control_plane import MACHINE_RECORD


def test_a_state_dir_too_deep_is_refused_naming_the_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 80)
    record = MACHINE_RECORD.read_text() if MACHINE_RECORD.exists() else None
    with pytest.raises(ValueError, match=r"too deep for containerd: its socket .*containerd\.sock"):
        start(deep)
    assert not deep.exists()  # nothing made, nothing started
    assert (MACHINE_RECORD.read_text() if MACHINE_RECORD.exists() else None) == record
