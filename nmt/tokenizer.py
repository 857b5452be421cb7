"""Tokenizers: training the joint sentencepiece model, encoding, decoding, the special ids.

The only module that imports sentencepiece, and the one owner of the special ids: a
`Tokenizer` knows them (`Tokenizer.specials`, a `SpecialIds`), and everything else (data,
models, search, export) receives them from it or as an argument. Every model nmt trains has
one joint sentencepiece model with `NMT_SPECIALS` (`pad=0, unk=1, bos=2, eos=3`,
`SentencePieceTokenizer`); an imported OPUS-MT / Marian model brings two sentencepiece models
and its own vocabulary and ids (`VocabTokenizer`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm

from nmt.atomic import read_regular
from nmt.errors import NmtError
from nmt.textio import SURROGATES, read_lines


@dataclass(frozen=True)
class SpecialIds:
    """The ids of a vocabulary's special tokens. A source is `tokens + [eos]`, the decoder
    input `[bos] + tokens` and its target `tokens + [eos]`; batches are padded with `pad`;
    the search never produces `pad` or `bos` (nor `unk`, unless asked to)."""

    pad: int
    unk: int
    bos: int
    eos: int

    def ids(self) -> list[int]:
        """The distinct special ids, ascending."""
        return sorted({self.pad, self.unk, self.bos, self.eos})


NMT_SPECIALS = SpecialIds(pad=0, unk=1, bos=2, eos=3)  # the ids of every vocabulary nmt trains


# where in its C++ sentencepiece raised an error, before the reason: "INTERNAL: src/x.cc(744) [(a)
# == (b)] "
_SPM_SOURCE = re.compile(r"^[A-Z_]+: \S+\(\d+\) \[.*?\] ")


def train_sentencepiece(
    texts_or_files: Iterable[str | os.PathLike],
    model_prefix: str | Path,
    vocab_size: int,
    *,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    input_sentence_size: int = 2_000_000,
    seed: int = 1,
    num_threads: int = 1,
    source: str = "",
    size_option: str = "--vocab-size",
) -> Path:
    """Learn a sentencepiece model; writes `model_prefix.model` and `.vocab`, returns the former.

    `texts_or_files` yields sentences (`str`) and/or files to read them from (`os.PathLike`,
    e.g. `pathlib.Path`; plain or .gz, read with `nmt.textio.read_lines`). At most
    `input_sentence_size` sentences, sampled uniformly from all of them (0 = use all), are
    used, which bounds memory and time on large corpora. A failure is an NmtError naming
    `source` (what the sentences are: "train.en + train.de") and `size_option`, the option
    that chose `vocab_size`.
    """

    def sentences() -> Iterator[str]:
        for item in texts_or_files:
            yield from read_lines(item) if isinstance(item, os.PathLike) else [item]

    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(),
            model_prefix=str(model_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            pad_id=NMT_SPECIALS.pad,
            unk_id=NMT_SPECIALS.unk,
            bos_id=NMT_SPECIALS.bos,
            eos_id=NMT_SPECIALS.eos,
            num_threads=num_threads,  # at least 1: PrepareOptions.workers
            minloglevel=2,
        )  # INFO is hundreds of lines, WARNING repeats the error we report in one line
    except RuntimeError as e:
        # e.g. "Vocabulary size too high (8000). Please set it to a value <= 5234."
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        reason = _SPM_SOURCE.sub(
            "", reason
        )  # "INTERNAL: src/trainer_interface.cc(744) [(...) == (...)] "
        on = f" on {source}" if source else ""
        raise NmtError(
            f"sentencepiece training{on} failed ({size_option} {vocab_size}): {reason}"
        ) from None
    return Path(f"{model_prefix}.model")


class Tokenizer:
    """What turns text into a model's ids and back: `encode` (source side), `encode_target`,
    `decode` (target ids to text), `piece`, `vocab_size` and the special ids (`specials`).

    Two kinds, loaded by `Tokenizer.from_file` / `from_bytes` from the bytes a checkpoint
    and a prepared directory's spm.model hold (`model_bytes`, `sha256`):
    - `SentencePieceTokenizer`: one joint sentencepiece model whose ids are the model's ids
      (every model nmt trains, with `NMT_SPECIALS`);
    - `VocabTokenizer`: a source and a target sentencepiece model and an explicit vocabulary
      mapping their pieces to the model's ids (an imported OPUS-MT / Marian model: `</s>` 0,
      `<unk>` 1, the pad row last), stored as nmt's bundle of the three.
    Both pickle as their bytes.
    """

    name: str
    model_bytes: bytes
    sha256: str
    specials: SpecialIds

    @staticmethod
    def from_file(path: str | os.PathLike) -> Tokenizer:
        """The tokenizer in a file, read whole under nmt's one rule (`nmt.atomic.read_regular`:
        a FIFO or a link to /dev/zero is refused, never waited on or read without end)."""
        try:
            data = read_regular(Path(path), "the sentencepiece model")
        except FileNotFoundError:
            raise NmtError(f"{path}: sentencepiece model not found") from None
        return Tokenizer.from_bytes(data, str(path))

    @staticmethod
    def from_bytes(model_bytes: bytes, name: str | None = None) -> Tokenizer:
        if model_bytes.startswith(BUNDLE_MAGIC):
            return VocabTokenizer.from_bundle(model_bytes, name)
        return SentencePieceTokenizer(model_bytes, name)

    def __reduce__(self):
        return (Tokenizer.from_bytes, (self.model_bytes, self.name))

    @property
    def vocab_size(self) -> int:
        """The target vocabulary's size (the source's too, unless `source_vocab_size` says
        otherwise)."""
        raise NotImplementedError

    @property
    def source_vocab_size(self) -> int | None:
        """The source vocabulary's size where it is its own (separate vocabularies), else None."""
        return None

    def vocabularies(self) -> tuple[list[str], list[str]]:
        """The source's and the target's pieces in id order: one list twice where they are joint."""
        if not hasattr(self, "_pieces"):  # made once
            self._pieces = [self.piece(i) for i in range(self.vocab_size)]
        return self._pieces, self._pieces

    def encode(self, text: str) -> list[int]:
        """Token ids of one source sentence, without BOS/EOS."""
        raise NotImplementedError

    def encode_target(self, text: str) -> list[int]:
        """Token ids of one target sentence (a reference, a constraint), without BOS/EOS."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """`encode` of many source sentences."""
        return [self.encode(t) for t in texts]

    def encode_target_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """`encode_target` of many target sentences."""
        return [self.encode_target(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of target token ids; pad/bos/eos are skipped, unk shows as ' ⁇ '."""
        raise NotImplementedError

    def normalize(self, text: str) -> str:
        """The source text as the model sees it (NFKC, whitespace collapsed)."""
        raise NotImplementedError

    def piece(self, token_id: int) -> str:
        raise NotImplementedError

    def files(self) -> dict[str, bytes]:
        """The sentencepiece models a deployment tokenizes with, by file name: spm.model, or
        source.spm and target.spm."""
        raise NotImplementedError

    def language_tokens(self) -> list[str]:
        """The target-language tokens (`>>xxx<<`) of a multilingual model's vocabulary, in id
        order; [] for others."""
        return []

    def unknown_language(self, text: str) -> str | None:
        """The `>>xxx<<` token a source text starts with where `encode` looks it up whole and the
        vocabulary lacks it (it becomes `<unk>`); None otherwise."""
        return None

    def language_token(self, lang: Any, name: str) -> str | None:
        """ ">>fra<<" for a target language given as fra or >>fra<< that the model has a token
        for; None for None; else an NmtError naming `name` (and the close matches)."""
        if lang is None:
            return None
        if not isinstance(lang, str):
            raise NmtError(f"{name} must be a language code string, got {type(lang).__name__}")
        bare = lang[2:-2] if LANGUAGE_TOKEN.fullmatch(lang) else lang
        if not re.fullmatch(r"[^\s<>]+", bare):  # not empty either
            raise NmtError(f"{name} must be a language code such as fra, got {lang!r}")
        token = f">>{bare}<<"
        known = self.language_tokens()
        if not known:
            raise NmtError(
                f"{name} {bare}: the model has no target-language tokens (>>xxx<<); it is not "
                "multilingual"
            )
        if token not in known:
            close = difflib.get_close_matches(token, known, n=3)
            hint = f" (did you mean {', '.join(t[2:-2] for t in close)}?)" if close else ""
            raise NmtError(
                f"{name} {bare}: the model has no {token} token{hint}; it knows {len(known)} "
                f"languages, e.g. {', '.join(t[2:-2] for t in known[:8])}"
            )
        return token

    def surfaces(self) -> list[bytes]:
        """What each target token id adds to `decode`'s text, as UTF-8 bytes (`▁` a space, a byte
        piece its byte, `<unk>` " ⁇ ", a control token nothing): a decoded text is its tokens'
        surfaces one after another, less its leading space (and with one U+FFFD for each
        undecodable byte)."""
        raise NotImplementedError


