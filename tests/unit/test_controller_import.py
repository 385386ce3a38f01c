"""Importing the operator's modules builds, registers and starts nothing."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import asyncio, gc, threading
before = threading.active_count()
import dispatcher.controller.handlers
import dispatcher.cli.operator
from dispatcher.controller.loops import Operator
built = [o for o in gc.get_objects() if isinstance(o, Operator)]
tasks = 0
try:
    tasks = len(asyncio.all_tasks())
except RuntimeError:  # no running loop: nothing was scheduled on one
    pass
print(len(built), tasks, threading.active_count() - before)
"""


def test_importing_the_handlers_builds_and_registers_no_operator() -> None:
    """No Operator (whose registration is what fills a kopf registry), task or thread exists
    after the import: whoever runs the operator builds one (``dispatcher operator``)."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["0", "0", "0"], done.stdout + done.stderr
