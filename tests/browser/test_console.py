"""``dispatcher console`` in a real browser (headless Chromium) over real PostgreSQL and Redis.

Each test starts the console as a process (the CLI), the enqueuer and a worker
when it needs tasks flowing, and drives the page as a person would: the numbers
the page shows are the servers' own, a replay from the page is handled, a
cancel from the page stops the run, and actions are refused without the token
(or without the CSRF token and our own origin). The screenshots of
docs/images/ (shown by the README and docs/console.md) are taken here
(``make screenshots``; a plain run saves them in a temporary folder).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis as sync_redis
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from dispatcher.console.run_search import SCAN_COUNT, SCAN_STEPS
from dispatcher.models import payload_fields
from dispatcher.outbox.app_api import enqueue_dispatch
from dispatcher.stream.cancel_keys import CANCELLED_RUNS
from dispatcher.stream.limit_keys import QueueLimits, limits_key
from dispatcher.stream.naming import SHARDS_KEY, dead_letter_stream, shard_for, task_stream
from dispatcher.worker.dedup import ATTEMPT_PREFIX, DONE
from tests.data import dispatch, insert_rows
from tests.enqueuers import spawn_enqueuer
from tests.fix_browser import SCREENSHOTS, ConsoleProcess
from tests.fix_worker_process import LOG_KEY, WorkerProcess
from tests.waiting import eventually_sync

SHARDS = 2
TOKEN = "let-me-act"
FLOWING, IDLE = "orders", "reports"
SLEEP0 = json.dumps({"sleep": 0})
Spawn = Callable[..., WorkerProcess]


def _seen(driver: WebDriver, check: Callable[[], Any], what: str, within: float = 30) -> Any:
    """Poll the page until ``check`` holds (elements may be redrawn meanwhile)."""
    return eventually_sync(
        check,
        within=within,
        interval=0.2,
        ignoring=(NoSuchElementException, StaleElementReferenceException, AssertionError),
        what=what,
    )


def _cell(driver: WebDriver, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _rate(text: str) -> float:
    """A rate cell's value; 0 while the page has no rate yet ("-")."""
    return 0.0 if text == "-" else float(text)


