"""Our images' entrypoints, read from the project's Dockerfile: the command of a container
that names none (``image: outbox-dispatcher-operator:TAG`` runs ``dispatcher operator``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["entrypoints", "image_stage"]

_STAGE = re.compile(r"^FROM\s+\S+\s+AS\s+(\S+)", re.IGNORECASE)
_ENTRYPOINT = re.compile(r"^ENTRYPOINT\s+(\[.*\])\s*$", re.IGNORECASE)
_IMAGE_PREFIX = "outbox-dispatcher-"


def entrypoints(dockerfile: Path) -> dict[str, list[str]]:
    """Each build stage's ENTRYPOINT (exec form), by stage name."""
    found: dict[str, list[str]] = {}
    stage = ""
    for line in dockerfile.read_text().splitlines():
        if match := _STAGE.match(line):
            stage = match.group(1)
        elif (match := _ENTRYPOINT.match(line)) and stage:
            found[stage] = list(json.loads(match.group(1)))
    return found


def image_stage(image: str) -> str | None:
    """The Dockerfile stage an image of ours was built from (``registry/outbox-dispatcher-worker:1``
    is ``worker``), or None for an image that is not ours."""
    repository = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    if repository.startswith(_IMAGE_PREFIX):
        return repository.removeprefix(_IMAGE_PREFIX)
    return None
