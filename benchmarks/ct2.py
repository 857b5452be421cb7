"""The CTranslate2 side of the comparisons: a checkpoint exported by `nmt export`, its own
tokenizer turned into CTranslate2's pieces, and the decode settings that equal nmt's.

CTranslate2 decodes with the settings that equal nmt's `length` style (length_penalty =
lenpen, |Y| counting the EOS via return_end_token, disable_unk). Its length limit
(`max_decoding_length`) is one number per call, so each batch gets nmt's limit for its longest
source, max_len_a * (tokens + 1) + max_len_b (+1 for the EOS step); where a shorter sentence
of the batch reaches its own nmt limit (an under-trained model repeating itself), nmt stops it
with EOS and CTranslate2 goes on, so such outputs differ.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Encode = Callable[[list[str]], list[list[str]]]
Decode = Callable[[list[str]], str]


def lenpen(decode: Any) -> float:
    """CTranslate2's length penalty for nmt's decode settings; other styles stop the suite."""
    if decode.lenpen_style == "length":
        return decode.lenpen
    if decode.lenpen_style == "none" and decode.lenpen == 0:
        return 0.0
    sys.exit(f"decode.lenpen_style {decode.lenpen_style}: CTranslate2 normalises by length only")


def write_tokenizer(state: dict, path: Path) -> str:
    """The tokenizer of a loaded checkpoint `state`, written to `path` for `tokens` (so that a
    CTranslate2 process need not load the checkpoint's weights)."""
    path.write_bytes(state["tokenizer"]["model"])
    return str(path)


def tokens(tokenizer_file: str) -> tuple[Encode, Decode]:
    """A checkpoint's own tokenizer (nmt's, of either kind: one sentencepiece model, or an
    imported model's source and target models over a vocabulary; `tokenizer_file` as
    `write_tokenizer` wrote it) as CTranslate2 takes and gives tokens: texts -> their source
    pieces (no EOS: `nmt export`'s config adds it), and an output's pieces -> the text nmt
    writes for them."""
    from nmt.tokenizer import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    source, target = tok.vocabularies()
    ids = {piece: i for i, piece in enumerate(target)}

    def encode(texts: list[str]) -> list[list[str]]:
        return [[source[i] for i in seq] for seq in tok.encode_batch(texts)]

    def decode(pieces: list[str]) -> str:
        return tok.decode([ids.get(p, tok.specials.unk) for p in pieces if p != "</s>"])

    return encode, decode


def export(checkpoint: str, model_dir: Path, quantization: str) -> float:
    """`nmt export` of `checkpoint` into `model_dir` (float32: no quantization); model.bin's MB."""
    from nmt.convert.ctranslate2 import export as nmt_export

    nmt_export(
        checkpoint, model_dir, quantization=None if quantization == "float32" else quantization
    )
    return (model_dir / "model.bin").stat().st_size / 2**20


def batches(texts: list[str], pieces: list[list[str]], batch_size: int) -> list[list[int]]:
    """The indices of the non-empty `texts` as nmt batches them: sorted by length, longest
    first, `batch_size` a batch."""
    order = sorted((i for i, t in enumerate(texts) if t.strip()), key=lambda i: -len(pieces[i]))
    return [order[b : b + batch_size] for b in range(0, len(order), batch_size)]


def batch_limit(pieces: list[list[str]], ids: list[int], max_len: tuple[float, float]) -> int:
    """nmt's length limit for the batch's longest source, and the EOS step."""
    a, b = max_len
    return max(int(a * (len(pieces[i]) + 1) + b) for i in ids) + 1


def translate_batches(
    translator: Any,
    pieces: list[list[str]],
    groups: list[list[int]],
    beam: int,
    length_penalty: float,
    max_len: tuple[float, float],
    asynchronous: bool = False,
) -> list[tuple[list[int], Any]]:
    """Each batch of `groups` through `translator.translate_batch` with nmt's settings: (the
    batch's indices, its results; with `asynchronous`, futures, so that the inter_threads
    decode batches in parallel)."""
    out = []
    for ids in groups:
        results = translator.translate_batch(
            [pieces[i] for i in ids],
            beam_size=beam,
            length_penalty=length_penalty,
            return_end_token=True,
            disable_unk=True,
            max_decoding_length=batch_limit(pieces, ids, max_len),
            asynchronous=asynchronous,
        )
        out.append((ids, results))
    return out
