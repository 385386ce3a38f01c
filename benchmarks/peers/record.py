"""A no-op handler's one act: note ``<task> <unix ns>`` when it starts (stdlib only).

Every system's handler calls ``note``; the harness joins these lines with the producers'
commit times. The file is ``PEERS_HANDLED_LOG``, one write per line, as River's handler does.
"""

from __future__ import annotations

import os
import threading
import time

_LOG = open(os.environ.get("PEERS_HANDLED_LOG", os.devnull), "a", buffering=1)  # noqa: SIM115
_LOCK = threading.Lock()


def note(task: str) -> None:
    line = f"{task} {time.time_ns()}\n"
    with _LOCK:
        _LOG.write(line)
