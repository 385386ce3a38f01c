"""No log line of the operator, at any level, holds a Secret's value.

The real operator (kopf and ``dispatcher.controller``, its requests through ``kubernetes_asyncio``)
runs against kmock's API with logging set up as ``dispatcher operator --log-level DEBUG
--log-format json`` sets it up, reads the dispatcher's Secrets (a PostgreSQL and a Redis
URL, each with a password), reconciles and measures; everything it printed is searched for
the values, their base64 (as the API sends them) and the passwords. The enqueuer's and the
worker's DEBUG logs are searched likewise in ``test_security_redis.py``.
"""

from __future__ import annotations

import base64
import io
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

from tests.fix_kube import (
    CR_URL,
    FakeClock,
    KubeEmulator,
    dispatcher,
    post_secrets,
    running_operator,
    status_of,
)
from tests.waiting import eventually


def _with_password(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{user}:{quote(password, safe='')}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


async def test_the_operator_at_debug_logs_no_secret_value(
    kube: KubeEmulator,
    clock: FakeClock,
    redis_url: str,
    printed: io.StringIO,
) -> None:
    pg_password, rd_password = f"pg-{uuid.uuid4().hex}", f"rd-{uuid.uuid4().hex}"
    pg_url = f"postgresql://app:{pg_password}@127.0.0.1:1/app"
    rd_url = _with_password(redis_url, "default", rd_password)  # nopass: any password works
    await post_secrets(kube, pg=pg_url, rd=rd_url)
    async with running_operator(kube, clock):
        await kube.send("post", CR_URL, dispatcher(migrate=False))
        await eventually(lambda: status_of(kube).shards == 2, within=30, what="a pass")
    text = printed.getvalue()
    assert '"level": "debug"' in text, "ran at DEBUG"
    assert "/secrets/" in text or "Secret" in text, "the Secrets were read"
    for value in (pg_url, rd_url, pg_password, rd_password):
        for form in (value, quote(value, safe=""), base64.b64encode(value.encode()).decode()):
            assert form not in text, f"{form[:12]}... logged"
