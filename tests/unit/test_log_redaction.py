"""Secrets never reach a log line: the values ``hide`` was given, and the API's bodies."""

from __future__ import annotations

import base64
import io
import logging

from dispatcher.logs import hide


def test_a_hidden_value_is_masked_in_every_form_it_may_take(printed: io.StringIO) -> None:
    url = "postgresql://app:s3cr%2Fet-pw@db:5432/app"
    hide(url)
    log = logging.getLogger("any.library")
    log.debug("connecting to %s", url)
    log.warning("the Secret holds %s", base64.b64encode(url.encode()).decode())
    log.error("password was %r", "s3cr/et-pw")
    text = printed.getvalue()
    assert text.count("***") == 3, text
    for secret in ("s3cr/et-pw", "s3cr%2Fet-pw", base64.b64encode(url.encode()).decode()):
        assert secret not in text


def test_only_the_password_of_a_settings_url_is_hidden(printed: io.StringIO) -> None:
    hide("redis://user:pa55word-x@cache:6379/0", whole=False)
    logging.getLogger("x").info("cannot reach redis://user:pa55word-x@cache:6379/0")
    assert "redis://user:***@cache:6379/0" in printed.getvalue()


def test_the_kubernetes_clients_response_bodies_are_never_logged(printed: io.StringIO) -> None:
    rest = logging.getLogger("kubernetes_asyncio.client.rest")
    rest.debug("response body: %s", b'{"kind": "Secret", "data": {"url": "c2VjcmV0"}}')
    rest.debug("something else")
    assert "c2VjcmV0" not in printed.getvalue()
    assert "something else" in printed.getvalue()
