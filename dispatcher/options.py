"""One definition per user-facing setting: its default, bound, help, flag and env variable.

A config dataclass declares each setting a user can change with ``option()``
instead of a bare default, and the process settings are ``Option`` values
(``dispatcher.config``). The ``dispatcher`` flags and their ``--help``
(``dispatcher.cli.flags``), the CRD model's defaults (``dispatcher.controller.model``) and
the tables of docs/configuration.md (``dispatcher.cli.docs``) are all read from here, so they
cannot drift apart.

``minimum`` is the smallest value a user may give (with ``above``, values must
exceed it); ``maximum`` the largest. A config may take shorter timings from
code than a user may set (tests run with sub-second intervals); where the two
are the same, the config checks these very bounds (``check_bounds``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field

__all__ = [
    "Option",
    "bound_error",
    "check_bounds",
    "default_of",
    "option",
    "option_of",
    "options",
    "pydantic_field",
    "show",
]

_KEY = "dispatcher.option"
Value = int | float | str | bool | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """A setting as a user meets it: flag (and old names), env variable, default, bound, help.

    ``name`` is the attribute it sets (a config field, an argparse ``dest``).
    ``shown`` is the default as documented when it is not a plain value (a
    computed default such as ``hostname-pid``).
    """

    name: str
    kind: type[int] | type[float] | type[str] | type[bool]
    default: Value
    help: str
    flag: str = ""
    aliases: tuple[str, ...] = ()
    minimum: float | None = None
    above: bool = False
    maximum: float | None = None
    env: str | None = None
    choices: tuple[str, ...] = ()
    shown: str | None = None
    required: bool = False
    repeat: bool = False

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag or "--" + self.name.replace("_", "-"), *self.aliases)

    @property
    def default_text(self) -> str:
        return self.shown if self.shown is not None else show(self.default)

    def error(self, value: float) -> str | None:
        """Why ``value`` is out of bounds (``must be >= 1, got 0``), or None."""
        return bound_error(value, minimum=self.minimum, above=self.above, maximum=self.maximum)


def show(value: Value) -> str:
    """A default as ``--help`` and the docs print it: ``30``, ``0.85``, ``workers``, ``off``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        text = f"{value:g}"
        return text if "e" not in text else repr(value)
    return "" if value is None else str(value)


def bound_error(
    value: float, *, minimum: float | None, above: bool = False, maximum: float | None = None
) -> str | None:
    if minimum is not None and (value <= minimum if above else value < minimum):
        return f"must be {'>' if above else '>='} {show(minimum)}, got {show(value)}"
    if maximum is not None and value > maximum:
        return f"must be <= {show(maximum)}, got {show(value)}"
    return None


def option(
    default: Value,
    *,
    help: str,
    minimum: float | None = None,
    above: bool = False,
    maximum: float | None = None,
    flag: str = "",
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field whose default, bound and help are those of its flag."""
    spec = Option(
        name="",
        kind=type(default) if default is not None else str,
        default=default,
        help=help,
        flag=flag,
        aliases=aliases,
        minimum=minimum,
        above=above,
        maximum=maximum,
    )
    return dataclasses.field(default=default, metadata={_KEY: spec})


def options(config: type[Any]) -> dict[str, Option]:
    """Every ``option()`` field of a config dataclass, by field name, in field order."""
    return {
        f.name: dataclasses.replace(f.metadata[_KEY], name=f.name)
        for f in dataclasses.fields(config)
        if _KEY in f.metadata
    }


def option_of(config: type[Any], name: str) -> Option:
    return options(config)[name]


def default_of(config: type[Any], name: str) -> Any:
    """The default of one option of a config dataclass."""
    return option_of(config, name).default


def check_bounds(config: Any) -> None:
    """Raise ``ValueError`` naming the first option of ``config`` out of its bounds."""
    for name, opt in options(type(config)).items():
        value = getattr(config, name)
        if isinstance(value, int | float) and (error := opt.error(value)):
            raise ValueError(f"{name.replace('_', ' ')} {error}")


def pydantic_field(opt: Option, **overrides: Any) -> Any:
    """A pydantic ``Field`` with the option's default, bound and help (``overrides`` win)."""
    bound = "gt" if opt.above else "ge"
    kwargs: dict[str, Any] = {
        "default": opt.default,
        bound: opt.minimum,
        "le": opt.maximum,
        "description": opt.help,
    }
    if {"ge", "gt"} & overrides.keys():
        kwargs.pop(bound)
    kwargs.update(overrides)
    return Field(**{k: v for k, v in kwargs.items() if v is not None or k == "default"})
