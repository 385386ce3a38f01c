"""The worker's pure parts: handler loading and calling, config, dead letters, slots."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest

from dispatcher.models import TaskMessage
from dispatcher.stream.entries import Message
from dispatcher.worker import (
    HandlerImportError,
    WorkerConfig,
    attempt_key,
    dead_letter_fields,
    load_handler,
)
from dispatcher.worker.dead_letter import MAX_ERROR_CHARS, describe_error
from dispatcher.worker.dedup import supports_claims
from dispatcher.worker.handler import invoker
from dispatcher.worker.slots import SlotPool

MESSAGE = TaskMessage(
    task_id="t1",
    run_id="r",
    workflow_id="w",
    workflow_version=1,
    node_id="n",
    node_type="http",
    attempt=2,
    input={"a": 1},
)


def test_load_handler_resolves_module_and_dotted_attribute() -> None:
    assert load_handler("json:dumps").__name__ == "dumps"
    assert load_handler("json:JSONEncoder.encode").__name__ == "encode"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("json", "handler must look like 'module:function'"),
        (":dumps", "handler must look like"),
        ("json:", "handler must look like"),
        (
            "no_such_mod_xyz:f",
            "cannot import handler module 'no_such_mod_xyz': ModuleNotFoundError",
        ),
        ("json:nope", "module 'json' has no attribute 'nope'"),
        ("json.decoder:NaN", "is not callable"),
    ],
)
def test_load_handler_says_what_is_wrong(path: str, message: str) -> None:
    with pytest.raises(HandlerImportError, match=re.escape(message)):
        load_handler(path)


async def test_invoke_awaits_async_handlers_on_the_loop() -> None:
    seen: list[tuple[str, str]] = []

    async def handler(message: TaskMessage) -> None:
        seen.append((message.task_id, threading.current_thread().name))

    await invoker(handler, executor=None)(MESSAGE)
    assert seen == [("t1", threading.main_thread().name)]


async def test_invoke_runs_sync_handlers_in_a_thread_and_propagates_errors() -> None:
    def handler(message: TaskMessage) -> None:
        assert threading.current_thread() is not threading.main_thread()
        raise ValueError(f"bad {message.task_id}")

    with pytest.raises(ValueError, match="bad t1"):
        await invoker(handler, executor=None)(MESSAGE)


async def test_invoke_supports_objects_with_async_call() -> None:
    class Handler:
        def __init__(self) -> None:
            self.seen: list[int] = []

        async def __call__(self, message: TaskMessage) -> None:
            self.seen.append(message.attempt)

    handler = Handler()
    await invoker(handler, executor=None)(MESSAGE)
    assert handler.seen == [2]


def test_config_defaults_follow_the_cli_contract() -> None:
    config = WorkerConfig(queues=("q",))
    assert (config.group, config.concurrency, config.max_runs) == ("workers", 8, 5)
    assert config.handler_timeout == 0  # none
    assert config.reclaim_idle_ms == 30_000
    assert config.consumer  # hostname-pid


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"queues": ()}, "at least one queue"),
        ({"queues": ("a.b",)}, "invalid queue name"),
        ({"concurrency": 0}, "concurrency must be >= 1"),
        ({"max_runs": 0}, "max runs must be >= 1"),
        ({"handler_timeout": -1}, "handler timeout must be >= 0"),
        ({"reclaim_idle": 0}, "reclaim idle must be > 0"),
        ({"grace_period": -1}, "grace period must be >= 0"),
    ],
)
def test_config_rejects_unusable_values(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkerConfig(**{"queues": ("q",), **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "ok"),
    [("7.0.15", True), ("7.4.0", True), ("8.0.2", True), ("6.2.14", False), ("x", True)],
)
def test_the_worker_needs_redis_7_for_its_claims(version: str, ok: bool) -> None:
    assert supports_claims(version) is ok


def test_dedup_keys_name_the_task_attempt() -> None:
    assert attempt_key(MESSAGE.dedup_key) == "dispatcher:attempt:r:t1:2"


@pytest.mark.parametrize(
    ("run_id", "task_id", "key"),
    [
        ("r1", "t8", "r1:t8:1"),
        ("a:b", "c", "a%3Ab:c:1"),  # not the key of run "a", task "b:c"
        ("a", "b:c", "a:b:c:1"),
        ("50%", "t", "50%25:t:1"),
        ("", "t", ":t:1"),
    ],
)
def test_the_dedup_key_is_run_task_and_attempt_unambiguously(
    run_id: str, task_id: str, key: str
) -> None:
    message = MESSAGE.model_copy(update={"run_id": run_id, "task_id": task_id, "attempt": 1})
    assert message.dedup_key == key


def test_dead_letter_carries_the_original_fields_and_where_from() -> None:
    message = Message(
        stream="workflow.tasks.q.3", id="5-1", fields={"task_id": "t", "x": "1"}, delivery_count=6
    )
    assert dead_letter_fields(message, error="boom") == {
        "task_id": "t",
        "x": "1",
        "error": "boom",
        "delivery_count": "6",
        "runs": "0",
        "source_stream": "workflow.tasks.q.3",
        "source_id": "5-1",
    }


def test_describe_error_is_bounded() -> None:
    assert describe_error(KeyError("k")) == "KeyError: 'k'"
    long = describe_error(RuntimeError("x" * 10_000))
    assert len(long) == MAX_ERROR_CHARS
    assert long.endswith("...")


async def test_slot_pool_bounds_and_reports_free_slots() -> None:
    pool = SlotPool(2)
    await pool.acquire()
    await pool.acquire()
    assert (pool.free, pool.held) == (0, 2)
    assert await pool.wait_free(within=0.01) == 0
    waiter = asyncio.create_task(pool.wait_free(within=30))
    await asyncio.sleep(0)
    pool.release()
    assert await waiter == 1
    await pool.acquire()
    third = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    assert not third.done()  # the bound holds
    pool.release()
    await third
    assert pool.held == 2


@pytest.mark.parametrize(
    ("flags", "max_runs"),
    [([], 5), (["--max-runs", "4"], 4), (["--max-deliveries", "3"], 3)],
)
def test_max_deliveries_is_the_old_name_of_max_runs(flags: list[str], max_runs: int) -> None:
    from dispatcher.cli.main import build_parser

    argv = ["worker", "--queue", "q", "--handler", "m:f", *flags, "--handler-timeout", "2.5"]
    args = build_parser().parse_args(argv)
    assert (args.max_runs, args.handler_timeout) == (max_runs, 2.5)


def test_worker_help_names_the_alias_and_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-runs MAX_RUNS, --max-deliveries MAX_RUNS" in text
    assert "--max-deliveries is its old name, same meaning" in text
    assert "--handler-timeout HANDLER_TIMEOUT" in text
