"""Plain conversion of the CLI's scalar options, so a command never imports pydantic.

Typer (from 0.2x) converts every non-flag parameter through a pydantic ``TypeAdapter``,
built on first use; importing pydantic and building adapters costs more than the rest of a
command's start-up together, and the start-up budget (``intloom runs --json`` within 1.3x of
``import typer``) cannot absorb it. Every parameter intloom declares is a ``str``, ``Path``,
``int`` or ``float`` (with an optional range), which needs no schema machinery, so each one
gets a small converter here. This uses Typer internals (``_runtime_param``); on a Typer that
lacks them nothing is installed and Typer's own conversion applies, which is correct, only
slower (tests/unit/test_cli_support.py notices: a query must not import pydantic).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["install"]

try:
    from typer._click.exceptions import BadParameter
    from typer._coercion import RuntimeParam
except ImportError:  # a Typer without the adapter layer: nothing to replace
    RuntimeParam = None  # type: ignore[assignment, misc]

_SCALARS = (str, Path, int, float, bool)
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


def _number(kind: type[Any], value: Any, low: Any, high: Any) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        name = "an integer" if kind is int else "a number"
        raise ValueError(f"{value!r} is not {name}.") from None
    if kind is float and not -math.inf < number < math.inf:  # nan, inf: no range holds them
        raise ValueError(f"{value!r} is not a finite number.")
    if (low is not None and number < low) or (high is not None and number > high):
        low_text = f"{_shown(low)}<=" if low is not None else ""
        high_text = f"<={_shown(high)}" if high is not None else ""
        raise ValueError(f"{_shown(number)} is not in the range {low_text}x{high_text}.")
    return number


def _shown(number: Any) -> str:
    """A float as a person writes it: 1e+09 and -1, not 1000000000.0 and -1.0; all its
    digits when six do not hold it (1000000001 past a bound of 1e+09 read "1e+09")."""
    if not isinstance(number, float):
        return str(number)
    short = f"{number:g}"
    if float(short) == number:
        return short
    return str(int(number)) if number.is_integer() else repr(number)


def _flag(value: Any, param: Any, ctx: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BadParameter(f"{value!r} is not a valid boolean.", ctx=ctx, param=param)


if RuntimeParam is not None:

    # No @dataclass of its own: it adds no field, and RuntimeParam's methods serve it (the
    # decorator made them again, ~1 ms of every command's start-up).
    class _Scalar(RuntimeParam):
        """str / Path / int / float, with the parameter's min and max."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kind = self.annotation
            if kind is str:
                return str(value)
            if kind is Path:
                return value if isinstance(value, Path) else Path(value)
            if kind is bool:
                return _flag(value, param, ctx)
            info = self.parameter_info
            try:
                return _number(kind, value, info.min, info.max)
            except ValueError as exc:
                raise BadParameter(str(exc), ctx=ctx, param=param) from None


def _plain(param: Any) -> None:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", True) is not None:
        return
    info = descriptor.parameter_info
    if (
        descriptor.annotation in _SCALARS
        and descriptor.file_annotation is None
        and info.parser is None
    ):
        param._runtime_param = _Scalar(parameter_info=info, annotation=descriptor.annotation)


def install(command: Any) -> None:
    """Give every scalar parameter of ``command`` and its subcommands the plain converter."""
    if RuntimeParam is None:
        return
    for param in getattr(command, "params", []):
        _plain(param)
    # The help option is made on first use, per command; convert it plainly too.
    original = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = original(ctx)
        if option is not None:
            _plain(option)
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        install(sub)
