"""What a user asks of one translation besides its text: target phrases that must appear
(constraints), phrases that must not (avoid), a forced target prefix; read from
`translate --json-input` lines and from a `--terminology` file.

Everything here is text: the phrases are segmented with the model's target tokenizer where
they meet a model (`nmt.api`), exactly as an output would be.

A terminology file has one pair a line, `source term<TAB>target term`. A source term matches a
line where it occurs as whole words: case-insensitively (Unicode case folding), not inside a
longer word (the characters either side, if any, are not letters, digits or `_`), with the
term's spaces matching any run of whitespace. Longer terms win where matches overlap; each
distinct target term of a line becomes one positive constraint of that line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt.errors import NmtError
from nmt.textio import read_lines

JSON_KEYS = ("text", "constraints", "avoid", "prefix", "ordered")


@dataclass(frozen=True)
class Request:
    """One line to translate and what is asked of its translation."""

    text: str
    constraints: tuple[str, ...] = ()  # target phrases that must appear
    avoid: tuple[str, ...] = ()  # target phrases that must not appear
    prefix: str = ""  # the translation must start with this
    ordered: bool = False  # the constraints must appear in this order
    terms: tuple[str, ...] = field(default=(), compare=False)  # which constraints came from --terminology

    def asks(self) -> bool:
        return bool(self.constraints or self.avoid or self.prefix)


def parse_json_line(line: str, where: str) -> Request:
    """`{"text": ..., "constraints": [...], "avoid": [...], "prefix": ..., "ordered": bool}` (every
    key but text optional) -> a Request; an NmtError naming `where` (FILE:LINE) otherwise."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise NmtError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise NmtError(f"{where}: not a JSON object (a JSON {type(obj).__name__})")
    unknown = sorted(set(obj) - set(JSON_KEYS))
    if unknown:
        raise NmtError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(JSON_KEYS)})")
    if not isinstance(obj.get("text"), str):
        raise NmtError(f"{where}: \"text\" must be a string" if "text" in obj else f"{where}: no \"text\"")
    ordered = obj.get("ordered", False)
    if not isinstance(ordered, bool):
        raise NmtError(f"{where}: \"ordered\" must be true or false")
    prefix = obj.get("prefix", "")
    if prefix is None:
        prefix = ""
    if not isinstance(prefix, str):
        raise NmtError(f"{where}: \"prefix\" must be a string")
    return Request(obj["text"], _phrases(obj.get("constraints"), "constraints", where),
                   _phrases(obj.get("avoid"), "avoid", where), prefix, ordered)


def _phrases(value: Any, key: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NmtError(f"{where}: \"{key}\" must be a list of strings")
    for i, phrase in enumerate(value):
        if not phrase.strip():
            raise NmtError(f"{where}: \"{key}\"[{i}] is empty")
    return tuple(value)


def check_request(request: Request, where: str) -> Request:
    """The checks of `parse_json_line` for a Request made in code (the API): phrases are
    non-empty strings."""
    for key in ("constraints", "avoid"):
        for i, phrase in enumerate(getattr(request, key)):
            if not isinstance(phrase, str) or not phrase.strip():
                raise NmtError(f"{where}: {key}[{i}] must be a non-empty string, got {phrase!r}")
    if not isinstance(request.prefix, str):
        raise NmtError(f"{where}: prefix must be a string, got {type(request.prefix).__name__}")
    if not isinstance(request.ordered, bool):
        raise NmtError(f"{where}: ordered must be True or False")
    return request


# ------------------------------------------------------------------ terminology


@dataclass(frozen=True)
class Terminology:
    """Source term -> target term pairs (`load_terminology`) and the rule that finds them."""

    pairs: tuple[tuple[str, str], ...]
    pattern: re.Pattern[str] | None
    targets: dict[str, str]  # folded source term -> target term

    def match(self, text: str) -> list[str]:
        """The target terms whose source terms occur in `text` (module docstring), each once,
        in order of first occurrence."""
        if self.pattern is None:
            return []
        found: dict[str, None] = {}
        for m in self.pattern.finditer(text):
            found.setdefault(self._target(m.group(0)), None)
        return list(found)

    def _target(self, matched: str) -> str:
        """The target term of a matched span. The regex folds case simply, the keys fully: where
        the two differ (rare letters), the term whose own pattern matches the span."""
        target = self.targets.get(_fold(matched))
        if target is not None:
            return target
        return next(t for k, t in self.targets.items()
                    if re.fullmatch(r"\s+".join(re.escape(w) for w in k.split()), matched, re.IGNORECASE))


def _fold(term: str) -> str:
    return " ".join(term.casefold().split())


def terminology_from_pairs(pairs: Sequence[tuple[str, str]]) -> Terminology:
    targets: dict[str, str] = {}
    for source, tgt in pairs:
        targets.setdefault(_fold(source), tgt)
    if not targets:
        return Terminology(tuple(pairs), None, targets)
    terms = sorted(targets, key=len, reverse=True)  # longer terms first: the regex takes the first alternative
    body = "|".join(r"\s+".join(re.escape(w) for w in t.split()) for t in terms)
    pattern = re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE)
    return Terminology(tuple(pairs), pattern, targets)


def load_terminology(path: str | Path) -> Terminology:
    """Read a terminology file: `source<TAB>target` a line (blank lines skipped); a missing
    column, an empty term or a line with more than one TAB is an NmtError naming FILE:LINE."""
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        where = f"{path}:{number}"
        if len(cols) != 2:
            raise NmtError(f"{where}: expected 'source term<TAB>target term', found {len(cols)} column"
                           f"{'s' if len(cols) != 1 else ''}")
        source, tgt = cols[0].strip(), cols[1].strip()
        if not source or not tgt:
            raise NmtError(f"{where}: the {'source' if not source else 'target'} term is empty")
        pairs.append((source, tgt))
    return terminology_from_pairs(pairs)


def with_terms(request: Request, terminology: Terminology | None) -> Request:
    """`request` with the target terms of its text's source terms added as constraints."""
    if terminology is None:
        return request
    terms = [t for t in terminology.match(request.text) if t not in request.constraints]
    if not terms:
        return request
    return Request(request.text, (*request.constraints, *terms), request.avoid, request.prefix, request.ordered,
                   tuple(terms))