def _shot(driver: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _sign_in(driver: WebDriver) -> None:
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#signin button").click()
    _seen(driver, lambda: "actions on" in _cell(driver, "#mode"), "signed in")


def _confirm(driver: WebDriver, expected: str) -> None:
    _seen(driver, lambda: expected in _cell(driver, "#confirm-text"), "the confirm dialog")
    driver.find_element(By.ID, "confirm-yes").click()


def _toast(driver: WebDriver, expected: str) -> str:
    return str(_seen(driver, lambda: expected in (t := _cell(driver, "#toast")) and t, expected))


def _dead_letter(r: sync_redis.Redis, queue: str, task_id: str, run_id: str) -> str:
    """A worker's dead letter of ``task_id`` as a worker writes it (original fields + why)."""
    d = dispatch(task_id, queue, run_id=run_id, input=SLEEP0)
    source = task_stream(queue, shard_for(task_id, SHARDS))
    fields = {
        **payload_fields(json.dumps(d.payload()), "0"),
        "error": "ValueError: the printer is on fire",
        "delivery_count": "3",
        "runs": "3",
        "source_stream": source,
        "source_id": "1-0",
    }
    return str(r.xadd(dead_letter_stream(queue), fields))  # type: ignore[arg-type]


@pytest.fixture
def r(redis_url: str) -> sync_redis.Redis:
    client = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(SHARDS_KEY, SHARDS)
    return client


def _handled(r: sync_redis.Redis) -> list[str]:
    return [e.removeprefix("done:") for e in r.lrange(LOG_KEY, 0, -1) if e.startswith("done:")]


def test_the_page_shows_the_servers_numbers_while_tasks_flow(
    chrome: WebDriver,
    console: Callable[..., ConsoleProcess],
    spawn: Spawn,
    outbox_db_url: str,
    redis_url: str,
    r: sync_redis.Redis,
    tmp_path: Path,
) -> None:
    spawn("--queue", FLOWING, "--handler", "tests.handlers:slow")
    enqueuer = spawn_enqueuer(outbox_db_url, redis_url, tmp_path / "enqueuer.log")
    try:
        insert_rows(outbox_db_url, 37, queue=IDLE, shards=SHARDS, prefix="idle-")
        for n in range(3):
            _dead_letter(r, IDLE, f"poison-{n}", "run-7")
        with psycopg.connect(outbox_db_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO outbox_dlq (id, task_id, stream, payload, attempts, last_error)"
                " SELECT 'lost-' || g, 'lost-' || g, 'workflow.tasks.orders', '{}', 5, 'boom'"
                "   FROM generate_series(1, 4) g"
            )
        site = console()
        chrome.get(site.url)
        # A mark on this page's window: a reload or a navigation would drop it.
        chrome.execute_script("window.sameDocument = true")
        # Tasks flow through `orders` while the page watches: its rate shows them handled.
        for batch in range(6):
            with psycopg.connect(outbox_db_url, autocommit=True) as conn:
                for i in range(50):
                    d = dispatch(f"o-{batch}-{i}", FLOWING, input=SLEEP0)
                    enqueue_dispatch(conn, d)
            _seen(chrome, lambda b=batch: len(_handled(r)) >= 50 * (b + 1), "tasks handled")
        rate = f'#queues tr[data-queue="{FLOWING}"] [data-field=handled_per_s]'
        # "-" until two samples make a rate.
        _seen(chrome, lambda: _rate(_cell(chrome, rate)) > 0, "a handled rate on the page")
        # ... on the page as it was loaded: the numbers updated without a reload.
        assert chrome.execute_script("return window.sameDocument") is True
        # `reports` has no worker: its numbers hold still, and must be Redis's own.
        lengths = {task_stream(IDLE, s): r.xlen(task_stream(IDLE, s)) for s in range(SHARDS)}
        assert sum(lengths.values()) == 37
        for stream, length in lengths.items():
            _seen(
                chrome,
                lambda s=stream, n=length: (
                    _number(_cell(chrome, f'#shards tr[data-stream="{s}"] [data-field=length]'))
                    == n
                ),
                f"{stream} length {length}",
            )
        row = f'#queues tr[data-queue="{IDLE}"]'
        _seen(
            chrome, lambda: _number(_cell(chrome, f"{row} [data-field=backlog]")) == 37, "backlog"
        )
        # The page redraws its rows at each sample: every read goes through _seen, which reads
        # again when an element was replaced under it.
        assert r.xlen(dead_letter_stream(IDLE)) == 3
        _seen(
            chrome,
            lambda: _number(_cell(chrome, f"{row} [data-field=dead_letters]")) == 3,
            "dead letters",
        )
        _seen(chrome, lambda: _number(_cell(chrome, "#c-outbox_dlq")) == 4, "outbox_dlq")
        _seen(chrome, lambda: _cell(chrome, "#c-shards") == str(SHARDS), "shard count")
        _seen(chrome, lambda: _cell(chrome, "#c-pending") == "0", "the outbox drained")
        _seen(chrome, lambda: _cell(chrome, "#mode") == "read-only", "read-only mode")
        assert chrome.find_elements(By.CSS_SELECTOR, "#chart-backlog polyline")
        _shot(chrome, "console-queues")

        chrome.get(site.url + "/#workers")
        _seen(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, "#workers tbody tr"), "workers")
        consumers = {
            c["name"]
            for s in range(SHARDS)
            for c in r.xinfo_consumers(task_stream(FLOWING, s), "workers")
        }

        def shown() -> set[str]:  # read again whenever a redraw replaced a row under the read
            return {
                _cell(chrome, f"#workers tbody tr:nth-child({i + 1}) [data-field=name]")
                for i in range(len(consumers))
            }

        _seen(chrome, lambda: shown() == consumers, "every worker's consumer name")
        _shot(chrome, "console-workers")
    finally:
        enqueuer.terminate()
        enqueuer.wait(30)


