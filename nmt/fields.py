"""Typed fields declared once: `opt` attaches a field's help (and command-line flags) to a
dataclass field, and `coerce` checks a value read from YAML or the command line against the
field's type. The config sections (nmt.config) and the commands' options (nmt.options) are
declared with them; docs/config.md and the CLI's flags are made from what they attach.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

from nmt.errors import ConfigError

REQUIRED: Any = dataclasses.MISSING  # opt(REQUIRED, ...): a field without a default


def opt(default: Any, help: str, *, flags: tuple[str, ...] = (), cli: bool = True) -> Any:
    """A dataclass field with its help text attached: `docs/config.md` and the command-line
    options made from a dataclass (nmt.cli) both read it. `flags` names the option where
    `--field-name` alone will not do (e.g. ("--input", "-i")); `cli=False` keeps a field off
    the command line."""
    return field(default=default, metadata={"help": help, "flags": flags, "cli": cli})


def opt_list(help: str, *, flags: tuple[str, ...] = ()) -> Any:
    """`opt` for a list option (repeatable on the command line), empty by default."""
    return field(default_factory=list, metadata={"help": help, "flags": flags, "cli": True})


def coerce(value: Any, tp: Any, key: str, where: str, *, strings: bool = True) -> Any:
    """Check `value` against the field type `tp`; return it converted where lossless. A float
    may be given as a str (YAML 1.1 reads `5e-4` as one) unless `strings` is False (Python
    arguments: a number is a number, as for int and bool)."""

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key} must be {expected}, got {value!r}")

    if get_origin(tp) is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise bad("one of " + ", ".join(repr(c) for c in choices))
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad("an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if strings and isinstance(value, str):  # YAML 1.1 reads `5e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise bad("a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad("a string")
    raise AssertionError(f"unsupported config type {tp!r} for {key}")  # pragma: no cover


def coerce_option(cls: type, key: str, value: Any, where: str) -> Any:
    """`value` checked against the type of field `key` of the dataclass `cls` (bool, int,
    float, str or a Literal; other types pass), for a keyword argument `key=` of `where`:
    the types as Python has them, no str for a number."""
    tp = typing.get_type_hints(cls)[key]
    if tp in (bool, int, float, str) or get_origin(tp) is Literal:
        return coerce(value, tp, f"{key}=", where, strings=False)
    return value
