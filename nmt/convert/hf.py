"""Hugging Face MarianMT folders: `nmt import` of one (`config.json`, `model.safetensors` or
`pytorch_model.bin`, `source.spm`, `target.spm`, `vocab.json`, and `tokenizer_config.json`,
`generation_config.json`), and `nmt export --format hf` of a checkpoint as one.

The mapping, as transformers computes the model: post-norm layers, embeddings scaled by
sqrt(d_model), the sinusoid table of `MarianSinusoidalPositionalEmbedding` (`positions:
hf_marian`), decoding starts from the embedding of `decoder_start_token_id` (the pad row),
logits plus `final_logits_bias`; the pad row is part of the vocabulary, as it is there. Where
each weight goes is the weight table's `HF_MARIAN` layout (`nmt.convert.table`); what transformers
would read in place of what nmt computes or reads (a stored position table that is not the
sinusoids, tied copies that differ) is refused. The decode settings of generation_config.json and
the languages of tokenizer_config.json come with the model. An export is
refused, naming the setting, where MarianMT would compute another model (`HF_ONLY`); it writes
what transformers would otherwise default wrongly (the tying flags, the decoder start, the
pieces never generated, the maximum length, the beam and its length penalty).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import ModelCheckpoint
from nmt.config import ModelConfig
from nmt.convert.reading import (
    LANGUAGE_CODE,
    Imported,
    Keys,
    Reader,
    Weights,
    check_config,
    decode_settings,
    pieces_in_id_order,
    shown,
)
from nmt.convert.table import HF_MARIAN, read, write
from nmt.errors import NmtError
from nmt.models.layers import sinusoids
from nmt.tokenizer import SpecialIds, VocabTokenizer

log = logging.getLogger(__name__)

_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "swish": "swish",
    "silu": "swish",
    "quick_gelu": "gelu_sigmoid",
}
# what MarianMT computes, where nmt has a choice: an import sets it, an export of anything else is
# refused
HF_ONLY: dict[str, Any] = {
    "arch": "transformer",
    "norm_first": False,
    "learned_positions": False,
    "positions": "hf_marian",
    "decoder_start": "bos",
    "norm_eps": 1e-5,
}
# nmt's model keys -> config.json's, for the messages of the config's validation
_KEYS = {
    "encoder_layers": "encoder_layers",
    "decoder_layers": "decoder_layers",
    "d_model": "d_model",
    "ffn_dim": "encoder_ffn_dim",
    "heads": "encoder_attention_heads",
    "dropout": "dropout",
    "attention_dropout": "attention_dropout",
    "activation_dropout": "activation_dropout",
    "max_positions": "max_position_embeddings",
}
POSITIONS_TOLERANCE = 1e-4  # rounding of transformers' table (computed in float64 or float32)
# generation_config.json's keys (else config.json's) -> nmt's decode settings; max_length is mapped
# to max_len_b by `_hf_decode`
GENERATION = {
    "num_beams": "beam",
    "length_penalty": "lenpen",
    "min_new_tokens": "min_len",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
    "max_length": "max_len_b",
}


def read_hf_folder(folder: Path) -> Imported:
    reader = Reader()
    cfg = reader.json(folder / "config.json")
    cfg.need(
        cfg.text("model_type", "") == "marian",
        f"model_type {cfg.raw.get('model_type')!r}, not marian",
    )
    heads = cfg.int("encoder_attention_heads", 8)
    ffn = cfg.int("encoder_ffn_dim", 2048)
    dec_heads = cfg.int("decoder_attention_heads", 8)
    dec_ffn = cfg.int("decoder_ffn_dim", 2048)
    cfg.need(
        heads == dec_heads,
        f"encoder_attention_heads {heads} != decoder_attention_heads {dec_heads}",
    )
    cfg.need(ffn == dec_ffn, f"encoder_ffn_dim {ffn} != decoder_ffn_dim {dec_ffn}")
    cfg.need(cfg.flag("scale_embedding", False), "scale_embedding is not true")
    for key, what in (
        ("normalize_before", " (pre-norm)"),
        ("normalize_embedding", ""),
        ("add_final_layer_norm", ""),
    ):
        cfg.need(not cfg.flag(key, False), f"{key}{what} is true")
    act = cfg.text("activation_function", "gelu")
    cfg.need(
        act in _ACTIVATIONS, f"activation_function {act!r} (supported: {', '.join(_ACTIVATIONS)})"
    )
    vocab_size = cfg.int("vocab_size")  # the source's; the target's is decoder_vocab_size
    sizes = (vocab_size, cfg.int("decoder_vocab_size", vocab_size))
    pad = cfg.int("pad_token_id")
    eos = cfg.int("eos_token_id")
    share = cfg.flag("share_encoder_decoder_embeddings", True)
    cfg.need(
        not share or sizes[1] == vocab_size,
        f"decoder_vocab_size {sizes[1]} != vocab_size {vocab_size} while "
        "share_encoder_decoder_embeddings is true",
    )
    model = ModelConfig(
        **HF_ONLY,
        encoder_layers=cfg.int("encoder_layers"),
        decoder_layers=cfg.int("decoder_layers"),
        d_model=cfg.int("d_model", 512),
        ffn_dim=ffn,
        heads=heads,
        dropout=cfg.number("dropout", 0.1),
        attention_dropout=cfg.number("attention_dropout", 0.0),
        activation_dropout=cfg.number("activation_dropout", 0.0),
        share_embeddings=share,
        tie_output=cfg.flag("tie_word_embeddings", True),
        output_bias=True,
        activation=_ACTIVATIONS[act],  # type: ignore[arg-type]
        max_positions=cfg.int("max_position_embeddings", 512),
    )
    check_config(model, cfg.where, _KEYS)
    tok_cfg = _optional_json(reader, folder / "tokenizer_config.json")
    tok = _hf_tokenizer(
        reader,
        folder,
        tok_cfg,
        sizes,
        share,
        SpecialIds(pad, 0, cfg.int("decoder_start_token_id", pad), eos),
    )
    # checked before the weights are read
    decode = _hf_decode(reader, folder, cfg, tok.vocab_size, model.max_positions)
    model, weights = _map_hf(reader, folder, model, tok)
    return Imported(model, weights, tok, decode, str(folder), reader.files, _hf_languages(tok_cfg))


def _optional_json(reader: Reader, path: Path) -> Keys:
    """A JSON file the folder may lack (then an empty mapping)."""
    return reader.json(path) if os.path.lexists(path) else Keys({}, str(path))


def _hf_decode(
    reader: Reader, folder: Path, cfg: Keys, vocab_size: int, positions: int
) -> dict[str, Any]:
    """The decode settings (`GENERATION`) of generation_config.json, which transformers' generate()
    prefers and where recent transformers versions write them (5.x keeps them nowhere else), else
    of config.json, checked as any config's decode section is (`decode_settings`). length_penalty
    is lenpen of nmt's `length` style (score / len^alpha, len counting </s>). max_length counts
    generate()'s decoder start: below the model's positions (which bound nmt's outputs anyway)
    its max_length - 1 tokens are nmt's length limit, whatever the source's length."""
    generation = _optional_json(reader, folder / "generation_config.json")
    settings: dict[str, Any] = {"lenpen_style": "length", "lenpen": 1.0}  # generate()'s default
    names: dict[str, str] = {}
    for key, ours in GENERATION.items():
        keys = generation if generation.raw.get(key) is not None else cfg
        if keys.raw.get(key) is None:
            continue
        settings[ours] = keys.number(key, 1.0) if key == "length_penalty" else keys.int(key)
        names[ours] = f"{keys.where}: {key}"
    length = settings.pop("max_len_b", positions)
    if length < 2:
        raise NmtError(
            f"{names['max_len_b']} {length} leaves no token to generate (it counts the decoder "
            "start)"
        )
    if length < positions:
        settings.update(max_len_a=0.0, max_len_b=length - 1)
    return decode_settings(settings, names, vocab_size)


def _hf_languages(tok_cfg: Keys) -> dict[str, str]:
    """tokenizer_config.json's source_lang and target_lang, as data.source_lang / target_lang
    (what `nmt serve` and the export name); one that is not a language code is left out, with a
    warning."""
    languages = {}
    for key in ("source_lang", "target_lang"):
        value = tok_cfg.raw.get(key)
        if isinstance(value, str) and LANGUAGE_CODE.fullmatch(value):
            languages[key] = value
        elif value is not None:
            log.warning(
                "%s: %s %s is not a language code; the checkpoint does not name it",
                tok_cfg.where,
                key,
                shown(value),
            )
    return languages


def _hf_tokenizer(
    reader: Reader,
    folder: Path,
    tok_cfg: Keys,
    sizes: tuple[int, int],
    share: bool,
    ids: SpecialIds,
) -> VocabTokenizer:
    """vocab.json, and with separate_vocabs the target's target_vocab.json (`sizes`: config.json's
    vocab_size and decoder_vocab_size; `tok_cfg`: tokenizer_config.json); the unk id is theirs."""
    separate = tok_cfg.flag("separate_vocabs", False)
    tok_cfg.need(
        not (separate and share),
        "separate_vocabs is true, but config.json shares the embeddings "
        "(share_encoder_decoder_embeddings)",
    )
    tok_cfg.need(
        separate or sizes[0] == sizes[1],
        f"separate_vocabs is not true, but config.json's decoder_vocab_size "
        f"{sizes[1]} != vocab_size {sizes[0]}",
    )
    source = _hf_vocab(reader, folder / "vocab.json", "vocab_size", sizes[0], ids.pad)
    target = source
    if separate:
        target_file = Path(tok_cfg.text("target_vocab_file", "target_vocab.json")).name
        target = _hf_vocab(reader, folder / target_file, "decoder_vocab_size", sizes[1], ids.pad)
        if source.index("<unk>") != target.index("<unk>"):
            raise NmtError(f"{folder}: <unk> has two ids in vocab.json and {target_file}")
    src_spm, tgt_spm = (
        reader.bytes(folder / name, "a sentencepiece model")
        for name in ("source.spm", "target.spm")
    )
    return VocabTokenizer(
        src_spm,
        tgt_spm,
        target,
        dataclasses.replace(ids, unk=target.index("<unk>")),
        name=f"{folder}: its tokenizer",
        source_pieces=source if separate else None,
    )


def _hf_vocab(reader: Reader, path: Path, key: str, size: int, pad: int) -> list[str]:
    """A vocabulary file's pieces in id order, as many as config.json's `key` says."""
    vocab = reader.json(path).raw
    if not all(type(v) is int for v in vocab.values()):  # not a bool either
        raise NmtError(f"{path}: not a mapping of pieces to ids")
    pieces = pieces_in_id_order(vocab, path)
    if len(pieces) == size - 1 and pad == size - 1:  # the pad row is the model's, not vocab.json's
        pieces.append("<pad>")
    if len(pieces) != size:
        raise NmtError(f"{path}: {len(pieces)} pieces, but config.json's {key} is {size}")
    if "<unk>" not in vocab:
        raise NmtError(f"{path}: no <unk> piece")
    return pieces


def _map_hf(
    reader: Reader, folder: Path, cfg: ModelConfig, tok: VocabTokenizer
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    names = [
        name
        for name in ("model.safetensors", "pytorch_model.bin")
        if os.path.lexists(folder / name)
    ]
    if not names:
        raise NmtError(f"{folder}: neither model.safetensors nor pytorch_model.bin")
    w = reader.weights(folder / names[0], prefix="model.")
    w.hint = (
        f" (d_model {cfg.d_model}, encoder_ffn_dim {cfg.ffn_dim}, vocab_size "
        f"{tok.source_vocab_size or tok.vocab_size})"
    )
    weights = read(
        HF_MARIAN,
        w,
        cfg,
        tok.vocab_size,
        f"that {folder / 'config.json'} describes",
        tok.source_vocab_size,
    )
    _check_position_tables(w, cfg)
    _check_tied_copies(w, cfg, weights)
    # transformers 5 ties the encoder's and decoder's tables to `shared` only while
    # tie_word_embeddings is true: a folder it wrote with share_encoder_decoder_embeddings true and
    # tie_word_embeddings false holds three different tables, and the model reads two of them
    share = cfg.share_embeddings and torch.equal(
        weights["src_embed.tokens.weight"], weights["tgt_embed.tokens.weight"]
    )
    return dataclasses.replace(cfg, share_embeddings=share), weights


def _check_position_tables(w: Weights, cfg: ModelConfig) -> None:
    """A stored `embed_positions.weight` (older uploads' `.bin` hold them) is what transformers
    runs, in place of the table it would compute: nmt computes its table (`positions:
    hf_marian`), so a stored one must be that table."""
    table = sinusoids(cfg.max_positions, cfg.d_model, "hf_marian")
    for name in ("encoder.embed_positions.weight", "decoder.embed_positions.weight"):
        if not w.has(name):
            continue
        error = float((w.take(name, *table.shape) - table).abs().max())
        if error > POSITIONS_TOLERANCE:
            raise NmtError(
                f"{w.path}: weight {w.keys[name]} is not MarianMT's sinusoid table (it differs by "
                f"up to {error:.3g}), which nmt computes; nmt import refuses a model it would run "
                "otherwise"
            )


def _check_tied_copies(w: Weights, cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """With tie_word_embeddings, transformers ties `lm_head` to the target's table, and with
    share_encoder_decoder_embeddings too both sides' tables to `shared`: every copy a file holds
    must be equal, or which one the model reads is not for nmt to guess (a `.bin` keeps them
    all)."""
    if not cfg.tie_output:
        return
    table = weights["tgt_embed.tokens.weight"]
    copies = ["lm_head.weight"]
    if cfg.share_embeddings:
        copies += ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
    for name in copies:
        if w.has(name) and not torch.equal(w.take(name, *table.shape), table):
            raise NmtError(
                f"{w.path}: weight {w.keys[name]} differs from its tied copies "
                "(tie_word_embeddings: transformers reads one of them); nmt import refuses a "
                "model it might run otherwise"
            )


def write_hf_folder(ckpt: ModelCheckpoint, model: torch.nn.Module, folder: Path) -> None:
    """`nmt export --format hf`: the checkpoint as a MarianMT folder in `folder` (an empty
    directory), for `MarianMTModel.from_pretrained` and `MarianTokenizer`."""
    from safetensors.torch import save

    cfg = ckpt.config.model
    tok = ckpt.tokenizer
    ids = tok.specials
    decode = ckpt.config.decode
    source, pieces = tok.vocabularies()
    sides = [pieces] if source is pieces else [source, pieces]
    vocabs = [
        {piece: i for i, piece in enumerate(side)} for side in sides
    ]  # vocab.json (, target_vocab.json)
    if any(len(vocab) != len(side) for vocab, side in zip(vocabs, sides, strict=True)):
        raise NmtError(f"{ckpt.path}: its vocabulary holds a piece twice; vocab.json cannot map it")
    tensors = {
        ("" if name in ("lm_head.weight", "final_logits_bias") else "model.") + name: t.float()
        .contiguous()
        .clone()
        for name, t in write(HF_MARIAN, cfg, model.state_dict()).items()
        if cfg.share_embeddings or name != "shared.weight"
    }  # MarianMT has `shared` only when it shares
    tensors["final_logits_bias"] = tensors.get(
        "final_logits_bias", torch.zeros(tok.vocab_size)
    ).view(1, -1)
    # written as every other file is (safetensors' save_file makes it 0600: unreadable to a server's
    # account)
    (folder / "model.safetensors").write_bytes(save(tensors, metadata={"format": "pt"}))
    activation = {v: k for k, v in reversed(_ACTIVATIONS.items())}[cfg.activation]
    # the ids transformers reads from config.json and from generation_config.json alike
    special_ids = {
        "pad_token_id": ids.pad,
        "eos_token_id": ids.eos,
        "decoder_start_token_id": ids.bos,
    }
    config = {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": len(sides[0]),
        "decoder_vocab_size": tok.vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads,
        "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.ffn_dim,
        "decoder_ffn_dim": cfg.ffn_dim,
        "activation_function": activation,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,
        "static_position_embeddings": True,
        "normalize_embedding": False,
        "share_encoder_decoder_embeddings": cfg.share_embeddings,
        "tie_word_embeddings": cfg.tie_output,
        **special_ids,
    }
    # generate() as nmt's search: the tokens it never writes suppressed, the beam stopped as
    # nmt stops it (early_stopping: at `beam` finished; without a length penalty, exactly); no
    # forced_eos_token_id, which would give </s> log-prob 0 at the length limit
    never = sorted({ids.pad, ids.bos} | (set() if decode.allow_unk else {ids.unk}))
    exact = decode.lenpen_style == "none" or decode.lenpen <= 0
    # generate()'s max_length counts the decoder start: nmt's fixed limit of max_len_b tokens
    # (max_len_a 0) is max_len_b + 1, the model's positions bound both (`_hf_decode` reads it back)
    length = cfg.max_positions
    if decode.max_len_a == 0:
        length = min(length, decode.max_len_b + 1)
    generation = {
        "num_beams": decode.beam,
        "early_stopping": not exact,
        "max_length": length,
        "min_new_tokens": decode.min_len,
        "no_repeat_ngram_size": decode.no_repeat_ngram_size,
        "suppress_tokens": never,
        "length_penalty": 0.0 if exact else decode.lenpen,
        **special_ids,
    }
    if decode.lenpen_style == "gnmt":  # generate() divides by length^alpha only
        log.warning(
            "decode.lenpen_style gnmt has no equivalent in transformers: generation_config.json "
            "divides by length^%g (nmt's length style, the </s> counted)",
            decode.lenpen,
        )
    data = ckpt.config.data
    tokenizer = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": data.source_lang or None,
        "target_lang": data.target_lang or None,
        "model_max_length": cfg.max_positions,
        "separate_vocabs": len(sides) == 2,
        "clean_up_tokenization_spaces": False,
        "eos_token": pieces[ids.eos],
        "unk_token": pieces[ids.unk],
        "pad_token": pieces[ids.pad],
    }
    # an imported model's source.spm and target.spm, or nmt's one joint spm.model
    files = tok.files()
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(files.get(name) or files["spm.model"])
    for name, content in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tokenizer),
        *zip(("vocab.json", "target_vocab.json"), vocabs),
    ):
        (folder / name).write_text(
            json.dumps(content, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
        )
