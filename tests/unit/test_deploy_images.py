"""The three Dockerfiles, the build context and ``skaffold.yaml``, checked without a Docker engine.

Each Dockerfile must parse, build the project as a wheel in a first stage, and end in a final
stage on a version-pinned slim Python that carries no build tools, runs as a non-root numeric
user and enters a real ``dispatcher`` subcommand.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from dispatcher.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
IMAGE_UID = 10001
IMAGES = {
    "outbox-dispatcher-operator": ("deploy/images/operator/Dockerfile", "operator"),
    "outbox-dispatcher-enqueuer": ("deploy/images/enqueuer/Dockerfile", "enqueuer"),
    "outbox-dispatcher-worker": ("deploy/images/worker/Dockerfile", "worker"),
}
PINNED_SLIM_PYTHON = re.compile(r"^python:3\.\d+\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|build-essential|cargo|rustc|apt-get|apk)\b")


def _stages(path: str) -> list[list[dict[str, Any]]]:
    """The Dockerfile's instructions, split into stages (ARGs before the first FROM dropped)."""
    parser = DockerfileParser(str(ROOT / path))
    stages: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _base(path: str, from_value: str) -> str:
    """The image a FROM names, with ``${ARG}`` defaults of the global ARGs substituted."""
    image = from_value.split()[0]
    for instruction in DockerfileParser(str(ROOT / path)).structure:
        if instruction["instruction"] == "FROM":
            break
        if instruction["instruction"] == "ARG" and "=" in instruction["value"]:
            name, _, default = instruction["value"].partition("=")
            image = image.replace(f"${{{name}}}", default).replace(f"${name}", default)
    return image


def _subcommands() -> set[str]:
    parser = build_parser()
    choices: set[str] = set()
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        choices.update(getattr(action, "choices", None) or {})
    return choices


@pytest.mark.parametrize(("image", "spec"), IMAGES.items(), ids=list(IMAGES))
def test_dockerfile_is_multi_stage_from_a_pinned_slim_python(
    image: str, spec: tuple[str, str]
) -> None:
    path, _ = spec
    stages = _stages(path)
    assert len(stages) >= 2, f"{path}: build and final stages expected"
    for stage in stages:
        base = _base(path, stage[0]["value"])
        assert PINNED_SLIM_PYTHON.match(base), f"{path}: {base!r} is not a pinned slim Python"


@pytest.mark.parametrize(("image", "spec"), IMAGES.items(), ids=list(IMAGES))
def test_project_is_built_as_a_wheel_and_only_the_venv_reaches_the_final_stage(
    image: str, spec: tuple[str, str]
) -> None:
    path, _ = spec
    *build, final = _stages(path)
    build_runs = " ".join(i["value"] for stage in build for i in stage if i["instruction"] == "RUN")
    assert "pip wheel" in build_runs
    assert re.search(r"pip install [^&]*\.whl", build_runs), "install the built wheel"
    copies = [i["value"] for i in final if i["instruction"] == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv"], copies
    final_runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    assert not BUILD_TOOLS.search(final_runs), f"{path}: build tooling in the final stage"
    assert "pip install" not in final_runs


@pytest.mark.parametrize(("image", "spec"), IMAGES.items(), ids=list(IMAGES))
def test_final_stage_runs_as_the_non_root_uid_the_operator_pods_use(
    image: str, spec: tuple[str, str]
) -> None:
    path, _ = spec
    final = _stages(path)[-1]
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    assert users, f"{path}: the final stage sets no USER (root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), "numeric, so runAsNonRoot can verify it"
    # The chart's podSecurityContext example and the worker recipe in the README name this UID.
    assert int(uid) == IMAGE_UID
    assert not gid or int(gid) == IMAGE_UID
    last = max(n for n, i in enumerate(final) if i["instruction"] == "USER")
    assert not [i for i in final[last:] if i["instruction"] == "RUN"], "RUN after USER"


@pytest.mark.parametrize(("image", "spec"), IMAGES.items(), ids=list(IMAGES))
def test_entrypoint_is_the_matching_dispatcher_subcommand(
    image: str, spec: tuple[str, str]
) -> None:
    path, subcommand = spec
    final = _stages(path)[-1]
    entrypoints = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    argv = json.loads(entrypoints[0])  # exec form: signals reach the process
    assert argv == ["dispatcher", subcommand]
    assert subcommand in _subcommands()
    title = DockerfileParser(str(ROOT / path)).labels["org.opencontainers.image.title"]
    assert title == image


def test_worker_image_documents_building_a_handler_image_from_it() -> None:
    text = (ROOT / IMAGES["outbox-dispatcher-worker"][0]).read_text()
    assert "FROM outbox-dispatcher-worker:" in text
    assert "handler:" in text
    assert "USER 10001:10001" in text


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
    for path, _ in IMAGES.values():
        for stage in _stages(path):
            for copy in (i["value"] for i in stage if i["instruction"] == "COPY"):
                if copy.startswith("--from"):
                    continue
                for source in copy.split()[:-1]:
                    assert (ROOT / source).exists(), source
                    assert not _ignored(source.rstrip("/"), patterns), f"{source} is ignored"
    for noise in (".venv", ".git", "tests", "benchmarks", "charts"):
        assert _ignored(noise, patterns), f"{noise} would be sent to the builder"


def test_skaffold_builds_the_three_images_and_deploys_the_chart() -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    assert config["apiVersion"].startswith("skaffold/v4")
    assert config["kind"] == "Config"
    artifacts = {a["image"]: a for a in config["build"]["artifacts"]}
    assert set(artifacts) == set(IMAGES)
    for image, artifact in artifacts.items():
        assert artifact["docker"]["dockerfile"] == IMAGES[image][0]
        assert (ROOT / artifact.get("context", ".") / artifact["docker"]["dockerfile"]).is_file()
    (release,) = config["deploy"]["helm"]["releases"]
    assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
    templates = " ".join(release["setValueTemplates"].values())
    for image in IMAGES:
        assert image.replace("-", "_") in templates, f"{image} is built but never deployed"
    (kind,) = [p for p in config["profiles"] if p["name"] == "kind"]
    assert kind["build"]["local"]["push"] is False
