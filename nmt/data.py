"""Binarized parallel data: memory-mapped splits, token-based batches, collation.

On-disk format (written by `nmt.prepare`, described by `prepare.json`), per split and
language:

- `{split}.{lang}.bin`: the token ids of all sentences back to back, little-endian uint16
  (vocabularies up to 65535) or int32, without BOS/EOS;
- `{split}.{lang}.idx`: little-endian int64 offsets into the .bin, one per sentence plus
  one (sentence i is `bin[idx[i]:idx[i+1]]`);
- `{split}.raw.{lang}` (valid/test splits): the cleaned input text, one line per sentence.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from nmt.atomic import os_errors_as, read_regular
from nmt.errors import NmtError
from nmt.tokenizer import SpecialIds

logger = logging.getLogger(__name__)

META_FILE = "prepare.json"
# Sort within pools of this many typical batches: big enough that padding is nearly as
# low as with a global sort, small enough that batch composition changes every epoch.
POOL_BATCHES = 100


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 65535 else np.dtype("<i4")


def bin_path(data_dir: str | Path, split: str, lang: str) -> Path:
    return Path(data_dir) / f"{split}.{lang}.bin"


def idx_path(data_dir: str | Path, split: str, lang: str) -> Path:
    return Path(data_dir) / f"{split}.{lang}.idx"


def raw_path(data_dir: str | Path, split: str, lang: str) -> Path:
    return Path(data_dir) / f"{split}.raw.{lang}"


def read_meta(data_dir: str | Path) -> dict:
    """The `prepare.json` of a directory written by `nmt prepare-bpe`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise NmtError(f"{data_dir}: data directory not found (data.dir; run nmt prepare-bpe)")
    path = data_dir / META_FILE
    try:
        meta = json.loads(read_regular(path, "the prepare-bpe report").decode("utf-8"))
    except FileNotFoundError:
        raise NmtError(
            f"{path} not found: data.dir is not a directory written by nmt prepare-bpe"
        ) from None
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: cannot read ({e})") from None
    _check_meta(meta, path)
    return meta


# The keys of prepare.json that nmt reads, and their types
_META_SHAPE: dict[str, type] = {
    "source_lang": str,
    "target_lang": str,
    "vocab_size": int,
    "dtype": str,
    "splits": dict,
    "spm": dict,
}


def _check_meta(meta: object, path: Path) -> None:
    """prepare.json must be what prepare-bpe writes: valid JSON of another shape is refused
    here, naming the key, rather than failing later with a KeyError."""
    if not isinstance(meta, dict):
        raise NmtError(
            f"{path}: not a prepare-bpe report (expected a JSON object, got {type(meta).__name__})"
        )
    for key, tp in _META_SHAPE.items():
        value = meta.get(key)
        if type(value) is not tp:  # not a bool for an int
            raise NmtError(
                f"{path}: not a prepare-bpe report ({key} missing or not a {tp.__name__})"
            )
    if (
        not isinstance(meta["spm"].get("sha256"), str)
        or meta["dtype"] not in ("uint16", "int32")
        or not isinstance(meta.get("fingerprint", ""), str)
        or type(meta.get("source_vocab_size")) not in (int, type(None))
    ):
        raise NmtError(
            f"{path}: not a prepare-bpe report (spm.sha256, dtype, fingerprint or "
            "source_vocab_size)"
        )


def read_raw(data_dir: str | Path, split: str, lang: str) -> list[str]:
    """The cleaned text of a valid/test split (BLEU references, translation input)."""
    path = raw_path(data_dir, split, lang)
    with os_errors_as(path, "cannot read"):
        text = read_regular(path, "the text", None).decode("utf-8")
    return text.split("\n")[:-1]


