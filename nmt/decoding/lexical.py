"""Lexical constraints asked as text (`nmt.terminology.Request`) for one model: each request's
phrases as the model's target token ids (`Constraints`, checked against the sentence's length
limit), and, after the search, warnings naming the line where a translation leaves them unmet.

A phrase is segmented with the target tokenizer as an output would be; an avoided phrase is
followed as text (`nmt.terminology.avoided_text`) through the target tokens' text as the
translations show it (`nmt.textio.on_one_line`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cached_property

import torch

from nmt.config import DecodeConfig
from nmt.decoding.constraints import AvoidText, Constraints
from nmt.decoding.predict import need_beam_search
from nmt.decoding.search import Hypothesis, max_output_lengths
from nmt.errors import NmtError
from nmt.fields import shown
from nmt.terminology import Request, Surfaces, avoided_text
from nmt.textio import clean_text, on_one_line
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class LexicalConstraints:
    """The requests' constraints over `tokenizer`'s target side, for a model of `max_positions`."""

    def __init__(self, tokenizer: Tokenizer, max_positions: int) -> None:
        self.tokenizer = tokenizer
        self.max_positions = max_positions

    @cached_property
    def surfaces(self) -> Surfaces:
        """The target tokens' text as translations show it (a line break is a space)."""
        return Surfaces(
            [
                on_one_line(s.decode(errors="surrogateescape")).encode(errors="surrogateescape")
                for s in self.tokenizer.surfaces()
            ]
        )

    def constraints(
        self,
        requests: Sequence[Request],
        seqs: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        where: Callable[[int], str],
    ) -> list[Constraints | None] | None:
        """Each request's phrases as target token ids and its avoided texts (None where it asks
        nothing or its source `seqs[i]` is empty; None for all when none asks anything). An
        NmtError naming `where(i)`: constraints under sampling, what cannot fit in its sentence's
        length limit (one phrase, or all of them: `Constraints.min_length`), a phrase with
        nothing left once normalized, a prefix that holds an avoided phrase. A prefix with
        pieces the vocabulary lacks is forced as `<unk>`, with a warning. A terminology's term
        is not the line's own request: one the line cannot use (too long for it, nothing left
        once normalized) is left unmet with a warning naming the line, and the line translated."""
        if not any(r.asks() for r in requests):
            return None
        need_beam_search(cfg, where(next(i for i, r in enumerate(requests) if r.asks())))
        specials = self.tokenizer.specials
        out: list[Constraints | None] = []
        for i, (request, seq) in enumerate(zip(requests, seqs, strict=True)):
            if not request.asks() or not seq:
                out.append(None)
                continue
            line = where(i)
            limit = int(
                max_output_lengths(torch.tensor([len(seq) + 1]), cfg, self.max_positions)[0]
            )
            own = request.constraints[: len(request.constraints) - len(request.terms)]
            include = [self._encoded("constraint", p, limit, line) for p in own]
            texts = list(own)
            for term in request.terms:
                ids = self._encoded("term", term, limit, line, refuse=False)
                if ids:
                    include.append(ids)
                    texts.append(term)
            prefix = (
                self._encoded("prefix", request.prefix, limit, line)
                if request.prefix.strip()
                else ()
            )
            avoid = tuple(avoided_text(p).encode() for p in request.avoid)
            for phrase, text in zip(request.avoid, avoid, strict=True):
                if not text or text in self.surfaces.text(prefix):
                    raise NmtError(
                        f"{line}: the avoided {shown(phrase)} is empty once normalized"
                        if not text
                        else f"{line}: the prefix {shown(request.prefix)} holds the avoided "
                        f"{shown(phrase)}"
                    )
            c = Constraints(
                tuple(include),
                request.ordered,
                prefix=prefix,
                texts=tuple(texts),
                avoid_text=AvoidText(avoid, self.surfaces) if avoid else None,
            )
            asked = Constraints(tuple(include[: len(own)]), request.ordered)  # terms may go unmet
            if asked.min_length() > limit:
                raise NmtError(
                    f"{line}: the {len(asked.include)} constraints need at least "
                    f"{asked.min_length()} tokens, more than the {limit} this line's translation "
                    "may have (decode.max_len_a/b)"
                )
            if specials.unk in prefix:
                log.warning(
                    "%s: the prefix %s has pieces the model's vocabulary lacks: forced as <unk>",
                    line,
                    shown(request.prefix),
                )
            out.append(c)
        return out

    def _encoded(
        self, kind: str, text: str, limit: int, where: str, refuse: bool = True
    ) -> tuple[int, ...]:
        """`text` (a constraint, a term, a prefix) as target token ids, segmented as an output
        would be; where it has none or more than `limit`, an NmtError naming `where`, or with
        `refuse=False` a warning and () (a term left unmet)."""
        ids = tuple(self.tokenizer.encode_target(clean_text(text)))
        if ids and len(ids) <= limit:
            return ids
        why = (
            (
                f"is {len(ids)} tokens, longer than the {limit} tokens this line's translation may "
                "have (decode.max_len_a/b)"
            )
            if ids
            else "is empty once normalized (only invisible or control characters)"
        )
        if refuse:
            raise NmtError(f"{where}: the {kind} {shown(text)} {why}")
        log.warning("%s: the %s %s %s: left unmet", where, kind, shown(text), why)
        return ()

    def report(
        self,
        requests: Sequence[Request],
        cons: Sequence[Constraints | None],
        hyps: Sequence[Sequence[Hypothesis]],
        texts: Sequence[Sequence[str]],
        cfg: DecodeConfig,
        where: Callable[[int], str],
        term_stats: dict[str, int],
    ) -> None:
        """Warn, naming the line, where the best translation leaves constraints unmet, and why
        (a phrase the search may not write: pieces the vocabulary lacks, an avoided phrase
        inside; else the length limit), or where a translation (`texts[i]`, the text of each of
        `hyps[i]`) holds an avoided phrase all the same (a limit of the search, see `AvoidText`);
        count the terminology's terms in `term_stats`."""
        unk = None if cfg.allow_unk else self.tokenizer.specials.unk
        for i, (request, c, hs) in enumerate(zip(requests, cons, hyps, strict=True)):
            if not hs or c is None:
                continue
            avoid = c.avoid_text.texts if c.avoid_text else ()
            unmet = hs[0].unmet  # of the best translation
            if unmet:
                why = [
                    f"{shown(text)} "
                    + (
                        "has pieces the model's vocabulary lacks (<unk>)"
                        if unk in ids
                        else "holds an avoided phrase"
                    )
                    for text, ids in zip(c.texts, c.include, strict=True)
                    if unk in ids or any(a in self.surfaces.text(ids) for a in avoid)
                ]
                if unmet > len(why):
                    why.append(
                        f"{unmet - len(why)} not within the length limit"
                        + (" or after one of those in the order" if why and c.ordered else "")
                    )
                log.warning(
                    "%s: %d of %d constraints not met: %s",
                    where(i),
                    unmet,
                    len(c.include),
                    "; ".join(why),
                )
            seen = next(
                (a.decode() for a in avoid for text in texts[i] if a.decode() in text), None
            )
            if seen is not None:
                log.warning(
                    "%s: the avoided %s is in the translation all the same: its text has it where "
                    "its "
                    "tokens' bytes do not (an undecodable byte shows as U+FFFD)",
                    where(i),
                    shown(seen),
                )
            if request.terms:
                term_stats["lines"] += 1
                term_stats["terms"] += len(request.terms)
                term_stats["met"] += sum(term in texts[i][0] for term in request.terms)
