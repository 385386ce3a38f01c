"""``dispatcher demo``: run the pipeline end to end with live progress and a verdict."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from dispatcher.cli.main import Common
from dispatcher.config import Settings
from dispatcher.demo.run import DemoResult, Progress, run_demo
from dispatcher.demo.servers import demo_servers
from dispatcher.demo.verdict import Latency

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline here: commit -> enqueuer -> Redis -> workers, then check",
        description="Commit N task dispatches (some transactions rolled back), publish them with "
        "the enqueuer, handle them with two workers, show live progress and end with latency "
        "percentiles and a check that every committed task - and no rolled-back one - was "
        "handled. Uses DATABASE_URL / REDIS_URL when they are set and answer; otherwise starts "
        "throwaway servers in a temp dir that is removed on exit.",
    )
    p.add_argument(
        "--tasks", type=int, default=10_000, help="dispatches to commit (default: %(default)s)"
    )
    p.add_argument("--workers", type=int, default=2, help="worker instances (default: %(default)s)")
    p.add_argument(
        "--timeout", type=float, default=300, help="give up after seconds (default: %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=None, help="seed for which batches roll back (default: random)"
    )
    common(p)
    p.set_defaults(handler=_demo)


def _sigterm_as_sigint(_signum: int, _frame: Any) -> None:
    signal.raise_signal(signal.SIGINT)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    try:
        from rich.console import Console
    except ModuleNotFoundError as exc:
        if (exc.name or "rich").partition(".")[0] != "rich":
            raise
        log.debug("importing rich failed", exc_info=True)
        print(
            "dispatcher demo needs the demo extra: pip install 'outbox-dispatcher[demo]'",
            file=sys.stderr,
        )
        return 2

    # SIGTERM (a closed terminal, `kill`, a CI timeout) stops the demo as Ctrl-C does: its
    # servers stopped and its temp dir removed, not left running.
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    console = Console(stderr=False)
    given = settings.model_fields_set
    db = settings.database_url.get_secret_value() if settings.database_url else None
    rd = settings.redis_url.get_secret_value() if "redis_url" in given else None
    console.print("preparing PostgreSQL and Redis...")
    with demo_servers(db, rd) as servers:
        console.print("[bold]outbox-dispatcher demo[/]  " + "; ".join(servers.notes))
        result = _with_progress(
            console, args, servers.database_url, servers.redis_url, servers.notes
        )
    _summary(console, result)
    return 0 if result.verdict.ok else 1


def _with_progress(
    console: Any, args: argparse.Namespace, db: str, rd: str, notes: list[str]
) -> DemoResult:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
    from rich.progress import Progress as Bar

    columns = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn())
    with Bar(*columns, console=console, transient=False) as bar:
        rows = {
            name: bar.add_task(name, total=args.tasks)
            for name in ("committed", "published", "handled")
        }

        def tick(p: Progress) -> None:
            expected = p.total - len(p.rolled_back)
            bar.update(rows["committed"], completed=len(p.committed), total=expected)
            bar.update(rows["published"], completed=len(p.published_at), total=expected)
            bar.update(rows["handled"], completed=len(p.handled_runs), total=expected)

        demo = functools.partial(
            run_demo,
            database_url=db,
            redis_url=rd,
            tasks=args.tasks,
            servers=notes,
            workers=args.workers,
            give_up_after=args.timeout,
            on_tick=tick,
            seed=args.seed,
        )
        try:
            return asyncio.run(_cancelled_by_sigterm(demo))
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None  # stopped as Ctrl-C stops it


async def _cancelled_by_sigterm(demo: Callable[[], Awaitable[DemoResult]]) -> DemoResult:
    """Run ``demo()``; SIGTERM cancels it (its parts stop, as on Ctrl-C) through the loop.

    The coroutine is made here, once the handler is in place: a SIGTERM that cancels this
    task before it ran leaves no coroutine never awaited (and no warning as the last line).
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await demo()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _sigterm_as_sigint)


def _ms(lat: Latency | None) -> tuple[str, str, str]:
    if lat is None:
        return ("-", "-", "-")
    return (f"{lat.p50_ms:.1f}", f"{lat.p95_ms:.1f}", f"{lat.p99_ms:.1f}")


def _summary(console: Any, r: DemoResult) -> None:
    from rich.table import Table

    v = r.verdict
    table = Table(title="summary", show_header=False)
    table.add_row("committed / rolled back", f"{v.committed} / {v.rolled_back}")
    table.add_row("handled (unique)", str(v.handled))
    table.add_row("throughput", f"{r.throughput:,.0f} tasks/s over {r.seconds:.1f} s")
    table.add_row("commit -> stream p50/p95/p99 ms", " / ".join(_ms(r.to_stream)))
    table.add_row("commit -> handled p50/p95/p99 ms", " / ".join(_ms(r.to_handled)))
    table.add_row("duplicates", str(v.duplicates))
    table.add_row("dead letters", str(r.dead_letters))
    check = (
        "[green]PASS[/]"
        if v.ok
        else f"[red]FAIL[/] missing {len(v.missing)}, unexpected {len(v.unexpected)}"
    )
    table.add_row("every committed task handled, no rolled-back one", check)
    console.print(table)