class SentencePieceTokenizer(Tokenizer):
    """One joint sentencepiece model with nmt's special ids (`NMT_SPECIALS`): its ids are the
    model's ids, on both sides."""

    def __init__(self, model_bytes: bytes, name: str | None = None):
        self.model_bytes = model_bytes
        self.name = name or "<sentencepiece model>"
        self.sha256 = hashlib.sha256(self.model_bytes).hexdigest()
        self._sp = sp = _load_spm(self.model_bytes, self.name)
        self.specials = SpecialIds(
            pad=sp.pad_id(), unk=sp.unk_id(), bos=sp.bos_id(), eos=sp.eos_id()
        )
        if self.specials != NMT_SPECIALS:
            have = self.specials
            need = NMT_SPECIALS
            raise NmtError(
                f"{self.name}: sentencepiece model has pad={have.pad} unk={have.unk} "
                f"bos={have.bos} eos={have.eos}; nmt needs pad={need.pad} unk={need.unk} "
                f"bos={need.bos} eos={need.eos} (train it with nmt prepare-bpe, or spm_train "
                f"--pad_id={need.pad} --unk_id={need.unk} --bos_id={need.bos} --eos_id={need.eos})"
            )

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    encode_target = encode

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Sentencepiece runs `num_threads` threads without the GIL."""
        return self._sp.encode(list(texts), num_threads=num_threads)

    encode_target_batch = encode_batch

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def normalize(self, text: str) -> str:
        """decode(encode(x)) == this when every character is in the vocabulary or byte_fallback is
        on."""
        return self._sp.normalize(text).replace("\u2581", " ").removeprefix(" ")

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(token_id)

    def surfaces(self) -> list[bytes]:
        return [_surface(self._sp, self.piece(i)) for i in range(self.vocab_size)]

    def files(self) -> dict[str, bytes]:
        return {"spm.model": self.model_bytes}


BUNDLE_MAGIC = (
    b"NMT-TOKENIZER\n"  # then one JSON line (the header), then the source and target models
)
LANGUAGE_TOKEN = re.compile(
    r">>[^<>\s]+<<"
)  # a multilingual model's target-language token, >>fra<<


def leading_language_token(text: str) -> str | None:
    """The target-language token (`LANGUAGE_TOKEN`: ">>", no space, "<<") that `text` starts
    with, or None: the one rule for what a source's language token is."""
    found = LANGUAGE_TOKEN.match(text)
    return found.group(0) if found else None


