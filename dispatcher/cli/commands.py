"""The registry of subcommands, in the order ``--help`` lists them."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Register = Callable[[argparse._SubParsersAction, Callable[[argparse.ArgumentParser], None]], None]  # type: ignore[type-arg]

REGISTRY: list[Register] = []
