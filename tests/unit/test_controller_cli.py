"""``dispatcher operator``: flags and the one-line errors, without a cluster."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.cli.main import build_parser, main


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """``main`` points the root logger at the captured stderr: put pytest's back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_operator_needs_a_scope(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dispatcher operator: pass --namespace NS (repeatable) or --all-namespaces"
    )


def test_operator_rejects_a_bad_interval(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["operator", "-A", "--autoscale-interval", "0"])
    assert exit.value.code == 2
    assert "argument --autoscale-interval: must be > 0, got 0" in capsys.readouterr().err


def test_the_old_liveness_flag_says_where_the_probe_went(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A manifest of an older release passes ``--liveness``: it fails in one line that says
    what to do, not with argparse's "unrecognized arguments"."""
    assert main(["operator", "-A", "--liveness=http://0.0.0.0:8080/healthz"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dispatcher operator: --liveness is gone: /healthz is served with /readyz and /metrics "
        "on --metrics-port (env METRICS_PORT); point the liveness probe there"
    )
    with pytest.raises(SystemExit):
        main(["operator", "--help"])
    help = capsys.readouterr().out
    assert "--metrics-port" in help
    assert "--liveness" not in help


def test_operator_flags() -> None:
    args = build_parser().parse_args(["operator", "-n", "a", "--namespace", "b"])
    assert args.namespaces == ["a", "b"]
    assert args.all_namespaces is False
    assert args.leader_election is True
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "-n", "a", "-A"])
    with pytest.raises(SystemExit):  # kopf's peering paused nothing: the Lease replaced it
        build_parser().parse_args(["operator", "-n", "a", "--peering", "p"])


def test_the_lease_is_in_the_pods_namespace_or_the_one_watched(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatcher.cli.operator import lease_config

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("POD_NAME", "op-7d9f-x2")

    def lease(*argv: str) -> Any:
        return lease_config(build_parser().parse_args(["operator", *argv]))

    found = lease("-n", "prod")
    assert (found.name, found.namespace, found.identity) == (
        "outbox-dispatcher-operator",
        "prod",
        "op-7d9f-x2",
    )
    assert lease("-A", "--lease-namespace", "ops", "--lease-name", "l").namespace == "ops"
    assert lease("-n", "a", "--no-leader-election") is None
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    assert lease("-A").namespace == "ops"
    monkeypatch.delenv("POD_NAMESPACE")
    assert main(["operator", "-n", "a", "-n", "b"]) == 2
    assert "pass --lease-namespace NS (or --no-leader-election)" in capsys.readouterr().err


def test_exact_namespaces_turn_kopf_scanning_off() -> None:
    from dispatcher.cli.operator import operator_settings

    assert operator_settings(["prod"], all_namespaces=False).scanning.disabled is True
    assert operator_settings(["team-*"], all_namespaces=False).scanning.disabled is False
    assert operator_settings([], all_namespaces=True).scanning.disabled is True


def test_workload_images_come_from_flags_then_env_then_the_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dispatcher.controller.model import DEFAULT_VERSION_TAG
    from dispatcher.controller.operator_config import OperatorConfig

    args = build_parser().parse_args(["operator", "-A", "--worker-image", "reg/w:9"])
    assert (args.enqueuer_image, args.worker_image) == (None, "reg/w:9")
    monkeypatch.setenv("DISPATCHER_ENQUEUER_IMAGE", "reg/enq:8")
    monkeypatch.delenv("DISPATCHER_WORKER_IMAGE", raising=False)
    found = OperatorConfig(worker_image=args.worker_image).workloads()
    assert (found.enqueuer_image, found.worker_image) == ("reg/enq:8", "reg/w:9")
    monkeypatch.delenv("DISPATCHER_ENQUEUER_IMAGE")
    found = OperatorConfig().workloads()
    assert found.enqueuer_image == f"outbox-dispatcher-enqueuer:{DEFAULT_VERSION_TAG}"
    assert found.run_as_user is None
