"""Logging set-up: one line per event, as text or JSON.

Fields passed through ``extra=`` (``outbox_id``, ``stream``...) become JSON
keys. Tracebacks are printed only at DEBUG level; at other levels an error is
one line that says what failed.

No line holds a secret, at any level. The Kubernetes client logs every response
body at DEBUG (``kubernetes_asyncio.client.rest``: a Secret's ``data`` among
them): those lines are dropped where they are made. And every value passed to
``hide`` (the operator's Secret values, each process's connection URLs and
their passwords) is replaced by ``***`` in whatever line would carry it, as
text, URL-encoded or base64 as the API sends it.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlsplit

__all__ = ["configure_logging", "hide"]

_HIDDEN: set[str] = set()
_MASK = "***"
_SHORTEST = 6  # a shorter value (a port, "app") would mask half the log, and hides nothing


def hide(*values: str, whole: bool = True) -> None:
    """Never log these values, nor the password of a URL among them (only that, if not
    ``whole``: a URL without its password may be shown)."""
    for value in values:
        if not value:
            continue
        password = urlsplit(value).password if "://" in value else None
        for secret in (value if whole else "", unquote(password) if password else ""):
            if len(secret) >= _SHORTEST:
                _HIDDEN.update(
                    {secret, quote(secret, safe=""), base64.b64encode(secret.encode()).decode()}
                )


class _Redact(logging.Filter):
    """Replaces every hidden value in a record's message (and drops its arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _HIDDEN:
            return True
        message = record.getMessage()
        found = [secret for secret in _HIDDEN if secret in message]
        if found:
            for secret in sorted(found, key=len, reverse=True):
                message = message.replace(secret, _MASK)
            record.msg, record.args = message, None
        return True


class _NoResponseBodies(logging.Filter):
    """Drops the Kubernetes client's ``response body: ...`` lines (a Secret's data among them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("response body")


_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info and logging.getLogger().isEnabledFor(logging.DEBUG):
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        line = super().format(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_Redact())
    rest = logging.getLogger("kubernetes_asyncio.client.rest")
    if not any(isinstance(f, _NoResponseBodies) for f in rest.filters):
        rest.addFilter(_NoResponseBodies())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
