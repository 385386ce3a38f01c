"""``dispatcher``: parse flags over env settings, run one subcommand, fail in one line.

Every subcommand module exposes ``register(subparsers)``; the function it sets
as ``handler`` gets the parsed namespace and the effective ``Settings``.
Errors a user can fix (bad flags, unreachable servers, invalid settings) end
as one line on stderr and a non-zero exit; the traceback only at DEBUG.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import psycopg
import pydantic
import redis.exceptions

from dispatcher.cli.flags import add_options
from dispatcher.config import (
    CONNECTION_OPTIONS,
    METRICS_PORT,
    REQUIRE_AOF,
    STREAM_SHARDS,
    ConfigError,
    Settings,
)
from dispatcher.logs import configure_logging, hide
from dispatcher.outbox.schema import SchemaNotReady

__all__ = ["Common", "UsageError", "main"]

log = logging.getLogger("dispatcher")


# Adds the connection and logging flags every subcommand shares.
Common = Callable[[argparse.ArgumentParser], None]


class UsageError(Exception):
    """A user mistake in flags or settings: exit 2 with the message."""


class _Parser(argparse.ArgumentParser):
    """Bad flags end in one line that names the flag, not a usage block (that is --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("connections and logging (override the environment)")
    add_options(g, CONNECTION_OPTIONS)


def build_parser() -> argparse.ArgumentParser:
    from dispatcher.cli import commands

    parser = _Parser(
        prog="dispatcher",
        description=(
            "Transactional outbox dispatcher: PostgreSQL outbox rows -> sharded Redis "
            "Streams -> workers. Settings come from the environment; flags override them."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in commands.REGISTRY:
        register(sub, _common_flags)
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        opt.name: value
        for opt in (*CONNECTION_OPTIONS, STREAM_SHARDS, METRICS_PORT, REQUIRE_AOF)
        if (value := getattr(args, opt.name, None)) is not None
    }
    if "log_level" in overrides:
        overrides["log_level"] = str(overrides["log_level"]).upper()
    return Settings(**overrides)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()]
        return "invalid setting: " + "; ".join(parts)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return f"the outbox schema is missing ({_first(exc)}): run `dispatcher migrate` first"
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return (
            f"a migration gave up waiting for a table lock ({_first(exc)}): a long transaction "
            "holds the outbox; run `dispatcher migrate` again once it has ended"
        )
    if isinstance(exc, psycopg.OperationalError) and "startup parameter" in str(exc):
        return (
            f"PostgreSQL, or a pooler in front of it, refused a session option ({_first(exc)}):"
            " behind PgBouncer add `options` to ignore_startup_parameters, or connect directly"
        )
    if isinstance(exc, psycopg.OperationalError):
        return f"cannot reach PostgreSQL (check DATABASE_URL / --database-url): {_first(exc)}"
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return f"cannot reach Redis (check REDIS_URL / --redis-url): {_first(exc)}"
    return f"{type(exc).__name__}: {_first(exc)}"


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace, Settings], Any] = args.handler
    try:
        settings = settings_from(args)
        configure_logging(settings.log_level, settings.log_format)
        urls = (settings.database_url, settings.redis_url)
        hide(*(url.get_secret_value() for url in urls if url), whole=False)
        result = handler(args, settings)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C, or a second SIGTERM that cancelled the graceful stop.
        print(f"dispatcher {args.command}: interrupted", file=sys.stderr)
        return 130
    except (UsageError, ConfigError, SchemaNotReady) as exc:
        log.debug("command failed", exc_info=True)
        print(f"dispatcher {args.command}: {exc}", file=sys.stderr)
        return 2
    except pydantic.ValidationError as exc:
        print(f"dispatcher {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        log.debug("command failed", exc_info=True)
        print(f"dispatcher {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
