"""argparse flags derived from ``Option`` values: one bound check, one help format.

Every numeric flag parses with ``number``: a finite value within the option's
bounds, else argparse's one error line naming the flag. Every help line ends
with the default (``(default: 30)``), or the env variable the flag overrides
and the default behind it (``(env STREAM_SHARDS, default: 4)``); a flag that
overrides the environment has no argparse default, so the environment still
counts when the flag is not given.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from typing import Any

from dispatcher.options import Option, bound_error, options

__all__ = ["add_options", "help_text", "number", "option_values"]


def number(
    kind: type[float] | type[int],
    minimum: float | None = 0,
    *,
    above: bool = False,
    maximum: float | None = None,
) -> Callable[[str], Any]:
    """argparse ``type=``: a finite ``kind`` within the bounds, else one clear error."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):  # nan/inf would spin or disable a timer
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if error := bound_error(value, minimum=minimum, above=above, maximum=maximum):
            raise argparse.ArgumentTypeError(error)
        return value

    return parse


class _NumberAction(argparse.Action):
    """Store a parsed number; refuse what ``type=`` never saw.

    Python 3.11's argparse drops a ``--`` value (``--batch-size=--``) before ``type=`` runs
    and stores ``[]``; this turns that into the usual one-line usage error.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if isinstance(values, bool) or not isinstance(values, int | float):
            parser.error(f"argument {'/'.join(self.option_strings)}: expected one number")
        setattr(namespace, self.dest, values)


def help_text(opt: Option) -> str:
    """The option's help with its default, as ``--help`` prints it."""
    if opt.kind is bool and not opt.env:  # a switch: off unless given
        return opt.help
    default = opt.default_text
    if opt.env:
        tail = f"env {opt.env}, default: {default}" if default else f"env {opt.env}"
    else:
        tail = f"default: {default}" if default else ""
    return f"{opt.help} ({tail})" if tail else opt.help


def add_options(group: Any, opts: Iterable[Option]) -> None:
    """Add one flag per option to an argparse parser or argument group."""
    for opt in opts:
        group.add_argument(*opt.flags, **_arguments(opt))


def option_values(args: argparse.Namespace, config: type[Any]) -> dict[str, Any]:
    """The parsed value of every option of a config dataclass, by field name."""
    return {name: getattr(args, name) for name in options(config)}


def _arguments(opt: Option) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "dest": opt.name,
        "help": help_text(opt).replace("%", "%%"),
        # A flag over an env variable leaves the value to Settings when it is not given.
        "default": None if opt.env else opt.default,
    }
    if opt.kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction if opt.env else "store_true"
        return kwargs
    if opt.kind is int or opt.kind is float:
        kwargs["type"] = number(opt.kind, opt.minimum, above=opt.above, maximum=opt.maximum)
        kwargs["action"] = _NumberAction
    if opt.choices:
        kwargs["choices"] = opt.choices
    if opt.required:
        kwargs["required"] = True
    if opt.repeat:
        kwargs["action"] = "append"
    return kwargs
