"""The encoder-decoder Transformer (Vaswani et al. 2017) and its incremental-decoding cache.

This module owns the network assembled from `nmt.models.layers` (embeddings and positions,
attention, encoder and decoder layers): the output projection, initialisation (as fairseq),
and the search protocol of
docs/architecture.md: `encode` -> `DecoderState`, `decode_step` (one target position per call,
with a self-attention key/value cache), `reorder` (expand / reorder / prune rows).
It knows nothing of files, tokenizers or losses; `forward` returns logits.

Shapes: B sentences, S source / T target positions, D = d_model, H heads, Dh = D / H,
V vocabulary, N decoder rows during search (e.g. B * beam).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.config import ModelConfig
from nmt.errors import ConfigError
from nmt.models.kernels import Int8Linear
from nmt.models.layers import (
    KV,
    DecoderLayer,
    Embedding,
    EncoderLayer,
    Layer,
    log_probs,
    source_rows,
    token_embedding,
)
from nmt.models.rnn import RNN


@dataclass
class DecoderState:
    """What `decode_step` needs for N decoder rows of B source sentences (N = B * group).

    Rows r*group .. r*group+group-1 (e.g. the beams of sentence r) share source r's encoder
    keys/values, so expanding to a beam or reordering within a beam copies no encoder state.
    """

    src_mask: Tensor  # (B, 1, 1, S) bool, True at real source tokens
    cross_kv: list[KV]  # per decoder layer: keys, values (B, H, S, Dh)
    group: int = 1  # decoder rows per source row
    self_kv: list[KV] = field(default_factory=list)  # per decoder layer: (N0, H, step, Dh)
    # reorders not yet applied to self_kv: row i is self_kv row self_kv_rows[i] (None: same rows).
    # decode_step applies them while appending, so the cache is copied once per step, not twice.
    self_kv_rows: Tensor | None = None  # (N,)
    # target position of the next token fed to decode_step: of every row, or (N,) CPU each row's
    # (rows that joined a search at different steps: `Transformer.merge`)
    step: int | Tensor = 0
    # a shortlist (nmt.decoding.shortlist): output column j is token vocab[j], and the tokens fed
    # back are columns too; source row r's sentence may not produce the columns blocked[r]
    vocab: Tensor | None = None  # (K,) long
    blocked: Tensor | None = None  # (B, K) bool
    # (N, D) -> (N, K): the output projection's rows of `vocab`
    project: Callable[[Tensor], Tensor] | None = None


class Transformer(nn.Module):
    """Encoder-decoder Transformer; `forward(src, prev_output)` -> logits for training.

    Embeddings: with `cfg.share_embeddings` the encoder and decoder inputs share one (V, D)
    matrix (joint vocabulary), otherwise each has its own. With `cfg.tie_output` the output
    projection is the decoder input's matrix (fairseq's share_decoder_input_output_embed; with
    share_embeddings three-way tying), otherwise its own `output_embedding`. `cfg.output_bias`
    adds a learned (V,) bias to the logits. `source_vocab`: the source side's own vocabulary size
    (separate vocabularies; one pad id in both), which cannot be shared.
    """

    def __init__(
        self, cfg: ModelConfig, vocab_size: int, pad_id: int, source_vocab: int | None = None
    ):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        tgt_tokens = token_embedding(vocab_size, cfg.d_model, pad_id)
        src_tokens = (
            tgt_tokens
            if cfg.share_embeddings
            else token_embedding(source_vocab or vocab_size, cfg.d_model, pad_id)
        )
        self.src_embed = Embedding(src_tokens, cfg)
        self.tgt_embed = Embedding(tgt_tokens, cfg, zero_start=cfg.decoder_start == "zeros")
        self.output_embedding = (
            None if cfg.tie_output else token_embedding(vocab_size, cfg.d_model, pad_id).weight
        )
        self.output_bias = nn.Parameter(torch.zeros(vocab_size)) if cfg.output_bias else None
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # pre-norm leaves the residual stream un-normalised: one final LayerNorm on each side
        final = cfg.norm_first and cfg.final_norm  # post-norm layers end normalised already
        norm = partial(nn.LayerNorm, cfg.d_model, eps=cfg.norm_eps) if final else nn.Identity
        self.encoder_norm = norm()
        self.decoder_norm = norm()
        self.cpu_output: nn.Module | None = None  # nmt.models.kernels: PackedLinear or Int8Linear

    def describe(self) -> str:
        c = self.cfg
        return (
            f"Transformer {c.encoder_layers}+{c.decoder_layers} layers, d_model {c.d_model}, "
            f"{c.heads} heads, ffn {c.ffn_dim}, {'pre' if c.norm_first else 'post'}-norm, "
            f"{'learned' if c.learned_positions else 'sinusoidal'} positions, vocab "
            f"{self.vocab_size}, {_tying(c)}"
        )

    def set_dropout(self, p: float) -> None:
        """Set the dropout on sub-layer outputs and embeddings (model.dropout) to p; attention
        and activation dropout keep their values."""
        for module in self.modules():
            if isinstance(module, (Embedding, Layer)):
                module.dropout.p = p

    def run_encoder(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> encoder output (B, S, D) and src_mask (B, 1, 1, S), True at real tokens."""
        mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        x = self.src_embed(src)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.encoder_norm(x), mask

    def cross_keys_values(self, memory: Tensor) -> list[KV]:
        """Encoder output (B, S, D) -> each decoder layer's cross-attention K/V (B, H, S, Dh)."""
        return [cast(DecoderLayer, layer).cross_attn.keys_values(memory) for layer in self.decoder]

    def output(self, x: Tensor) -> Tensor:
        """Decoder output (..., D) -> logits (..., V): the final norm, then the output
        projection."""
        return self.projection()(self.decoder_norm(x))

    def projection(self, vocab: Tensor | None = None) -> Callable[[Tensor], Tensor]:
        """The output projection (the one way to it): final decoder states (N, D) -> logits
        (N, V), or with `vocab` (K,) (a shortlist) the logits of those K tokens (N, K); through
        the CPU kernel (packed fp32 or int8) of a model loaded for decoding (nmt.models.kernels)."""
        weight: Tensor = self.output_weight  # (V, D)
        bias: Tensor | None = self.output_bias  # (V,) or None
        if vocab is not None:
            weight = weight[vocab]  # (K, D), (K,)
            bias = None if bias is None else bias[vocab]
        if self.cpu_output is not None and vocab is None:
            return self.cpu_output
        if isinstance(self.cpu_output, Int8Linear):  # a shortlist's rows: quantised for this batch
            return Int8Linear(weight, bias)
        # (packing them would make a kernel per batch)
        return partial(F.linear, weight=weight, bias=bias)

    def forward(self, src: Tensor, prev_output: Tensor) -> Tensor:
        """src (B, S), prev_output (B, T) ([BOS] + target) -> logits (B, T, V).

        Padding must be at the right end of each row. Training computes its loss from
        `decoder_states` instead, skipping the padded positions. Under autocast the logits stay
        in the autocast dtype (no fp32 copy); the caller's loss upcasts.
        """
        return self.output(self._decode_all(src, prev_output))

    def decoder_states(self, src: Tensor, prev_output: Tensor, index: Tensor) -> Tensor:
        """The final decoder states (after the final norm) at the flat positions `index` (M,)
        of (B * T): what the output projection turns into logits (training's loss,
        nmt.training.loss). An index made on the host, unlike a boolean mask, costs the device no
        sync."""
        x = self._decode_all(src, prev_output)
        return self.decoder_norm(x.reshape(-1, x.size(-1)).index_select(0, index))

    @property
    def output_weight(self) -> Tensor:
        """(V, D): the output projection's matrix, the target embedding's unless
        `model.tie_output` is false (the loss, nmt.training.loss, multiplies by it chunk by
        chunk, adding `output_bias` (V,) where there is one)."""
        return (
            self.tgt_embed.tokens.weight if self.output_embedding is None else self.output_embedding
        )

    def attention_weights(self, src: Tensor, prev_output: Tensor) -> Tensor:
        """Teacher-forced cross-attention: src (B, S), prev_output (B, T) -> weights (B, L, H, T, S)
        of each decoder layer and head; row t is the attention while predicting target token t
        (what the search saw at that step, since cached decoding equals this full pass). Computed
        explicitly, only here: training and search keep the fused attention kernel."""
        weights: list[Tensor] = []
        self._decode_all(src, prev_output, weights)
        return torch.stack(weights, 1)

    def _decode_all(
        self, src: Tensor, prev_output: Tensor, weights: list[Tensor] | None = None
    ) -> Tensor:
        """src (B, S), prev_output (B, T) -> decoder output (B, T, D) before the final norm; each
        layer's cross-attention weights appended to `weights` if given (`CrossAttention`)."""
        memory, mask = self.run_encoder(src)
        x = self.tgt_embed(prev_output)
        for layer, memory_kv in zip(self.decoder, self.cross_keys_values(memory), strict=True):
            x, _ = layer(x, memory_kv, mask, weights=weights)
        return x

    # ------------------------------------------------------------------ search protocol
    # No gradients here (the search never needs them, and `append` writes into a buffer);
    # run all three under the same autocast, if any.

    @torch.no_grad()
    def encode(self, src: Tensor, shortlist: tuple[Tensor, Tensor] | None = None) -> DecoderState:
        """src (N, S) -> state with one row per sentence and each decoder layer's source K/V.

        shortlist = (vocab (K,), allowed (N, K)), see nmt.decoding.shortlist: decode_step then
        scores the K tokens instead of the whole vocabulary, each sentence only its allowed ones.
        """
        memory, mask = self.run_encoder(src)
        state = DecoderState(mask, self.cross_keys_values(memory))
        if shortlist is not None:
            state.vocab = shortlist[0]
            state.blocked = ~shortlist[1]
            state.project = self.projection(state.vocab)
        return state

    @torch.no_grad()
    def decode_step(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """tokens (N,) at position state.step -> fp32 log-probs (N, V) of the next token, state.

        The state passed in is used up: each layer's old self-attention cache is released as
        soon as its new one exists, so a step holds the cache plus one layer's copy, not two
        whole caches (the largest memory of a search). Continue from the returned state.
        """
        old = state.self_kv
        if any(kv is None for kv in old):
            raise ValueError(
                "this DecoderState was already passed to decode_step; use the state it returned"
            )
        if state.vocab is not None:  # columns -> token ids
            tokens = state.vocab[tokens]
        x = self.tgt_embed(tokens.unsqueeze(1), start=state.step)  # (N, 1, D)
        slots = self_mask = None
        # row i attends to its own positions 0 .. step[i]
        if isinstance(state.step, Tensor) and old:
            slots = state.step.to(x.device)
            self_mask = (
                torch.arange(int(state.step.max()) + 1, device=x.device) <= slots.unsqueeze(1)
            )[:, None, None]
        self_kv: list[KV] = []
        for i, layer in enumerate(self.decoder):
            cache = None
            if old:  # taken out of the list, which no longer keeps it alive
                cache = old[i]
                old[i] = None  # type: ignore[call-overload]
            x, kv = layer(
                x,
                state.cross_kv[i],
                state.src_mask,
                cache,
                state.self_kv_rows,
                slots=slots,
                self_mask=self_mask,
            )
            cache = None  # freed here, before the next layer copies its own
            self_kv.append(kv)
        project = state.project or self.projection()  # (N, D) -> (N, V), or a shortlist's (N, K)
        logits = project(self.decoder_norm(x.squeeze(1)))
        new = replace(state, self_kv=self_kv, self_kv_rows=None, step=state.step + 1)
        return log_probs(logits, state.blocked), new

    @torch.no_grad()
    def reorder(self, state: DecoderState, index: Tensor) -> DecoderState:
        """New row i = old row index[i], index (N',): expands to beams, reorders, prunes.

        Source K/V are shared by rows of a sentence as long as the new rows stay grouped
        (sentence-major, same count per sentence); otherwise each row gets its own copy.
        """
        take, group = source_rows(state.src_mask.size(0), state.group, index)
        rows = index if state.self_kv_rows is None else state.self_kv_rows[index]
        step = state.step[index.cpu()] if isinstance(state.step, Tensor) else state.step
        new = replace(state, group=group, self_kv_rows=rows if state.self_kv else None, step=step)
        if take is not None:
            new.src_mask = state.src_mask.index_select(0, take)
            new.cross_kv = [
                (k.index_select(0, take), v.index_select(0, take)) for k, v in state.cross_kv
            ]
            new.blocked = None if state.blocked is None else state.blocked.index_select(0, take)
        return new

    @torch.no_grad()
    def merge(self, a: DecoderState, b: DecoderState) -> DecoderState:
        """The rows of `a`, then those of `b`, as one state: sentences joining a running search
        (continuous batching, nmt serve). Both have the same group and no shortlist, and `b` was
        not decoded yet. The source side is padded (masked) to the longer source; each row keeps its
        position (`step` becomes per row), and the next `decode_step` copies a's cache with b's rows
        (zeros) after it (`nmt.models.layers.append`)."""
        if a.group != b.group or a.vocab is not None or b.vocab is not None or b.self_kv:
            raise ValueError(
                "only states of one group, without a shortlist, b not decoded yet, can merge"
            )
        S = max(a.src_mask.size(-1), b.src_mask.size(-1))
        src_mask = torch.cat(
            [F.pad(m, (0, S - m.size(-1)), value=False) for m in (a.src_mask, b.src_mask)]
        )
        cross_kv = [
            (_stack(ka[0], kb[0], S), _stack(ka[1], kb[1], S))
            for ka, kb in zip(a.cross_kv, b.cross_kv, strict=True)
        ]
        steps = [
            s.step
            if isinstance(s.step, Tensor)
            else torch.full((s.src_mask.size(0) * s.group,), s.step)
            for s in (a, b)
        ]
        # b's rows have no cache yet: the next step's `append` gives them zeros after a's rows
        rows = (
            torch.arange(steps[0].numel(), device=src_mask.device)
            if a.self_kv and a.self_kv_rows is None
            else a.self_kv_rows
        )
        return DecoderState(src_mask, cross_kv, a.group, a.self_kv, rows, step=torch.cat(steps))


def _stack(x: Tensor, y: Tensor, width: int) -> Tensor:
    """x (Bx, H, Sx, Dh) above y (By, H, Sy, Dh), each with zeros after its positions up to
    `width`."""
    return torch.cat([F.pad(t, (0, 0, 0, width - t.size(2))) for t in (x, y)])


def build_model(
    cfg: ModelConfig, vocab_size: int, pad_id: int, source_vocab: int | None = None
) -> Transformer | RNN:
    """The network `cfg.arch` names: a `Transformer` or an `nmt.models.rnn.RNN`. Both give training
    `forward` / `decoder_states` / `output_weight` and the search its protocol. `source_vocab`: the
    source side's size where it has its own vocabulary (then `cfg.share_embeddings` must be
    false)."""
    if source_vocab is not None and cfg.share_embeddings:
        raise ConfigError(
            "model.share_embeddings must be false: the source and target vocabularies are "
            f"separate ({source_vocab} and {vocab_size} tokens)"
        )
    return (RNN if cfg.arch == "rnn" else Transformer)(cfg, vocab_size, pad_id, source_vocab)


def _tying(c: ModelConfig) -> str:
    """Which embedding matrices are one, in words."""
    if c.share_embeddings and c.tie_output:
        return "all embeddings tied"
    if c.tie_output:
        return "decoder input/output tied"
    return "source/target embeddings tied" if c.share_embeddings else "no embeddings tied"


def num_parameters(model: nn.Module) -> int:
    """Number of distinct parameters: a tied matrix counts once (parameters() de-duplicates)."""
    return sum(p.numel() for p in model.parameters())


def summary(model: Transformer | RNN) -> str:
    """A few lines: the architecture, parameters per top-level module, the total."""
    lines = [model.describe()]
    seen: set[int] = set()
    for name, child in model.named_children():
        params = [p for p in child.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            lines.append(f"  {name:<14} {sum(p.numel() for p in params):>12,}")
        elif list(child.parameters()):
            lines.append(f"  {name:<14} {'(tied)':>12}")
    lines.append(f"parameters: {num_parameters(model)}")
    return "\n".join(lines)
