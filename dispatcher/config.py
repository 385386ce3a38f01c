"""Process settings from the environment (flags override them in the CLI).

Connection URLs are ``SecretStr`` so they never show up in a repr, a log line
or a validation error.

Settings at two layers share the name ``config``: this module is what every
process reads from its environment; ``dispatcher.worker.config`` is the
worker's own settings value, built from these and the worker's flags.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from dispatcher.stream.naming import DEFAULT_SHARDS

__all__ = ["ConfigError", "Settings"]


class ConfigError(ValueError):
    """A setting is missing or unusable; the message names it."""


class Settings(BaseSettings):
    """``DATABASE_URL``, ``REDIS_URL``, ``REDIS_CLUSTER``, ``STREAM_SHARDS``, logging, metrics."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, case_sensitive=False)

    database_url: SecretStr | None = None
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    redis_cluster: bool = False
    stream_shards: int = Field(default=DEFAULT_SHARDS, ge=1, le=4096)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["json", "text"] = "text"
    metrics_port: int = Field(default=0, ge=0, le=65535)

    def require_database_url(self) -> str:
        if self.database_url is None:
            raise ConfigError("DATABASE_URL is not set (or pass --database-url)")
        return self.database_url.get_secret_value()
