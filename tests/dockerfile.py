"""The repository's Dockerfile read as stages, without a Docker engine: what each target is
built on, which stage builds the wheel and what it is built from (``tests.unit.test_deploy_images``,
``tests.integration.test_wheel``, ``tests.e2e.test_kind``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

__all__ = ["DOCKERFILE", "ROOT", "Stage", "build_sources", "chain", "copied_from", "stages",
           "wheel_stage"]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = "Dockerfile"


@dataclass
class Stage:
    name: str
    parent: str  # the image or the earlier stage it starts FROM
    instructions: list[dict[str, Any]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [i["value"] for i in self.instructions if i["instruction"] == instruction]


def stages(path: str = DOCKERFILE) -> dict[str, Stage]:
    """The Dockerfile's stages by name, ``${ARG}`` defaults of the global ARGs substituted."""
    found: dict[str, Stage] = {}
    args: dict[str, str] = {}
    current: Stage | None = None
    for instruction in DockerfileParser(str(ROOT / path)).structure:
        kind, value = instruction["instruction"], instruction["value"]
        if kind == "ARG" and current is None and "=" in value:
            name, _, default = value.partition("=")
            args[name] = default
        elif kind == "FROM":
            words = value.split()
            parent = words[0]
            for name, default in args.items():
                parent = parent.replace(f"${{{name}}}", default).replace(f"${name}", default)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(found))
            current = found[name] = Stage(name=name, parent=parent)
        elif current is not None and kind != "COMMENT":
            current.instructions.append(instruction)
    return found


def chain(target: str, found: dict[str, Stage] | None = None) -> list[Stage]:
    """The stages a target is built on, from the one that starts from an image to ``target``."""
    found = found if found is not None else stages()
    line = [found[target]]
    while line[0].parent in found:
        line.insert(0, found[line[0].parent])
    return line


def copied_from(stage: Stage) -> list[str]:
    """The stages a stage copies from (``COPY --from=...``)."""
    return [v.split()[0].removeprefix("--from=") for v in stage.values("COPY") if "--from=" in v]


def wheel_stage(found: dict[str, Stage] | None = None) -> Stage:
    """The one stage that builds the project's wheel."""
    found = found if found is not None else stages()
    (stage,) = [s for s in found.values() if any("pip wheel" in r for r in s.values("RUN"))]
    return stage


def build_sources() -> list[str]:
    """What the wheel is built from: the repository paths the wheel stage copies in."""
    return [
        source.rstrip("/")
        for copy in wheel_stage().values("COPY")
        if not copy.startswith("--")
        for source in copy.split()[:-1]
    ]