def test_a_replay_from_the_page_is_handled(
    chrome: WebDriver,
    console: Callable[..., ConsoleProcess],
    spawn: Spawn,
    r: sync_redis.Redis,
) -> None:
    spawn("--queue", FLOWING, "--handler", "tests.handlers:slow")
    kept = _dead_letter(r, FLOWING, "kept-1", "run-9")
    entry = _dead_letter(r, FLOWING, "fixed-1", "run-9")
    site = console(token=TOKEN)
    chrome.get(site.url + "/#dead")
    _sign_in(chrome)
    Select(chrome.find_element(By.ID, "dead-source")).select_by_value(FLOWING)
    row = f'#dead tr[data-id="{entry}"]'
    _seen(
        chrome, lambda: _cell(chrome, f"{row} [data-field=error]").startswith("ValueError"), "row"
    )
    _seen(chrome, lambda: _cell(chrome, f"{row} [data-field=task_id]") == "fixed-1", "task id")
    _seen(chrome, lambda: _cell(chrome, f"{row} [data-field=runs]") == "3", "its runs")
    assert "sleep" not in chrome.find_element(By.ID, "dead").text  # no payload unless asked
    chrome.find_element(By.CSS_SELECTOR, f"{row} button.payload").click()
    _seen(chrome, lambda: "sleep" in _cell(chrome, "#dead pre.payload"), "the payload")
    _shot(chrome, "console-dead-letters")

    chrome.find_element(By.CSS_SELECTOR, f"{row} input.pick").click()
    chrome.find_element(By.ID, "dead-replay").click()
    _confirm(chrome, f"1 of workflow.dead.{FLOWING}")
    _toast(chrome, f"replayed 1 of workflow.dead.{FLOWING}")
    eventually_sync(lambda: "fixed-1" in _handled(r), within=30, what="the replayed task handled")
    assert [e[0] for e in r.xrange(dead_letter_stream(FLOWING))] == [kept]
    _seen(chrome, lambda: not chrome.find_elements(By.CSS_SELECTOR, row), "the row gone")


def test_a_cancel_from_the_page_stops_the_run(
    chrome: WebDriver,
    console: Callable[..., ConsoleProcess],
    spawn: Spawn,
    outbox_db_url: str,
    redis_url: str,
    r: sync_redis.Redis,
    tmp_path: Path,
) -> None:
    run = "run-to-stop"
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        for i in range(3):
            enqueue_dispatch(conn, dispatch(f"stop-{i}", FLOWING, run_id=run, input=SLEEP0))
    site = console(token=TOKEN)
    chrome.get(site.url + "/#run")
    _sign_in(chrome)
    chrome.find_element(By.ID, "run-id").send_keys(run)
    chrome.find_element(By.CSS_SELECTOR, "#run-form button[type=submit]").click()
    _seen(chrome, lambda: "3 waiting" in _cell(chrome, "#run-state"), "the run's tasks")
    _shot(chrome, "console-run")
    chrome.find_element(By.ID, "run-cancel").click()
    _confirm(chrome, f"Cancel run {run}?")
    _toast(chrome, "3 outbox rows removed")
    _seen(chrome, lambda: "cancel committed" in _cell(chrome, "#run-state"), "cancelled")
    with psycopg.connect(outbox_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)

    # The enqueuer records the cancel for the workers: a task of the run that reaches a
    # stream anyway (published before the cancel) is acked without running.
    spawn("--queue", FLOWING, "--handler", "tests.handlers:slow")
    enqueuer = spawn_enqueuer(outbox_db_url, redis_url, tmp_path / "enqueuer.log")
    try:
        eventually_sync(lambda: r.zscore(CANCELLED_RUNS, run), within=30, what="relayed")
        late = dispatch("stop-late", FLOWING, run_id=run, input=SLEEP0)
        control = dispatch("control", FLOWING, input=SLEEP0)
        for d in (late, control):
            r.xadd(
                task_stream(FLOWING, shard_for(d.task_id, SHARDS)),
                payload_fields(json.dumps(d.payload()), "0"),
            )  # type: ignore[arg-type]
        eventually_sync(lambda: "control" in _handled(r), within=30, what="the control task")
        eventually_sync(
            lambda: all(r.xlen(task_stream(FLOWING, s)) == 0 for s in range(SHARDS)),
            within=30,
            what="the late task acked",
        )
        assert not [t for t in r.lrange(LOG_KEY, 0, -1) if "stop-" in t]
        chrome.find_element(By.CSS_SELECTOR, "#run-form button[type=submit]").click()
        _seen(
            chrome, lambda: "cancelled: workers start none" in _cell(chrome, "#run-state"), "state"
        )
    finally:
        enqueuer.terminate()
        enqueuer.wait(30)


