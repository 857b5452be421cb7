"""`nmt export`: a checkpoint as a CTranslate2 model directory.

The model is described with CTranslate2's own converter API (`ctranslate2.specs.TransformerSpec`
filled through the weight table's `CTRANSLATE2` layout, `nmt.convert.table`, written by a
`ctranslate2.converters.Converter`), never by writing its binary format by hand. `ctranslate2` is an
optional dependency (`pip install nmt[ctranslate2]`).

What has to line up (docs/architecture.md, "Exporting"):
- positions: CTranslate2's built-in sinusoids count positions from 1, ours from 0 (and may be
  learned), so the table is always stored explicitly (`position_encodings.encodings`, row i
  = position i);
  any sinusoid layout (`model.positions`) is therefore exported as it is;
- embeddings are scaled by sqrt(d_model) on both sides (`scale_embeddings`); the output
  projection is `Transformer.output_weight` (the target embedding unless `model.tie_output` is
  false) with `output_bias` where there is one; `model.decoder_start: zeros` is
  `start_from_zero_embedding`; `model.activation` is one of CTranslate2's activations;
- post-norm layers (`pre_norm=False`) have no final LayerNorm; pre-norm has one per side
  (our `encoder_norm` / `decoder_norm`); their epsilon (`model.norm_eps`) is `layer_norm_epsilon`;
- self-attention's fused q/k/v rows are in CTranslate2's order (q, k, v), cross-attention's
  fused k/v too (its query is separate);
- the source is tokens + EOS (`add_source_eos`), the decoder starts from BOS
  (`decoder_start_token`), the vocabulary is the sentencepiece pieces in id order.
Anything else in a checkpoint (a model setting or a weight this mapping does not know) is
refused with a one-line error rather than exported wrong.
"""

from __future__ import annotations

import logging
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from nmt.atomic import (
    FileArg,
    check_outputs,
    check_replaceable,
    directory_target,
    replacing_directory,
)
from nmt.checkpoint import load_model_checkpoint
from nmt.config import ModelConfig
from nmt.convert.table import CTRANSLATE2, write
from nmt.errors import NmtError
from nmt.models.transformer import Transformer
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)
FORMATS = ("ctranslate2", "hf")
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "float16",
    "bfloat16",
    "float32",
)
INSTALL_HINT = "pip install 'nmt[ctranslate2]' (or pip install ctranslate2)"


def import_ctranslate2(what: str) -> Any:
    """The ctranslate2 package, or an NmtError saying that `what` needs it and how to install
    it."""
    try:
        import ctranslate2
    except ImportError:
        raise NmtError(f"{what} needs the ctranslate2 package: {INSTALL_HINT}") from None
    return ctranslate2


# The model settings this export maps. A setting added to ModelConfig later is refused (unless
# it has its default) until the mapping handles it. Dropouts do not exist at inference.
EXPORTED_FIELDS = frozenset(
    {
        "encoder_layers",
        "decoder_layers",
        "d_model",
        "ffn_dim",
        "heads",
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "norm_first",
        "share_embeddings",
        "learned_positions",
        "max_positions",
        "tie_output",
        "output_bias",
        "activation",
        "norm_eps",
        "positions",
        "decoder_start",
        # arch is checked first (transformer only); the rnn keys do not apply
        "arch",
        "cell",
        "attention",
        "rnn_hidden",
        "rnn_layers",
    }
)
# an existing OUT_DIR is replaced (--force) only if it looks like an export of the format
MARKERS = {"ctranslate2": ("config.json", "model.bin"), "hf": ("config.json", "model.safetensors")}
# every name an export writes, in either vocabulary layout (one joint, or a source's and a target's)
WRITES = {
    "ctranslate2": {
        *MARKERS["ctranslate2"],
        "shared_vocabulary.json",
        "source_vocabulary.json",
        "target_vocabulary.json",
        "spm.model",
        "source.spm",
        "target.spm",
    },
    "hf": {
        *MARKERS["hf"],
        "generation_config.json",
        "tokenizer_config.json",
        "vocab.json",
        "target_vocab.json",
        "source.spm",
        "target.spm",
    },
}


