"""Sentencepiece: training the joint model, encoding, decoding, the fixed special ids.

The only module that imports sentencepiece. Every model nmt uses has `pad=0, unk=1,
bos=2, eos=3`; loading a model with other ids is an error, since the ids are baked into
the binarized data and the model's embedding table.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from nmt.errors import NmtError
from nmt.textio import read_lines

PAD, UNK, BOS, EOS = 0, 1, 2, 3

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
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
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
    """A loaded sentencepiece model with nmt's special ids.

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
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise NmtError(
                f"{self.name}: sentencepiece model has pad={ids[0]} unk={ids[1]} bos={ids[2]} "
                f"eos={ids[3]}; nmt needs pad=0 unk=1 bos=2 eos=3 (train it with nmt "
                "prepare-bpe, or spm_train --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)"
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
        """Text of token ids; PAD/BOS/EOS are skipped, UNK shows as ' ⁇ '."""
        return self._sp.decode([int(i) for i in ids])

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def normalize(self, text: str) -> str:
        """The text as the model sees it (NFKC, whitespace collapsed); decode(encode(x)) == this
        when every character is in the vocabulary or byte_fallback is on."""
        return self._sp.normalize(text).replace("\u2581", " ").removeprefix(" ")

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(token_id)
