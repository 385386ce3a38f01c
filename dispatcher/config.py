"""Process settings from the environment (flags override them in the CLI).

Each setting is an ``Option`` (its env variable, flag, default and help) and
``Settings`` reads the environment by them. Connection URLs are ``SecretStr``
so they never show up in a repr, a log line or a validation error.

Settings at two layers share the name ``config``: this module is what every
process reads from its environment; ``dispatcher.worker.worker_config`` is the
worker's own settings value, built from these and the worker's flags.
"""

from __future__ import annotations

from typing import Literal

import psycopg
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from dispatcher.options import Option, pydantic_field
from dispatcher.stream.naming import DEFAULT_SHARDS

__all__ = [
    "CONNECTION_OPTIONS",
    "CONNECT_TIMEOUT",
    "DATABASE_URL",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "METRICS_PORT",
    "REDIS_CLUSTER",
    "REDIS_URL",
    "REQUIRE_AOF",
    "STREAM_SHARDS",
    "ConfigError",
    "Settings",
]


class ConfigError(ValueError):
    """A setting is missing or unusable; the message names it."""


# Seconds to wait for a PostgreSQL or Redis server to answer a new connection.
CONNECT_TIMEOUT = 10


DATABASE_URL = Option(
    name="database_url",
    kind=str,
    default=None,
    shown="",
    env="DATABASE_URL",
    help="PostgreSQL URL; required by migrate, enqueuer, status and dlq",
)
REDIS_URL = Option(
    name="redis_url",
    kind=str,
    default="redis://127.0.0.1:6379/0",
    env="REDIS_URL",
    help="Redis URL, redis:// or rediss://",
)
REDIS_CLUSTER = Option(
    name="redis_cluster",
    kind=bool,
    default=False,
    shown="0",
    env="REDIS_CLUSTER",
    help="Redis is a Redis Cluster (in the environment: 1 or 0)",
)
LOG_LEVEL = Option(
    name="log_level",
    kind=str,
    default="INFO",
    env="LOG_LEVEL",
    help="DEBUG (tracebacks), INFO, WARNING, ERROR",
)
LOG_FORMAT = Option(
    name="log_format",
    kind=str,
    default="text",
    env="LOG_FORMAT",
    choices=("text", "json"),
    help="text, or json (one object per line, extra fields as keys)",
)
STREAM_SHARDS = Option(
    name="stream_shards",
    kind=int,
    default=DEFAULT_SHARDS,
    flag="--shards",
    minimum=1,
    maximum=4096,
    env="STREAM_SHARDS",
    help="the shard count while composer:stream_shards is absent; the first enqueuer writes "
    "it there (never over it); change it later with `dispatcher shards set N`",
)
METRICS_PORT = Option(
    name="metrics_port",
    kind=int,
    default=0,
    minimum=0,
    maximum=65535,
    env="METRICS_PORT",
    help="port serving /metrics, /healthz and /readyz; 0 = off",
)
REQUIRE_AOF = Option(
    name="require_aof",
    kind=bool,
    default=False,
    shown="0",
    env="REQUIRE_AOF",
    help="refuse to start unless Redis runs with appendonly yes (without AOF a restart loses "
    "the streams; off: an ERROR in the log); in the environment: 1 or 0",
)
# The flags every subcommand takes.
CONNECTION_OPTIONS = (DATABASE_URL, REDIS_URL, REDIS_CLUSTER, LOG_LEVEL, LOG_FORMAT)


class Settings(BaseSettings):
    """``DATABASE_URL``, ``REDIS_URL``, ``REDIS_CLUSTER``, ``STREAM_SHARDS``, logging, metrics,
    ``REQUIRE_AOF``."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, case_sensitive=False)

    database_url: SecretStr | None = pydantic_field(DATABASE_URL)
    redis_url: SecretStr = pydantic_field(REDIS_URL, default=SecretStr(str(REDIS_URL.default)))
    redis_cluster: bool = pydantic_field(REDIS_CLUSTER)
    stream_shards: int = pydantic_field(STREAM_SHARDS)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = pydantic_field(LOG_LEVEL)
    log_format: Literal["json", "text"] = pydantic_field(LOG_FORMAT)
    metrics_port: int = pydantic_field(METRICS_PORT)
    require_aof: bool = pydantic_field(REQUIRE_AOF)

    def require_database_url(self) -> str:
        """The database URL, with a connect timeout unless it names one.

        Without one, libpq waits for a server that accepts and never answers for as
        long as the kernel keeps the connection: a start-up that hangs, saying nothing.
        """
        if self.database_url is None:
            raise ConfigError("DATABASE_URL is not set (or pass --database-url)")
        url = self.database_url.get_secret_value()
        try:
            given = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            # psycopg's message quotes the text, password included: say which setting instead.
            raise ConfigError(
                "DATABASE_URL (or --database-url) is not a PostgreSQL URL or connection string "
                "(postgresql://USER:PASSWORD@HOST:PORT/DB)"
            ) from None
        if "connect_timeout" in given:
            return url
        return psycopg.conninfo.make_conninfo(url, connect_timeout=CONNECT_TIMEOUT)
