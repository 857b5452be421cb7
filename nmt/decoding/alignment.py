"""Attention you can look at: the cross-attention of translations, hard word-piece alignments
(Pharaoh `i-j`, as fairseq's `--print-alignment` and Marian's `--alignment`) and the `.npz`
file of attention matrices that `translate --attention` writes and `nmt plot attention` draws.

The weights come from a teacher-forced pass over the source and the chosen hypothesis
(`model.attention_weights`, computed explicitly there and only there, so that search keeps the
fused attention kernel). Since cached decoding equals the full forward pass, row t is the
attention of the step that produced target token t. Of an ensemble, the first model's.

Shapes: L decoder layers, H heads, T = target tokens + EOS, S = source tokens + EOS.
"""

from __future__ import annotations

import contextlib
import logging
import math
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.atomic import replacing, target
from nmt.data import pad_rows
from nmt.decoding.predict import decode_autocast
from nmt.errors import NmtError, one_line
from nmt.tokenizer import SpecialIds

log = logging.getLogger(__name__)
ATTENTION_BATCH = 32  # sentences per teacher-forced pass


def attention_model(model: Any) -> Any:
    """The model whose attention is reported: the model, or the first of an ensemble."""
    return model.models[0] if hasattr(model, "models") else model


def layer_count(model: Any) -> int:
    """Decoder layers with cross-attention (1 for the RNN, 0 for an RNN without attention)."""
    m = attention_model(model)
    if hasattr(m, "has_attention"):
        return int(m.has_attention)
    return len(m.decoder)


def default_layer(layers: int) -> int:
    """The layer whose argmax alignments are the default: the last decoder layer (fairseq's
    default too). On 500 Multi30k val pairs its links agreed best with IBM Model 1's, though
    by a small margin over the penultimate (docs/benchmarks-log.md,
    "Which layer aligns"); Garg et al. (2019) found the penultimate best for trained 6-layer
    models, so `--alignment-layer -2` is worth a look."""
    return layers - 1


def resolve_layer(layer: int | None, layers: int, name: str = "--alignment-layer") -> int:
    """A layer number as given (0-based, negative from the end, None = `default_layer`) ->
    0-based."""
    if layers == 0:
        raise NmtError(
            "this model has no attention (model.attention none): no alignment or attention to "
            "report"
        )
    if layer is None:
        return default_layer(layers)
    if not -layers <= layer < layers:
        raise NmtError(
            f"{name} {layer}: the model has {layers} decoder layer(s) with attention (0 .. "
            f"{layers - 1}, or negative from the end)"
        )
    return layer % layers


def attention_matrices(
    model: Any,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    specials: SpecialIds,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
) -> list[np.ndarray]:
    """For each (source, target) token-id pair (without eos) the cross-attention weights
    (L, H, T, S) float32 of the teacher-forced target; rows sum to one over the source.
    `specials` are the special ids of the model's vocabulary (`Tokenizer.specials`)."""
    m = attention_model(model)
    resolve_layer(None, layer_count(m))  # refuses a model without attention
    device = torch.device(device)
    out: list[np.ndarray] = []
    amp = decode_autocast(device, precision)
    for first in range(0, len(sources), ATTENTION_BATCH):
        srcs = sources[first : first + ATTENTION_BATCH]
        tgts = targets[first : first + ATTENTION_BATCH]
        src = pad_rows([[*s, specials.eos] for s in srcs], specials.pad).to(device)  # (B, S)
        prev = pad_rows([[specials.bos, *t] for t in tgts], specials.pad).to(device)  # (B, T)
        with torch.inference_mode(), amp:
            weights = m.attention_weights(src, prev).float().cpu()  # (B, L, H, T, S)
        for row, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
            out.append(weights[row, :, :, : len(t) + 1, : len(s) + 1].numpy())
    return out