class TokenArray:
    """Sentences of one split and language: a flat token array and offsets (both memmaps)."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens = tokens
        self.offsets = offsets
        self.sizes = np.diff(offsets)  # int64, tokens per sentence (no EOS)

    @classmethod
    def load(cls, data_dir: str | Path, split: str, lang: str, dtype: np.dtype) -> TokenArray:
        bin_file = bin_path(data_dir, split, lang)
        idx_file = idx_path(data_dir, split, lang)
        tokens = _memmap(bin_file, dtype)
        offsets = _memmap(idx_file, np.dtype("<i8"))
        if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(tokens):
            raise NmtError(
                f"{idx_file} does not match {bin_file.name} (truncated?); re-run nmt prepare-bpe"
            )
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    if not path.is_file():
        raise NmtError(f"{path} not found (re-run nmt prepare-bpe?)")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise NmtError(
            f"{path}: size {size} is not a multiple of {dtype.itemsize} bytes (truncated?)"
        )
    if size == 0:  # mmap refuses empty files
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


@dataclass
class ParallelData:
    """One split's source and target sentences; sentence i of both is a translation pair."""

    src_lang: str
    tgt_lang: str
    src_data: TokenArray
    tgt_data: TokenArray

    @classmethod
    def load(
        cls,
        data_dir: str | Path,
        split: str,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
    ) -> ParallelData:
        """Memory-map `split`; languages default to prepare.json's (either direction works)."""
        meta = read_meta(data_dir)
        if split not in meta["splits"]:
            raise NmtError(f"{data_dir}: no split {split!r} (has {', '.join(meta['splits'])})")
        langs = (meta["source_lang"], meta["target_lang"])
        src_lang = src_lang or langs[0]
        tgt_lang = tgt_lang or langs[1]
        for lang in (src_lang, tgt_lang):
            if lang not in langs:
                raise NmtError(f"{data_dir}: no language {lang!r} (prepared {langs[0]}-{langs[1]})")
        dtype = np.dtype(meta["dtype"]).newbyteorder("<")
        src, tgt = (TokenArray.load(data_dir, split, lang, dtype) for lang in (src_lang, tgt_lang))
        if len(src) != len(tgt):
            raise NmtError(
                f"{data_dir}: {split}.{src_lang} has {len(src)} sentences but {split}.{tgt_lang} "
                f"has {len(tgt)}; re-run nmt prepare-bpe"
            )
        return cls(src_lang, tgt_lang, src, tgt)

    def __len__(self) -> int:
        return len(self.src_data)

    @property
    def src_sizes(self) -> np.ndarray:
        return self.src_data.sizes

    @property
    def tgt_sizes(self) -> np.ndarray:
        return self.tgt_data.sizes

    def src(self, i: int) -> np.ndarray:
        return self.src_data[i]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_data[i]


# ---------------------------------------------------------------- batches


@dataclass
class Batch:
    """Padded tensors of a batch of pairs. B sentences, S / T positions."""

    src: torch.Tensor  # (B, S) long: tokens + EOS, right-padded with PAD
    prev_output: torch.Tensor  # (B, T) long: BOS + tokens, right-padded (decoder input)
    target: torch.Tensor  # (B, T) long: tokens + EOS, right-padded
    ids: torch.Tensor  # (B,) long: dataset indices; stays on the CPU
    num_target_tokens: int  # non-pad target positions (EOS included): the loss's token count
    # the real (non-pad) target positions, made on the CPU so that the device never has to
    # tell the host how many there are (a boolean mask would: a sync in every forward)
    target_index: torch.Tensor  # (M,) long: flat positions in (B * T), row-major
    target_tokens: torch.Tensor  # (M,) long: target[target_index], the loss's labels

    def __len__(self) -> int:
        return self.src.size(0)

    def pin_memory(self) -> Batch:
        return self._map(torch.Tensor.pin_memory)

    def to(self, device: torch.device | str) -> Batch:
        """Copy the tensors to `device` (asynchronous from pinned memory); ids stay."""
        return self._map(lambda t: t.to(device, non_blocking=True))

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        return dataclasses.replace(
            self,
            src=fn(self.src),
            prev_output=fn(self.prev_output),
            target=fn(self.target),
            target_index=fn(self.target_index),
            target_tokens=fn(self.target_tokens),
        )


Length = TypeVar("Length", int, np.ndarray)


