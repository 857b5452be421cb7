"""The RNN encoder-decoder that the Transformer replaced: a bidirectional GRU or LSTM encoder
and a one-layer decoder with additive attention (Bahdanau, Cho and Bengio 2015,
"Neural Machine Translation by Jointly Learning to Align and Translate"), or, with
`model.attention: none`, a decoder that sees one fixed summary vector of the source at
every step (the RNN encoder-decoder of Cho et al. 2014: the bottleneck attention lifted).

Decoder step t (s = decoder state, h_j = encoder annotations, y = target embeddings):
    e_tj = v^T tanh(W_a s_{t-1} + U_a h_j),  a_t = softmax_j(e_t)   (over real source tokens)
    c_t  = sum_j a_tj h_j                    (attention none: c_t = [h_fwd_last; h_bwd_first])
    s_t  = cell([y_{t-1}; c_t], s_{t-1}),    s_0 = tanh(W_init [h_fwd_last; h_bwd_first])
    o_t  = tanh(W_o [s_t; c_t; y_{t-1}])     (D = d_model; Bahdanau's maxout is a tanh here)
    p(y_t | ...) = softmax(o_t E^T)          (E = the target embedding, tied as the Transformer's)

The same training interface as `nmt.models.transformer.Transformer` (`forward`, `decoder_states`,
`output_weight`, `set_dropout`) and the same search protocol (`encode`, `decode_step`,
`reorder`); training runs the decoder step by step with the function the search calls.

Shapes: B sentences, S source / T target positions, D = d_model, H = rnn_hidden,
N decoder rows during search (B * group, e.g. the beams of each sentence).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.config import ModelConfig
from nmt.models.layers import Dropout, log_probs, source_rows, token_embedding


@dataclass
class RNNState:
    """What `RNN.decode_step` needs for N decoder rows of B source sentences (N = B * group)."""

    memory: Tensor  # (B, S, 2H) encoder annotations, zero at padding
    keys: Tensor | None  # (B, S, H) U_a h_j, computed once; None without attention
    src_mask: Tensor  # (B, S) bool, True at real source tokens
    summary: Tensor  # (B, 2H) the fixed source vector (context without attention)
    hidden: Tensor  # (N, H)
    cell: Tensor | None  # (N, H) LSTM memory cell; None for GRU
    group: int = 1  # decoder rows per source row
    vocab: Tensor | None = None  # shortlist (K,), as nmt.models.transformer.DecoderState
    blocked: Tensor | None = None  # (B, K) bool
    project: Callable[[Tensor], Tensor] | None = None  # (N, D) -> (N, K)


class RNN(nn.Module):
    """Bidirectional RNN encoder, attentional RNN decoder; `forward(src, prev_output)` -> logits."""

    def __init__(
        self, cfg: ModelConfig, vocab_size: int, pad_id: int, source_vocab: int | None = None
    ):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        D = cfg.d_model
        H = cfg.rnn_hidden
        self.lstm = cfg.cell == "lstm"
        self.tgt_tokens = token_embedding(vocab_size, D, pad_id)
        self.src_tokens = (
            self.tgt_tokens
            if cfg.share_embeddings
            else token_embedding(source_vocab or vocab_size, D, pad_id)
        )
        rnn = nn.LSTM if self.lstm else nn.GRU
        self.encoder = rnn(
            D,
            H,
            num_layers=cfg.rnn_layers,
            batch_first=True,
            bidirectional=True,
            dropout=cfg.dropout if cfg.rnn_layers > 1 else 0.0,
        )
        self.init = nn.Linear(2 * H, H)
        if self.has_attention:
            self.attn_query = nn.Linear(H, H, bias=False)  # W_a
            self.attn_key = nn.Linear(2 * H, H)  # U_a
            self.attn_v = nn.Linear(H, 1, bias=False)  # v
        self.decoder = (nn.LSTMCell if self.lstm else nn.GRUCell)(D + 2 * H, H)
        self.readout = nn.Linear(H + 2 * H + D, D)
        self.dropout = Dropout(cfg.dropout)

    @property
    def has_attention(self) -> bool:
        return self.cfg.attention == "bahdanau"

    def describe(self) -> str:
        c = self.cfg
        return (
            f"RNN encoder-decoder: bidirectional {c.cell.upper()} encoder ({c.rnn_layers} "
            f"layer(s)), {c.cell.upper()} decoder, hidden {c.rnn_hidden}, embeddings {c.d_model}, "
            f"attention {c.attention}, vocab {self.vocab_size}, "
            f"{'all embeddings tied' if c.share_embeddings else 'decoder input/output tied'}"
        )

    def set_dropout(self, p: float) -> None:
        """Set the dropout on embeddings and readout (model.dropout) to p."""
        self.dropout.p = p

    @property
    def output_weight(self) -> Tensor:
        """(V, D): the output projection, tied to the target embedding."""
        return self.tgt_tokens.weight

    output_bias = None  # the output projection has no bias (the training loss asks)

    # ------------------------------------------------------------------ encoder and one step

    def run_encoder(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """src (B, S), padding at the right -> annotations (B, S, 2H), mask (B, S), summary (B, 2H).

        Packed by length, so padding never enters the recurrence (a padded sentence encodes as
        it does alone). The summary is the last forward and the first backward state of the top
        layer: the whole sentence read in each direction."""
        mask = src != self.pad_id  # (B, S)
        lengths = mask.sum(1).cpu()  # packing wants the lengths on the host
        x = self.dropout(self.src_tokens(src))  # (B, S, D)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, last = self.encoder(packed)
        h_n = last[0] if self.lstm else last  # (layers * 2, B, H)
        memory, _ = pad_packed_sequence(
            out, batch_first=True, total_length=src.size(1)
        )  # (B, S, 2H)
        return memory, mask, torch.cat([h_n[-2], h_n[-1]], -1)

    def _step(
        self, emb: Tensor, hidden: Tensor, cell: Tensor | None, state: RNNState
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """One decoder step for N = B * group rows: emb (N, D) of the previous token, the
        previous hidden (and cell) (N, H) -> readout (N, D), the new hidden (and cell), and
        the attention weights (N, S) (None without attention)."""
        B, S = state.src_mask.shape
        g = hidden.size(0) // B
        if state.keys is None:
            weights = None
            context = state.summary.repeat_interleave(g, 0) if g > 1 else state.summary  # (N, 2H)
        else:
            query = self.attn_query(hidden).view(B, g, 1, -1)  # (B, g, 1, H)
            energy = self.attn_v(torch.tanh(state.keys.unsqueeze(1) + query)).squeeze(
                -1
            )  # (B, g, S)
            energy = energy.float().masked_fill(~state.src_mask.unsqueeze(1), -math.inf)
            weights = energy.softmax(-1)  # (B, g, S)
            context = torch.bmm(weights.to(state.memory.dtype), state.memory).view(
                B * g, -1
            )  # (N, 2H)
            weights = weights.view(B * g, S)
        inp = torch.cat([emb, context.to(emb.dtype)], -1)  # (N, D + 2H)
        if self.lstm:
            assert cell is not None
            hidden, cell = self.decoder(inp, (hidden, cell))
        else:
            hidden = self.decoder(inp, hidden)
        out = torch.tanh(
            self.readout(torch.cat([hidden, context.to(hidden.dtype), emb.to(hidden.dtype)], -1))
        )
        return out, hidden, cell, weights

    def _start(self, src: Tensor) -> RNNState:
        memory, mask, summary = self.run_encoder(src)
        keys = self.attn_key(memory) if self.has_attention else None  # (B, S, H)
        hidden = torch.tanh(self.init(summary))  # (B, H)
        return RNNState(
            memory, keys, mask, summary, hidden, torch.zeros_like(hidden) if self.lstm else None
        )

    # ------------------------------------------------------------------ training

    def _decode_all(
        self, src: Tensor, prev_output: Tensor, weights: list[Tensor] | None = None
    ) -> Tensor:
        """src (B, S), prev_output (B, T) -> readouts (B, T, D), the steps of the search in a loop;
        each step's attention weights (B, S) appended to `weights` if given."""
        state = self._start(src)
        hidden = state.hidden
        cell = state.cell
        emb = self.dropout(self.tgt_tokens(prev_output))  # (B, T, D)
        outs = []
        for t in range(prev_output.size(1)):
            out, hidden, cell, w = self._step(emb[:, t], hidden, cell, state)
            outs.append(out)
            if weights is not None and w is not None:
                weights.append(w)
        return self.dropout(torch.stack(outs, 1))  # (B, T, D)

    def forward(self, src: Tensor, prev_output: Tensor) -> Tensor:
        """src (B, S), prev_output (B, T) -> logits (B, T, V)."""
        return F.linear(self._decode_all(src, prev_output), self.output_weight)

    def decoder_states(self, src: Tensor, prev_output: Tensor, index: Tensor) -> Tensor:
        """The readouts (M, D) at the flat positions `index` of (B * T) (training's loss)."""
        x = self._decode_all(src, prev_output)
        return x.reshape(-1, x.size(-1)).index_select(0, index)

    def attention_weights(self, src: Tensor, prev_output: Tensor) -> Tensor | None:
        """Teacher-forced attention: (B, 1, 1, T, S), one layer and one head; row t is the
        attention while predicting target token t. None without attention."""
        if not self.has_attention:
            return None
        weights: list[Tensor] = []
        self._decode_all(src, prev_output, weights)
        return torch.stack(weights, 1)[:, None, None]  # (B, 1, 1, T, S)

    # ------------------------------------------------------------------ search protocol

    @torch.no_grad()
    def encode(self, src: Tensor, shortlist: tuple[Tensor, Tensor] | None = None) -> RNNState:
        """src (N, S) -> state with one row per sentence; shortlist as `Transformer.encode`."""
        state = self._start(src)
        if shortlist is not None:
            state.vocab = shortlist[0]
            state.blocked = ~shortlist[1]
            state.project = partial(F.linear, weight=self.output_weight[state.vocab])
        return state

    @torch.no_grad()
    def decode_step(self, tokens: Tensor, state: RNNState) -> tuple[Tensor, RNNState]:
        """tokens (N,) -> fp32 log-probs (N, V) of the next token, and the advanced state."""
        if state.vocab is not None:  # columns -> token ids
            tokens = state.vocab[tokens]
        out, hidden, cell, _ = self._step(self.tgt_tokens(tokens), state.hidden, state.cell, state)
        # (N, D) -> (N, V), or a shortlist's (N, K)
        project = state.project or partial(F.linear, weight=self.output_weight)
        return log_probs(project(out), state.blocked), replace(state, hidden=hidden, cell=cell)

    @torch.no_grad()
    def reorder(self, state: RNNState, index: Tensor) -> RNNState:
        """New row i = old row index[i]; source rows shared by groups as in
        `Transformer.reorder`."""
        take, group = source_rows(state.src_mask.size(0), state.group, index)
        new = replace(
            state,
            hidden=state.hidden.index_select(0, index),
            group=group,
            cell=None if state.cell is None else state.cell.index_select(0, index),
        )
        if take is not None:
            new.memory, new.src_mask, new.summary = (
                t.index_select(0, take) for t in (state.memory, state.src_mask, state.summary)
            )
            new.keys = None if state.keys is None else state.keys.index_select(0, take)
            new.blocked = None if state.blocked is None else state.blocked.index_select(0, take)
        return new