def hard_alignment(weights: np.ndarray, layer: int) -> list[tuple[int, int]]:
    """weights (L, H, T, S) -> (source piece i, target piece j) pairs: for each target piece
    (EOS excluded) the source piece (EOS excluded) with the most attention of `layer`,
    averaged over its heads; in target order. Empty for an empty output."""
    mean = weights[layer].mean(0)[:-1, :-1]  # (T - 1, S - 1)
    if 0 in mean.shape:
        return []
    return [(int(i), j) for j, i in enumerate(mean.argmax(1))]


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """`i-j` pairs separated by spaces (source index first), e.g. "0-0 1-2 2-1"."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


# (index, weights (L, H, T, S), source, target)
AttentionItem = tuple[int, np.ndarray, list[str], list[str]]


class AttentionWriter:
    """An open `.npz` attention file (see `writing_attention`): `add` writes one sentence's
    arrays at once, so memory stays flat however many sentences there are (issue 25: they
    were kept until the end, ~62 KB each)."""

    def __init__(self, archive: zipfile.ZipFile):
        self.archive = archive
        self.indices: list[int] = []

    def add(self, index: int, weights: np.ndarray, source: list[str], target: list[str]) -> None:
        self._array(f"attention_{index}", weights.astype(np.float32))
        self._array(f"source_{index}", np.array(source, dtype=str))
        self._array(f"target_{index}", np.array(target, dtype=str))
        self.indices.append(index)

    def finish(self) -> None:
        """The last array: `index`, the indices in the order added."""
        self._array("index", np.array(self.indices, dtype=np.int64))

    def _array(self, key: str, array: np.ndarray) -> None:
        # what np.savez_compressed writes for one array, so that np.load reads the file as one of
        # its own
        with self.archive.open(f"{key}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, array, allow_pickle=False)


@contextlib.contextmanager
def writing_attention(path: str | Path) -> Iterator[AttentionWriter]:
    """The `.npz` file of `translate --attention`, written as translations come and renamed into
    place at the end, whole or not at all: arrays `attention_<index>` (L, H, T, S) float32,
    `source_<index>` (S,) and `target_<index>` (T,) pieces (each ending in `</s>`) per sentence
    in the order added, then `index`, the indices in that order. A killed run's temporary is
    removed first."""
    with (
        replacing(target(path, "--attention"), "the attention") as tmp,
        open(tmp, "xb") as f,
        zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as archive,
    ):
        writer = AttentionWriter(archive)
        yield writer
        writer.finish()
    log.info("wrote the attention of %d translations to %s", len(writer.indices), path)


_NOT_OURS = "not an attention file from `nmt translate --attention`"
# what a damaged or forged .npz raises when opened or when an array is read from it (RuntimeError:
# zipfile on an encrypted member, NotImplementedError on an unknown compression)
_READ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    KeyError,
    RuntimeError,
    zipfile.BadZipFile,
    zlib.error,
)


def load_attention(path: str | Path, sentences: int = 0) -> list[AttentionItem]:
    """Read what `writing_attention` wrote (the first `sentences`, if > 0), each array checked:
    a file that is not such a file is an NmtError naming it and the bad key."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except _READ_ERRORS as e:
        raise NmtError(f"{path}: {_NOT_OURS} ({one_line(e)})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise NmtError(f"{path}: {_NOT_OURS} (a .npy array, not an .npz archive)")
    with data:
        index = _array(data, path, "index")
        line_numbers = index.ndim == 1 and index.dtype.kind in "iu" and (index >= 0).all()
        if not line_numbers or len(set(index.tolist())) < index.size:
            raise NmtError(
                f"{path}: index: {_NOT_OURS} (expected distinct line numbers, got {index.dtype} "
                f"{index.shape})"
            )
        return [_item(data, path, int(i)) for i in index[: sentences or None]]


def _item(data: Any, path: str | Path, i: int) -> AttentionItem:
    weights = _array(data, path, f"attention_{i}")
    if weights.ndim != 4 or weights.dtype.kind != "f" or 0 in weights.shape:
        raise NmtError(
            f"{path}: attention_{i}: {_NOT_OURS} (expected real weights (layers, heads, target, "
            f"source), none empty, got {weights.dtype} {weights.shape})"
        )
    if not np.isfinite(weights).all():
        raise NmtError(
            f"{path}: attention_{i}: {_NOT_OURS} (weights that are not finite: NaN or inf)"
        )
    pieces = []
    for side, size in (("source", weights.shape[3]), ("target", weights.shape[2])):
        array = _array(data, path, f"{side}_{i}")
        if array.dtype.kind != "U" or array.shape != (size,):
            raise NmtError(
                f"{path}: {side}_{i}: {_NOT_OURS} (expected {size} pieces for attention_{i} "
                f"{weights.shape}, got {array.dtype} {array.shape})"
            )
        pieces.append(array.tolist())
    return i, weights.astype(np.float32), pieces[0], pieces[1]


def _array(data: Any, path: str | Path, key: str) -> np.ndarray:
    """Array `key` of the open .npz `data`, its header checked first: a forged shape bigger
    than the data stored would be a MemoryError (numpy allocates the array before reading)."""
    try:
        with data.zip.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(f)
            stored = data.zip.getinfo(f"{key}.npy").file_size
        if math.prod(shape) * dtype.itemsize > stored:
            raise NmtError(
                f"{path}: {key}: {_NOT_OURS} (its header declares a {dtype} array of shape "
                f"{shape}, more than the {stored} bytes stored)"
            )
        return data[key]
    except KeyError:
        raise NmtError(f"{path}: {key}: {_NOT_OURS} (no such array)") from None
    except _READ_ERRORS as e:
        raise NmtError(f"{path}: {key}: {_NOT_OURS} ({one_line(e)})") from None
