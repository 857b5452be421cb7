"""The weight table: nmt's Transformer weights under each foreign layout (Hugging Face MarianMT,
Marian's `.npz`, CTranslate2's spec), and the one loop that applies it in each direction.

A `Row` names one nmt tensor and the foreign tensors it is made of: several parts are
concatenated on dim 0 (nmt fuses self-attention's q, k, v and cross-attention's k, v), none
make zeros (a bias the source may lack); parts may be stored transposed ((in, out): Marian's
matrices) and without nmt's pad row (Marian has none: `pad` is the value of the row nmt
appends). Rows of one nmt tensor are alternatives, tried in order (a Marian model holds one
`Wemb` or `encoder_Wemb` and `decoder_Wemb`); where the source holds none, the last is read,
and the refusal names its missing part. A layer's rows come from `LAYER` and `CROSS` (one line
per nmt module, one column per layout), the others from the layout's `top`.

- `read` (`nmt import`): every weight the model config makes, each part checked by `Weights`
  (present, of its shape, finite) before it is fused; a source weight no row read is refused.
- `write` (`nmt export`, the tests' Marian writer): every foreign tensor a row names, from the
  first of its rows whose nmt tensor exists; an nmt weight no row wrote is refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator

import torch

from nmt.config import ModelConfig
from nmt.convert.reading import Weights
from nmt.errors import NmtError
from nmt.models.transformer import Transformer

PAD_LOGIT_BIAS = -1e4  # exp(-1e4 - max) underflows to 0 in every float format; fp16 can hold it


@dataclasses.dataclass(frozen=True)
class Row:
    nmt: str  # nmt's state dict key ({side}: encoder or decoder, {emb}: src or tgt)
    parts: tuple[str, ...]  # the foreign names, concatenated on dim 0; () reads zeros
    transposed: bool = False  # the parts are stored (in, out)
    pad: float | None = None  # the parts lack nmt's last (pad) row, of this value

    def format(self, **keys: object) -> Row:
        return dataclasses.replace(
            self, nmt=self.nmt.format(**keys), parts=tuple(p.format(**keys) for p in self.parts)
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    column: int  # its column in LAYER and CROSS (1, 2 or 3)
    layer: str  # the prefix of a layer's names: {side}, {i} (from 0), {n} (from 1, Marian's)
    linear: tuple[str, str]  # {p} of a linear layer's weight and bias
    norm: tuple[str, str]  # {p} of a LayerNorm's scale and bias ({tail}: Marian's pre-norm suffix)
    top: tuple[Row, ...]  # the weights outside the layers
    transposed: bool = False  # linear weights stored (in, out)
    # names a source may hold that nmt does not read (tied copies, recomputed tables)
    ignored: tuple[str, ...] = ()


# A layer's modules: nmt's, then Hugging Face MarianMT's, Marian's and CTranslate2's names after
# the layout's `layer` prefix ("+" joins the parts nmt fuses). norms.{ffn} is the feed-forward's
# LayerNorm, nmt's last: norms.1 in an encoder layer, norms.2 in a decoder layer.
LAYER = (
    (
        "self_attn.qkv",
        "self_attn.q_proj.{p}+self_attn.k_proj.{p}+self_attn.v_proj.{p}",
        "self_{p}q+self_{p}k+self_{p}v",
        "self_attention/linear_0/{p}",
    ),
    ("self_attn.out", "self_attn.out_proj.{p}", "self_{p}o", "self_attention/linear_1/{p}"),
    ("norms.0", "self_attn_layer_norm.{p}", "self_Wo_ln_{p}", "self_attention/layer_norm/{p}"),
    ("ffn.fc1", "fc1.{p}", "ffn_{p}1", "ffn/linear_0/{p}"),
    ("ffn.fc2", "fc2.{p}", "ffn_{p}2", "ffn/linear_1/{p}"),
    ("norms.{ffn}", "final_layer_norm.{p}", "ffn_ffn_ln_{p}", "ffn/layer_norm/{p}"),
)
CROSS = (  # a decoder layer's cross-attention
    ("cross_attn.q", "encoder_attn.q_proj.{p}", "context_{p}q", "attention/linear_0/{p}"),
    (
        "cross_attn.kv",
        "encoder_attn.k_proj.{p}+encoder_attn.v_proj.{p}",
        "context_{p}k+context_{p}v",
        "attention/linear_1/{p}",
    ),
    ("cross_attn.out", "encoder_attn.out_proj.{p}", "context_{p}o", "attention/linear_2/{p}"),
    ("norms.1", "encoder_attn_layer_norm.{p}", "context_Wo_ln_{p}", "attention/layer_norm/{p}"),
)

# names without the "model." prefix; logits plus final_logits_bias when it is there
HF_MARIAN = Layout(
    "Hugging Face MarianMT",
    1,
    "{side}.layers.{i}.",
    ("weight", "bias"),
    ("weight", "bias"),
    top=(
        # what MarianMTModel reads,
        Row("{emb}_embed.tokens.weight", ("{side}.embed_tokens.weight",)),
        Row("{emb}_embed.tokens.weight", ("shared.weight",)),  # a file may hold only `shared`
        Row("output_embedding", ("lm_head.weight",)),
        Row("output_bias", ("final_logits_bias",)),
        Row("output_bias", ()),
    ),
    ignored=(
        "shared.weight",
        "lm_head.weight",
        "encoder.embed_positions.weight",
        "decoder.embed_positions.weight",
    ),
)

# Marian's vocabulary has no pad row: a zero embedding, an output bias of PAD_LOGIT_BIAS
MARIAN = Layout(
    "Marian",
    2,
    "{side}_l{n}_",
    ("W", "b"),
    ("scale{tail}", "bias{tail}"),
    transposed=True,
    top=(
        Row("{emb}_embed.tokens.weight", ("Wemb",), pad=0.0),
        Row("{emb}_embed.tokens.weight", ("{side}_Wemb",), pad=0.0),
        # older Marian's
        Row("output_embedding", ("decoder_ff_logit_out_W",), transposed=True, pad=0.0),
        Row("output_embedding", ("decoder_ff_logit_out_Wt",), pad=0.0),
        Row("output_bias", ("decoder_ff_logit_out_b",), pad=PAD_LOGIT_BIAS),
        Row("output_bias", (), pad=PAD_LOGIT_BIAS),
        Row("{side}_norm.weight", ("{side}_top_ln_scale",)),
        Row("{side}_norm.bias", ("{side}_top_ln_bias",)),
    ),
)

CTRANSLATE2 = Layout(  # ctranslate2.specs.TransformerSpec's variables
    "CTranslate2",
    3,
    "{side}/layer_{i}/",
    ("weight", "bias"),
    ("gamma", "beta"),
    top=(
        Row("src_embed.tokens.weight", ("encoder/embeddings_0/weight",)),
        Row("tgt_embed.tokens.weight", ("decoder/embeddings/weight",)),
        # always stored: CTranslate2's own sinusoids count positions from 1, nmt's from 0
        Row("{emb}_embed.positions.weight", ("{side}/position_encodings/encodings",)),
        Row("{emb}_embed.sinusoids", ("{side}/position_encodings/encodings",)),
        Row("{side}_norm.weight", ("{side}/layer_norm/gamma",)),
        Row("{side}_norm.bias", ("{side}/layer_norm/beta",)),
        Row("output_embedding", ("decoder/projection/weight",)),
        Row("tgt_embed.tokens.weight", ("decoder/projection/weight",)),  # tied
        Row("output_bias", ("decoder/projection/bias",)),
    ),
)


def rows(layout: Layout, cfg: ModelConfig) -> Iterator[Row]:
    """The layout's rows for a model of `cfg`, alternatives in their order, a layer's as they are
    needed."""
    yield from dict.fromkeys(
        row.format(side=side, emb=emb)
        for side, emb in (("encoder", "src"), ("decoder", "tgt"))
        for row in layout.top
    )  # a row without {side} is made twice
    sides = (
        ("encoder", cfg.encoder_layers, LAYER, 1),
        ("decoder", cfg.decoder_layers, LAYER + CROSS, 2),
    )
    for side, count, modules, ffn in sides:  # ffn: the index of the feed-forward's LayerNorm
        for i in range(count):
            keys = {
                "side": side,
                "i": i,
                "n": i + 1,
                "ffn": ffn,
                "tail": "_pre" if cfg.norm_first else "",
            }
            for module in modules:
                norm = module[0].startswith("norms")
                for param, p in zip(
                    ("weight", "bias"), layout.norm if norm else layout.linear, strict=True
                ):
                    parts = module[layout.column].split("+")
                    yield Row(
                        f"{side}.{i}.{module[0].format(**keys)}.{param}",
                        tuple(
                            (layout.layer + part).format(p=p.format(**keys), **keys)
                            for part in parts
                        ),
                        transposed=layout.transposed and not norm and param == "weight",
                    )


def _first_layer(name: str) -> str:
    return re.sub(r"^(encoder|decoder)\.\d+\.", r"\1.0.", name)


def read(
    layout: Layout,
    w: Weights,
    cfg: ModelConfig,
    vocab_size: int,
    why: str,
    source_vocab: int | None = None,
) -> dict[str, torch.Tensor]:
    """The state dict of a model of `cfg` (and of `source_vocab`, separate vocabularies) from a
    source's weights `w`, read in the table's order (a missing layer is refused when it is
    reached); `why` ends the refusal of a weight no row read ("that its config describes")."""
    try:  # the names and shapes of the model's tensors, a layer's those of the first
        with torch.device("meta"):
            reference = Transformer(
                dataclasses.replace(cfg, encoder_layers=1, decoder_layers=1),
                vocab_size,
                0,
                source_vocab,
            ).state_dict()
    except (RuntimeError, TypeError):  # sizes whose tensors overflow int64, even unallocated
        raise NmtError(f"{w.path}: no model of these sizes can be built{w.hint}") from None
    out: dict[str, torch.Tensor] = {}
    for name, group in itertools.groupby(rows(layout, cfg), key=lambda row: row.nmt):
        if (
            like := reference.get(_first_layer(name))
        ) is None:  # not in this model (a tied output, post-norm's top)
            continue
        options = list(group)
        row = next((r for r in options if all(map(w.has, r.parts))), options[-1])
        # a part's shape in nmt's layout: 1/k of a fused tensor, without the pad row
        n, *rest = like.shape
        shape = ((n - (row.pad is not None)) // max(len(row.parts), 1), *rest)
        parts = [w.take(p, *(shape[::-1] if row.transposed else shape)) for p in row.parts] or [
            torch.zeros(shape)
        ]
        pad = [] if row.pad is None else [torch.full((1, *rest), row.pad)]
        out[name] = torch.cat([*(p.T if row.transposed else p for p in parts), *pad])
    if unread := set(reference) - set(map(_first_layer, out)):
        raise NmtError(
            f"{w.path}: the {layout.name} table has no row for nmt's weight {min(unread)}"
        )
    w.ignore(*layout.ignored)
    w.check_all_used(why)
    return out


def write(
    layout: Layout,
    cfg: ModelConfig,
    weights: dict[str, torch.Tensor],
    tables: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The foreign tensors of a model of `cfg` from its state dict `weights` (each must be
    written) and the `tables` it recomputes (its sinusoid buffers: written where a row asks)."""
    source = {**(tables or {}), **weights}
    out = dict[str, torch.Tensor]()
    used = set[str]()
    for row in rows(layout, cfg):
        # absent, or an alternative written
        if row.nmt not in source or not row.parts or row.parts[0] in out:
            continue
        tensor = source[row.nmt][:-1] if row.pad is not None else source[row.nmt]
        for name, part in zip(row.parts, tensor.chunk(len(row.parts)), strict=True):
            out[name] = part.T if row.transposed else part
        used.add(row.nmt)
    if unused := [name for name in weights if name not in used]:
        raise NmtError(
            f"the {layout.name} layout has no place for nmt's weights {', '.join(unused[:3])}"
        )
    return out
