"""The registry of subcommands, in the order ``--help`` lists them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dispatcher.cli.cancel import register as register_cancel
from dispatcher.cli.console import register as register_console
from dispatcher.cli.demo import register as register_demo
from dispatcher.cli.limits import register as register_limits
from dispatcher.cli.operator import register as register_operator
from dispatcher.cli.ops import register_dlq, register_status
from dispatcher.cli.outbox import register_enqueuer, register_migrate
from dispatcher.cli.shards import register as register_shards
from dispatcher.cli.worker import register as register_worker

Register = Callable[[Any, Callable[[argparse.ArgumentParser], None]], None]

REGISTRY: list[Register] = [
    register_migrate,
    register_enqueuer,
    register_worker,
    register_status,
    register_dlq,
    register_shards,
    register_limits,
    register_cancel,
    register_console,
    register_demo,
    register_operator,
]
