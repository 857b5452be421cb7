"""The Python API: `Translator`, what `nmt translate` does, for a program.

    from nmt import Translator
    tr = Translator.load("runs/m30k/checkpoint_avg.pt", beam=5, device="cpu")
    tr.translate(["A dog runs in the park.", ""])   # -> ["Ein Hund ...", ""]

`Translator.load` takes the options of `nmt translate` that are not its stream I/O (device,
precision, threads, workers, shortlist: `nmt.options.TranslateOptions`) and the decode
settings (`nmt.config.DecodeConfig`: beam, lenpen, ...) as keyword arguments; both are
declared once there, so the command's flags and the API's arguments are the same list.
`nmt translate` is stream I/O over this class (nmt.translate).

The guarantees are the command's: one result per input, in input order; an empty or
whitespace-only input gives "" without touching the model; line breaks, NUL and undecodable
characters inside an input are cleaned as the command cleans a line; an input longer than the
model's maximum is truncated with a warning; a result never contains a line break or a tab;
results do not depend on how inputs are batched. Mistakes raise `nmt.errors.NmtError` with a
one-line message, also an argument of the wrong type (checked here, at the boundary: texts in
any iterable of str but one str, a number as a number, a bool as a bool), named in it.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from nmt import terminology as terms
from nmt.config import DecodeConfig, check_nbest
from nmt.decoding.alignment import attention_matrices, hard_alignment, layer_count, resolve_layer
from nmt.decoding.lexical import LexicalConstraints
from nmt.decoding.predict import (
    Loaded,
    decode_autocast,
    decode_config,
    load_models,
    load_shortlist_for,
    need_beam_search,
    resolve_checkpoints,
    score_token_lists,
    translate_token_lists,
)
from nmt.decoding.search import Hypothesis, length_penalty
from nmt.decoding.shortlist import Shortlist
from nmt.device import resolve_device, resolve_precision
from nmt.engine import CTranslate2Engine, converted, decode_refusal, load_refusal
from nmt.errors import NmtError
from nmt.fields import check_bounds, coerce, coerce_option, flag
from nmt.options import TranslateOptions
from nmt.segment import Segmented, per_text, segment
from nmt.terminology import Request, Terminology
from nmt.textio import clean_text, on_one_line
from nmt.tokenizer import leading_language_token

log = logging.getLogger(__name__)
#: `Translator.load`'s keyword arguments besides the decode settings: the options of
#: `nmt translate` that are not its stream I/O
LOAD_OPTIONS = tuple(
    f.name
    for f in fields(TranslateOptions)
    if f.metadata.get("cli", True) and not f.metadata.get("io") and f.name != "checkpoints"
)
DECODE_OPTIONS = tuple(f.name for f in fields(DecodeConfig) if f.metadata.get("cli", True))


@dataclass(frozen=True)
class Attention:
    """The cross-attention of one translation: weights (L, H, T, S) float32 per decoder layer
    and head, row t (a target piece) summing to one over the source pieces; the pieces
    (sentencepiece's, each side ending in `</s>`)."""

    weights: Any  # numpy.ndarray (L, H, T, S)
    source: list[str]  # S pieces
    target: list[str]  # T pieces


@dataclass(frozen=True)
class Translation:
    """One hypothesis: its detokenized text, the score the beam search ranks by (log-prob
    over the length penalty) and its log-probability (sum over its tokens and the EOS).
    Asked for: its hard alignment, (source piece, target piece) index pairs without the
    `</s>`s, and its attention (nmt.decoding.alignment)."""

    text: str
    score: float
    logprob: float
    alignment: list[tuple[int, int]] | None = None
    attention: Attention | None = None


def clean_output(text: str) -> str:
    """A translation on one line: line breaks, tabs and other separators become spaces."""
    return on_one_line(text).strip()


def joined(segmented: Segmented, hyps: list[list[Translation]]) -> list[Translation]:
    """A split text's translations from those of its sentences (`segmented.spans`, in order): a
    sentence's n-best put in the text's place; for several sentences, the best of each put in
    place, with the sums of their scores and log-probabilities and their alignments one after
    another (the pieces of the sentences before counted: `attention` asked); [] for a blank
    text; a text with nothing to translate as it is."""
    if not segmented.spans:
        return [Translation(segmented.text, 0.0, 0.0)] if segmented.text.strip() else []
    if len(hyps) == 1:
        return [replace(h, text=segmented.joined([h.text])[0], attention=None) for h in hyps[0]]
    best = [hs[0] for hs in hyps]
    alignment = None
    if best[0].attention is not None:
        alignment = []
        source = 0
        target = 0
        for h in best:
            assert h.attention is not None
            alignment += [(i + source, j + target) for i, j in h.alignment or []]
            source += len(h.attention.source) - 1  # its pieces, less the </s>
            target += len(h.attention.target) - 1
    text = segmented.joined([h.text for h in best])[0]
    return [Translation(text, sum(h.score for h in best), sum(h.logprob for h in best), alignment)]


MAX_THREADS = 4096  # torch refuses absurd thread counts with an error of its own


def _arg(value: Any, tp: type, name: str, where: str) -> Any:
    """A Python argument checked against its type (`nmt.fields.coerce`, no str for a number,
    no bool for an int): an NmtError naming `where` and `name`."""
    return coerce(value, tp, name, where, strings=False)


def _iterable(texts: Any, name: str, where: str) -> Iterable[Any]:
    """`texts` if it is an iterable of texts (a list, a tuple, a generator), or an NmtError naming
    `where` and the argument `name`. One str is refused: it would be translated character by
    character (issue 25)."""
    if isinstance(texts, str):
        raise NmtError(f"{where}: {name} must be an iterable of str, got one str: pass [text]")
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Iterable):
        raise NmtError(f"{where}: {name} must be an iterable of str, got {type(texts).__name__}")
    return texts


