"""The KEDA example of docs/kubernetes.md: it scales the right Deployment on every shard."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from dispatcher.controller.identity import Owner, worker_name
from dispatcher.stream.naming import task_stream

README = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def test_keda_example_sums_every_shard_of_the_queue() -> None:
    text = README.read_text()
    section = text[text.index("**Hand scaling to KEDA") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    scaled, auth = list(yaml.safe_load_all(block.group(1)))
    assert (scaled["kind"], auth["kind"]) == ("ScaledObject", "TriggerAuthentication")
    owner = Owner(name="example", namespace="outbox-dispatcher", uid="u")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker_name(owner, "emails")
    triggers = scaled["spec"]["triggers"]
    streams = [t["metadata"]["stream"] for t in triggers]
    assert streams == [task_stream("emails", s) for s in range(4)]
    assert {t["type"] for t in triggers} == {"redis-streams"}
    assert all("streamLength" in t["metadata"] for t in triggers)
    formula = scaled["spec"]["advanced"]["scalingModifiers"]["formula"]
    assert sorted(term.strip() for term in formula.split("+")) == sorted(
        t["name"] for t in triggers
    )
    assert {t["authenticationRef"]["name"] for t in triggers} == {auth["metadata"]["name"]}
