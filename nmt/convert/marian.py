"""`nmt import`: an OPUS-MT / Marian model -> one ordinary nmt checkpoint.

Two sources are read:
- a Hugging Face MarianMT folder: `config.json`, `model.safetensors` or `pytorch_model.bin`,
  `source.spm`, `target.spm`, `vocab.json` (and `tokenizer_config.json`);
- a Marian release: a folder with `decoder.yml` (or the `decoder.yml` itself) naming the
  `.npz` model and its vocabularies (`vocab.yml` with `source.spm` / `target.spm` beside it,
  or `.spm` vocabularies), the model's options in the `.npz`'s `special:model.yml`.

The result carries the model config (`nmt.config.ModelConfig`: activation, tying, output
bias, the position table the weights were trained with, the decoder start, LayerNorm
epsilon, maximum length), the weights in nmt's layout, and a `VocabTokenizer` (both
sentencepiece models and the vocabulary in the model's id order, with its special ids).

The mapping, as each source computes its model:
- Hugging Face: post-norm layers, embeddings scaled by sqrt(d_model), the sinusoid table of
  `MarianSinusoidalPositionalEmbedding` (`positions: hf_marian`), decoding starts from the
  embedding of `decoder_start_token_id` (the pad row), logits plus `final_logits_bias`;
  the pad row is part of the vocabulary, as it is there.
- Marian: Marian's own sinusoids (`positions: marian`), decoding starts from a zero vector
  (`decoder_start: zeros`), LayerNorm epsilon 1e-6; `transformer-ffn-activation: gelu` is
  x*sigmoid(1.702x) in Marian up to v1.12.2 and the exact erf GELU after (the model.yml's
  `version` decides). A Marian model has no pad row: one is appended, with a zero embedding and
  an output bias of `PAD_LOGIT_BIAS`, so that its probability is exactly 0 in fp32, bf16 and fp16
  and the other tokens' log-probabilities are Marian's.

Nothing here runs code from a file: `.bin` weights load with `torch.load(weights_only=True)`,
`.npz` with `numpy.load(allow_pickle=False)`, safetensors by reading its header and buffers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from nmt.atomic import FileArg, atomic_write_bytes, check_outputs
from nmt.checkpoint import atomic_save, check_average_output
from nmt.config import Config, ModelConfig, config_to_dict, dump_config
from nmt.errors import NmtError
from nmt.models.transformer import Transformer
from nmt.tokenizer import SpecialIds, Tokenizer, VocabTokenizer, spm_pieces

PAD_LOGIT_BIAS = -1e4  # exp(-1e4 - max) underflows to 0 in every float format; fp16 can hold it
MARIAN_LAYERNORM_EPS = 1e-6

_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


@dataclasses.dataclass
class Imported:
    """A model read from its source: config, weights in nmt's layout, tokenizer, and the decode
    settings it ships with (beam, length penalty: `DecodeConfig` keys)."""

    model: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    decode: dict[str, Any]
    source: str  # what it was read from, for the checkpoint's record


# ---------------------------------------------------------------- entry point


def import_model(source: str | Path) -> Imported:
    """Read a Hugging Face MarianMT folder or a Marian release (see the module docstring)."""
    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file():
        return read_hf_folder(path)
    if path.is_dir() and (path / "decoder.yml").is_file():
        return read_marian(path / "decoder.yml")
    if path.is_file() and path.suffix in (".yml", ".yaml"):
        return read_marian(path)
    if not path.exists():
        raise NmtError(f"{path}: not found")
    raise NmtError(f"{path}: neither a Hugging Face MarianMT folder (config.json) nor a Marian release "
                   "(a folder with decoder.yml, or the decoder.yml)")


def imported_checkpoint(imported: Imported, base: Config | None = None) -> dict[str, Any]:
    """The checkpoint dict of an imported model (nmt's format, `nmt.checkpoint`)."""
    cfg = base or Config()
    cfg = dataclasses.replace(cfg, model=imported.model, decode=dataclasses.replace(cfg.decode, **imported.decode))
    tok = imported.tokenizer
    return {"format_version": 1, "model": imported.weights, "config": config_to_dict(cfg),
            "vocab_size": tok.vocab_size, "tokenizer": {"model": tok.model_bytes, "sha256": tok.sha256},
            "update": 0, "epoch": 0, "imported_from": imported.source}


# ---------------------------------------------------------------- Hugging Face


def read_hf_folder(folder: Path) -> Imported:
    cfg = _read_json(folder / "config.json")
    where = f"{folder / 'config.json'}"

    def get(key: str, default: Any = None) -> Any:
        return cfg.get(key, default)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise NmtError(f"{where}: {what}; nmt import cannot map it")

    need(get("model_type") == "marian", f"model_type {get('model_type')!r}, not marian")
    d_model = int(get("d_model", 512))
    heads, dec_heads = int(get("encoder_attention_heads", 8)), int(get("decoder_attention_heads", 8))
    ffn, dec_ffn = int(get("encoder_ffn_dim", 2048)), int(get("decoder_ffn_dim", 2048))
    need(heads == dec_heads, f"encoder_attention_heads {heads} != decoder_attention_heads {dec_heads}")
    need(ffn == dec_ffn, f"encoder_ffn_dim {ffn} != decoder_ffn_dim {dec_ffn}")
    need(get("scale_embedding", False) is True, "scale_embedding is not true")
    need(not get("normalize_before", False), "normalize_before (pre-norm) is true")
    need(not get("normalize_embedding", False), "normalize_embedding is true")
    need(not get("add_final_layer_norm", False), "add_final_layer_norm is true")
    activations = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "swish": "swish", "silu": "swish"}
    act = get("activation_function", "gelu")
    need(act in activations, f"activation_function {act!r} (supported: {', '.join(activations)})")
    vocab_size = int(get("vocab_size"))
    dec_vocab = get("decoder_vocab_size") or vocab_size
    share = bool(get("share_encoder_decoder_embeddings", True))
    need(dec_vocab == vocab_size, f"decoder_vocab_size {dec_vocab} != vocab_size {vocab_size} "
                                  "(separate source and target vocabularies)")
    pad, eos = int(get("pad_token_id")), int(get("eos_token_id"))
    start = int(get("decoder_start_token_id", pad))

    tok = _hf_tokenizer(folder, vocab_size, pad, eos, start)
    tie = bool(get("tie_word_embeddings", True))
    beam = _hf_beam(folder, cfg)  # checked before the weights are read
    weights = {k.removeprefix("model."): v for k, v in _hf_weights(folder).items()}
    share = share and _same_embeddings(weights)
    model = ModelConfig(
        arch="transformer", encoder_layers=int(get("encoder_layers")), decoder_layers=int(get("decoder_layers")),
        d_model=d_model, ffn_dim=ffn, heads=heads, dropout=float(get("dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        activation_dropout=float(get("activation_dropout", 0.0)), norm_first=False,
        share_embeddings=share, tie_output=tie, output_bias=True, activation=activations[act],  # type: ignore[arg-type]
        norm_eps=1e-5, positions="hf_marian", decoder_start="bos",
        max_positions=int(get("max_position_embeddings", 512)))
    return Imported(model, _map_hf(weights, model, folder, vocab_size), tok, beam, str(folder))


def _hf_beam(folder: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The decode settings of generation_config.json, which transformers' generate() prefers and
    where recent transformers versions write them (5.x keeps them nowhere else), else of
    config.json: num_beams -> beam, length_penalty -> lenpen (score / len^alpha, len counting
    </s>: nmt's `length` style)."""
    path = folder / "generation_config.json"
    generation = _read_json(path) if path.is_file() else {}
    if not (isinstance(generation, dict) and generation.get("num_beams") is not None):
        path, generation = folder / "config.json", cfg
    decode: dict[str, Any] = {}
    beams = generation.get("num_beams")
    if beams is not None:
        if not isinstance(beams, int) or isinstance(beams, bool) or beams < 1:
            raise NmtError(f"{path}: num_beams {beams!r} is not a positive integer")
        decode["beam"] = beams
    penalty = generation.get("length_penalty", 1.0)
    if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) or not 0 <= penalty <= 10:
        raise NmtError(f"{path}: length_penalty {penalty!r} is not a number between 0 and 10")
    decode.update(lenpen=float(penalty), lenpen_style="length")
    return decode


def _hf_tokenizer(folder: Path, vocab_size: int, pad: int, eos: int, start: int) -> VocabTokenizer:
    tok_cfg = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    if tok_cfg.get("separate_vocabs"):
        raise NmtError(f"{folder / 'tokenizer_config.json'}: separate_vocabs is true (separate source and target "
                       "vocabularies); nmt import cannot map it")
    vocab = _read_json(folder / "vocab.json")
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise NmtError(f"{folder / 'vocab.json'}: not a mapping of pieces to ids")
    pieces = _pieces_in_id_order(vocab, folder / "vocab.json")
    if len(pieces) == vocab_size - 1 and pad == vocab_size - 1:  # the pad row is the model's, not vocab.json's
        pieces.append("<pad>")
    if len(pieces) != vocab_size:
        raise NmtError(f"{folder / 'vocab.json'}: {len(pieces)} pieces, but config.json's vocab_size is {vocab_size}")
    if "<unk>" not in vocab:
        raise NmtError(f"{folder / 'vocab.json'}: no <unk> piece")
    specials = SpecialIds(pad=pad, unk=vocab["<unk>"], bos=start, eos=eos)
    return VocabTokenizer(_read_bytes(folder / "source.spm"), _read_bytes(folder / "target.spm"), pieces,
                          specials, name=f"{folder}: its tokenizer")


def _hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")
    path = folder / "pytorch_model.bin"
    if not path.is_file():
        raise NmtError(f"{folder}: neither model.safetensors nor pytorch_model.bin")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        if zipfile.is_zipfile(path) and "Weights only load failed" in str(e):
            raise NmtError(f"{path}: holds objects that safe loading (weights_only) refuses") from None
        raise NmtError(f"{path}: cannot read ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise NmtError(f"{path}: not a state dict of tensors")
    return state


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file (8-byte header length, JSON header, raw buffers)."""
    data = _read_bytes(path)
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        out = {}
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in _SAFETENSORS_DTYPES:
                raise ValueError(f"tensor {name} has dtype {info['dtype']}")
            begin, end = info["data_offsets"]
            if not 0 <= begin <= end <= len(data) - base:
                raise ValueError(f"tensor {name} lies outside the file")
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            buf = bytearray(data[base + begin : base + end])
            tensor = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out[name] = tensor.reshape(info["shape"])
    except (ValueError, KeyError, TypeError, struct.error, RuntimeError) as e:
        raise NmtError(f"{path}: not a readable safetensors file ({e})") from None
    return out


def _same_embeddings(w: dict[str, torch.Tensor]) -> bool:
    """Whether the encoder's and the decoder's token embeddings are one table. MarianMTModel's
    forward reads `encoder.embed_tokens` and `decoder.embed_tokens` (a file may leave them out
    where they are `shared`); transformers 5 ties them to `shared` only while
    `tie_word_embeddings` is true, so a folder it wrote with `share_encoder_decoder_embeddings`
    true and `tie_word_embeddings` false holds three different tables."""
    shared = w.get("shared.weight")
    enc, dec = w.get("encoder.embed_tokens.weight", shared), w.get("decoder.embed_tokens.weight", shared)
    return enc is None or dec is None or (enc.shape == dec.shape and torch.equal(enc, dec))


def _map_hf(w: dict[str, torch.Tensor], cfg: ModelConfig, folder: Path, vocab_size: int) -> dict[str, torch.Tensor]:
    def take(*names: str) -> torch.Tensor:
        for name in names:
            if name in w:
                return w[name].float()
        raise NmtError(f"{folder}: the weights lack {names[0]}")

    shared = ("shared.weight",)
    enc = take("encoder.embed_tokens.weight", *shared)  # what the forward reads (`_same_embeddings`)
    dec = take("decoder.embed_tokens.weight", *shared)
    out: dict[str, torch.Tensor] = {"src_embed.tokens.weight": enc, "tgt_embed.tokens.weight": dec}
    if not cfg.tie_output:
        out["output_embedding"] = take("lm_head.weight")
    bias = w.get("final_logits_bias")
    out["output_bias"] = torch.zeros(vocab_size) if bias is None else bias.float().reshape(-1)

    def attention(src: str, dst: str, fused: bool) -> None:
        q, k, v, o = (f"{src}.{p}_proj" for p in ("q", "k", "v", "out"))
        if fused:
            out[f"{dst}.qkv.weight"] = torch.cat([take(f"{q}.weight"), take(f"{k}.weight"), take(f"{v}.weight")])
            out[f"{dst}.qkv.bias"] = torch.cat([take(f"{q}.bias"), take(f"{k}.bias"), take(f"{v}.bias")])
        else:
            out[f"{dst}.q.weight"], out[f"{dst}.q.bias"] = take(f"{q}.weight"), take(f"{q}.bias")
            out[f"{dst}.kv.weight"] = torch.cat([take(f"{k}.weight"), take(f"{v}.weight")])
            out[f"{dst}.kv.bias"] = torch.cat([take(f"{k}.bias"), take(f"{v}.bias")])
        out[f"{dst}.out.weight"], out[f"{dst}.out.bias"] = take(f"{o}.weight"), take(f"{o}.bias")

    def norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = take(f"{src}.weight"), take(f"{src}.bias")

    def ffn(src: str, dst: str) -> None:
        for a, b in (("fc1", "fc1"), ("fc2", "fc2")):
            out[f"{dst}.ffn.{b}.weight"], out[f"{dst}.ffn.{b}.bias"] = take(f"{src}.{a}.weight"), take(f"{src}.{a}.bias")

    for i in range(cfg.encoder_layers):
        s, d = f"encoder.layers.{i}", f"encoder.{i}"
        attention(f"{s}.self_attn", f"{d}.self_attn", fused=True)
        norm(f"{s}.self_attn_layer_norm", f"{d}.norms.0")
        ffn(s, d)
        norm(f"{s}.final_layer_norm", f"{d}.norms.1")
    for i in range(cfg.decoder_layers):
        s, d = f"decoder.layers.{i}", f"decoder.{i}"
        attention(f"{s}.self_attn", f"{d}.self_attn", fused=True)
        norm(f"{s}.self_attn_layer_norm", f"{d}.norms.0")
        attention(f"{s}.encoder_attn", f"{d}.cross_attn", fused=False)
        norm(f"{s}.encoder_attn_layer_norm", f"{d}.norms.1")
        ffn(s, d)
        norm(f"{s}.final_layer_norm", f"{d}.norms.2")
    _check_shapes(out, cfg, vocab_size, str(folder))
    return out


# ---------------------------------------------------------------- Marian


def read_marian(decoder_yml: Path) -> Imported:
    """A Marian release: decoder.yml -> its first model and its vocabularies."""
    where = str(decoder_yml)
    try:
        dec = yaml.safe_load(decoder_yml.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise NmtError(f"{where}: cannot read ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(dec, dict) or not dec.get("models") or not dec.get("vocabs"):
        raise NmtError(f"{where}: needs models: and vocabs: lists")
    models, vocabs = dec["models"], dec["vocabs"]
    if len(models) != 1:
        raise NmtError(f"{where}: {len(models)} models (an ensemble); import each and pass them all to "
                       "nmt translate --checkpoint")
    if len(vocabs) != 2:
        raise NmtError(f"{where}: vocabs: must list a source and a target vocabulary")
    root = decoder_yml.parent
    npz = root / models[0]
    w = _read_npz(npz)
    opts = _model_yml(w, npz)
    tok = _marian_tokenizer(root / vocabs[0], root / vocabs[1], where)
    decode: dict[str, Any] = {}
    if isinstance(dec.get("beam-size"), int) and not isinstance(dec.get("beam-size"), bool) and dec["beam-size"] > 0:
        decode["beam"] = dec["beam-size"]
    normalize = dec.get("normalize", 0.0)  # Marian: score / len^normalize, len counting </s> (History::add)
    if not isinstance(normalize, (int, float)) or isinstance(normalize, bool) or not 0 <= normalize <= 10:
        raise NmtError(f"{where}: normalize {normalize!r} is not a number between 0 and 10")
    decode.update(lenpen=float(normalize), lenpen_style="length")
    model, weights = _map_marian(w, opts, tok, str(npz))
    return Imported(model, weights, tok, decode, str(npz))


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise NmtError(f"{path}: not found") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise NmtError(f"{path}: not a readable .npz ({' '.join(str(e).split())[:160]})") from None


def _model_yml(w: dict[str, np.ndarray], npz: Path) -> dict[str, Any]:
    raw = w.get("special:model.yml")
    if raw is None:
        raise NmtError(f"{npz}: no special:model.yml (not a Marian model)")
    text = raw.tobytes().rstrip(b"\0").decode("utf-8", "replace")
    try:
        opts = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise NmtError(f"{npz}: special:model.yml is not YAML ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(opts, dict):
        raise NmtError(f"{npz}: special:model.yml is not a mapping")
    return opts


# Characters that yaml-cpp (which writes and reads Marian's vocabularies) takes as text, but
# PyYAML refuses raw (DEL and other control characters: yaml-cpp writes DEL raw, even quoted) or
# reads as line breaks (NEL, U+2028, U+2029: YAML 1.1's, not 1.2's; yaml-cpp writes them raw).
_YAML_CPP_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def _stand_ins(text: str) -> tuple[str, dict[int, str]]:
    """`text` with each _YAML_CPP_TEXT character replaced by a private-use character it does not
    hold, and the table that puts them back."""
    found: list[str] = sorted(set(_YAML_CPP_TEXT.findall(text)))
    free = (chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in text)
    stand_in = {ord(ch): next(free) for ch in found}
    return text.translate(stand_in), {ord(v): chr(k) for k, v in stand_in.items()}


def read_marian_vocab(path: Path) -> list[str]:
    """A Marian vocabulary file (.yml: piece: id) -> its pieces in id order."""
    try:
        text, back = _stand_ins(path.read_text(encoding="utf-8"))
        mapping = yaml.load(text, Loader=getattr(yaml, "CBaseLoader", yaml.BaseLoader))  # every key a str
    except FileNotFoundError:
        raise NmtError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise NmtError(f"{path}: not a Marian vocabulary ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(mapping, dict):
        raise NmtError(f"{path}: not a Marian vocabulary (a mapping of pieces to ids)")
    try:
        ids = {str(k).translate(back): int(v) for k, v in mapping.items()}
    except (TypeError, ValueError):
        raise NmtError(f"{path}: a piece's id is not an integer") from None
    return _pieces_in_id_order(ids, path)


def _pieces_in_id_order(vocab: dict[str, int], path: Path) -> list[str]:
    pieces: list[str | None] = [None] * len(vocab)
    for piece, i in vocab.items():
        if not 0 <= i < len(vocab) or pieces[i] is not None:
            raise NmtError(f"{path}: ids are not 0..{len(vocab) - 1}, each once (id {i} of {piece!r})")
        pieces[i] = piece
    return [p for p in pieces if p is not None]


def _marian_tokenizer(src_vocab: Path, tgt_vocab: Path, where: str) -> VocabTokenizer:
    """Yml vocabularies with source.spm/target.spm beside them, or .spm vocabularies (whose ids
    are Marian's ids); the pad row is appended."""
    if src_vocab.suffix == ".spm" or tgt_vocab.suffix == ".spm":
        src_bytes, tgt_bytes = _read_bytes(src_vocab), _read_bytes(tgt_vocab)
        if src_bytes != tgt_bytes:
            pieces_s, pieces_t = spm_pieces(src_bytes, str(src_vocab)), spm_pieces(tgt_bytes, str(tgt_vocab))
            if pieces_s != pieces_t:
                raise NmtError(f"{where}: the source and target .spm vocabularies differ (separate "
                               "vocabularies); nmt import cannot map them")
        pieces = spm_pieces(src_bytes, str(src_vocab))
    else:
        pieces = read_marian_vocab(src_vocab)
        if tgt_vocab != src_vocab and read_marian_vocab(tgt_vocab) != pieces:
            raise NmtError(f"{where}: {src_vocab.name} and {tgt_vocab.name} differ (separate source and target "
                           "vocabularies); nmt import cannot map them")
        folder = src_vocab.parent
        for name in ("source.spm", "target.spm"):
            if not (folder / name).is_file():
                raise NmtError(f"{folder}: {name} is missing (a .yml vocabulary needs the release's source.spm "
                               "and target.spm beside it)")
        src_bytes, tgt_bytes = _read_bytes(folder / "source.spm"), _read_bytes(folder / "target.spm")
    for piece in ("</s>", "<unk>"):
        if piece not in pieces:
            raise NmtError(f"{src_vocab}: no {piece} in the vocabulary")
    pad = len(pieces)
    pieces = [*pieces, "<pad>" if "<pad>" not in pieces else "<nmt-pad>"]
    specials = SpecialIds(pad=pad, unk=pieces.index("<unk>"), bos=pad, eos=pieces.index("</s>"))
    return VocabTokenizer(src_bytes, tgt_bytes, pieces, specials, name=f"{src_vocab.parent}: its tokenizer")


_MARIAN_ACTIVATIONS = ("relu", "swish", "gelu")


def _marian_gelu(version: str) -> str:
    """Marian's gelu was x*sigmoid(1.702x) up to v1.12.2 (marian-dev d225c24d, March 2023, made it
    the erf GELU and bumped VERSION from v1.12.2 to v1.12.3)."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    if m and tuple(map(int, m.groups())) <= (1, 12, 2):
        return "gelu_sigmoid"
    return "gelu"


def _map_marian(w: dict[str, np.ndarray], o: dict[str, Any], tok: VocabTokenizer,
                where: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    def opt(key: str, default: Any) -> Any:
        value = o.get(key, default)
        return default if value is None else value

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise NmtError(f"{where}: special:model.yml {what}; nmt import cannot map it")

    need(opt("type", "") == "transformer", f"type {opt('type', '')!r} (only transformer)")
    need(opt("transformer-decoder-autoreg", "self-attention") == "self-attention",
         f"transformer-decoder-autoreg {opt('transformer-decoder-autoreg', '')!r} (only self-attention)")
    need(not opt("transformer-no-projection", False), "transformer-no-projection is true")
    need(not opt("transformer-train-position-embeddings", False), "transformer-train-position-embeddings is true")
    need(not opt("transformer-disable-position-embeddings", False), "transformer-disable-position-embeddings is true")
    need(not opt("ulr", False), "ulr is true (universal language representation embeddings)")
    need(not opt("transformer-tied-layers", []), "transformer-tied-layers is set")
    need(int(opt("transformer-ffn-depth", 2)) == 2, f"transformer-ffn-depth {opt('transformer-ffn-depth', 2)} (only 2)")
    need(int(opt("transformer-decoder-ffn-depth", 0)) in (0, 2),
         f"transformer-decoder-ffn-depth {opt('transformer-decoder-ffn-depth', 0)} (only 2)")
    need(not opt("right-left", False), "right-left is true")
    need(int(opt("lemma-dim-emb", 0)) == 0, "lemma-dim-emb is set (factored vocabulary)")
    pre, post = opt("transformer-preprocess", ""), opt("transformer-postprocess", "dan")
    top, emb = opt("transformer-postprocess-top", ""), opt("transformer-postprocess-emb", "d")
    need(emb in ("", "d"), f"transformer-postprocess-emb {emb!r} (a LayerNorm on the embeddings)")
    if pre:
        need((pre, post, top) == ("n", "da", "n"), f"pre-norm options {pre!r}/{post!r}/{top!r} "
             "(supported: preprocess n, postprocess da, postprocess-top n)")
    else:
        need((post, top) == ("dan", ""), f"post-norm options {post!r}/{top!r} (supported: postprocess dan, "
             "postprocess-top '')")
    act = opt("transformer-ffn-activation", "swish")
    need(act in _MARIAN_ACTIVATIONS, f"transformer-ffn-activation {act!r} (supported: {', '.join(_MARIAN_ACTIVATIONS)})")
    activation = _marian_gelu(str(opt("version", ""))) if act == "gelu" else act
    d_model, ffn_dim = int(opt("dim-emb", 512)), int(opt("transformer-dim-ffn", 2048))
    dec_ffn = int(opt("transformer-decoder-dim-ffn", 0)) or ffn_dim
    need(dec_ffn == ffn_dim, f"transformer-decoder-dim-ffn {dec_ffn} != transformer-dim-ffn {ffn_dim}")
    share = bool(opt("tied-embeddings-all", False) or opt("tied-embeddings-src", False))
    tie = bool(opt("tied-embeddings-all", False) or opt("tied-embeddings", False))
    if "Wemb" in w:
        share = True
    cfg = ModelConfig(
        arch="transformer", encoder_layers=int(opt("enc-depth", 6)), decoder_layers=int(opt("dec-depth", 6)),
        d_model=d_model, ffn_dim=ffn_dim, heads=int(opt("transformer-heads", 8)),
        dropout=float(opt("transformer-dropout", 0.1)),
        attention_dropout=float(opt("transformer-dropout-attention", 0.0)),
        activation_dropout=float(opt("transformer-dropout-ffn", 0.0)), norm_first=bool(pre),
        share_embeddings=share, tie_output=tie, output_bias=True, activation=activation,  # type: ignore[arg-type]
        norm_eps=MARIAN_LAYERNORM_EPS, positions="marian", decoder_start="zeros", max_positions=1024)
    V, pad = tok.vocab_size, tok.specials.pad
    sizes = f"dim-emb {d_model}, transformer-dim-ffn {ffn_dim}, a vocabulary of {V - 1}"

    def get(name: str, *shape: int) -> torch.Tensor:
        """Parameter `name`, which must be a float array of `shape` (a vector (n,) may be (1, n),
        as Marian writes its vectors), as float32."""
        if name not in w:
            raise NmtError(f"{where}: no parameter {name}")
        a = w[name]
        if a.dtype.kind != "f":
            raise NmtError(f"{where}: parameter {name} holds {a.dtype}, not floating-point numbers")
        if a.shape != shape and not (len(shape) == 1 and a.shape == (1, *shape)):
            want = (1, *shape) if len(shape) == 1 else shape
            raise NmtError(f"{where}: parameter {name} has shape {a.shape}, not {want} ({sizes})")
        if not np.isfinite(a).all():
            raise NmtError(f"{where}: parameter {name} holds NaN or infinite values")
        return torch.from_numpy(a.astype(np.float32).reshape(shape))

    def with_pad(rows: torch.Tensor) -> torch.Tensor:  # (V-1, D) -> (V, D): a zero pad row
        return torch.cat([rows, torch.zeros(1, rows.shape[1])])

    def embedding(side: str) -> torch.Tensor:
        return get("Wemb" if "Wemb" in w else f"{side}_Wemb", V - 1, d_model)

    out: dict[str, torch.Tensor] = {"src_embed.tokens.weight": with_pad(embedding("encoder")),
                                    "tgt_embed.tokens.weight": with_pad(embedding("decoder"))}
    if not tie:
        if "decoder_ff_logit_out_W" in w:
            out["output_embedding"] = with_pad(get("decoder_ff_logit_out_W", d_model, V - 1).T)
        else:
            out["output_embedding"] = with_pad(get("decoder_ff_logit_out_Wt", V - 1, d_model))
    bias = get("decoder_ff_logit_out_b", V - 1) if "decoder_ff_logit_out_b" in w else torch.zeros(V - 1)
    out["output_bias"] = torch.cat([bias, torch.tensor([PAD_LOGIT_BIAS])])
    assert pad == V - 1

    def linear(prefix: str, suffix: str, d_in: int = d_model, d_out: int = d_model) -> tuple[torch.Tensor, torch.Tensor]:
        """Marian's W is (in, out), nmt's (out, in)."""
        return get(f"{prefix}_W{suffix}", d_in, d_out).T.contiguous(), get(f"{prefix}_b{suffix}", d_out)

    def norm(prefix: str, dst: str) -> None:
        tail = "_pre" if pre else ""
        out[f"{dst}.weight"] = get(f"{prefix}_ln_scale{tail}", d_model)
        out[f"{dst}.bias"] = get(f"{prefix}_ln_bias{tail}", d_model)

    def attention(prefix: str, dst: str, fused: bool) -> None:
        (wq, bq), (wk, bk), (wv, bv) = (linear(prefix, s) for s in "qkv")
        if fused:
            out[f"{dst}.qkv.weight"], out[f"{dst}.qkv.bias"] = torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv])
        else:
            out[f"{dst}.q.weight"], out[f"{dst}.q.bias"] = wq, bq
            out[f"{dst}.kv.weight"], out[f"{dst}.kv.bias"] = torch.cat([wk, wv]), torch.cat([bk, bv])
        out[f"{dst}.out.weight"], out[f"{dst}.out.bias"] = linear(prefix, "o")

    def ffn(prefix: str, dst: str) -> None:
        out[f"{dst}.ffn.fc1.weight"], out[f"{dst}.ffn.fc1.bias"] = linear(f"{prefix}_ffn", "1", d_model, ffn_dim)
        out[f"{dst}.ffn.fc2.weight"], out[f"{dst}.ffn.fc2.bias"] = linear(f"{prefix}_ffn", "2", ffn_dim, d_model)

    for i in range(cfg.encoder_layers):
        s, d = f"encoder_l{i + 1}", f"encoder.{i}"
        attention(f"{s}_self", f"{d}.self_attn", True)
        norm(f"{s}_self_Wo", f"{d}.norms.0")
        ffn(s, d)
        norm(f"{s}_ffn_ffn", f"{d}.norms.1")
    for i in range(cfg.decoder_layers):
        s, d = f"decoder_l{i + 1}", f"decoder.{i}"
        attention(f"{s}_self", f"{d}.self_attn", True)
        norm(f"{s}_self_Wo", f"{d}.norms.0")
        attention(f"{s}_context", f"{d}.cross_attn", False)
        norm(f"{s}_context_Wo", f"{d}.norms.1")
        ffn(s, d)
        norm(f"{s}_ffn_ffn", f"{d}.norms.2")
    if pre:
        for side in ("encoder", "decoder"):
            out[f"{side}_norm.weight"] = get(f"{side}_top_ln_scale", d_model)
            out[f"{side}_norm.bias"] = get(f"{side}_top_ln_bias", d_model)
    _check_shapes(out, cfg, V, where)
    return cfg, out


# ---------------------------------------------------------------- shared


def _check_shapes(weights: dict[str, torch.Tensor], cfg: ModelConfig, vocab_size: int, where: str) -> None:
    """Every weight the model config needs, of its shape; an NmtError naming the first that is not."""
    with torch.device("meta"):
        reference = Transformer(cfg, vocab_size, pad_id=0).state_dict()
    if cfg.d_model % cfg.heads:
        raise NmtError(f"{where}: d_model {cfg.d_model} is not a multiple of {cfg.heads} heads")
    for name, tensor in reference.items():
        have = weights.get(name)
        if have is None:
            raise NmtError(f"{where}: no weight for {name}")
        if tuple(have.shape) != tuple(tensor.shape):
            raise NmtError(f"{where}: {name} has shape {tuple(have.shape)}, the config needs {tuple(tensor.shape)}")
    for name in list(weights):
        if name not in reference:
            del weights[name]
    for name, tensor in weights.items():
        if not torch.isfinite(tensor).all() and name != "output_bias":
            raise NmtError(f"{where}: {name} holds NaN or infinite values")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NmtError(f"{path}: not readable JSON ({' '.join(str(e).split())[:160]})") from None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{path}: not found") from None
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None


# starting points for fine-tuning an imported model on in-domain data (the README's recipe)
FINETUNE_TRAIN: dict[str, Any] = {"lr": 5e-5, "warmup_updates": 500, "warmup_init_lr": 1e-7, "label_smoothing": 0.1,
                  "max_tokens": 4096, "save_interval_updates": 500, "keep_last": 5}


def finetune_config(imported: Imported, checkpoint: Path) -> Config:
    """A training config to fine-tune the imported checkpoint: its model section, train.init_from
    set to it, conservative fine-tuning settings (`FINETUNE_TRAIN`), data.dir to fill in."""
    base = Config()
    train = dataclasses.replace(base.train, init_from=str(checkpoint), run_dir="runs/finetune", **FINETUNE_TRAIN)
    decode = dataclasses.replace(base.decode, **imported.decode)
    return dataclasses.replace(base, data=dataclasses.replace(base.data, dir="data-bin/finetune"),
                               model=imported.model, train=train, decode=decode)


def import_command(source: Path, output: Path, config: Path | None = None) -> Imported:
    """`nmt import SOURCE -o OUTPUT [--config YAML]`: read the model, write its checkpoint (and
    a fine-tuning config) atomically. An output that is one of the source's files, or a name
    `nmt train` owns in a run directory, is refused before anything is read."""
    outputs = [FileArg("--config", config)] if config is not None else []
    folder = source if source.is_dir() else source.parent
    inputs = [FileArg("SOURCE", p, f"a file of the model being imported ({p.name})")
              for p in sorted(folder.iterdir()) if p.is_file()] if folder.is_dir() else []
    check_outputs(inputs, [FileArg("-o", output, "the checkpoint"), *outputs])
    check_average_output([], output)
    imported = import_model(source)
    atomic_save(imported_checkpoint(imported), output)
    if config is not None:
        atomic_write_bytes(dump_config(finetune_config(imported, output)).encode(), config, "the config")
    return imported