def _texts(
    texts: Any, name: str, where: str, first: int = 0, kinds: tuple[type, ...] = (str,)
) -> list[Any]:
    """`texts` (see `_iterable`) as a list of `kinds` (str; to translate, str or Request), or an
    NmtError naming a bad item (`name[first + i]`)."""
    texts = list(_iterable(texts, name, where))
    for i, text in enumerate(texts):
        if not isinstance(text, kinds):
            raise NmtError(
                f"{where}: {name}[{first + i}] is {type(text).__name__}, not "
                + " or ".join(k.__name__ for k in kinds)
            )
    return texts


_TO_TRANSLATE = (
    str,
    Request,
)  # what a text to translate may be: a str, or a Request (a text and what is asked)


def _paths(checkpoints: Any) -> list[Path]:
    """`Translator.load`'s checkpoints: one path (str or os.PathLike) or an iterable of them."""
    where = "Translator.load: checkpoints"
    if isinstance(checkpoints, (str, os.PathLike)):
        return [Path(checkpoints)]
    if isinstance(checkpoints, (bytes, bytearray)) or not isinstance(checkpoints, Iterable):
        raise NmtError(
            f"{where} must be a path (str or os.PathLike) or a list of paths, got "
            f"{type(checkpoints).__name__}"
        )
    paths = list(checkpoints)
    for i, path in enumerate(paths):
        if not isinstance(path, (str, os.PathLike)):
            raise NmtError(
                f"{where}[{i}] is {type(path).__name__}, not a path (str or os.PathLike)"
            )
    return [Path(path) for path in paths]


