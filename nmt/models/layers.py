"""The Transformer's building blocks (Vaswani et al. 2017): sinusoidal positions, embeddings,
dropout whose masks resume exactly, self- and cross-attention with a key/value cache, the
feed-forward block, and encoder and decoder layers (post-norm as the paper, or pre-norm).
`nmt.models.transformer` assembles them into the encoder-decoder.

Shapes: B sentences, S source / T target positions, D = d_model, H heads, Dh = D / H,
N decoder rows during search (e.g. B * beam).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.config import ModelConfig

KV = tuple[Tensor, Tensor]  # keys and values, each (B, H, L, Dh)


def sinusoids(length: int, dim: int, layout: str) -> Tensor:
    """(length, dim) positions table, row p = position p, sin in the first columns and cos in the
    rest (not interleaved), in the layout `model.positions` names:
    nmt: frequency 10000^(-i/(h-1)) for column i of each half h = dim // 2 (tensor2tensor);
    marian: Marian's SinusoidalPositionEmbeddings (the same for an even dim);
    hf_marian: transformers' MarianSinusoidalPositionalEmbedding, frequency 10000^(-2i/dim).
    """
    if layout == "marian":  # column c: frequency of c % h, sin for c < h (h = int(dim / 2))
        h = dim // 2
        cols = torch.arange(dim)
        freqs = torch.exp((cols % h) * -(math.log(10000.0) / ((dim / 2 - 1) or 1.0)))
        args = torch.arange(length).unsqueeze(1) * freqs  # (length, dim)
        return torch.where(cols < h, torch.sin(args), torch.cos(args))
    if layout == "hf_marian":  # ceil(dim/2) sin columns, then floor(dim/2) cos columns
        freqs = torch.pow(10000.0, -2 * torch.arange((dim + 1) // 2, dtype=torch.float64) / dim)
        # (length, ceil(dim/2))
        args = torch.arange(length, dtype=torch.float64).unsqueeze(1) * freqs
        return torch.cat([torch.sin(args), torch.cos(args[:, : dim // 2])], dim=1).float()
    half = dim // 2
    freqs = torch.exp(torch.arange(half) * -(math.log(10000.0) / max(half - 1, 1)))
    args = torch.arange(length).unsqueeze(1) * freqs  # (length, half)
    # odd dim: a zero last column
    return F.pad(torch.cat([torch.sin(args), torch.cos(args)], dim=1), (0, dim % 2))


def linear(d_in: int, d_out: int, parts: int = 1, gain: float = 1.0) -> nn.Linear:
    """Linear layer initialised as fairseq: xavier-uniform weights (per fused part), zero bias."""
    layer = nn.Linear(d_in, d_out)
    for w in layer.weight.chunk(parts):
        nn.init.xavier_uniform_(w, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


def token_embedding(vocab_size: int, d_model: int, pad_id: int) -> nn.Embedding:
    """(V, D) token embedding, normal(0, D^-0.5) with a zero padding row (fairseq)."""
    emb = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
    nn.init.normal_(emb.weight, std=d_model**-0.5)
    nn.init.zeros_(emb.weight[pad_id])
    return emb


class Dropout(nn.Module):
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p).

    On the CPU the keep mask comes from 16 random bits per element (p is rounded to a
    multiple of 2^-16, and the scale uses the rounded p, so the expectation stays exact):
    drawing 64-bit words is 2-3x cheaper than torch's per-element Bernoulli draws, which
    took ~10% of a training update. The default generator draws them, so checkpoints that
    save its state resume the same masks. Elsewhere it is `F.dropout`.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        drop = round(self.p * 65536)
        if drop >= 65536:
            return x * 0.0
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        bits = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform on [-2^15, 2^15)
        keep = bits >= drop - 32768  # P = 1 - drop / 2^16
        return torch.where(keep, x * (65536.0 / (65536 - drop)), 0.0)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(D) plus positions, then dropout: (B, T) -> (B, T, D).

    Positions are 0 .. T-1 (padding is at the right end, so it needs no offset), sinusoidal
    (`cfg.positions`) or learned (`cfg.learned_positions`). `tokens` may be shared with the other
    side. With `zero_start` (the decoder's, `model.decoder_start: zeros`) the token at position 0
    contributes a zero vector, whatever it is: only its position remains (Marian).
    """

    sinusoids: Tensor

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig, zero_start: bool = False):
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(cfg.d_model)
        self.zero_start = zero_start
        self.max_positions = cfg.max_positions
        self.learned = cfg.learned_positions
        if self.learned:
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
            nn.init.normal_(self.positions.weight, std=cfg.d_model**-0.5)
        else:  # a buffer, not saved in checkpoints: rebuilt from the config
            table = sinusoids(cfg.max_positions, cfg.d_model, cfg.positions)
            self.register_buffer("sinusoids", table, persistent=False)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, tokens: Tensor, start: int | Tensor = 0) -> Tensor:
        """tokens (B, T) at positions start .. start+T-1 -> (B, T, D); with `start` a (B,) CPU
        tensor and T = 1, row b at position start[b] (rows that joined a search at different
        steps)."""
        end = int(start.max()) + 1 if isinstance(start, Tensor) else start + tokens.size(1)
        if end > self.max_positions:
            raise ValueError(
                f"a sequence of {end} positions exceeds model.max_positions={self.max_positions}; "
                "truncate it first"
            )
        table = self.positions.weight if self.learned else self.sinusoids
        x = self.tokens(tokens) * self.scale  # (B, T, D)
        if isinstance(start, Tensor):
            positions = start.to(x.device).unsqueeze(1)  # (B, 1)
        else:
            positions = torch.arange(start, end, device=x.device)  # (T,)
        if self.zero_start:
            x = x.masked_fill((positions == 0).unsqueeze(-1), 0.0)
        return self.dropout(x + table[positions])


