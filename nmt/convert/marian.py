"""`nmt import`: an OPUS-MT / Marian model -> one ordinary nmt checkpoint.

Two sources are read:
- a Hugging Face MarianMT folder (`nmt.convert.hf`);
- a Marian release (here): a folder with `decoder.yml` (or the `decoder.yml` itself) naming the
  `.npz` model and its vocabularies (`vocab.yml` with `source.spm` / `target.spm` beside it,
  or `.spm` vocabularies), the model's options in the `.npz`'s `special:model.yml`.

The result carries the model config (`nmt.config.ModelConfig`: activation, tying, output
bias, the position table the weights were trained with, the decoder start, LayerNorm
epsilon, maximum length), the weights in nmt's layout, and a `VocabTokenizer` (both
sentencepiece models and the vocabulary in the model's id order, with its special ids). What
both sources share is `nmt.convert.reading`'s (reading files, numbers and weights; the checks)
and `nmt.convert.table`'s (where each weight goes: the `HF_MARIAN` and `MARIAN` layouts).

The Marian mapping: Marian's own sinusoids (`positions: marian`), decoding starts from a zero
vector (`decoder_start: zeros`), LayerNorm epsilon 1e-6; `transformer-ffn-activation: gelu` is
x*sigmoid(1.702x) in Marian up to v1.12.2 and the exact erf GELU after (the model.yml's
`version` decides). A Marian model has no pad row: one is appended, with a zero embedding and
an output bias of `nmt.convert.table.PAD_LOGIT_BIAS`, so that its probability is exactly 0 in
fp32, bf16 and fp16 and the other tokens' log-probabilities are Marian's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import torch
import yaml

from nmt.atomic import FileArg, check_outputs, replacing_together, target, write_all
from nmt.checkpoint import check_average_output, checkpoint_dict
from nmt.config import Config, ModelConfig, dump_config
from nmt.convert.hf import read_hf_folder
from nmt.convert.reading import (
    Imported,
    Keys,
    Npz,
    Reader,
    check_computes,
    check_config,
    decode_settings,
    load_yaml,
    pieces_in_id_order,
)
from nmt.convert.table import MARIAN, read
from nmt.errors import NmtError
from nmt.tokenizer import SpecialIds, VocabTokenizer, spm_pieces

MARIAN_LAYERNORM_EPS = 1e-6
_MODEL_YML_LIMIT = 1 << 20  # bytes of special:model.yml (a few kB in every release)
# nmt's model keys -> special:model.yml's, for the messages of the config's validation
_KEYS = {
    "encoder_layers": "enc-depth",
    "decoder_layers": "dec-depth",
    "d_model": "dim-emb",
    "ffn_dim": "transformer-dim-ffn",
    "heads": "transformer-heads",
    "dropout": "transformer-dropout",
    "attention_dropout": "transformer-dropout-attention",
    "activation_dropout": "transformer-dropout-ffn",
}


# ---------------------------------------------------------------- entry point


def import_model(source: str | Path) -> Imported:
    """Read a Hugging Face MarianMT folder or a Marian release (see the module docstring), and
    refuse it unless it computes finite log-probabilities (`check_computes`)."""
    imported = _read(Path(source))
    check_computes(imported)
    return imported


def _read(path: Path) -> Imported:
    if path.is_dir() and os.path.lexists(path / "config.json"):
        return read_hf_folder(path)
    if path.is_dir() and os.path.lexists(path / "decoder.yml"):
        return read_marian(path / "decoder.yml")
    if path.suffix in (".yml", ".yaml") and not path.is_dir():  # a missing one: "not found"
        return read_marian(path)
    if not os.path.lexists(path):
        raise NmtError(f"{path}: not found")
    raise NmtError(
        f"{path}: neither a Hugging Face MarianMT folder (config.json) nor a Marian release (a "
        "folder with decoder.yml, or the decoder.yml)"
    )


def imported_checkpoint(imported: Imported) -> dict[str, Any]:
    """The checkpoint dict of an imported model (nmt's format, `nmt.checkpoint`)."""
    cfg = _imported_config(Config(), imported)
    return checkpoint_dict(imported.weights, cfg, imported.tokenizer, imported_from=imported.source)


def _imported_config(base: Config, imported: Imported) -> Config:
    """`base` with the imported model section, its decode settings and the languages it names."""
    decode = dataclasses.replace(base.decode, **imported.decode)
    data = dataclasses.replace(base.data, **imported.languages)
    return dataclasses.replace(base, model=imported.model, decode=decode, data=data)


# ---------------------------------------------------------------- Marian


def read_marian(decoder_yml: Path) -> Imported:
    """A Marian release: decoder.yml -> its first model and its vocabularies."""
    reader = Reader()
    where = str(decoder_yml)
    dec = Keys(load_yaml(reader.text(decoder_yml, "the decoder config"), where), where)
    models = dec.names("models")
    vocabs = dec.names("vocabs")
    if not models or not vocabs:
        raise NmtError(f"{where}: needs models: and vocabs: lists")
    if len(models) != 1:
        raise NmtError(
            f"{where}: {len(models)} models (an ensemble); import each and pass them all to nmt "
            "translate --checkpoint"
        )
    if len(vocabs) != 2:
        raise NmtError(f"{where}: vocabs: must list a source and a target vocabulary")
    # Marian's normalize: score / len^normalize, len counting </s> (History::add)
    decode: dict[str, Any] = {"lenpen_style": "length", "lenpen": dec.number("normalize", 0.0)}
    if dec.raw.get("beam-size") is not None:
        decode["beam"] = dec.int("beam-size")
    root = decoder_yml.parent
    npz = root / models[0]
    with contextlib.closing(reader.npz(npz)) as w:
        opts = _model_yml(w)
        tok = _marian_tokenizer(reader, root / vocabs[0], root / vocabs[1], where)
        names = {"beam": f"{where}: beam-size", "lenpen": f"{where}: normalize"}
        decode_settings(decode, names, tok.vocab_size)
        model, weights = _map_marian(w, opts, tok)
    return Imported(model, weights, tok, decode, str(npz), reader.files)


def _model_yml(w: Npz) -> Keys:
    if "special:model.yml" not in w.members:
        raise NmtError(f"{w.path}: no special:model.yml (not a Marian model)")
    raw = w.member("special:model.yml", _MODEL_YML_LIMIT)[2]
    assert raw is not None
    text = raw.tobytes().rstrip(b"\0").decode("utf-8", "replace")
    where = f"{w.path}: special:model.yml"
    return Keys(load_yaml(text, where), where)


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


def read_marian_vocab(path: Path, reader: Reader | None = None) -> list[str]:
    """A Marian vocabulary file (.yml: piece: id) -> its pieces in id order."""
    text, back = _stand_ins((reader or Reader()).text(path, "a Marian vocabulary"))
    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # every key a str
    mapping = load_yaml(text, f"{path}: a Marian vocabulary", loader)
    if not isinstance(mapping, dict):
        raise NmtError(f"{path}: not a Marian vocabulary (a mapping of pieces to ids)")
    try:
        ids = {str(k).translate(back): int(v) for k, v in mapping.items()}
    except (TypeError, ValueError):
        raise NmtError(f"{path}: a piece's id is not an integer") from None
    return pieces_in_id_order(ids, path)


def _marian_tokenizer(
    reader: Reader, src_vocab: Path, tgt_vocab: Path, where: str
) -> VocabTokenizer:
    """Yml vocabularies with source.spm/target.spm beside them, or .spm vocabularies (whose ids
    are Marian's ids), one or two (separate vocabularies, of one size); the pad row is appended."""
    if src_vocab.suffix == ".spm" or tgt_vocab.suffix == ".spm":
        src_bytes = reader.bytes(src_vocab, "a sentencepiece model")
        tgt_bytes = reader.bytes(tgt_vocab, "a sentencepiece model")
        source = spm_pieces(src_bytes, str(src_vocab))
        pieces = spm_pieces(tgt_bytes, str(tgt_vocab))
    else:
        source = read_marian_vocab(src_vocab, reader)
        pieces = source if tgt_vocab == src_vocab else read_marian_vocab(tgt_vocab, reader)
        folder = src_vocab.parent
        for name in ("source.spm", "target.spm"):
            if not os.path.lexists(folder / name):
                raise NmtError(
                    f"{folder}: {name} is missing (a .yml vocabulary needs the release's "
                    "source.spm and target.spm beside it)"
                )
        src_bytes = reader.bytes(folder / "source.spm", "a sentencepiece model")
        tgt_bytes = reader.bytes(folder / "target.spm", "a sentencepiece model")
    for piece in ("</s>", "<unk>"):
        if piece not in source or piece not in pieces:
            raise NmtError(
                f"{src_vocab if piece not in source else tgt_vocab}: no {piece} in the vocabulary"
            )
        if source.index(piece) != pieces.index(piece):
            raise NmtError(f"{where}: {piece} has two ids in the source and target vocabularies")
    if len(source) != len(pieces):
        raise NmtError(
            f"{where}: the source and target vocabularies have {len(source)} and {len(pieces)} "
            "pieces; nmt import maps separate vocabularies of one size (the pad row after both)"
        )
    pad = len(pieces)
    padded = [[*side, "<pad>" if "<pad>" not in side else "<nmt-pad>"] for side in (source, pieces)]
    specials = SpecialIds(pad=pad, unk=pieces.index("<unk>"), bos=pad, eos=pieces.index("</s>"))
    return VocabTokenizer(
        src_bytes,
        tgt_bytes,
        padded[1],
        specials,
        name=f"{src_vocab.parent}: its tokenizer",
        source_pieces=padded[0] if source != pieces else None,
    )


_MARIAN_ACTIVATIONS = ("relu", "swish", "gelu")


def _marian_gelu(version: str) -> str:
    """Marian's gelu was x*sigmoid(1.702x) up to v1.12.2 (marian-dev d225c24d, March 2023, made it
    the erf GELU and bumped VERSION from v1.12.2 to v1.12.3)."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    return "gelu_sigmoid" if m and tuple(map(int, m.groups())) <= (1, 12, 2) else "gelu"


def _map_marian(
    w: Npz, o: Keys, tok: VocabTokenizer
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    need = o.need
    need(o.text("type", "") == "transformer", f"type {o.raw.get('type')!r} (only transformer)")
    autoreg = o.text("transformer-decoder-autoreg", "self-attention")
    need(
        autoreg == "self-attention",
        f"transformer-decoder-autoreg {autoreg!r} (only self-attention)",
    )
    for key, what in (
        ("transformer-no-projection", ""),
        ("transformer-train-position-embeddings", ""),
        ("transformer-disable-position-embeddings", ""),
        ("right-left", ""),
        ("ulr", " (universal language representation embeddings)"),
        ("transformer-pool", " (pooling in place of self-attention)"),
    ):
        need(not o.flag(key, False), f"{key} is true{what}")
    need(not o.raw.get("transformer-tied-layers"), "transformer-tied-layers is set")
    need(
        not o.int("factors-dim-emb", 0) and not o.raw.get("factors-combine"),
        "factors-dim-emb / factors-combine are set (factored vocabulary)",
    )
    need(
        o.int("transformer-ffn-depth", 2) == 2,
        f"transformer-ffn-depth {o.int('transformer-ffn-depth', 2)} (only 2)",
    )
    need(
        o.int("transformer-decoder-ffn-depth", 0) in (0, 2),
        f"transformer-decoder-ffn-depth {o.int('transformer-decoder-ffn-depth', 0)} (only 2)",
    )
    need(o.int("lemma-dim-emb", 0) == 0, "lemma-dim-emb is set (factored vocabulary)")
    pre = o.text("transformer-preprocess", "")
    post = o.text("transformer-postprocess", "dan")
    top = o.text("transformer-postprocess-top", "")
    emb = o.text("transformer-postprocess-emb", "d")
    need(emb in ("", "d"), f"transformer-postprocess-emb {emb!r} (a LayerNorm on the embeddings)")
    if pre:
        need(
            (pre, post) == ("n", "da") and top in ("n", ""),
            f"pre-norm options {pre!r}/{post!r}/{top!r} "
            "(supported: preprocess n, postprocess da, postprocess-top n or '')",
        )
    else:
        need(
            (post, top) == ("dan", ""),
            f"post-norm options {post!r}/{top!r} (supported: postprocess dan, postprocess-top '')",
        )
    act = o.text("transformer-ffn-activation", "swish")
    need(
        act in _MARIAN_ACTIVATIONS,
        f"transformer-ffn-activation {act!r} (supported: {', '.join(_MARIAN_ACTIVATIONS)})",
    )
    D = o.int("dim-emb", 512)
    F = o.int("transformer-dim-ffn", 2048)
    dec_ffn = o.int("transformer-decoder-dim-ffn", 0) or F
    need(dec_ffn == F, f"transformer-decoder-dim-ffn {dec_ffn} != transformer-dim-ffn {F}")
    tied_all = o.flag("tied-embeddings-all", False)  # the source, target and output embeddings
    share = tied_all or o.flag("tied-embeddings-src", False) or w.has("Wemb")
    need(
        not share or tok.source_vocab_size is None,
        "tied-embeddings-all or tied-embeddings-src with separate source and target vocabularies",
    )
    tie = tied_all or o.flag("tied-embeddings", False)
    activation = _marian_gelu(o.text("version", "")) if act == "gelu" else act
    cfg = ModelConfig(
        arch="transformer",
        encoder_layers=o.int("enc-depth", 6),
        decoder_layers=o.int("dec-depth", 6),
        d_model=D,
        ffn_dim=F,
        heads=o.int("transformer-heads", 8),
        dropout=o.number("transformer-dropout", 0.1),
        attention_dropout=o.number("transformer-dropout-attention", 0.0),
        activation_dropout=o.number("transformer-dropout-ffn", 0.0),
        norm_first=bool(pre),
        final_norm=top == "n" or not pre,
        share_embeddings=share,
        tie_output=tie,
        output_bias=True,
        norm_eps=MARIAN_LAYERNORM_EPS,
        positions="marian",
        decoder_start="zeros",
        max_positions=1024,
        activation=activation,  # type: ignore[arg-type]
    )
    check_config(cfg, o.where, _KEYS)
    w.hint = f" (dim-emb {D}, transformer-dim-ffn {F}, a vocabulary of {tok.vocab_size - 1})"
    return cfg, read(
        MARIAN,
        w,
        cfg,
        tok.vocab_size,
        "that its special:model.yml describes",
        tok.source_vocab_size,
    )


# ---------------------------------------------------------------- the command


# starting points for fine-tuning an imported model on in-domain data (the pretrained-models guide's
# recipe)
FINETUNE_TRAIN: dict[str, Any] = {
    "lr": 5e-5,
    "warmup_updates": 500,
    "warmup_init_lr": 1e-7,
    "label_smoothing": 0.1,
    "max_tokens": 4096,
    "save_interval_updates": 500,
    "keep_last": 5,
}


def finetune_config(imported: Imported, checkpoint: Path) -> Config:
    """A training config to fine-tune the imported checkpoint: its model section, train.init_from
    set to it, conservative fine-tuning settings (`FINETUNE_TRAIN`), data.dir to fill in."""
    base = Config()
    train = dataclasses.replace(
        base.train, init_from=str(checkpoint), run_dir="runs/finetune", **FINETUNE_TRAIN
    )
    data = dataclasses.replace(base.data, dir="data-bin/finetune")
    return _imported_config(dataclasses.replace(base, data=data, train=train), imported)


def import_command(source: Path, output: Path, config: Path | None = None) -> Imported:
    """`nmt import SOURCE -o OUTPUT [--config YAML]`: read the model, write its checkpoint (and
    a fine-tuning config). Both outputs are checked before the model is read (a possible file,
    not a name `nmt train` owns in a run directory, not one another), and against every file
    the import read before anything is written; both are made whole in temporaries, then a device
    or a FIFO among them is written into (`replacing_together`) before a file is renamed, so that
    neither is written unless both can be (`--config /dev/full` leaves no checkpoint)."""
    outputs = [FileArg("-o", output, "the checkpoint")]
    written = [(output, "the checkpoint")]
    if config is not None:
        outputs.append(FileArg("--config", config, "the config"))
        written.append((config, "the config"))
    check_outputs([], outputs)
    check_average_output([], output)
    if config is not None:
        target(config, "--config")
    imported = import_model(source)
    folder = source if source.is_dir() else source.parent  # its other files too, read or not
    files = [*imported.files, *(p for p in sorted(folder.iterdir()) if p.is_file())]
    check_outputs(
        [FileArg("SOURCE", p, "a file of the model being imported") for p in files], outputs
    )
    with replacing_together(written) as temporaries:
        with open(temporaries[0], "xb") as f:
            torch.save(imported_checkpoint(imported), f)
            f.flush()
            os.fsync(f.fileno())
        if config is not None:
            with open(temporaries[1], "xb") as f:
                write_all(f.fileno(), dump_config(finetune_config(imported, output)).encode())
                os.fsync(f.fileno())
    return imported
