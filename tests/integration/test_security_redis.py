"""Redis ACL users, TLS, and secrets kept out of logs, with real processes and servers.

The ACL lines are read from ``docs/security.md`` (so the documentation is what
is tested), applied with ``ACL SETUSER`` on a redis-server the test starts, and
real ``dispatcher enqueuer`` / ``dispatcher worker`` processes run a pipeline
through them with ``redis://user:pass@...`` URLs. Handler runs are recorded on
the machine's Redis (the ``redis_url`` DB of the test).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import redis as sync_redis
from redis.exceptions import NoPermissionError, ResponseError

from dispatcher import cancel_run
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from dispatcher.stream.cancel_keys import CANCEL_SIGNAL, CANCELLED_RUNS
from tests.faults.harness import ROOT, Pipeline
from tests.faults.load import LoadSpec
from tests.fix_redis import documented_acl, user_url
from tests.waiting import eventually_sync


@pytest.fixture
def make_pipeline(
    own_pg_db_url: str, redis_url: str, tmp_path: Path
) -> Iterator[Callable[[str], Pipeline]]:
    made: list[Pipeline] = []

    def make(admin_url: str) -> Pipeline:
        p = Pipeline(
            scenario="security",
            db_url=own_pg_db_url,
            redis_url=admin_url,
            recorder_url=redis_url,
            workdir=tmp_path,
        )
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop_all()


def test_enqueuer_and_worker_run_as_the_documented_acl_users(
    acl_redis: tuple[RedisProcess, dict[str, str]], make_pipeline: Callable[[str], Pipeline]
) -> None:
    server, passwords = acl_redis
    p = make_pipeline(server.url)
    enq = user_url(server.port, "dispatcher-enqueuer", passwords["dispatcher-enqueuer"])
    wrk = user_url(server.port, "dispatcher-worker", passwords["dispatcher-worker"])
    p.enqueuer(redis_url=enq)
    # Queue limits (not binding): the workers take and free slots and tokens as their user.
    limits = '{"max_in_flight": 1000, "rate": 100000, "burst": 1000}'
    p.redis.set(f"composer:limits:{{{p.queue}}}", limits)
    p.worker("--max-deliveries", "2", "--reclaim-idle", "0.5", redis_url=wrk)
    p.worker("--max-deliveries", "2", "--reclaim-idle", "0.5", redis_url=wrk)
    p.start_load(LoadSpec(tasks=300, rate=150, poison_every=50))
    with psycopg.connect(p.db_url) as conn:  # relayed by the enqueuer, read by the workers
        cancel_run(conn, "run-of-nothing")
    p.verify(within=120)
    dead = p.redis.xlen(f"workflow.dead.{p.queue}")
    assert dead == len(p.load.poison) > 0 if p.load else False  # dead letters written too
    assert p.redis.zscore(CANCELLED_RUNS, "run-of-nothing") is not None
    assert server.cli("ACL", "LOG") == "", "no command or key was denied"

    as_enqueuer = sync_redis.Redis.from_url(enq, decode_responses=True)
    as_worker = sync_redis.Redis.from_url(wrk, decode_responses=True)
    stream = f"workflow.tasks.{p.queue}.0"
    for client, command in [
        (as_enqueuer, ("XREADGROUP", "GROUP", "workers", "x", "STREAMS", stream, ">")),
        (as_enqueuer, ("GET", "dispatcher:lease:x")),
        (as_enqueuer, ("SCAN", "0")),
        (as_enqueuer, ("SET", "dispatcher:lease:x", "1")),
        (as_worker, ("SET", "composer:stream_shards", "1")),
        (as_worker, ("SET", f"composer:limits:{{{p.queue}}}", "{}")),
        (as_worker, ("SET", "app:secret", "1")),
        (as_worker, ("XADD", "other.stream", "*", "a", "b")),
        (as_worker, ("ZADD", CANCELLED_RUNS, "1", "run")),
        (as_worker, ("XADD", CANCEL_SIGNAL, "*", "a", "b")),
    ]:
        with pytest.raises(NoPermissionError):
            client.execute_command(*command)
    for client in (as_enqueuer, as_worker):
        for command in (("KEYS", "*"), ("FLUSHALL",), ("CONFIG", "GET", "*"), ("MONITOR",)):
            with pytest.raises(NoPermissionError):
                client.execute_command(*command)
        client.close()


def _tls_certs(workdir: Path) -> dict[str, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    paths = {n: workdir / f"{n}" for n in ("ca.key", "ca.crt", "server.key", "server.crt")}
    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], capture_output=True, check=True, timeout=60)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(paths["ca.key"]),
        "-out",
        str(paths["ca.crt"]),
        "-days",
        "1",
        "-subj",
        "/CN=od-test-ca",
    )
    csr = workdir / "server.csr"
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(paths["server.key"]),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(paths["ca.crt"]),
        "-CAkey",
        str(paths["ca.key"]),
        "-CAcreateserial",
        "-out",
        str(paths["server.crt"]),
        "-days",
        "1",
        "-extfile",
        str(workdir / "san.ext"),
    )
    return paths


def test_enqueuer_and_worker_over_tls_with_acl_users(
    tmp_path: Path, make_pipeline: Callable[[str], Pipeline]
) -> None:
    if not shutil.which("openssl"):
        pytest.skip("no openssl CLI to make certificates")
    certs = _tls_certs(tmp_path / "tls")
    tls_port = RedisProcess(tmp_path / "unused").port
    server = RedisProcess(
        tmp_path / "tls-redis",
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(certs["server.crt"]),
        "--tls-key-file",
        str(certs["server.key"]),
        "--tls-ca-cert-file",
        str(certs["ca.crt"]),
        "--tls-auth-clients",
        "no",
    )
    try:
        server.start()
    except (AssertionError, OSError):
        pytest.skip("this redis-server was built without TLS")
    try:
        passwords = {
            "dispatcher-enqueuer": "tls-enq",
            "dispatcher-worker": "tls-wrk",
            "dispatcher-operator": "tls-op",
        }
        admin = sync_redis.Redis(port=server.port)
        for args in documented_acl(passwords):
            admin.execute_command("ACL", "SETUSER", *args)
        admin.close()
        query = f"?ssl_ca_certs={quote(str(certs['ca.crt']))}&ssl_cert_reqs=required"
        p = make_pipeline(server.url)
        p.enqueuer(redis_url=user_url(tls_port, "dispatcher-enqueuer", "tls-enq", "rediss", query))
        p.worker(redis_url=user_url(tls_port, "dispatcher-worker", "tls-wrk", "rediss", query))
        p.start_load(LoadSpec(tasks=150, rate=150))
        p.verify(within=120)
        clients = sync_redis.Redis(port=server.port).client_list()
        users = {c["user"] for c in clients}
        assert {"dispatcher-enqueuer", "dispatcher-worker"} <= users
        # A client that does not trust the CA is refused: it really is TLS, verified.
        with pytest.raises(sync_redis.exceptions.ConnectionError):
            sync_redis.Redis.from_url(f"rediss://127.0.0.1:{tls_port}/0").ping()
    finally:
        server.kill()


def test_passwords_never_appear_in_logs(
    acl_redis: tuple[RedisProcess, dict[str, str]],
    make_pipeline: Callable[[str], Pipeline],
    pg_process: PostgresProcess,
    own_pg_db_url: str,
    tmp_path: Path,
) -> None:
    server, passwords = acl_redis
    pg_password = f"pg-{uuid.uuid4().hex}"
    database = psycopg.conninfo.conninfo_to_dict(own_pg_db_url)["dbname"]
    db_with_password = pg_process.url(str(database), password=pg_password)
    closed_port = RedisProcess(tmp_path / "closed").port
    secrets = [pg_password, *passwords.values()]
    enq_ok = user_url(server.port, "dispatcher-enqueuer", passwords["dispatcher-enqueuer"])
    wrk_ok = user_url(server.port, "dispatcher-worker", passwords["dispatcher-worker"])
    bad_password = user_url(server.port, "dispatcher-worker", passwords["dispatcher-enqueuer"])
    bad_db = f"postgresql://postgres:{pg_password}@127.0.0.1:{closed_port}/x?connect_timeout=2"

    refused = [  # a wrong password: one line, exit 1
        _run("enqueuer", database_url=db_with_password, redis_url=bad_password),
        _run("worker", database_url=db_with_password, redis_url=bad_password),
    ]
    for code, text in refused:
        assert code != 0, text
        assert "dispatcher " in text, text
        assert "cannot reach" in text or "invalid" in text, text
    down = [  # nothing listening: retried with the cause until SIGTERM
        _run("enqueuer", database_url=bad_db, redis_url=enq_ok),
        _run(
            "enqueuer",
            database_url=db_with_password,
            redis_url=enq_ok.replace(str(server.port), str(closed_port)),
        ),
        _run(
            "worker",
            database_url=db_with_password,
            redis_url=wrk_ok.replace(str(server.port), str(closed_port)),
        ),
    ]
    for code, text in down:
        assert code == 0, text
        assert "failed (" in text, text
        assert "trying again" in text, text
    outputs = refused + down

    p = make_pipeline(server.url)
    debug = {"LOG_LEVEL": "DEBUG", "DATABASE_URL": db_with_password}
    enqueuer = p.enqueuer(redis_url=enq_ok, env=debug)
    worker = p.worker(redis_url=wrk_ok, env=debug)
    p.start_load(LoadSpec(tasks=100, rate=100))
    p.verify(within=120)
    p.stop_all()
    logs = [enqueuer.log.read_text(), worker.log.read_text()]
    assert any("DEBUG" in log for log in logs), "ran at DEBUG"

    for text in [t for _, t in outputs] + logs:
        for secret in secrets:
            assert secret not in text, text[-3000:]
            assert quote(secret, safe="") not in text, text[-3000:]
            assert not re.search(r"://[^/\s:]+:[^@/\s*]+@", text), text[-3000:]


def _run(command: str, *, database_url: str, redis_url: str) -> tuple[int, str]:
    """Run ``dispatcher <command>`` until it exits, or until it says it will try again (then
    SIGTERM it); its exit code and everything it printed."""
    flags = {
        "enqueuer": ["--no-listen"],
        "worker": ["--queue", "q", "--handler", "tests.handlers:record"],
    }[command]
    env = {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "LOG_LEVEL": "DEBUG",
        "PATH": "/usr/bin:/bin",
    }
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", command, *flags],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def printed() -> str:
            out.seek(0)
            return out.read()

        try:
            eventually_sync(
                lambda: proc.poll() is not None or "trying again" in printed(), within=60
            )
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return code, printed()


def test_a_worker_whose_user_may_not_read_the_clock_stops_at_start_saying_so(
    acl_redis: tuple[RedisProcess, dict[str, str]], outbox_db_url: str
) -> None:
    """The worker ACL of 0.1.0 had no +time, which leases are timed by: without the check
    the worker would start and every claim fail, its entries pending for good."""
    server, passwords = acl_redis
    admin = sync_redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "dispatcher-worker", "-time")
    admin.close()
    url = user_url(server.port, "dispatcher-worker", passwords["dispatcher-worker"])

    code, text = _run("worker", database_url=outbox_db_url, redis_url=url)

    assert code == 2, text
    assert "may not run TIME" in text, text
    assert "add +time to its ACL" in text, text


def test_documented_acl_lines_parse(acl_redis: tuple[RedisProcess, dict[str, str]]) -> None:
    server, _ = acl_redis
    users = server.cli("ACL", "USERS").split()
    assert {"dispatcher-enqueuer", "dispatcher-worker", "dispatcher-operator"} <= set(users)
    with pytest.raises(ResponseError):
        sync_redis.Redis(port=server.port).execute_command("ACL", "SETUSER", "x", "+nosuchcmd")