def padded_length(length: Length, multiple: int) -> Length:
    """`length` (an int, or an integer array elementwise) rounded up to a multiple of
    `multiple` (1: unchanged)."""
    return -(-length // multiple) * multiple


def pad_rows(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """Token lists -> (len(rows), longest) long tensor, each row right-padded with `pad`."""
    batch = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row)
    return batch


def collate(
    data: ParallelData,
    indices: Sequence[int] | np.ndarray,
    specials: SpecialIds,
    pin_memory: bool = False,
    pad_to: int = 1,
) -> Batch:
    """Pad the pairs `indices` of `data` into a Batch (rows in the order of `indices`), with the
    special ids of the data's vocabulary (`Tokenizer.specials`).

    With pad_to > 1 both lengths are padded up to a multiple of it, so that the tensors of an
    epoch take few distinct shapes (kernels, attention backends and torch.compile see
    repeats); the padding is masked like any other and changes no result."""
    ids = np.array(indices, dtype=np.int64)  # a copy: batch.ids must not alias the batch list
    src_len = data.src_sizes[ids]
    tgt_len = data.tgt_sizes[ids]
    src = np.full(
        (len(ids), padded_length(int(src_len.max()) + 1, pad_to)), specials.pad, dtype=np.int64
    )
    prev = np.full(
        (len(ids), padded_length(int(tgt_len.max()) + 1, pad_to)), specials.pad, dtype=np.int64
    )
    target = np.full_like(prev, specials.pad)
    for row, i in enumerate(ids):
        n = src_len[row]
        m = tgt_len[row]
        src[row, :n] = data.src(i)
        src[row, n] = specials.eos
        prev[row, 0] = specials.bos
        prev[row, 1 : m + 1] = target[row, :m] = data.tgt(i)
        target[row, m] = specials.eos
    real = np.arange(target.shape[1])[None, :] <= tgt_len[:, None]  # (B, T): tokens and EOS
    target_index = np.flatnonzero(real)
    batch = Batch(
        torch.from_numpy(src),
        torch.from_numpy(prev),
        torch.from_numpy(target),
        torch.from_numpy(ids),
        int(tgt_len.sum()) + len(ids),
        torch.from_numpy(target_index),
        torch.from_numpy(target.reshape(-1)[target_index]),
    )
    return batch.pin_memory() if pin_memory else batch


class Batches(list):
    """`make_batches`' result: a list of index arrays, plus counts of what needed a decision.

    `excluded`: pairs left out because a side is longer than max_positions - 1.
    `oversized`: pairs that exceed max_tokens on their own; each is a batch of its own.
    """

    excluded: int = 0
    oversized: int = 0


def make_batches(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    max_positions: int | None = None,
    pad_to: int = 1,
) -> Batches:
    """Group pair indices into batches of at most `max_tokens` padded positions.

    A batch of B pairs costs B * (max source len + 1) + B * (max target len + 1) (EOS on
    the source, BOS/EOS on the target). With `shuffle`, the kept pairs are permuted, cut
    into pools of about POOL_BATCHES batches, sorted by length within each pool (so pairs
    of similar length share a batch) and packed greedily; then the batch order is
    permuted. Everything depends on (seed, epoch) only, so an epoch's batches can be
    rebuilt to resume at any batch. Without `shuffle`: one global length sort, in order
    (validation). Every kept pair is in exactly one batch. Pairs that exceed max_tokens on
    their own are not dropped but batched alone (counted in `.oversized`, logged), since
    prepare-bpe's max_len already bounds training pairs and valid/test must stay whole.
    With pad_to > 1 (see `collate`) a batch costs its lengths rounded up to that multiple.
    """
    src = np.asarray(src_sizes, dtype=np.int64)
    tgt = np.asarray(tgt_sizes, dtype=np.int64)
    keep = np.arange(len(src))
    if max_positions is not None:  # the EOS (source) and BOS/EOS (target) need a position too
        keep = np.flatnonzero((src < max_positions) & (tgt < max_positions))
    pools = [keep]  # without shuffle: one global length sort
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(keep)
        mean_pair = float(src[keep].mean() + tgt[keep].mean()) + 2 if len(keep) else 1.0
        pool = POOL_BATCHES * max(1, int(max_tokens // mean_pair))
        pools = [order[start : start + pool] for start in range(0, len(order), pool)]
    batches = Batches()
    for chunk in pools:
        # pairs of similar lengths together: by source length, then target length. With pad_to > 1
        # the source lengths that pad to the same width count as equal, so that the target lengths
        # sort within them (less target padding, for free)
        by_length = np.lexsort((tgt[chunk], padded_length(src[chunk] + 1, pad_to)))
        batches.extend(_pack(chunk[by_length], src, tgt, max_tokens, pad_to))
    if shuffle:
        batches[:] = [batches[i] for i in rng.permutation(len(batches))]
    batches.excluded = len(src) - len(keep)
    batches.oversized = sum(
        1 for b in batches if len(b) == 1 and src[b[0]] + tgt[b[0]] + 2 > max_tokens
    )
    if batches.excluded:
        logger.info(
            "left out %d pairs too long for max_positions=%s", batches.excluded, max_positions
        )
    if batches.oversized:
        logger.warning(
            "%d pairs exceed max_tokens=%d on their own; each is a batch of its own",
            batches.oversized,
            max_tokens,
        )
    return batches


def _pack(
    order: np.ndarray, src: np.ndarray, tgt: np.ndarray, max_tokens: int, pad_to: int
) -> list[np.ndarray]:
    """Cut `order` greedily into consecutive batches within the padded-token budget."""
    cuts = [0]
    start = max_s = max_t = 0
    # the lengths as collate pads them (EOS, BOS/EOS, then the multiple), less the one added below
    src_len = padded_length(src[order] + 1, pad_to) - 1
    tgt_len = padded_length(tgt[order] + 1, pad_to) - 1
    # plain ifs, not max(): this loop runs once per pair per epoch (3x faster)
    for i, (s, t) in enumerate(zip(src_len.tolist(), tgt_len.tolist(), strict=True)):
        if s > max_s:
            max_s = s
        if t > max_t:
            max_t = t
        if (i - start + 1) * (max_s + max_t + 2) > max_tokens and i > start:
            cuts.append(i)
            start = i
            max_s = s
            max_t = t
    cuts.append(len(order))
    return [order[a:b] for a, b in pairwise(cuts) if b > a]
