"""The ``dispatcher`` command line: thin glue from flags and env to the library."""

from dispatcher.cli.main import main

__all__ = ["main"]
