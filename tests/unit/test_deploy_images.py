"""The Dockerfile, the build context and ``skaffold.yaml``, checked without a Docker engine.

One Dockerfile builds the three images as targets. It must parse, build the project as a
wheel in one stage that every target's venv comes from, and end each target in an image on a
version-pinned slim Python that carries no build tools, runs as a non-root numeric user and
enters a real ``dispatcher`` subcommand.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex

import pytest
import yaml

from dispatcher.cli.main import build_parser
from tests.dockerfile import DOCKERFILE, ROOT, Stage, chain, copied_from, stages, wheel_stage

IMAGE_UID = 10001
# image -> the Dockerfile target that builds it (also its `dispatcher` subcommand)
IMAGES = {
    "outbox-dispatcher-operator": "operator",
    "outbox-dispatcher-enqueuer": "enqueuer",
    "outbox-dispatcher-worker": "worker",
}
PINNED_SLIM_PYTHON = re.compile(r"^python:3\.\d+\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|build-essential|cargo|rustc|apt-get|apk)\b")


def labels(stage: Stage) -> dict[str, str]:
    pairs = [shlex.split(v) for v in stage.values("LABEL")]
    return dict(p.split("=", 1) for words in pairs for p in words)


def _subcommands() -> set[str]:
    parser = build_parser()
    choices: set[str] = set()
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        choices.update(getattr(action, "choices", None) or {})
    return choices


def test_there_is_one_dockerfile() -> None:
    found = sorted(
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*Dockerfile*")
        if not {".venv", ".git", "node_modules"} & set(p.relative_to(ROOT).parts)
    )
    assert found == [DOCKERFILE]


def test_every_stage_starts_from_a_pinned_slim_python_or_an_earlier_stage() -> None:
    found = stages()
    names = list(found)
    for index, stage in enumerate(found.values()):
        if stage.parent in found:
            assert names.index(stage.parent) < index, f"{stage.name} starts from a later stage"
        else:
            assert PINNED_SLIM_PYTHON.match(stage.parent), f"{stage.parent!r} is not pinned"


@pytest.mark.parametrize(("image", "target"), IMAGES.items(), ids=list(IMAGES))
def test_each_image_gets_only_the_venv_built_from_the_one_wheel(image: str, target: str) -> None:
    found = stages()
    wheel = wheel_stage(found)
    assert re.search(r"pip install [^&]*\.whl", " ".join(wheel.values("RUN"))), "install it"
    final = chain(target, found)
    assert wheel.name not in {s.name for s in final}, "the build stage is not in the image"
    copies = [v for stage in final for v in stage.values("COPY")]
    (copy,) = copies
    source, *paths = copy.split()
    assert paths == ["/opt/venv", "/opt/venv"]
    assert wheel in chain(source.removeprefix("--from="), found), f"{copy}: not from the wheel"
    runs = " ".join(r for stage in final for r in stage.values("RUN"))
    assert not BUILD_TOOLS.search(runs), f"{target}: build tooling in the image"
    assert "pip install" not in runs


def test_the_wheel_is_built_in_one_stage_every_image_shares() -> None:
    found = stages()
    wheel = wheel_stage(found)
    for target in IMAGES.values():
        (source,) = [s for stage in chain(target, found) for s in copied_from(stage)]
        assert chain(source, found)[0] is wheel


@pytest.mark.parametrize(("image", "target"), IMAGES.items(), ids=list(IMAGES))
def test_each_image_runs_as_the_non_root_uid_the_operator_pods_use(image: str, target: str) -> None:
    instructions = [i for stage in chain(target) for i in stage.instructions]
    users = [i["value"] for i in instructions if i["instruction"] == "USER"]
    assert users, f"{target}: no USER (root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), "numeric, so runAsNonRoot can verify it"
    # The chart's podSecurityContext example and docs/kubernetes.md's worker recipe name it.
    assert int(uid) == IMAGE_UID
    assert not gid or int(gid) == IMAGE_UID
    last = max(n for n, i in enumerate(instructions) if i["instruction"] == "USER")
    assert not [i for i in instructions[last:] if i["instruction"] == "RUN"], "RUN after USER"


@pytest.mark.parametrize(("image", "target"), IMAGES.items(), ids=list(IMAGES))
def test_each_image_enters_its_dispatcher_subcommand(image: str, target: str) -> None:
    final = chain(target)
    entrypoints = [v for stage in final for v in stage.values("ENTRYPOINT")]
    assert entrypoints, f"{target}: no ENTRYPOINT"
    argv = json.loads(entrypoints[-1])  # exec form: signals reach the process
    assert argv == ["dispatcher", target]
    assert target in _subcommands()
    assert not [v for stage in final for v in stage.values("CMD")]
    assert labels(final[-1])["org.opencontainers.image.title"] == image


def test_images_write_nothing_outside_tmp() -> None:
    """A read-only root filesystem: no bytecode written at run time, HOME on the /tmp mount."""
    for target in IMAGES.values():
        env = " ".join(v for stage in chain(target) for v in stage.values("ENV"))
        assert "PYTHONDONTWRITEBYTECODE=1" in env
        assert "HOME=/tmp" in env
    assert "--compile" in " ".join(wheel_stage().values("RUN"))


def test_a_plain_build_gives_the_worker_image_handler_images_start_from() -> None:
    assert list(stages())[-1] == "worker"


def test_the_dockerfile_documents_building_a_handler_image_from_the_worker() -> None:
    text = (ROOT / DOCKERFILE).read_text()
    assert "FROM outbox-dispatcher-worker:" in text
    assert "handler:" in text
    assert "USER 10001:10001" in text
    for target in IMAGES.values():
        assert f"--target {target}" in text


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, glob) or path.startswith(f"{glob}/"):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_images_copy_and_drops_the_rest() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    for stage in stages().values():
        for copy in stage.values("COPY"):
            if copy.startswith("--from"):
                continue
            for source in copy.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert not _ignored(source.rstrip("/"), patterns), f"{source} is ignored"
    for noise in (".venv", ".git", "tests", "benchmarks", "charts"):
        assert _ignored(noise, patterns), f"{noise} would be sent to the builder"


def test_skaffold_builds_the_three_targets_and_deploys_the_chart() -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    assert config["apiVersion"].startswith("skaffold/v4")
    assert config["kind"] == "Config"
    artifacts = {a["image"]: a for a in config["build"]["artifacts"]}
    assert set(artifacts) == set(IMAGES)
    found = stages()
    for image, artifact in artifacts.items():
        docker = artifact["docker"]
        assert docker.get("dockerfile", "Dockerfile") == DOCKERFILE
        assert (ROOT / artifact.get("context", ".") / DOCKERFILE).is_file()
        assert docker["target"] == IMAGES[image]
        assert docker["target"] in found
    (release,) = config["deploy"]["helm"]["releases"]
    assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
    templates = " ".join(release["setValueTemplates"].values())
    for image in IMAGES:
        assert image.replace("-", "_") in templates, f"{image} is built but never deployed"
    (kind,) = [p for p in config["profiles"] if p["name"] == "kind"]
    assert kind["build"]["local"]["push"] is False