def append(
    cache: Tensor, new: Tensor, rows: Tensor | None, slots: Tensor | None, width: int
) -> Tensor:
    """Rows `rows` (N,) of cache (N0, H, L, Dh) (all if None) followed by new (N, H, T, Dh).

    Returns (N, H, L+T, Dh) with one copy of the cache: on CPU 2-3x faster than
    index_select followed by torch.cat. With `slots` (N,) (rows at different positions, T = 1),
    row i's new keys go to slot slots[i] of a (N, H, width, Dh) cache instead: each row's own
    positions first, then zeros (which the caller masks); `rows` may then be fewer than N, the
    rows after them having no cache yet (`Transformer.merge`).
    """
    L = cache.size(2) if slots is None else min(cache.size(2), width)
    out = new.new_empty(
        new.size(0), new.size(1), L + new.size(2) if slots is None else width, new.size(3)
    )
    n = cache.size(0) if rows is None else rows.numel()
    if rows is None:
        out[:n, :, :L] = cache[:, :, :L]
    else:
        torch.index_select(cache[:, :, :L], 0, rows, out=out[:n, :, :L])
    if slots is None:
        out[:, :, L:] = new
        return out
    out[:n, :, L:] = 0
    out[n:] = 0
    out[torch.arange(out.size(0), device=out.device), :, slots] = new[:, :, 0]
    return out


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection and an optional key/value cache."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        # fairseq: xavier on each of q, k, v with gain 1/sqrt(2), on the output with gain 1
        self.qkv = linear(d_model, 3 * d_model, parts=3, gain=2**-0.5)
        self.out = linear(d_model, d_model)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: KV | None = None,
        cache_rows: Tensor | None = None,
        slots: Tensor | None = None,
    ) -> tuple[Tensor, KV]:
        """x (B, T, D) -> (B, T, D), and keys/values (B, H, L, Dh) including the cached ones.

        mask (B, 1, 1, L) bool is True where a key may be attended. With a cache (rows
        `cache_rows` of it, see `append`), the T new positions attend to all L = cached + T keys
        (search feeds T = 1, so no causal mask); with `slots`, row b's position (see `append`),
        to the keys the mask allows.
        """
        B, T, D = x.shape
        # 3 x (B, H, T, Dh)
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            width = 0 if mask is None else mask.size(-1)
            k, v = (
                append(c, n, cache_rows, slots, width) for c, n in zip(cache, (k, v))
            )  # (B, H, L, Dh)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out(y.transpose(1, 2).reshape(B, T, D)), (k, v)  # (B, T, D)


class CrossAttention(nn.Module):
    """Multi-head attention of decoder positions over the encoder output (fused KV projection)."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.q = linear(d_model, d_model, gain=2**-0.5)
        self.kv = linear(d_model, 2 * d_model, parts=2, gain=2**-0.5)
        self.out = linear(d_model, d_model)

    def keys_values(self, memory: Tensor) -> KV:
        """memory (B, S, D) -> keys, values (B, H, S, Dh); computed once per sentence in search."""
        B, S, D = memory.shape
        # 2 x (B, H, S, Dh)
        k, v = self.kv(memory).view(B, S, 2, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        return k, v

    def forward(
        self, x: Tensor, kv: KV, mask: Tensor, weights: list[Tensor] | None = None
    ) -> Tensor:
        """x (B, T, D), kv from `keys_values`, mask (B, 1, 1, S) True at real source: -> (B, T, D).

        With a list `weights`, the attention is computed explicitly (no fused kernel) and its
        weights (B, H, T, S) are appended to the list (alignment, attention maps)."""
        B, T, D = x.shape
        q = self.q(x).view(B, T, self.heads, D // self.heads).transpose(1, 2)  # (B, H, T, Dh)
        if weights is not None:
            scores = q @ kv[0].transpose(-1, -2) / math.sqrt(D // self.heads)  # (B, H, T, S)
            w = scores.float().masked_fill(~mask, -math.inf).softmax(-1)
            weights.append(w)
            y = w.to(kv[1].dtype) @ kv[1]  # (B, H, T, Dh)
        else:
            y = F.scaled_dot_product_attention(
                q, kv[0], kv[1], attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
            )
        return self.out(y.transpose(1, 2).reshape(B, T, D))  # (B, T, D)


def gelu_sigmoid(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 x): the gelu of older Marian versions (swish with beta 1.702)."""
    return x * torch.sigmoid(1.702 * x)