def test_a_run_lookup_searches_further_from_the_page(
    chrome: WebDriver,
    console: Callable[..., ConsoleProcess],
    outbox_db_url: str,
    r: sync_redis.Redis,
) -> None:
    """A keyspace larger than one request's budget: the page searches on when asked."""
    run = "run-far"
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        for i in range(3):
            enqueue_dispatch(conn, dispatch(f"far-{i}", FLOWING, run_id=run, input=SLEEP0))
    own = {f"{ATTEMPT_PREFIX}{run}:far-{i}:{1 + i % 2}": DONE for i in range(5)}
    r.mset(own)  # type: ignore[arg-type]
    budget = SCAN_STEPS * SCAN_COUNT
    for start in range(0, 2 * budget, 5000):
        r.mset({f"{ATTEMPT_PREFIX}other-{n}:t:1": DONE for n in range(start, start + 5000)})  # type: ignore[arg-type]
    site = console()
    status, first = site.api(f"/api/run?run_id={run}")
    assert status == 200
    assert first["next"] is not None  # one request did not walk to the end
    status, refused = site.api(f"/api/run?run_id={run}&cursor={first['next'][:-3]}x!x")
    assert (status, refused["error"].split(" (")[0]) == (
        400,
        "cursor: not a cursor of a run's search",
    )

    chrome.get(site.url + "/#run")
    chrome.find_element(By.ID, "run-id").send_keys(run)
    chrome.find_element(By.CSS_SELECTOR, "#run-form button[type=submit]").click()
    _seen(chrome, lambda: "3 waiting" in _cell(chrome, "#run-state"), "the first step")
    assert "not complete" in _cell(chrome, "#run-state")
    further = chrome.find_element(By.ID, "run-further")
    clicks = 0
    while further.is_displayed():
        steps = _cell(chrome, "#run-state")
        further.click()
        clicks += 1
        _seen(chrome, lambda s=steps: _cell(chrome, "#run-state") != s, "one more step")
        assert clicks < 20, "the search never completes"
    assert clicks >= 1
    state = _cell(chrome, "#run-state")
    assert "search complete" in state
    assert "3 waiting, 5 attempts seen" in state
    rows = chrome.find_elements(By.CSS_SELECTOR, "#run-attempts tbody tr")
    shown = sorted(
        (row.get_attribute("data-task"), row.find_elements(By.TAG_NAME, "td")[1].text)
        for row in rows
    )
    assert shown == sorted((k.split(":")[3], k.split(":")[4]) for k in own)
    assert len(chrome.find_elements(By.CSS_SELECTOR, "#run-outbox tbody tr")) == 3


