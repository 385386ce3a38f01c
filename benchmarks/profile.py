"""Where the time goes: ``python -m benchmarks.profile {drain,worker,idle}``.

One drain of pre-filled rows (``--size`` bytes, ``--rows``) by ``dispatcher
enqueuer``, one worker consume of ``--messages`` by ``dispatcher worker``, or
``--samples`` idle dispatches of the idle probe through ``dispatcher enqueuer``,
each its own process with its defaults, as in the figures of ``benchmarks.run``.
Meanwhile py-spy samples the product's process (``--nonblocking``: it never
stops it; with ``--native`` it pauses it for each sample and also names the C
functions, e.g. ``send`` for the time in the kernel's socket writes) and /proc
gives the CPU each side spent. Printed: µs per row (or per message, or idle
dispatch) in the product, in PostgreSQL's backends and in Redis; then the
product's own time by function (self time, samples where Python was not idle),
as µs per row: the share of the samples times the product's µs per row.

py-spy is not a project dependency: ``make bench`` builds ``.venv-bench`` with
it (``benchmarks/requirements-bench.txt``), so run this as
``.venv-bench/bin/python -m benchmarks.profile drain`` (it needs ptrace: root,
or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from benchmarks import drain, probe
from benchmarks import worker_consume as wc
from benchmarks.env import bench_env
from benchmarks.workload import SMALL, load_average

RATE = 250  # samples per second per process


@contextlib.contextmanager
def py_spy(out: Path, *, native: bool = False) -> Iterator[wc.Around]:
    """An ``Around`` that records each pid with py-spy into ``out`` (raw collapsed stacks)."""
    tool = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    recorders: list[subprocess.Popen[bytes]] = []

    @contextlib.contextmanager
    def around(pids: list[int]) -> Iterator[None]:
        for pid in pids:
            mode = "--native" if native else "--nonblocking"
            command = [tool, "record", "--pid", str(pid), "--rate", str(RATE), mode,
                       "--format", "raw", "--output", f"{out}.{pid}"]  # fmt: skip
            recorders.append(
                subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        try:
            yield
        finally:
            for r in recorders:
                r.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
            for r in recorders:
                r.wait(60)

    yield around


# With --native, py-spy counts a thread blocked in one of these as busy (it was a third of
# a drain's samples: the listener's thread, waiting for notifications that never came).
# The event loop's epoll_wait is kept: on a busy loop it returns at once, and costs.
_WAITING = re.compile(r"^(poll|ppoll|select|pselect|__poll|__select) \(")


def self_time(raw: list[Path]) -> Counter[str]:
    """Samples by innermost function (``name (file)``, lines folded) over the raw files.

    Samples of a thread blocked in a wait (``_WAITING``) are left out.
    """
    found: Counter[str] = Counter()
    for path in raw:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frame = stack.rpartition(";")[2]
            if _WAITING.match(frame):
                continue
            found[re.sub(r":\d+\)$", ")", frame)] += int(count)
    return found


def report(title: str, per_side: dict[str, float], product_key: str, samples: Counter[str]) -> str:
    total = sum(samples.values())
    product = per_side[product_key]
    lines = [f"# {title}", "", f"load average: {load_average()}", "",
             "| side | µs |", "|---|---:|"]  # fmt: skip
    lines += [f"| {k} | {v:,.1f} |" for k, v in per_side.items()]
    lines += ["", f"product self time by function ({total:,} samples at {RATE}/s)", "",
              "| function | share | µs |", "|---|---:|---:|"]  # fmt: skip
    for frame, n in samples.most_common(25):
        lines.append(f"| `{frame}` | {n / total:.1%} | {n / total * product:,.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("drain", "worker", "idle"))
    parser.add_argument("--size", type=int, default=SMALL, help="payload bytes (drain)")
    parser.add_argument("--rows", type=int, default=drain.ROWS)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--samples", type=int, default=probe.SAMPLES)
    parser.add_argument(
        "--native",
        action="store_true",
        help="name C functions too (py-spy --native: pauses the process for each sample)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-profile-"))
    try:
        with bench_env() as env, py_spy(workdir / "raw", native=args.native) as around:
            if args.what == "drain":
                found = drain.enqueuer(env, args.size, rows=args.rows, around=around)
                title = f"drain of {args.rows:,} rows, {args.size} B: µs per row"
                key = "product_us_per_row"
            elif args.what == "idle":
                found = probe.idle_enqueuer(env, args.samples, around=around)
                title = f"{args.samples} idle dispatches: µs per dispatch, latencies in ms"
                key = "product_us_per_dispatch"
            else:
                variant = wc.workers(1, around=around)
                found = asyncio.run(wc.figure(variant, args.messages)(env))
                title = f"worker consume of {args.messages:,} messages: µs per message"
                key = "cpu_us_per_msg"
        print(report(title, found, key, self_time(list(workdir.glob("raw.*")))))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