# model.activation -> the function (see its help for which reference computes which)
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_sigmoid": gelu_sigmoid,
    "swish": F.silu,
}


class FeedForward(nn.Module):
    """Position-wise feed-forward, fc2(activation(fc1(x))): (..., D) -> (..., D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = linear(cfg.d_model, cfg.ffn_dim)
        self.fc2 = linear(cfg.ffn_dim, cfg.d_model)
        self.activation = ACTIVATIONS[cfg.activation]
        self.dropout = Dropout(cfg.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.activation(self.fc1(x))))


class Layer(nn.Module):
    """What encoder and decoder layers share: self-attention, the feed-forward block and the
    residual + LayerNorm plumbing.

    Post-norm (paper): x = norm(x + dropout(f(x))). Pre-norm: x = x + dropout(f(norm(x))).
    """

    def __init__(self, cfg: ModelConfig, sublayers: int):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.norms = nn.ModuleList(
            nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) for _ in range(sublayers)
        )
        self.dropout = Dropout(cfg.dropout)
        self.ffn = FeedForward(cfg)
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)

    def pre(self, x: Tensor, i: int) -> Tensor:
        return self.norms[i](x) if self.norm_first else x

    def add(self, x: Tensor, y: Tensor, i: int) -> Tensor:
        x = x + self.dropout(y)
        return x if self.norm_first else self.norms[i](x)


class EncoderLayer(Layer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, sublayers=2)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) True at real tokens -> (B, S, D)."""
        x = self.add(x, self.self_attn(self.pre(x, 0), mask=mask)[0], 0)
        return self.add(x, self.ffn(self.pre(x, 1)), 1)


class DecoderLayer(Layer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, sublayers=3)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)

    def forward(
        self,
        x: Tensor,
        memory_kv: KV,
        src_mask: Tensor,
        cache: KV | None = None,
        cache_rows: Tensor | None = None,
        weights: list[Tensor] | None = None,
        slots: Tensor | None = None,
        self_mask: Tensor | None = None,
    ) -> tuple[Tensor, KV]:
        """x (R, T, D) -> (R, T, D) and this layer's self-attention keys/values (R, H, L, Dh).

        Without `cache` the T positions attend causally (training, or search step 0); with it,
        the new position attends to every cached one. `memory_kv` / `src_mask` have B <= R rows:
        decoder rows r*g .. r*g+g-1 (g = R / B, e.g. the beams of a sentence) read source r.
        With a list `weights`, the cross-attention weights are appended to it (`CrossAttention`).
        Rows at different positions: `slots` and `self_mask` (`SelfAttention`).
        """
        h, cache = self.self_attn(
            self.pre(x, 0),
            self_mask,
            causal=cache is None,
            cache=cache,
            cache_rows=cache_rows,
            slots=slots,
        )
        x = self.add(x, h, 0)
        # the g rows sharing a source act as g*T query positions of one row: (B, g*T, D)
        B = src_mask.size(0)
        h = self.cross_attn(self.pre(x, 1).reshape(B, -1, x.size(-1)), memory_kv, src_mask, weights)
        x = self.add(x, h.view_as(x), 1)
        return self.add(x, self.ffn(self.pre(x, 2)), 2), cache


def source_rows(sources: int, group: int, index: Tensor) -> tuple[Tensor | None, int]:
    """A reorder of decoder rows (new row i = old row index[i]) over a state whose source rows
    are each shared by `group` consecutive decoder rows -> the source rows of the new state
    (None: unchanged, no copy) and its new group.

    Source rows stay shared as long as the new rows stay grouped (sentence-major, the same
    count per sentence); otherwise each new row gets its own source row (group 1).
    """
    source = index // group  # (N',): the source row each new row reads
    used, renumbered = torch.unique(source, return_inverse=True)  # sources still read
    n = index.numel()
    b = used.numel()
    grouped = (
        b > 0
        and n % b == 0
        and torch.equal(renumbered, torch.arange(b, device=index.device).repeat_interleave(n // b))
    )
    if not grouped:
        return source, 1
    return (None if b == sources else used), n // b


def log_probs(logits: Tensor, blocked: Tensor | None) -> Tensor:
    """A decode step's logits (N, V), or a shortlist's (N, K) -> fp32 log-probs, the columns
    `blocked` (B, K) of source row r -inf in its rows r*g .. r*g+g-1 (g = N / B). In place: on
    CPU a fresh (N, V) tensor costs page faults and a pass over memory."""
    logits = logits.float()
    if blocked is not None:
        B, K = blocked.shape
        logits.view(B, -1, K).masked_fill_(blocked.unsqueeze(1), -math.inf)
    return torch.log_softmax(logits, dim=-1, out=logits)
