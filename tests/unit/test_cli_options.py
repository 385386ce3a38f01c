"""The enqueuer and worker flags come from one definition of each setting.

``--help`` prints every default, docs/configuration.md's tables are the generated ones,
a numeric flag out of bounds is the same argparse error line on both
commands, and the CRD's defaults are the flags' defaults.
"""

from __future__ import annotations

import argparse
import re

import pytest
from pydantic import SecretStr

from dispatcher.cli.docs import CONFIGURATION_PAGE, page_with_tables
from dispatcher.cli.main import build_parser, main
from dispatcher.cli.outbox import ENQUEUER_OPTIONS
from dispatcher.cli.worker import WORKER_OPTIONS
from dispatcher.config import (
    LOG_FORMAT,
    LOG_LEVEL,
    METRICS_PORT,
    REDIS_CLUSTER,
    REDIS_URL,
    REQUIRE_AOF,
    STREAM_SHARDS,
    Settings,
)
from dispatcher.controller.model import EnqueuerSpec, QueueSpec
from dispatcher.options import Option, show
from dispatcher.outbox import EnqueuerConfig
from dispatcher.worker import WorkerConfig

COMMANDS = [
    ["migrate"],
    ["enqueuer"],
    ["worker"],
    ["status"],
    ["dlq", "list"],
    ["dlq", "replay"],
    ["shards"],
    ["shards", "set"],
    ["limits"],
    ["limits", "set"],
    ["demo"],
    ["operator"],
]
REQUIRED: dict[str, list[str]] = {"enqueuer": [], "worker": ["--queue", "q", "--handler", "m:f"]}


def _subparser(path: list[str]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _flat(text: str) -> str:
    """Help text with argparse's line wrapping undone (it also breaks after hyphens)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_prints_every_default(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*path, "--help"])
    printed = _flat(capsys.readouterr().out)
    parser = _subparser(path)
    missing = []
    for action in parser._actions:
        if not action.option_strings or action.required or action.dest == "help":
            continue
        if action.help == argparse.SUPPRESS:  # a flag that is gone, kept to say so
            continue
        text = _flat(parser._get_formatter()._expand_help(action))
        assert text in printed
        env = re.search(r"\(env [A-Z_]+(, default: [^()]+)?\)$", text)
        if env is not None:  # overrides the environment: no argparse default
            if env.group(1) is None and action.dest != "database_url":
                missing.append(action.option_strings[0])
        elif (
            action.default not in (None, False) and f"(default: {show(action.default)})" not in text
        ):
            missing.append(
                action.option_strings[0]
            )  # (None/False: a switch, or unset unless given)
    assert not missing, f"--help of {' '.join(path)} prints no default for {missing}"


def test_help_prints_the_env_default_behind_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    printed = _flat(capsys.readouterr().out)
    assert "(env STREAM_SHARDS, default: 4)" in printed
    assert "(env REDIS_URL, default: redis://127.0.0.1:6379/0)" in printed
    assert "--concurrency CONCURRENCY handlers running at once (default: 8)" in printed


def test_the_configuration_pages_tables_are_the_generated_ones() -> None:
    page = CONFIGURATION_PAGE.read_text()
    assert page == page_with_tables(page), "run `python -m dispatcher.cli.docs --write`"


@pytest.mark.parametrize(
    ("command", "flag", "error"),
    [
        ("enqueuer", "--concurrency=0", "argument --concurrency: must be >= 1, got 0"),
        ("worker", "--concurrency=0", "argument --concurrency: must be >= 1, got 0"),
        (
            "worker",
            "--max-deliveries=0",
            "argument --max-runs/--max-deliveries: must be >= 1, got 0",
        ),
        (
            "enqueuer",
            "--recover-in-flight-after=0",
            "argument --hung-batch-timeout/--recover-in-flight-after: must be >= 1, got 0",
        ),
        ("worker", "--reclaim-idle=0", "argument --reclaim-idle: must be > 0, got 0"),
        ("worker", "--lease-ttl=x", "argument --lease-ttl: not a number: 'x'"),
        ("enqueuer", "--shards=0", "argument --shards: must be >= 1, got 0"),
        ("worker", "--shards=0", "argument --shards: must be >= 1, got 0"),
    ],
)
def test_a_bad_number_is_one_argparse_error_on_either_command(
    command: str, flag: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main([command, *REQUIRED[command], flag])
    assert exit.value.code == 2
    prog = f"dispatcher {command}"
    assert capsys.readouterr().err == f"{prog}: error: {error} (see {prog} --help)\n"


def _numeric() -> list[tuple[str, Option]]:
    return [
        (command, opt)
        for command, opts in (("enqueuer", ENQUEUER_OPTIONS), ("worker", WORKER_OPTIONS))
        for opt in opts
        if opt.kind in (int, float)
    ]


@pytest.mark.parametrize(("command", "opt"), _numeric(), ids=lambda x: getattr(x, "name", x))
def test_every_numeric_flag_refuses_a_value_below_its_bound(
    command: str, opt: Option, capsys: pytest.CaptureFixture[str]
) -> None:
    assert opt.minimum is not None, "every numeric flag has a lower bound"
    below = opt.minimum if opt.above else opt.minimum - 1
    with pytest.raises(SystemExit):
        main([command, *REQUIRED[command], f"{opt.flags[0]}={below}"])
    sign = ">" if opt.above else ">="
    expected = f"argument {'/'.join(opt.flags)}: must be {sign} {show(opt.minimum)}"
    assert f"error: {expected}, got {show(below)}" in capsys.readouterr().err


def test_the_crd_defaults_are_the_flags_defaults() -> None:
    enqueuer, queue = EnqueuerSpec(), QueueSpec(name="q", handler="m:f")
    config = EnqueuerConfig()
    for name in ("batch_size", "concurrency", "poll_interval", "wait_replicas"):
        assert getattr(enqueuer, name) == getattr(config, name), name
    worker = WorkerConfig(queues=("q",))
    assert (queue.concurrency, queue.runs_limit) == (worker.concurrency, worker.max_runs)
    assert queue.reclaim_idle_seconds == worker.reclaim_idle
    assert queue.handler_timeout_seconds == worker.handler_timeout


@pytest.mark.parametrize(
    ("opt", "text", "value"),
    [
        (REDIS_URL, "redis://elsewhere:6380/2", "redis://elsewhere:6380/2"),
        (REDIS_CLUSTER, "1", True),
        (LOG_LEVEL, "DEBUG", "DEBUG"),
        (LOG_FORMAT, "json", "json"),
        (STREAM_SHARDS, "7", 7),
        (METRICS_PORT, "9100", 9100),
        (REQUIRE_AOF, "1", True),
    ],
    ids=lambda x: getattr(x, "env", None) or "",
)
def test_each_setting_is_read_from_the_env_variable_its_option_names(
    opt: Option, text: str, value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert opt.env is not None
    monkeypatch.setenv(opt.env, text)
    got = getattr(Settings(), opt.name)
    assert (got.get_secret_value() if isinstance(got, SecretStr) else got) == value