def export(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    format: str = "ctranslate2",
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Write `checkpoint` as a `format` model directory `out_dir` (whole or not at all):
    model.bin, config.json and shared_vocabulary.json of CTranslate2, and the sentencepiece
    model(s) to tokenize with: spm.model, or an imported model's source.spm and target.spm;
    or (`hf`) a Hugging Face MarianMT folder (nmt.convert.hf). Returns `out_dir`."""
    if format not in FORMATS:
        raise NmtError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise NmtError(
            f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    if quantization is not None and format == "hf":
        raise NmtError(
            "--quantization is for --format ctranslate2: a MarianMT folder holds float32 weights"
        )
    out = _destination(Path(checkpoint), Path(out_dir), force, format)
    ckpt = load_model_checkpoint(Path(checkpoint))
    cfg = ckpt.config.model
    tokenizer = ckpt.tokenizer
    if cfg.arch != "transformer":
        raise NmtError(
            f"{checkpoint}: model.arch {cfg.arch} cannot be exported; nmt export maps a "
            "Transformer only"
        )
    from nmt.convert.hf import HF_ONLY, write_hf_folder

    _check_exportable(
        cfg,
        str(checkpoint),
        *(("a MarianMT", HF_ONLY) if format == "hf" else ("a CTranslate2", {})),
    )
    model = Transformer(
        cfg, tokenizer.vocab_size, tokenizer.specials.pad, tokenizer.source_vocab_size
    )
    ckpt.load_into(model)
    # a name no export of `format` writes (a clone's .git, a README): replacing OUT_DIR must refuse
    # to remove it; what an earlier export wrote, in the other vocabulary layout too, is replaced
    own = out.is_dir() and not {p.name for p in out.iterdir()} <= WRITES[format]
    if format == "hf":
        with replacing_directory(out, "the export", "OUT_DIR", own=own) as work:
            write_hf_folder(ckpt, model, work)
        log.info(
            "wrote %s (a Hugging Face MarianMT folder, vocabulary %d)", out, tokenizer.vocab_size
        )
        return out
    converters = import_ctranslate2("nmt export --format ctranslate2").converters
    spec = transformer_spec(model, tokenizer)

    class _Converter(converters.Converter):  # type: ignore[name-defined]
        def _load(self) -> Any:
            return spec

    with replacing_directory(out, "the export", "OUT_DIR", own=own) as work:
        _Converter().convert(str(work), quantization=quantization, force=True)
        # spm.model, or an imported model's source/target.spm
        for name, data in tokenizer.files().items():
            (work / name).write_bytes(data)
    log.info(
        "wrote %s (CTranslate2%s, vocabulary %d)",
        out,
        f", {quantization}" if quantization else "",
        tokenizer.vocab_size,
    )
    return out


def _destination(checkpoint: Path, out_dir: Path, force: bool, format: str) -> Path:
    """The directory to write (a symlink's target), checked before the work: not one holding
    the checkpoint, and (with --force) only an earlier export is replaced."""
    out = directory_target(out_dir, "OUT_DIR")
    check_outputs(
        [FileArg("CHECKPOINT", checkpoint, "the checkpoint")],
        [FileArg("OUT_DIR", out_dir, directory=True)],
    )
    if not out.parent.is_dir():
        raise NmtError(f"{out.parent}: no such directory")
    check_replaceable(
        out,
        force,
        MARKERS[format],
        "a CTranslate2 model" if format == "ctranslate2" else "a MarianMT folder",
        "OUT_DIR",
    )
    return out


def _check_exportable(cfg: ModelConfig, where: str, model: str, only: dict[str, Any]) -> None:
    """Every model setting is one the format (`model`: "a CTranslate2") maps; those of `only` have
    the one value it computes."""
    for f in fields(ModelConfig):
        value = getattr(cfg, f.name)
        if f.name in only and value != only[f.name]:
            raise NmtError(
                f"{where}: model.{f.name}={value!r} cannot be exported exactly: a "
                f"MarianMT model has {f.name} {only[f.name]!r}"
            )
        if f.name not in EXPORTED_FIELDS and value != f.default:
            raise NmtError(
                f"{where}: model.{f.name}={value!r} cannot be represented in "
                f"{model} model by this version of nmt export"
            )


# ------------------------------------------------------------------ the mapping (nmt.convert.table)


def transformer_spec(model: Transformer, tokenizer: Tokenizer) -> Any:
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights (the weight table's
    CTRANSLATE2 layout: every weight of the model must be written), with the vocabulary and
    special tokens of `tokenizer`."""
    from ctranslate2.specs import transformer_spec as ts
    from ctranslate2.specs.common_spec import Activation
    from ctranslate2.specs.model_spec import index_spec

    cfg = model.cfg
    activation = {
        "relu": Activation.RELU,
        "gelu": Activation.GELU,
        "gelu_tanh": Activation.GELUTanh,
        "gelu_sigmoid": Activation.GELUSigmoid,
        "swish": Activation.SWISH,
    }[cfg.activation]
    spec = ts.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.heads,
        pre_norm=cfg.norm_first,
        activation=activation,
    )
    for name, tensor in write(
        CTRANSLATE2, cfg, model.state_dict(), dict(model.named_buffers())
    ).items():
        # index_spec: "decoder/layer_0/ffn" -> spec.decoder.layer[0].ffn
        scope, _, attr = name.rpartition("/")
        # a spec refuses a new name
        setattr(index_spec(spec, scope), attr, tensor.float().cpu().numpy())
    # x sqrt(d_model), as nmt.models.layers.Embedding
    spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = True
    spec.decoder.start_from_zero_embedding = model.tgt_embed.zero_start
    source, pieces = tokenizer.vocabularies()
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(pieces)
    ids = tokenizer.specials
    spec.config.unk_token = pieces[ids.unk]
    spec.config.bos_token = pieces[ids.bos]
    spec.config.eos_token = pieces[ids.eos]
    spec.config.decoder_start_token = pieces[ids.bos]  # [bos] + tokens, as nmt.tokenizer
    spec.config.add_source_eos = True  # tokens + [eos]
    spec.config.layer_norm_epsilon = cfg.norm_eps  # every LayerNorm's
    return spec
