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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.atomic import replacing
from nmt.data import pad_rows
from nmt.device import autocast
from nmt.errors import NmtError
from nmt.tokenizer import BOS, EOS, PAD

ATTENTION_BATCH = 32  # sentences per teacher-forced pass


def attention_model(model: Any) -> Any:
    """The model whose attention is reported: the model, or the first of an ensemble."""
    return model.models[0] if hasattr(model, "models") else model


def layer_count(model: Any) -> int:
    """Decoder layers with cross-attention (1 for the RNN, 0 for an RNN without attention)."""
    m = attention_model(model)
    if hasattr(m, "has_attention"):
        return 1 if m.has_attention else 0
    return len(m.decoder)


def default_layer(layers: int) -> int:
    """The layer whose argmax alignments are the default: the last decoder layer (fairseq's
    default too). On 500 Multi30k val pairs its links agreed best with IBM Model 1's, though
    by a small margin over the penultimate (scripts/check_alignment_layer.py; docs/benchmarks.md,
    "Which layer aligns"); Garg et al. (2019) found the penultimate best for trained 6-layer
    models, so `--alignment-layer -2` is worth a look."""
    return layers - 1


def resolve_layer(layer: int | None, layers: int, name: str = "--alignment-layer") -> int:
    """A layer number as given (0-based, negative from the end, None = `default_layer`) -> 0-based."""
    if layers == 0:
        raise NmtError("this model has no attention (model.attention none): no alignment or attention to report")
    if layer is None:
        return default_layer(layers)
    if not -layers <= layer < layers:
        raise NmtError(f"{name} {layer}: the model has {layers} decoder layer(s) with attention "
                       f"(0 .. {layers - 1}, or negative from the end)")
    return layer % layers


def attention_matrices(model: Any, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                       device: torch.device | str = "cpu", precision: str = "fp32") -> list[np.ndarray]:
    """For each (source, target) token-id pair (without EOS) the cross-attention weights
    (L, H, T, S) float32 of the teacher-forced target; rows sum to one over the source."""
    m = attention_model(model)
    if layer_count(m) == 0:
        raise NmtError("this model has no attention (model.attention none): no alignment or attention to report")
    device = torch.device(device)
    out: list[np.ndarray] = []
    amp = autocast(device, "fp32" if precision == "int8" else precision)
    for first in range(0, len(sources), ATTENTION_BATCH):
        srcs, tgts = sources[first:first + ATTENTION_BATCH], targets[first:first + ATTENTION_BATCH]
        src = pad_rows([[*s, EOS] for s in srcs], PAD).to(device)  # (B, S)
        prev = pad_rows([[BOS, *t] for t in tgts], PAD).to(device)  # (B, T)
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
    if mean.shape[0] == 0 or mean.shape[1] == 0:
        return []
    return [(int(i), j) for j, i in enumerate(mean.argmax(1))]


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """`i-j` pairs separated by spaces (source index first), e.g. "0-0 1-2 2-1"."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def save_attention(path: str | Path, items: Sequence[tuple[int, np.ndarray, list[str], list[str]]]) -> None:
    """Write `(index, weights (L, H, T, S), source pieces (S,), target pieces (T,))` per sentence
    to an .npz file, whole or not at all: arrays `attention_<index>`, `source_<index>`,
    `target_<index>` (pieces include the final `</s>`), and `index`, the indices in order."""
    arrays: dict[str, np.ndarray] = {"index": np.array([i for i, *_ in items], dtype=np.int64)}
    for i, weights, src, tgt in items:
        arrays[f"attention_{i}"] = weights.astype(np.float32)
        arrays[f"source_{i}"] = np.array(src, dtype=str)
        arrays[f"target_{i}"] = np.array(tgt, dtype=str)
    with replacing(Path(path), "the attention") as tmp, open(tmp, "xb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]


def load_attention(path: str | Path) -> list[tuple[int, np.ndarray, list[str], list[str]]]:
    """Read what `save_attention` wrote."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: not an attention file from `nmt translate --attention` ({e})") from None
    with data:
        if "index" not in data:
            raise NmtError(f"{path}: not an attention file from `nmt translate --attention` (no index)")
        return [(int(i), data[f"attention_{i}"], data[f"source_{i}"].tolist(), data[f"target_{i}"].tolist())
                for i in data["index"]]
