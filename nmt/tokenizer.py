"""Sentencepiece: training the joint model, encoding, decoding, the special ids.

The only module that imports sentencepiece, and the one owner of the special ids: a
`Tokenizer` reads them from its model (`Tokenizer.specials`, a `SpecialIds`), and everything
else (data, models, search, export) receives them from it or as an argument. Every model nmt
trains has `NMT_SPECIALS` (`pad=0, unk=1, bos=2, eos=3`); loading a model with other ids is
an error, since the ids are baked into the binarized data and the model's embedding table.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from nmt.errors import NmtError
from nmt.textio import read_lines


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

logger = logging.getLogger(__name__)


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
) -> Path:
    """Learn a sentencepiece model; writes `model_prefix.model` and `.vocab`, returns the former.

    `texts_or_files` yields sentences (`str`) and/or files to read them from (`os.PathLike`,
    e.g. `pathlib.Path`; plain or .gz, read with `nmt.textio.read_lines`). At most
    `input_sentence_size` sentences, sampled uniformly from all of them (0 = use all), are
    used, which bounds memory and time on large corpora.
    """

    def sentences() -> Iterator[str]:
        for item in texts_or_files:
            if isinstance(item, os.PathLike):
                yield from read_lines(item)
            else:
                yield item

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
            num_threads=max(1, num_threads),
            minloglevel=2,  # INFO is hundreds of lines, WARNING repeats the error we report in one line
        )
    except RuntimeError as e:
        # e.g. "Vocabulary size too high (8000). Please set it to a value <= 5234."
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise NmtError(
            f"sentencepiece training failed (--vocab-size {vocab_size}): {reason}"
        ) from None
    return Path(f"{model_prefix}.model")


class Tokenizer:
    """A loaded sentencepiece model with nmt's special ids (`specials`).

    `Tokenizer(path)` reads a .model file; `Tokenizer(model_bytes)` (or `from_bytes`) loads
    the bytes a checkpoint embeds. Keeps the bytes (`model_bytes`, `sha256`) and pickles as
    them.
    """

    def __init__(self, source: str | os.PathLike | bytes, name: str | None = None):
        if isinstance(source, (bytes, bytearray)):
            self.model_bytes, self.name = bytes(source), name or "<sentencepiece model>"
        else:
            self.name = name or str(source)
            try:
                self.model_bytes = Path(source).read_bytes()
            except OSError as e:
                raise NmtError(
                    f"{source}: cannot read sentencepiece model ({e.strerror})"
                ) from None
        self.sha256 = hashlib.sha256(self.model_bytes).hexdigest()
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self.model_bytes)
        except (RuntimeError, OSError, TypeError) as e:
            raise NmtError(f"{self.name}: not a sentencepiece model ({e})") from None
        sp = self._sp
        self.specials = SpecialIds(pad=sp.pad_id(), unk=sp.unk_id(), bos=sp.bos_id(), eos=sp.eos_id())
        if self.specials != NMT_SPECIALS:
            have, need = self.specials, NMT_SPECIALS
            raise NmtError(
                f"{self.name}: sentencepiece model has pad={have.pad} unk={have.unk} bos={have.bos} "
                f"eos={have.eos}; nmt needs pad={need.pad} unk={need.unk} bos={need.bos} eos={need.eos} "
                f"(train it with nmt prepare-bpe, or spm_train --pad_id={need.pad} --unk_id={need.unk} "
                f"--bos_id={need.bos} --eos_id={need.eos})"
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        return cls(Path(path))

    @classmethod
    def from_bytes(cls, model_bytes: bytes, name: str | None = None) -> Tokenizer:
        return cls(bytes(model_bytes), name)

    def __reduce__(self):
        return (Tokenizer, (self.model_bytes, self.name))

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of one sentence, without BOS/EOS."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Token ids of many sentences; sentencepiece runs `num_threads` threads without the GIL."""
        if not texts:
            return []
        return self._sp.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids; pad/bos/eos are skipped, unk shows as ' ⁇ '."""
        return self._sp.decode([int(i) for i in ids])

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def normalize(self, text: str) -> str:
        """The text as the model sees it (NFKC, whitespace collapsed); decode(encode(x)) == this
        when every character is in the vocabulary or byte_fallback is on."""
        return self._sp.normalize(text).replace("\u2581", " ").removeprefix(" ")

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(token_id)
