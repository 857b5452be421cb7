"""Segmentation: a text cut into the sentences a model was trained on, and its translation put
back together (`Translator.translate(..., split=True)`, `nmt translate --split-sentences`,
`nmt serve`).

A text is cut into lines (its `\\n`, `\\r\\n` and blank lines kept as sent), each line into
sentences by sentencex (`pip install 'nmt[split]'`) with the rules of the model's source language
(sentencex's fallback chain for a language it lacks, English for a model without one), and a
sentence still longer than the model's maximum into pieces that fit, cut at a space or
punctuation where there is one. What lies between sentences (spaces, line breaks) and pieces with
nothing to translate (emoji, digits, punctuation, URLs, @mentions, #hashtags) are kept as sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from nmt.errors import NmtError

INSTALL = (
    "splitting text into sentences needs sentencex: pip install 'nmt[split]' (or pip install "
    "sentencex)"
)
LINE = re.compile(r"[^\r\n]+")
# what a piece may hold and still have nothing to translate, with emoji, digits and punctuation
UNTRANSLATED = re.compile(r"https?://\S+|www\.\S+|[@#][\w.@-]+")
# where a sentence too long for the model is cut: after punctuation, or at spaces
BREAK = re.compile(r"[,;:.!?)\]]*\s+|[,;:.!?)\]]+")

T = TypeVar("T")


@dataclass(frozen=True)
class Segmented:
    """A text and its sentences to translate, [start, end) in it; `cut`: a sentence was too long
    for the model and was cut into pieces, each one of the spans."""

    text: str
    spans: list[tuple[int, int]]
    cut: bool

    def joined(self, translations: list[str]) -> tuple[str, list[int]]:
        """The text with span i replaced by translations[i], and where each translation starts
        in it."""
        joined = ""
        starts = []
        previous = 0
        for (start, end), translation in zip(self.spans, translations, strict=True):
            joined += self.text[previous:start]
            starts.append(len(joined))
            joined += translation
            previous = end
        return joined + self.text[previous:], starts


def per_text(parts: list[Segmented], items: list[T]) -> list[list[T]]:
    """`items`, one for each span of `parts` in order, grouped by text."""
    rest = iter(items)
    return [[next(rest) for _ in part.spans] for part in parts]


def segment(text: str, lang: str, fits: Callable[[str], bool]) -> Segmented:
    """The sentences of `text` in language `lang` ("" for English rules), each cut into pieces
    that `fits` the model."""
    try:
        import sentencex
    except ImportError:
        raise NmtError(INSTALL) from None
    spans = []
    cut = False
    for line in LINE.finditer(text):
        start = line.start()
        for sentence in sentencex.segment(lang.lower().replace("_", "-") or "en", line.group()):
            first = start + len(sentence) - len(sentence.lstrip())
            end = start + len(sentence.rstrip())
            start += len(sentence)
            if any(c.isalpha() for c in UNTRANSLATED.sub("", text[first:end])):
                pieces = _fitted(text, first, end, fits)
                cut = cut or len(pieces) > 1
                spans += pieces
    return Segmented(text, spans, cut)


def _fitted(text: str, start: int, end: int, fits: Callable[[str], bool]) -> list[tuple[int, int]]:
    """text[start:end] in pieces that each fit: the longest start that does (found by bisection),
    ended at the last break in its second half where there is one."""
    pieces = []
    while not fits(text[start:end]):
        lo = 1
        hi = end - start
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(text[start : start + mid]):
                lo = mid
            else:
                hi = mid - 1
        breaks = list(BREAK.finditer(text, start + lo // 2, start + lo))
        if not breaks:
            pieces.append((start, start + lo))
            start += lo
            continue
        last = breaks[-1]  # the punctuation stays with the piece, the spaces between pieces
        pieces.append((start, last.start() + len(last.group().rstrip())))
        start = last.end()
    return [*pieces, (start, end)]
