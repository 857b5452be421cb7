"""What a user asks of one translation besides its text: target phrases that must appear
(constraints), phrases that must not (avoid), a forced target prefix; read from
`translate --json-input` lines and from a `--terminology` file.

Everything here is text: the phrases are segmented with the model's target tokenizer where
they meet a model (`nmt.api`), exactly as an output would be.

A terminology file has one pair a line, `source term<TAB>target term`. A source term matches a
line where it occurs as whole words: the line's text and the term are equal once both are
normalized and case-folded (`folded_units`: NFC, NFKC, `str.casefold`: "STRASSE" and "Straße"
match "Straße", "İSTANBUL" matches "İstanbul", fullwidth "ｄｏｇ" matches "dog", "café" its
NFD form), not inside a longer word (the match starts and ends between whole characters, each
with its combining marks, and the characters either side, if any, are not letters, digits,
`_` or combining marks), with the term's spaces matching any run of whitespace. Longer terms
win where matches overlap; each distinct target term of a line becomes one positive
constraint of that line. A term that is empty, only spaces or nothing once normalized is
refused (`check_pair`), from a file or as pairs (the API, a server request).

An avoided phrase is matched as text (`avoided_text`): after NFKC normalization, with its
whitespace runs as one space, none at its ends and no control or format characters (zero-width
spaces and joiners: the models' texts have none), it never occurs in the translation: anywhere,
also inside a longer word ("stand" rules out "understand"), case-sensitively.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, replace
from itertools import accumulate
from operator import itemgetter
from pathlib import Path
from typing import Any

from nmt.atomic import read_regular
from nmt.errors import NmtError
from nmt.fields import shown
from nmt.textio import clean_text

JSON_KEYS = ("text", "constraints", "avoid", "prefix", "ordered")


@dataclass(frozen=True)
class Request:
    """One text to translate and what is asked of its translation, checked as it is made: the
    one check of a request, whether a `--json-input` line's (`parse_json_line`), the API's
    arguments' (`requests_from`) or a program's. Phrases are non-empty strings (lists are kept
    as tuples), the prefix a string (None: ""), `ordered` a bool; else an NmtError naming
    `where` and the field (with `json_keys`, as a JSON line's key: "constraints", true)."""

    text: str
    constraints: tuple[str, ...] = ()  # target phrases that must appear
    avoid: tuple[str, ...] = ()  # target phrases that must not appear
    prefix: str = ""  # the translation must start with this
    ordered: bool = False  # the constraints must appear in this order
    terms: tuple[str, ...] = field(
        default=(), compare=False
    )  # which constraints came from --terminology
    where: InitVar[str] = "Request"
    json_keys: InitVar[bool] = False

    def __post_init__(self, where: str, json_keys: bool) -> None:
        q = '"' if json_keys else ""  # a key in quotes
        if not isinstance(self.text, str):
            raise NmtError(f"{where}: {q}text{q} must be a string")
        if not isinstance(self.ordered, bool):
            raise NmtError(
                f"{where}: {q}ordered{q} must be "
                f"{'true or false' if json_keys else 'True or False'}"
            )
        prefix = "" if self.prefix is None else self.prefix
        if not isinstance(prefix, str):
            raise NmtError(f"{where}: {q}prefix{q} must be a string, got {type(prefix).__name__}")
        object.__setattr__(self, "prefix", prefix)
        for key in ("constraints", "avoid"):
            phrases = getattr(self, key)
            if phrases is None:
                phrases = ()
            if (
                isinstance(phrases, str)
                or not isinstance(phrases, Sequence)
                or not all(isinstance(p, str) for p in phrases)
            ):
                raise NmtError(f"{where}: {q}{key}{q} must be a list of strings")
            for i, phrase in enumerate(phrases):
                if not phrase.strip():
                    raise NmtError(
                        f"{where}: {q}{key}{q}[{i}] "
                        + (
                            "is empty"
                            if json_keys
                            else f"must be a non-empty string, got {phrase!r}"
                        )
                    )
            object.__setattr__(self, key, tuple(phrases))

    def asks(self) -> bool:
        return bool(self.constraints or self.avoid or self.prefix)


def parse_json_line(line: str, where: str) -> Request:
    """`{"text": ..., "constraints": [...], "avoid": [...], "prefix": ..., "ordered": bool}` (every
    key but text optional) -> a Request; an NmtError naming `where` (FILE:LINE) otherwise."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise NmtError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise NmtError(f"{where}: not a request (JSON nested too deeply)") from None
    if not isinstance(obj, dict):
        raise NmtError(f"{where}: not a JSON object (a JSON {type(obj).__name__})")
    if unknown := sorted(set(obj) - set(JSON_KEYS)):
        raise NmtError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(JSON_KEYS)})")
    if "text" not in obj:
        raise NmtError(f'{where}: no "text"')
    return Request(**obj, where=where, json_keys=True)


def requests_from(
    texts: Sequence[str | Request],
    constraints: Any,
    avoid: Any,
    prefix: Any,
    ordered: Any,
    where: str,
) -> list[Request]:
    """The Request of each text given to the API (`Translator.translate`): a Request as it is; a
    str with its entries of `constraints`, `avoid` and `prefix` (each None or a list with one
    entry per text) and of `ordered` (one bool, or one per text)."""
    n = len(texts)
    if isinstance(ordered, bool):
        ordered = [ordered] * n
    elif (
        isinstance(ordered, str)
        or not isinstance(ordered, Sequence)
        or len(ordered) != n
        or not all(isinstance(o, bool) for o in ordered)
    ):
        raise NmtError(
            f"{where}: ordered must be True, False or a list of them, one per text ({n})"
        )
    columns = {
        k: v
        for k, v in (("constraints", constraints), ("avoid", avoid), ("prefix", prefix))
        if v is not None
    }
    for key, value in columns.items():
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != n:
            raise NmtError(f"{where}: {key} must be a list with one entry per text ({n})")
    out = []
    for i, text in enumerate(texts):
        asked = {key: column[i] for key, column in columns.items()}
        if isinstance(text, Request):
            if asked or ordered[i]:
                raise NmtError(
                    f"{where}: texts[{i}] is a Request: ask its constraints in it, not as arguments"
                )
            out.append(text)
        else:  # `ordered` orders the phrases asked here, not those a terminology adds alone
            out.append(
                Request(
                    text, ordered=ordered[i] and bool(columns), where=f"{where}: text {i}", **asked
                )
            )
    return out


def avoided_text(phrase: str) -> str:
    """An avoided phrase as the translation's text must never hold it (module docstring)."""
    text = " ".join(unicodedata.normalize("NFKC", clean_text(phrase)).split())
    return "".join(c for c in text if unicodedata.category(c) not in ("Cc", "Cf")).strip()


class Surfaces:
    """A target vocabulary's text: what each token adds to a translation (`pieces`, UTF-8 bytes,
    from `Tokenizer.surfaces`), indexed for the search to find the tokens that would complete an
    avoided text (`nmt.decoding.constraints`), which keeps its `tensors` here."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.pieces = list(pieces)
        self.size = len(pieces)
        self.width = max(map(len, self.pieces), default=0)  # W: the longest surface
        self.order = sorted(range(self.size), key=self.pieces.__getitem__)  # by surface
        self._sorted = [self.pieces[i] for i in self.order]
        self._joined = b"".join(self.pieces)
        self._ends = list(accumulate(map(len, self.pieces)))
        self.tensors: dict[Any, Any] = {}

    def text(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.pieces[t] for t in ids)

    def index(self, phrase: bytes) -> tuple[list[int], list[int], list[int]]:
        """For each byte q of `phrase`, the range [lo, hi) of `order` whose surfaces start with
        the phrase's bytes from q; and the tokens whose surface holds the whole phrase further
        in. Found again at each call, never kept: a phrase is a request's, and what a request
        sends must not outlive its answer (4,096 kept phrases could hold gigabytes)."""
        n = len(phrase)
        lo = [0] * n  # a rest longer than any surface: no token
        hi = [0] * n
        for q in range(max(0, n - self.width), n):
            rest = phrase[q:]
            lo[q] = bisect_left(self._sorted, rest)
            hi[q] = bisect_right(self._sorted, rest, lo[q], key=itemgetter(slice(len(rest))))
        inside = []
        if n < self.width:  # a longer surface may hold it
            for m in re.finditer(b"(?=" + re.escape(phrase) + b")", self._joined):
                t = bisect_right(self._ends, m.start())
                if m.start() + n <= self._ends[t]:
                    inside.append(t)
        return lo, hi, inside


# ------------------------------------------------------------------ terminology

# bytes of a terminology file: a million terms fit; /dev/zero or a runaway file does not
TERMINOLOGY_LIMIT = 64 << 20
# a term is a word or a phrase; a longer one is a wrong file or a hostile request
MAX_TERM_CHARS = 1000


@functools.cache
def _marks() -> str:
    """The combining marks (Unicode categories Mn, Mc, Me), for a regex class: a mark belongs
    to the character before it, so no term starts after one or ends before one: "stanbul" is
    not a word of "İstanbul" (whose "İ" folds to "i" and a combining dot), nor "te" of an "été"
    written with combining accents (issue 57)."""
    return "".join(
        chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)).startswith("M")
    )


def folded_units(text: str) -> list[str]:
    """`text` as terms are matched in it: NFC, cut into its characters each with the combining
    marks after it (a match starts and ends between two of them, never inside: not "s" in
    "ß", whose folding is "ss"), each folded: NFKC (fullwidth "ｄｏｇ" is "dog", "ﬁ" is "fi")
    and case-folded (`str.casefold`: "ß" is "ss")."""
    # most lines: there the normalizations change nothing and the fold is lower()
    if text.isascii():
        return list(text.lower())
    units: list[str] = []
    for c in unicodedata.normalize("NFC", text):
        if units and unicodedata.category(c).startswith("M"):
            units[-1] += c
        else:
            units.append(c)
    return [
        unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", u).casefold()) for u in units
    ]


@dataclass(frozen=True)
class Terminology:
    """Source term -> target term pairs (`load_terminology`) and the rule that finds them."""

    pattern: re.Pattern[str] | None  # the folded terms, over folded text
    targets: dict[str, str]  # folded source term -> target term

    def match(self, text: str) -> list[str]:
        """The target terms whose source terms occur in `text` (module docstring), each once,
        in order of first occurrence."""
        if self.pattern is None:
            return []
        units = folded_units(text)
        edges = set(accumulate(map(len, units), initial=0))  # a match starts and ends at one
        found: dict[str, None] = {}
        for m in self.pattern.finditer("".join(units)):
            if m.start() in edges and m.end() in edges:
                found.setdefault(self.targets[" ".join(m.group(0).split())], None)
        return list(found)


def check_pair(source: str, target: str, where: str) -> tuple[str, str]:
    """A terminology pair, its terms stripped, or an NmtError naming `where` (FILE:LINE, or the
    pair) and the term: empty or only spaces ("" would match everywhere and force its target
    into every translation), nothing left once normalized (zero-width or control characters
    alone: no token writes them, `avoided_text`), longer than MAX_TERM_CHARS."""
    terms = {"source": source.strip(), "target": target.strip()}
    for side, term in terms.items():
        if len(term) > MAX_TERM_CHARS:
            raise NmtError(
                f"{where}: the {side} term is {len(term):,} characters; a term has at most "
                f"{MAX_TERM_CHARS:,}"
            )
        if not term:
            raise NmtError(f"{where}: the {side} term is empty")
        if not avoided_text(term):
            raise NmtError(
                f"{where}: the {side} term is empty once normalized (only invisible or control "
                "characters)"
            )
    return terms["source"], terms["target"]


def terminology_from_pairs(
    pairs: Sequence[tuple[str, str]], where: str = "terminology"
) -> Terminology:
    """The terminology of (source term, target term) pairs, each checked (`check_pair`, naming
    it as `where[source term]`): the API's and a request's. The first pair of a source term wins."""
    terminology = _compiled(
        [check_pair(source, tgt, f"{where}[{shown(source)}]") for source, tgt in pairs]
    )
    # `re` keeps every pattern it compiles in a module-wide cache (512 of them) and has no call
    # that compiles without caching: a server's requests would each leave their terms there
    # (+157 MB after 30 requests). Dropping the cache costs the other patterns one recompile.
    re.purge()
    return terminology


def _compiled(pairs: Sequence[tuple[str, str]]) -> Terminology:
    targets: dict[str, str] = {}
    for source, tgt in pairs:
        targets.setdefault(
            " ".join("".join(folded_units(source)).split()), tgt
        )  # folded as the text will be
    if not targets:
        return Terminology(None, targets)
    terms = sorted(
        targets, key=len, reverse=True
    )  # longer terms first: the regex takes the first alternative
    body = "|".join(r"\s+".join(re.escape(w) for w in t.split()) for t in terms)
    word = rf"[\w{_marks()}]"  # a letter, a digit, _ or a combining mark
    return Terminology(re.compile(rf"(?<!{word})(?:{body})(?!{word})"), targets)


def load_terminology(path: str | Path) -> Terminology:
    """Read a terminology file: `source<TAB>target` a line (blank lines skipped), UTF-8, a
    regular file of at most TERMINOLOGY_LIMIT bytes (`nmt.atomic.read_regular`: never a FIFO or
    /dev/zero, which would never end). A missing column, a line with more than one TAB, a term
    `check_pair` refuses, bytes that are not UTF-8 (a term is typed on purpose: no guess) are
    an NmtError naming FILE:LINE."""
    try:
        data = read_regular(path, "the terminology file", TERMINOLOGY_LIMIT)
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    pairs: list[tuple[str, str]] = []
    for number, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").split(b"\n"), 1):
        where = f"{path}:{number}"
        try:
            line = clean_text(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise NmtError(f"{where}: not UTF-8; write the terminology file in UTF-8") from None
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 2:
            raise NmtError(
                f"{where}: expected 'source term<TAB>target term', found {len(cols)} "
                f"column{'s' if len(cols) != 1 else ''}"
            )
        pairs.append(check_pair(cols[0], cols[1], where))
    return _compiled(pairs)


def with_terms(request: Request, terminology: Terminology | None) -> Request:
    """`request` with the target terms of its text's source terms added as constraints."""
    if terminology is None:
        return request
    terms = [t for t in terminology.match(request.text) if t not in request.constraints]
    if not terms:
        return request
    return replace(request, constraints=(*request.constraints, *terms), terms=tuple(terms))
