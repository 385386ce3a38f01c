"""``skaffold.yaml``: the ``kind`` profile builds, loads and substitutes all three images.

skaffold rewrites and ``kind load``s only the images it finds in the manifests it deploys, and
by default it looks only inside built-in workload kinds. The enqueuer and worker images appear
only inside the ``OutboxDispatcher``, so skaffold must be told (a ``resourceSelector`` allow rule)
or their pods pull images that were never loaded. Checked here without skaffold: the chart is
rendered with the values the kind profile passes (skaffold's templates filled in), and every image
the rendered resources name must be one skaffold builds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.chart import render

ROOT = Path(__file__).resolve().parents[2]
TAG = "e2e1234"


def _config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    return config


def _built() -> set[str]:
    return {a["image"] for a in _config()["build"]["artifacts"]}


def _fill(template: str) -> str:
    """skaffold's Go template variables, as it fills them for a local build."""

    def value(match: re.Match[str]) -> str:
        kind, image = match.group(1), match.group(2).replace("_", "-")
        return {"REPO": image, "TAG": TAG, "FULLY_QUALIFIED": f"{image}:{TAG}"}[kind]

    return re.sub(r"\{\{\s*\.IMAGE_(REPO|TAG|FULLY_QUALIFIED)_([a-z_]+)\s*\}\}", value, template)


def _set(values: dict[str, Any], dotted: str, value: Any) -> None:
    """Helm's ``--set a.b[0].c=v`` into ``values``."""
    node: Any = values
    parts = re.findall(r"([^.\[\]]+)(?:\[(\d+)\])?", dotted)
    for i, (key, index) in enumerate(parts):
        last = i == len(parts) - 1
        if index:
            items = node.setdefault(key, [])
            while len(items) <= int(index):
                items.append({})
            if last:
                items[int(index)] = value
            node = items[int(index)]
        elif last:
            node[key] = value
        else:
            node = node.setdefault(key, {})


def kind_profile_values() -> dict[str, Any]:
    """The chart values `skaffold dev -p kind` passes."""
    config = _config()
    (release,) = config["deploy"]["helm"]["releases"]
    (profile,) = [p for p in config["profiles"] if p["name"] == "kind"]
    values: dict[str, Any] = {}
    for key, template in release["setValueTemplates"].items():
        _set(values, key, _fill(template))
    for patch in profile.get("patches", []):
        if patch["path"] == "/deploy/helm/releases/0/setValues":
            for key, value in patch["value"].items():
                _set(values, key, value)
    return values


WORKLOAD_IMAGE_ENV = {"DISPATCHER_ENQUEUER_IMAGE", "DISPATCHER_WORKER_IMAGE"}


def _images(obj: Any) -> list[str]:
    """Every ``image:`` value anywhere in ``obj``, and the workload images the operator is
    given in its environment."""
    if isinstance(obj, dict):
        found = [v for k, v in obj.items() if k == "image" and isinstance(v, str)]
        if obj.get("name") in WORKLOAD_IMAGE_ENV and isinstance(obj.get("value"), str):
            found.append(obj["value"])
        return found + [i for v in obj.values() for i in _images(v)]
    if isinstance(obj, list):
        return [i for v in obj for i in _images(v)]
    return []


def _repository(image: str) -> str:
    return image.split("@", 1)[0].rsplit(":", 1)[0]


def test_skaffold_is_told_to_rewrite_and_load_images_inside_the_custom_resource() -> None:
    selector = _config().get("resourceSelector") or {}
    rules = {rule["groupKind"]: rule for rule in selector.get("allow", [])}
    assert "OutboxDispatcher.dispatch.composer.dev" in rules, selector
    assert ".*" in rules["OutboxDispatcher.dispatch.composer.dev"]["image"]


def test_every_image_the_kind_profile_deploys_is_one_skaffold_builds() -> None:
    objects = render(kind_profile_values())
    (cr,) = [o for o in objects if o["kind"] == "OutboxDispatcher"]
    assert _images(cr) == []  # its pods follow the operator's workload images
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    assert len(_images(operator)) == 3  # its own, the enqueuer's and the worker's
    every = [i for o in objects for i in _images(o)]
    assert {_repository(i) for i in every} == _built()
    assert all(i.endswith(f":{TAG}") for i in every), every