class VocabTokenizer(Tokenizer):
    """A source and a target sentencepiece model whose pieces are looked up in an explicit
    vocabulary (`pieces`, the model's id order), as OPUS-MT / Marian models are segmented:
    a piece missing from the vocabulary is `<unk>`; the special ids are the vocabulary's
    (`specials`), not the sentencepiece models'. With `source_pieces` the source side has its own
    vocabulary (separate vocabularies; the special ids are the same ids in both). A source text
    may start with a target-language token (`>>fra<<`), which is looked up whole, as Marian and
    Hugging Face's MarianTokenizer do.
    Decoding joins the target pieces with the target model (`▁` becomes a space)."""

    def __init__(
        self,
        source_model: bytes,
        target_model: bytes,
        pieces: Sequence[str],
        specials: SpecialIds,
        name: str | None = None,
        source_pieces: Sequence[str] | None = None,
    ):
        self.name = name or "<vocabulary tokenizer>"
        self.source_model = source_model
        self.target_model = target_model
        self.pieces = list(pieces)
        self.specials = specials
        self.separate = source_pieces is not None
        self.source_pieces = list(source_pieces) if source_pieces is not None else self.pieces
        self._ids = self._index(self.pieces, "target ")
        self._source_ids = self._index(self.source_pieces, "source ")
        header = {
            "pieces": self.pieces,
            "specials": vars(specials),
            "source_bytes": len(self.source_model),
            "target_bytes": len(self.target_model),
        } | ({"source_pieces": self.source_pieces} if self.separate else {})
        self._source = _load_spm(self.source_model, f"{self.name} (source model)")
        self._target = _load_spm(self.target_model, f"{self.name} (target model)")
        self.model_bytes = (
            BUNDLE_MAGIC
            + json.dumps(header, ensure_ascii=False).encode()
            + b"\n"
            + self.source_model
            + self.target_model
        )
        self.sha256 = hashlib.sha256(self.model_bytes).hexdigest()
        self._skip = {specials.pad, specials.bos, specials.eos}

    def _index(self, pieces: list[str], side: str) -> dict[str, int]:
        ids = {p: i for i, p in enumerate(pieces)}
        if len(ids) != len(pieces) or not all(isinstance(p, str) for p in pieces):
            raise NmtError(
                f"{self.name}: the {side * self.separate}vocabulary lists a piece twice or a "
                "non-string"
            )
        surrogate = SURROGATES.search(
            "".join(pieces)
        )  # JSON can spell one (\ud800); UTF-8 cannot encode it
        if surrogate is not None:
            i = next(i for i, p in enumerate(pieces) if surrogate.group() in p)
            raise NmtError(
                f"{self.name}: piece {i} of the {side * self.separate}vocabulary holds a lone "
                f"surrogate ({surrogate.group()!a}), which is not text"
            )
        if bad := [k for k, v in vars(self.specials).items() if not 0 <= v < len(pieces)]:
            raise NmtError(
                f"{self.name}: special id {bad[0]}={getattr(self.specials, bad[0])} is outside the "
                f"{side * self.separate}vocabulary of {len(pieces)}"
            )
        return ids

    @classmethod
    def from_bundle(cls, data: bytes, name: str | None = None) -> VocabTokenizer:
        name = name or "<vocabulary tokenizer>"
        try:
            end = data.index(b"\n", len(BUNDLE_MAGIC))
            header = json.loads(data[len(BUNDLE_MAGIC) : end])
            n_src = int(header["source_bytes"])
            models = data[end + 1 :]  # the source's, then the target's
            src = models[:n_src]
            tgt = models[n_src:]
            source_pieces = header.get("source_pieces")
            if len(tgt) != int(header["target_bytes"]) or not all(
                isinstance(p, list) for p in (header["pieces"], source_pieces or [])
            ):
                raise ValueError("truncated")
            specials = SpecialIds(
                **{k: int(header["specials"][k]) for k in ("pad", "unk", "bos", "eos")}
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise NmtError(f"{name}: corrupt tokenizer bundle ({e})") from None
        return cls(src, tgt, header["pieces"], specials, name, source_pieces)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @property
    def source_vocab_size(self) -> int | None:
        return len(self.source_pieces) if self.separate else None

    def vocabularies(self) -> tuple[list[str], list[str]]:
        return self.source_pieces, self.pieces

    def _lookup(self, pieces: Iterable[str], ids: dict[str, int]) -> list[int]:
        return [ids.get(p, self.specials.unk) for p in pieces]

    def unknown_language(self, text: str) -> str | None:
        token = leading_language_token(text)
        return token if token is not None and token not in self._source_ids else None

    def encode(self, text: str) -> list[int]:
        code: list[int] = []
        if (token := leading_language_token(text)) is not None:  # looked up whole
            code = self._lookup([token], self._source_ids)
            text = text[len(token) :]
        return code + self._lookup(self._source.encode(text, out_type=str), self._source_ids)

    def encode_target(self, text: str) -> list[int]:
        return self._lookup(self._target.encode(text, out_type=str), self._ids)

    def decode(self, ids: Iterable[int]) -> str:
        pieces = [self.pieces[int(i)] for i in ids if int(i) not in self._skip]
        return self._target.decode_pieces(pieces).replace("\u2581", " ").strip()

    def normalize(self, text: str) -> str:
        return self._source.normalize(text).replace("\u2581", " ").removeprefix(" ")

    def piece(self, token_id: int) -> str:
        return self.pieces[token_id]

    def surfaces(self) -> list[bytes]:
        return [
            b"" if i in self._skip else _surface(self._target, p) for i, p in enumerate(self.pieces)
        ]

    def files(self) -> dict[str, bytes]:
        return {"source.spm": self.source_model, "target.spm": self.target_model}

    def language_tokens(self) -> list[str]:  # a source text's first token
        return [p for p in self.source_pieces if LANGUAGE_TOKEN.fullmatch(p)]


def spm_pieces(model_bytes: bytes, name: str) -> list[str]:
    """The pieces of a sentencepiece model, in id order."""
    sp = _load_spm(model_bytes, name)
    return [sp.id_to_piece(i) for i in range(sp.vocab_size())]


def _surface(sp: spm.SentencePieceProcessor, piece: str) -> bytes:
    """What `piece` adds to the text `sp` decodes (see `Tokenizer.surfaces`); a piece the model
    lacks comes out as it is."""
    i = sp.piece_to_id(piece)
    if sp.id_to_piece(i) == piece:
        if sp.is_byte(i):
            return bytes([int(piece[1:-1], 16)])  # <0xNN>
        if sp.is_control(i):
            return b""
        if sp.is_unknown(i):
            return " \u2047 ".encode()
    return piece.replace("\u2581", " ").encode()


def _load_spm(model_bytes: bytes, name: str) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except (RuntimeError, OSError, TypeError) as e:
        raise NmtError(f"{name}: not a sentencepiece model ({e})") from None
    return sp