def test_actions_are_refused_without_the_token_and_csrf_checks(
    chrome: WebDriver,
    console: Callable[..., ConsoleProcess],
    r: sync_redis.Redis,
) -> None:
    _dead_letter(r, FLOWING, "t-1", "run-1")
    site = console(token=TOKEN)
    chrome.get(site.url + "/#settings")
    _seen(chrome, lambda: _cell(chrome, "#mode") == "signed out", "signed out")
    # From the page, not signed in: confirmed, sent, refused; nothing changed.
    shards = chrome.find_element(By.ID, "shards-count")
    shards.clear()
    shards.send_keys("3")
    chrome.find_element(By.CSS_SELECTOR, "#shards-form button").click()
    _confirm(chrome, "Change the shard count to 3?")
    _toast(chrome, "refused: sign in with the console's token first")
    assert r.get(SHARDS_KEY) == str(SHARDS)

    # As a script: no session, a wrong token, no CSRF token, another origin: all refused.
    own = {"Origin": site.url}
    assert site.api("/api/actions/shards", {"count": 3}, headers=own)[0] == 401
    assert site.api("/api/login", {"token": "guess"}, headers=own)[0] == 401
    assert site.api("/api/login", {"token": TOKEN})[0] == 403  # no Origin
    payload = site.api(f"/api/dead-letters/payload?queue={FLOWING}&id=0-1")
    assert payload[0] == 403
    cookies = _signed_in_cookies(site)
    session = "; ".join(f"{k}={v}" for k, v in cookies.items())
    csrf = cookies["console_csrf"]
    act = "/api/actions/shards"
    assert site.api(act, {"count": 3}, headers={**own, "Cookie": session})[0] == 403
    evil = {"Origin": "http://evil.example", "Cookie": session, "X-Console-CSRF": csrf}
    assert site.api(act, {"count": 3}, headers=evil)[0] == 403
    forged = {**own, "Cookie": f"console_session=x.y; console_csrf={csrf}", "X-Console-CSRF": csrf}
    assert site.api(act, {"count": 3}, headers=forged)[0] == 401
    assert r.get(SHARDS_KEY) == str(SHARDS)
    good = {**own, "Cookie": session, "X-Console-CSRF": csrf}
    assert site.api(act, {"count": "x"}, headers=good) == (
        400,
        {"error": "count: a whole number >= 1"},
    )

    # Signed in on the page, the same actions go through.
    _sign_in(chrome)
    chrome.find_element(By.CSS_SELECTOR, "#shards-form button").click()
    _confirm(chrome, "Change the shard count to 3?")
    _toast(chrome, "shard count: 2 -> 3")
    assert r.get(SHARDS_KEY) == "3"
    _seen(
        chrome,
        lambda: Select(chrome.find_element(By.ID, "limits-queue")).select_by_value(FLOWING) or 1,
        "the queue offered",
    )
    chrome.find_element(By.ID, "limits-max").send_keys("4")
    chrome.find_element(By.ID, "limits-rate").send_keys("2.5")
    chrome.find_element(By.CSS_SELECTOR, "#limits-form button").click()
    _confirm(chrome, f"Set the limits of {FLOWING}: max in flight 4, rate 2.5/s?")
    _toast(chrome, f"limits of {FLOWING}: none -> max in flight 4, rate 2.5/s burst 1")
    assert QueueLimits.model_validate_json(r.get(limits_key(FLOWING)) or "") == QueueLimits(
        max_in_flight=4, rate=2.5
    )
    _shot(chrome, "console-settings")


def test_a_read_only_console_refuses_every_action(
    chrome: WebDriver, console: Callable[..., ConsoleProcess], r: sync_redis.Redis
) -> None:
    site = console()
    chrome.get(site.url + "/#settings")
    _seen(chrome, lambda: _cell(chrome, "#mode") == "read-only", "read-only")
    assert not chrome.find_element(By.CSS_SELECTOR, "#shards-form button").is_enabled()
    assert not chrome.find_element(By.ID, "signin").is_displayed()
    own = {"Origin": site.url}
    for action, body in [
        ("shards", {"count": 3}),
        ("cancel", {"run_id": "r"}),
        ("limits", {"queue": FLOWING, "clear": True}),
        ("dead-letters", {"op": "delete", "queue": FLOWING, "all": True}),
    ]:
        status, answer = site.api(f"/api/actions/{action}", body, headers=own)
        assert (status, answer["error"].split(":")[0]) == (403, "this console is read-only")
    assert site.api("/api/login", {"token": ""}, headers=own)[0] == 403
    assert r.get(SHARDS_KEY) == str(SHARDS)


def _signed_in_cookies(site: ConsoleProcess) -> dict[str, str]:
    import urllib.request

    request = urllib.request.Request(
        site.url + "/api/login",
        data=json.dumps({"token": TOKEN}).encode(),
        headers={"Content-Type": "application/json", "Origin": site.url},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        found = response.headers.get_all("Set-Cookie")
    return dict(c.split(";", 1)[0].split("=", 1) for c in found)