class Translator:
    """Loaded checkpoint(s) with decode settings; translate, n-best, stream and score.

    Make one with `Translator.load` (or `from_options`, which `nmt translate` uses). Methods
    may be called any number of times; they are not meant to be called from several threads
    at once (CPU `workers` already decode several batches in parallel).
    """

    def __init__(
        self,
        loaded: Loaded,
        decode: DecodeConfig,
        *,
        device: torch.device,
        precision: str = "fp32",
        workers: int = 0,
        shortlist: Shortlist | None = None,
        alignment_layer: int | None = None,
    ):
        self.loaded = loaded
        self.decode = decode
        self.device = device
        self.precision = precision
        self.workers = workers
        self.shortlist = shortlist
        self.alignment_layer = alignment_layer  # as given: checked against the model when used
        # the >>xxx<< token every source gets (from_options sets it)
        self.target_lang: str | None = None
        # source term -> target term constraints (from_options)
        self.terminology: Terminology | None = None
        self.term_stats = {
            "lines": 0,
            "terms": 0,
            "met": 0,
        }  # lines with terms, their terms, terms in the output
        self.lexical = LexicalConstraints(
            loaded.tokenizer, loaded.max_positions
        )  # requests -> Constraints
        self._warned: set[str] = set()  # unknown >>xxx<< tokens warned about
        self.engine: CTranslate2Engine | None = None  # CTranslate2 decodes (`from_options`)
        self.engine_choice = "torch"  # as asked: torch, ctranslate2 or auto

    @classmethod
    def load(
        cls, checkpoints: str | os.PathLike | Sequence[str | os.PathLike], **options: Any
    ) -> Translator:
        """Load one checkpoint, or several as an ensemble (mean of log-probabilities).

        options: device ("auto", "cpu", "cuda", "cuda:N"), precision ("fp32", "bf16", "fp16",
        "int8"), engine ("auto", "torch", "ctranslate2"), cache_dir, threads, workers, shortlist
        (a file from `nmt shortlist`), alignment_layer (the decoder layer of
        `translate_nbest(..., alignment=True)`), and any decode setting over the checkpoint's
        own: beam, lenpen, lenpen_style, max_len_a, max_len_b, min_len,
        no_repeat_ngram_size, sampling, topk, topp, temperature, seed, batch_size, max_tokens.
        Defaults are `nmt translate`'s.
        """
        paths = _paths(checkpoints)
        if not paths:
            raise NmtError("Translator.load needs at least one checkpoint")
        if unknown := sorted(set(options) - set(LOAD_OPTIONS) - set(DECODE_OPTIONS)):
            raise NmtError(
                f"Translator.load: unknown option {unknown[0]}= (options: "
                f"{', '.join(LOAD_OPTIONS + DECODE_OPTIONS)})"
            )
        decode = {
            k: coerce_option(DecodeConfig, k, options.pop(k), "Translator.load")
            for k in DECODE_OPTIONS
            if k in options
        }
        options = {
            k: coerce_option(TranslateOptions, k, v, "Translator.load") for k, v in options.items()
        }
        opts = TranslateOptions(checkpoints=paths, decode=decode, **options)
        return cls.from_options(opts, name=lambda key: f"{key}=")

    @staticmethod
    def check_options(opts: TranslateOptions, name: Callable[[str], str] = flag) -> None:
        """The bounds of the options that are not decode settings (those are checked against
        the checkpoint's in `from_options`). `name(key)` names an option in errors: `--threads`
        for the command (the default), `threads=` for the API."""
        check_bounds(opts, name)
        layer = opts.alignment_layer
        if layer is not None and (not isinstance(layer, int) or isinstance(layer, bool)):
            raise NmtError(f"{name('alignment_layer')} must be an integer or None, got {layer!r}")
        for key in ("shortlist", "terminology", "cache_dir"):
            path = getattr(opts, key)
            if not isinstance(path, (str, os.PathLike, type(None))):
                raise NmtError(
                    f"{name(key)} must be a path (str or os.PathLike), got {type(path).__name__}"
                )

    @classmethod
    def from_options(cls, opts: TranslateOptions, name: Callable[[str], str] = flag) -> Translator:
        """The translator `opts` describe (their I/O fields aside), options named in errors by
        `name` (see `check_options`)."""
        cls.check_options(opts, name)
        if opts.threads > 0:
            torch.set_num_threads(min(opts.threads, MAX_THREADS))
        # int8 decoding exists on the CPU only: there, auto means the CPU even where CUDA is present
        device = resolve_device(
            "cpu" if opts.precision == "int8" and opts.device == "auto" else opts.device
        )
        precision, why = resolve_precision(opts.precision, device)
        if opts.precision == "auto":
            log.info("precision %s (%s)", precision, why)
        decode_autocast(device, precision)  # fp16 off CUDA: refused before the models load
        checkpoints = resolve_checkpoints([str(p) for p in opts.checkpoints])
        loaded = load_models(checkpoints, device, precision)
        cfg = decode_config(
            loaded.config.decode,
            opts.decode,
            opts.nbest,
            source=str(checkpoints[0]),
            vocab_size=loaded.tokenizer.vocab_size,
            option=name,
        )
        shortlist = (
            load_shortlist_for(str(opts.shortlist), loaded, cfg.beam) if opts.shortlist else None
        )
        translator = cls(
            loaded,
            cfg,
            device=device,
            precision=precision,
            workers=opts.workers,
            shortlist=shortlist,
            alignment_layer=opts.alignment_layer,
        )
        translator.target_lang = loaded.tokenizer.language_token(
            opts.target_lang, name("target_lang")
        )
        if opts.terminology is not None:
            need_beam_search(cfg, name("terminology"))
            translator.terminology = terms.load_terminology(opts.terminology)
        layers = layer_count(loaded.model)
        # checked against the model now, not at the first line
        if opts.alignment_layer is not None and layers:
            resolve_layer(opts.alignment_layer, layers, name("alignment_layer"))
        translator._choose_engine(opts, checkpoints, name)
        return translator

    def _choose_engine(
        self, opts: TranslateOptions, checkpoints: list[Path], name: Callable[[str], str]
    ) -> None:
        """Set up CTranslate2 where `opts.engine` asks for it and the options allow it
        (nmt.engine): `ctranslate2` refuses an option it cannot honour, `auto` stays on torch
        there (or where the ctranslate2 package is missing); the choice goes to the log."""
        self.engine_choice = opts.engine
        if opts.engine == "torch":
            return
        if opts.engine == "auto" and importlib.util.find_spec("ctranslate2") is None:
            log.info("engine torch (auto: the ctranslate2 package is not installed)")
            return
        why = load_refusal(
            len(checkpoints),
            self.loaded.config.model.arch,
            self.precision,
            self.device,
            self.shortlist is not None,
            self.terminology is not None,
        )
        why = why or decode_refusal(self.decode)
        if why and opts.engine == "ctranslate2":
            raise NmtError(f"{name('engine')} ctranslate2 cannot honour {why}; use torch or auto")
        if why:
            log.info("engine torch (auto: CTranslate2 cannot honour %s)", why)
            return
        try:
            folder = converted(checkpoints[0], Path(opts.cache_dir) if opts.cache_dir else None)
        except NmtError as e:  # a model setting the converter does not map
            if opts.engine == "ctranslate2":
                raise
            log.info("engine torch (auto: %s)", e)
            return
        self.engine = CTranslate2Engine(
            folder, self.loaded.tokenizer, self.device, self.precision, self.workers
        )
        log.info("engine ctranslate2 (%s, its model in %s)", opts.engine, folder)

    def on_engine(self, constrained: bool) -> bool:
        """Whether CTranslate2 decodes a call with these decode settings, with lexical
        constraints or not; under `ctranslate2` an NmtError names what it cannot honour."""
        why = decode_refusal(self.decode)
        if constrained:
            why = why or "lexical constraints"
        if why and self.engine_choice == "ctranslate2":
            raise NmtError(f"engine ctranslate2 cannot honour {why}; use torch or auto")
        return why is None

    # ------------------------------------------------------------------ translation

    def translate(
        self,
        texts: Iterable[str | Request],
        *,
        target_lang: str | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        avoid: Sequence[Sequence[str]] | None = None,
        prefix: Sequence[str] | None = None,
        ordered: bool = False,
        split: bool = False,
    ) -> list[str]:
        """The best translation of each text, in order; "" for an empty or blank text.
        `target_lang` (a multilingual model's >>xxx<< language, e.g. "fra") overrides the one
        the translator was loaded with, for this call. Lexical constraints, one entry per text
        (see `translate_nbest`): `constraints` (target phrases that must appear), `avoid`
        (phrases that must not), `prefix` (the translation's start), `ordered`; or a text is a
        `nmt.terminology.Request`, which carries its own. With `split`, see `translate_nbest`."""
        if _arg(split, bool, "split", "translate"):
            hyps = self.translate_nbest(
                texts,
                target_lang=target_lang,
                constraints=constraints,
                avoid=avoid,
                prefix=prefix,
                split=True,  # which takes no constraints: ordered does not matter
            )
        else:
            lang = self.loaded.tokenizer.language_token(target_lang, "translate: target_lang")
            texts = _texts(texts, "texts", "translate", kinds=_TO_TRANSLATE)
            requests = terms.requests_from(texts, constraints, avoid, prefix, ordered, "translate")
            hyps = self._nbest(requests, lang=lang)
        return [h[0].text if h else "" for h in hyps]

    def translate_nbest(
        self,
        texts: Iterable[str | Request],
        nbest: int = 1,
        *,
        where: Callable[[int], str] | None = None,
        first_index: int = 0,
        alignment: bool = False,
        attention: bool = False,
        target_lang: str | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        avoid: Sequence[Sequence[str]] | None = None,
        prefix: Sequence[str] | None = None,
        ordered: bool | Sequence[bool] = False,
        abandoned: Callable[[int], bool] | None = None,
        split: bool = False,
    ) -> list[list[Translation]]:
        """The `nbest` (1 .. beam) best translations of each text, best first, with scores;
        [] for an empty or blank text. `where(i)` names input i in warnings (default
        "texts[i]"; the command passes FILE:LINE). With sampling, text i is input sentence
        first_index + i of the seed's generators (nmt.decoding.sampling; the command passes the line
        number, so chunking does not matter). With `alignment` / `attention`, each Translation
        carries its hard alignment (of the `alignment_layer`) / its attention matrices.
        `target_lang` as for `translate`.

        Lexical constraints (beam search only), each a list with one entry per text:
        `constraints[i]`, target phrases that must all appear in translation i (in the given
        order with `ordered`; segmented as an output would be); `avoid[i]`, texts it must never
        hold (`nmt.terminology.avoided_text`); `prefix[i]`, the text it must start with ("" for
        none); `ordered` (for all texts, or one per text). Or a text is a `Request`
        (nmt.terminology), its text and these (checked when it was made). Constraints that can never
        fit in the length limit are an NmtError naming the text; a translation whose constraints do
        not fit ends with them unmet, with a warning naming the text and why. With the
        translator's `terminology`, the target terms of each text's source terms are added to
        its constraints.

        `abandoned(i)`: whether nobody waits for text i any more (nmt serve: a 504, a client
        gone), asked before each decoding step; its translation then ends there, cut short.

        With `split`, a text is translated sentence by sentence (`nmt.segment`: its lines kept,
        pieces with nothing to translate kept as sent, a sentence too long for the model cut into
        pieces with a warning), its translations put back in its place (`joined`: the n-best of
        a text of one sentence; the best of each sentence joined for several). Texts are str
        (no constraints); no `attention`."""
        name = "translate_nbest"
        lang = self.loaded.tokenizer.language_token(target_lang, f"{name}: target_lang")
        nbest = _arg(nbest, int, "nbest", name)
        first_index = _arg(first_index, int, "first_index", name)
        alignment = _arg(alignment, bool, "alignment", name)
        attention = _arg(attention, bool, "attention", name)
        if first_index < 0:
            raise NmtError(f"{name}: first_index must be 0 or more, got {first_index}")
        if not (where is None or callable(where)):
            raise NmtError(f"{name}: where= must be a function of a text's index, or None")
        if not (abandoned is None or callable(abandoned)):
            raise NmtError(f"{name}: abandoned= must be a function of a text's index, or None")
        if _arg(split, bool, "split", name) and (attention or constraints or avoid or prefix):
            raise NmtError(f"{name}: split=True takes no attention, constraints, avoid or prefix")
        texts = _texts(texts, "texts", name, kinds=(str,) if split else _TO_TRANSLATE)
        if split:
            return self._split(texts, nbest, where, first_index, alignment, lang, abandoned)
        requests = terms.requests_from(texts, constraints, avoid, prefix, ordered, name)
        return self._nbest(
            requests,
            nbest,
            where=where,
            first_index=first_index,
            alignment=alignment,
            attention=attention,
            lang=lang,
            abandoned=abandoned,
        )

    def _nbest(
        self,
        requests: list[Request],
        nbest: int = 1,
        *,
        where: Callable[[int], str] | None = None,
        first_index: int = 0,
        alignment: bool = False,
        attention: bool = False,
        lang: str | None = None,
        abandoned: Callable[[int], bool] | None = None,
    ) -> list[list[Translation]]:
        """`translate_nbest` of arguments already checked: the texts and what is asked of their
        translations (`requests`); `lang` a checked >>xxx<< token."""
        check_nbest(nbest, self.decode, "nbest")
        where = where or (lambda i: f"texts[{i}]")
        if alignment or attention:  # a bad alignment layer fails before decoding
            resolve_layer(self.alignment_layer, layer_count(self.loaded.model))
        seqs = self.encode([r.text for r in requests], where, lang=lang or self.target_lang)
        requests = [terms.with_terms(r, self.terminology) for r in requests]
        cons = self.lexical.constraints(requests, seqs, self.decode, where)
        constrained = cons is not None and any(c is not None for c in cons)
        if self.engine is not None and self.on_engine(constrained):
            hyps = self.engine.translate(
                seqs, self.decode, nbest, self.loaded.max_positions, self.loaded.name
            )
        else:
            hyps = translate_token_lists(
                self.loaded.model,
                seqs,
                self.decode,
                specials=self.loaded.tokenizer.specials,
                nbest=nbest,
                device=self.device,
                precision=self.precision,
                max_positions=self.loaded.max_positions,
                workers=self.workers,
                shortlist=self.shortlist,
                first_index=first_index,
                constraints=cons,
                model_name=self.loaded.name,
                abandoned=abandoned,
            )
        # alignments and attention: torch's model forced on the hypotheses, whichever engine
        out = self.translations(seqs, hyps, alignment, attention)
        if cons is not None:
            self.lexical.report(
                requests,
                cons,
                hyps,
                [[t.text for t in ts] for ts in out],
                self.decode,
                where,
                self.term_stats,
            )
        return out

    def _split(
        self,
        texts: list[str],
        nbest: int,
        where: Callable[[int], str] | None,
        first_index: int,
        alignment: bool,
        lang: str | None,
        abandoned: Callable[[int], bool] | None,
    ) -> list[list[Translation]]:
        """`translate_nbest(..., split=True)`: the sentences of all texts in one batch."""
        where = where or (lambda i: f"texts[{i}]")
        parts = [self.segmented(t, lang) for t in texts]
        for i, part in enumerate(parts):
            if part.cut:
                log.warning(
                    "%s: a sentence longer than the model's maximum of %d tokens is translated "
                    "in pieces",
                    where(i),
                    self.loaded.max_positions - 1,
                )
        owner = [i for i, part in enumerate(parts) for _ in part.spans]
        hyps = self._nbest(
            [Request(part.text[a:b]) for part in parts for a, b in part.spans],
            nbest,
            where=lambda k: where(owner[k]),
            first_index=first_index,
            alignment=alignment,
            attention=alignment,  # the pieces `joined` counts
            lang=lang,
            abandoned=abandoned and (lambda k: abandoned(owner[k])),
        )
        return [joined(part, hs) for part, hs in zip(parts, per_text(parts, hyps))]

    def segmented(self, text: str, lang: str | None = None) -> Segmented:
        """`text` cut into the sentences of the model's source language (`nmt.segment`), each
        within the model's maximum with the target-language token `lang` (">>fra<<")."""
        limit = self.loaded.max_positions - 1
        lang = lang or self.target_lang
        return segment(
            text,
            self.loaded.config.data.source_lang,
            lambda s: len(self.encode([s], None, lang=lang)[0]) <= limit,
        )

    def translations(
        self,
        seqs: list[list[int]],
        hyps: list[list[Hypothesis]],
        alignment: bool = False,
        attention: bool = False,
    ) -> list[list[Translation]]:
        """The hypotheses of the sources `seqs` (token ids) as texts, with their alignment and / or
        attention if asked (`translate_nbest`)."""
        decode = self.loaded.tokenizer.decode
        out = [
            [Translation(clean_output(decode(h.tokens)), h.score, h.logprob) for h in hs]
            for hs in hyps
        ]
        if not (alignment or attention):
            return out
        # each translation's alignment and / or attention (nmt.decoding.alignment)
        layer = resolve_layer(self.alignment_layer, layer_count(self.loaded.model))
        pairs = [(i, k) for i, hs in enumerate(hyps) for k in range(len(hs))]
        weights = attention_matrices(
            self.loaded.model,
            [seqs[i] for i, _ in pairs],
            [hyps[i][k].tokens for i, k in pairs],
            specials=self.loaded.tokenizer.specials,
            device=self.device,
            precision=self.precision,
        )
        source, target = self.loaded.tokenizer.vocabularies()
        eos = self.loaded.tokenizer.specials.eos
        for (i, k), w in zip(pairs, weights, strict=True):
            att = None
            if attention:
                att = Attention(
                    w,
                    [source[t] for t in [*seqs[i], eos]],
                    [target[t] for t in [*hyps[i][k].tokens, eos]],
                )
            out[i][k] = replace(
                out[i][k], alignment=hard_alignment(w, layer) if alignment else None, attention=att
            )
        return out

    def translate_stream(self, lines: Iterable[str], *, buffer_lines: int = 1) -> Iterator[str]:
        """Translate an iterable of lines (str, or `Request`s) lazily, yielding one result per line
        in order.

        At most `buffer_lines` lines are read ahead and translated together. The default, 1,
        answers each line before the next is read (fairseq-interactive's default), for a
        source that waits on the answer; a larger value batches, which is faster for text
        that is already there (the results are the same). The arguments are checked here, the
        lines as they are read.
        """
        where = "translate_stream"
        lines = _iterable(lines, "lines", where)
        buffer_lines = _arg(buffer_lines, int, "buffer_lines", where)
        if not 1 <= buffer_lines <= sys.maxsize:
            raise NmtError(
                f"{where}: buffer_lines must be between 1 and {sys.maxsize}, got {buffer_lines}"
            )
        return self._stream(iter(lines), buffer_lines)

    def _stream(self, lines: Iterator[Any], buffer_lines: int) -> Iterator[str]:
        first = 0
        while chunk := _texts(
            islice(lines, buffer_lines), "lines", "translate_stream", first, _TO_TRANSLATE
        ):
            requests = terms.requests_from(chunk, None, None, None, False, "translate_stream")
            yield from (
                hyps[0].text if hyps else "" for hyps in self._nbest(requests, first_index=first)
            )
            first += len(chunk)

    # ------------------------------------------------------------------ forced decoding

    def score(
        self, sources: Iterable[str], targets: Iterable[str], *, normalize: bool = False
    ) -> list[float]:
        """The model's log-probability (natural log) of each target given its source.

        It is the sum of the log-probs of the target's tokens (as the checkpoint's
        sentencepiece model splits the text) and of the final EOS: the `logprob` of a
        `Translation`, the score of `--lenpen-style none`. With `normalize`, it is divided by
        the length penalty of the decode settings (lenpen, lenpen_style) with |Y| = tokens +
        EOS, which is the `score` beam search ranks hypotheses by and `--scores` prints.

        Sources are cleaned and truncated as `translate` does. An empty or blank source gives
        0.0 for an empty target and -inf for any other (that is what translation does with
        it: "" for certain). A target too long for the model is an error. Always decodes over
        the whole vocabulary (no shortlist).
        """
        sources = _texts(sources, "sources", "score")
        targets = _texts(targets, "targets", "score")
        normalize = _arg(normalize, bool, "normalize", "score")
        if len(sources) != len(targets):
            raise NmtError(f"score: {len(sources)} sources but {len(targets)} targets")
        srcs = self.encode(sources, lambda i: f"sources[{i}]")
        tgts = self.encode(targets, None, target=True)
        limit = self.loaded.max_positions - 1
        for i, t in enumerate(tgts):
            if len(t) > limit:
                raise NmtError(
                    f"targets[{i}]: {len(t)} tokens, more than the model's maximum of {limit}"
                )
        todo = [i for i, s in enumerate(srcs) if s]
        todo_sources = [srcs[i] for i in todo]
        todo_targets = [tgts[i] for i in todo]
        if self.engine is not None:
            lprobs = self.engine.score(todo_sources, todo_targets, self.loaded.name)
        else:
            lprobs = score_token_lists(
                self.loaded.model,
                todo_sources,
                todo_targets,
                self.decode,
                specials=self.loaded.tokenizer.specials,
                device=self.device,
                precision=self.precision,
                model_name=self.loaded.name,
            )
        scores = [0.0 if not t else -math.inf for t in tgts]  # empty sources
        for i, lp in zip(todo, lprobs, strict=True):
            scores[i] = sum(lp)
            if normalize:
                scores[i] /= length_penalty(len(lp), self.decode.lenpen, self.decode.lenpen_style)
        return scores

    # ------------------------------------------------------------------ helpers

    def _unknown_language(self, token: str, where: str) -> None:
        """A source starting with a `>>xxx<<` token the vocabulary lacks: refused where the model
        has language tokens (a typo would steer the translation to no language; `target_lang`
        refuses it too), else read as `<unk>` (as Marian does) with a warning, once a token."""
        if self.loaded.tokenizer.language_tokens():
            self.loaded.tokenizer.language_token(
                token, where
            )  # raises, naming the line and the close matches
        if token not in self._warned:
            self._warned.add(token)
            log.warning(
                "%s: %s is not a token of this model (it has no target-language tokens); read as "
                "<unk>",
                where,
                token,
            )

    def encode(
        self,
        texts: Sequence[str],
        where: Callable[[int], str] | None,
        *,
        target: bool = False,
        lang: str | None = None,
    ) -> list[list[int]]:
        """Token ids of each text (cleaned, a str: see `_texts`), as a source or with `target` as a
        target, as `translate` and `score` give them to the model (and the server's running search,
        nmt.serve.stream); [] for blank ones. A source text not starting with a language token
        gets `lang` (">>fra<<") first. With `where`, a text longer than the model's maximum is
        truncated, with a warning naming `where(i)`."""
        limit = self.loaded.max_positions - 1
        encode = self.loaded.tokenizer.encode_target if target else self.loaded.tokenizer.encode
        seqs = []
        for i, text in enumerate(texts):
            text = clean_text(text)
            if lang and text.strip() and not leading_language_token(text):
                text = f"{lang} {text}"
            if (
                where is not None
                and not target
                and (unknown := self.loaded.tokenizer.unknown_language(text))
            ):
                self._unknown_language(unknown, where(i))
            seq = encode(text) if text.strip() else []
            if where is not None and len(seq) > limit:
                log.warning(
                    "%s: %d tokens, truncated to the model's maximum of %d",
                    where(i),
                    len(seq),
                    limit,
                )
                seq = seq[:limit]
            seqs.append(seq)
        return seqs
