"""The console's guard: who may act (the token, the session, the CSRF token, our own origin)."""

from __future__ import annotations

import pytest

from dispatcher.console.guard import CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE, Guard, Refused

OWN = {"Host": "127.0.0.1:8080", "Origin": "http://127.0.0.1:8080"}


def _signed_in(guard: Guard) -> tuple[dict[str, str], dict[str, str]]:
    session, csrf = guard.sign_in("s3cret")
    return {**OWN, CSRF_HEADER: csrf}, {SESSION_COOKIE: session, CSRF_COOKIE: csrf}


def test_a_signed_in_page_of_our_origin_may_act() -> None:
    guard = Guard("s3cret")
    headers, cookies = _signed_in(guard)
    guard.check_action(headers, cookies)
    assert guard.signed_in(cookies)


@pytest.mark.parametrize(
    ("change", "status", "said"),
    [
        ({"drop_header": CSRF_HEADER}, 403, "CSRF"),
        ({"header": {CSRF_HEADER: "0" * 64}}, 403, "CSRF"),
        ({"cookie": {CSRF_COOKIE: "0" * 64}}, 403, "CSRF"),
        ({"drop_cookie": SESSION_COOKIE}, 401, "sign in"),
        ({"cookie": {SESSION_COOKIE: "abc.def"}}, 401, "sign in"),
        ({"header": {"Origin": "http://evil.example"}}, 403, "cross-origin"),
        ({"header": {"Origin": "http://127.0.0.1:8080.evil.example"}}, 403, "cross-origin"),
        ({"drop_header": "Origin"}, 403, "no Origin"),
    ],
)
def test_a_missing_piece_refuses_the_action(
    change: dict[str, object], status: int, said: str
) -> None:
    guard = Guard("s3cret")
    headers, cookies = _signed_in(guard)
    headers.pop(str(change.get("drop_header", "")), None)
    cookies.pop(str(change.get("drop_cookie", "")), None)
    headers.update(change.get("header", {}))  # type: ignore[call-overload]
    cookies.update(change.get("cookie", {}))  # type: ignore[call-overload]
    with pytest.raises(Refused, match=said) as refused:
        guard.check_action(headers, cookies)
    assert refused.value.status == status


def test_a_session_of_another_console_or_restart_is_not_valid() -> None:
    headers, cookies = _signed_in(Guard("s3cret"))
    with pytest.raises(Refused, match="sign in"):
        Guard("s3cret").check_action(headers, cookies)  # a new key: signed out


def test_a_wrong_token_and_a_read_only_console_refuse_sign_in() -> None:
    with pytest.raises(Refused, match="wrong token"):
        Guard("s3cret").sign_in("s3cre")
    read_only = Guard(None)
    assert read_only.read_only
    with pytest.raises(Refused, match="read-only"):
        read_only.sign_in("")
    with pytest.raises(Refused, match="read-only"):
        read_only.check_action(OWN, {})
    assert not read_only.signed_in({SESSION_COOKIE: "x.y"})
