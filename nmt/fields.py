"""Typed fields declared once: `opt` attaches a field's help, command-line flags and bounds to
a dataclass field, `coerce` checks a value read from YAML or the command line against the
field's type, and `check_bounds` every value of a dataclass against its field's bounds. The
config sections (nmt.config) and the commands' options (nmt.options) are declared with them;
docs/config.md and the CLI's flags and arguments are made from what they attach.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import reprlib
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

from nmt.errors import ConfigError

REQUIRED: Any = dataclasses.MISSING  # opt(REQUIRED, ...): a field without a default


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The values a field allows (`check_bounds`): at least / above a low end, at most / below
    a high end, one of `choices`. None (an option left unset) is always allowed."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] = ()

    def allows(self, value: Any) -> bool:
        return (
            (self.at_least is None or value >= self.at_least)
            and (self.above is None or value > self.above)
            and (self.at_most is None or value <= self.at_most)
            and (self.below is None or value < self.below)
            and (not self.choices or value in self.choices)
        )

    def rule(self) -> str:
        """The bounds in words, as errors and docs/config.md say them: "must be in [0, 1)"."""
        if self.choices:
            return "must be one of " + ", ".join(repr(c) for c in self.choices)
        low = self.at_least if self.above is None else self.above
        high = self.at_most if self.below is None else self.below
        if low is not None and high is not None:
            return (
                f"must be in {'[' if self.above is None else '('}{_number(low)}, "
                f"{_number(high)}{']' if self.below is None else ')'}"
            )
        if high is not None:
            return f"must be {'at most' if self.below is None else 'below'} {_number(high)}"
        if low == 0:
            return "must not be negative" if self.above is None else "must be positive"
        return f"must be {'at least' if self.above is None else 'above'} {_number(low)}"


def _number(x: float | None) -> str:
    """A bound as people write it: 2^62 for a large power of two."""
    return (
        f"2^{x.bit_length() - 1}"
        if isinstance(x, int) and x > 2**32 and x & (x - 1) == 0
        else str(x)
    )


def opt(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    cli: bool = True,
    argument: bool = False,
    io: bool = False,
    factory: Callable[[], Any] | None = None,
    **bounds: Any,
) -> Any:
    """A dataclass field with its help text and bounds attached: `docs/config.md` and the
    command-line options made from a dataclass (nmt.cli) read them. `bounds` are a `Bounds`'
    (at_least=1: >= 1; above=0: > 0; at_most, below; choices), checked by `check_bounds`.
    `flags` names the option where `--field-name` alone will not do (e.g. ("--input", "-i"));
    `argument` makes it a positional argument of the command, `cli=False` keeps it off the
    command line; `io` marks `nmt translate`'s stream I/O (not an argument of
    `Translator.load`); `factory`, where given, makes each instance's default instead of
    `default` (a list, a count of cores)."""
    metadata = {
        "help": help,
        "flags": flags,
        "cli": cli,
        "argument": argument,
        "io": io,
        "bounds": Bounds(**bounds),
    }
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def opt_list(help: str, *, flags: tuple[str, ...] = ()) -> Any:
    """`opt` for a list option (repeatable on the command line), empty by default."""
    return opt(None, help, flags=flags, factory=list)


def check_bounds(obj: Any, name: Callable[[str], str], **values: Any) -> None:
    """Every field of the dataclass `obj` within its declared bounds (a Literal's choices are
    its bounds) and every float finite, or a ConfigError naming the field as `name(field)`
    says: "cfg.yaml: train.lr must be positive, got 0.0", "--nbest must be at least 1, got 0".
    Given `values`, those values of the fields they name instead: a function's arguments
    checked against the options they come from (`obj` may then be the dataclass itself)."""
    hints = typing.get_type_hints(obj if isinstance(obj, type) else type(obj))
    for f in dataclasses.fields(obj):
        if values and f.name not in values:
            continue
        value = values[f.name] if values else getattr(obj, f.name)
        bounds = f.metadata.get("bounds", Bounds())
        if get_origin(hints[f.name]) is Literal and not bounds.choices:
            bounds = dataclasses.replace(bounds, choices=get_args(hints[f.name]))
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name(f.name)} must be a finite number, got {value!r}")
        if value is not None and not bounds.allows(value):
            raise ConfigError(f"{name(f.name)} {bounds.rule()}, got {value!r}")


def flag(key: str) -> str:
    """The command-line flag of the field `key` (one without flags of its own), as errors name
    it: `check_bounds(options, flag)` says "--max-len must be at least 1, got 0"."""
    return f"--{key.replace('_', '-')}"


# a rejected value as an error shows it: a YAML alias bomb's list stays a few lines
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxlist = 4
_SHORT.maxdict = 4
_SHORT.maxstring = 80


def shown(value: Any) -> str:
    """`value` as a message shows it: its repr cut short (a megabyte constraint, an alias bomb)."""
    return _SHORT.repr(value)


# the plain field types: the Python types of the values each takes (a bool only for bool), and what
# an error says a value must be
_PLAIN: dict[Any, tuple[tuple[type[Any], ...], str]] = {
    bool: ((bool,), "true or false"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
}


def coerce(value: Any, tp: Any, key: str, where: str, *, strings: bool = True) -> Any:
    """Check `value` against the field type `tp`; return it converted where lossless. A float
    may be given as a str (YAML 1.1 reads `5e-4` as one) unless `strings` is False (Python
    arguments: a number is a number, as for int and bool)."""
    if get_origin(tp) is Literal:
        choices = Bounds(choices=get_args(tp))
        if not choices.allows(value):
            raise ConfigError(f"{where}: {key} {choices.rule()}, got {shown(value)}")
        return value
    if tp not in _PLAIN:
        raise AssertionError(f"unsupported config type {tp!r} for {key}")  # pragma: no cover
    kinds, expected = _PLAIN[tp]
    if isinstance(value, kinds) and (tp is bool or not isinstance(value, bool)):
        if tp is not float:
            return value
        try:
            return float(value)
        except OverflowError:  # an integer of 400 digits: 1e400 written out
            raise ConfigError(
                f"{where}: {key} must be a finite number, got {shown(value)}"
            ) from None
    # YAML 1.1 reads `5e-4` (no dot) as a string
    if tp is float and strings and isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    raise ConfigError(f"{where}: {key} must be {expected}, got {shown(value)}")


def coerce_option(cls: type, key: str, value: Any, where: str, name: str | None = None) -> Any:
    """`value` checked against the type of field `key` of the dataclass `cls` (bool, int,
    float, str or a Literal; other types pass), for a keyword argument `key=` of `where` (or
    as `name` says, e.g. a JSON key): the types as Python has them, no str for a number."""
    tp = typing.get_type_hints(cls)[key]
    if tp in _PLAIN or get_origin(tp) is Literal:
        return coerce(value, tp, name or f"{key}=", where, strings=False)
    return value
