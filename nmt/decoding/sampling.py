"""Sampling instead of beam search (`translate --sampling`): each output token is drawn from
the model's distribution, optionally sharpened or flattened (temperature), cut to the k
likeliest tokens (top-k; Fan et al. 2018) and/or to the smallest set of likeliest tokens whose
probability reaches p (nucleus or top-p; Holtzman et al. 2020). Used for back-translation
(Edunov et al. 2018 found sampled back-translations better than beam ones) and generation.

Reproducible whatever the batching: input sentence i draws from its own generator, seeded
by (seed, i), one uniform number per output token, so a sentence's sample depends only on
its seed, its index and the model's log-probs. Each step follows the search's token rules
(`nmt.decoding.search.token_search`: length limits, no pad/bos/unk, min_len, no_repeat_ngram_size).
With topk 1 the draw always takes the likeliest token, ties to the lower id: greedy search.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor

from nmt.config import DecodeConfig
from nmt.decoding.search import Pick


def sentence_generator(seed: int, index: int) -> torch.Generator:
    """The generator of input sentence `index` under `seed` (a hash of both, so that
    neighbouring seeds and sentences get unrelated streams)."""
    digest = hashlib.blake2b(f"nmt-sampling:{seed}:{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def tempered(ordered: Tensor, temperature: float) -> Tensor:
    """Log-probs (N, V), each row sorted descending, over `temperature`, as float64 logits whose
    row maximum is 0. The maximum is taken off first, so no positive temperature overflows
    (issue 25: float32 log-probs over 1e-46 were -inf - -inf = NaN, and every row came out
    empty): towards 0 the likeliest token takes all the mass (greedy), towards infinity
    every allowed token gets the same; -inf (a blocked token) stays -inf."""
    wide = ordered.double()
    return (wide - wide[:, :1]) / temperature  # a fully blocked row: NaN, zeroed by the caller


def sampler(cfg: DecodeConfig, indices: Sequence[int]) -> Pick:
    """The `Pick` of `nmt.decoding.search.token_search` for a batch whose sentence b is input
    sentence
    `indices[b]`: a token drawn from each row's distribution as `cfg` shapes it."""
    generators = [sentence_generator(cfg.seed, i) for i in indices]

    def pick(scores: Tensor, sent_ids: Tensor) -> tuple[Tensor, Tensor]:
        # scores (N, V) log-probs, -inf where the rules block a token. Sorted once, descending,
        # stable: equal scores keep the lower id first, as greedy's first maximum.
        ordered, order = scores.sort(dim=-1, descending=True, stable=True)  # (N, V)
        # a fully blocked row: all 0
        probs = torch.softmax(tempered(ordered, cfg.temperature), dim=-1).nan_to_num_(0.0)
        keep = torch.ones_like(probs, dtype=torch.bool)
        if cfg.topk:
            keep[:, cfg.topk :] = False
        if cfg.topp < 1.0:  # the mass before a token must be below p for it to be kept
            keep &= (probs.cumsum(-1) - probs) < cfg.topp
        keep[:, 0] = True  # the likeliest token is always a candidate
        probs.masked_fill_(~keep, 0.0)
        cdf = probs.cumsum(-1)  # (N, V), cdf[:, -1] = the kept mass
        draws = torch.stack(
            [
                torch.rand((), generator=generators[i], dtype=torch.float64)
                for i in sent_ids.tolist()
            ]
        ).to(scores.device)  # (N,)
        position = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1), right=True)
        position.clamp_(max=keep.sum(-1, keepdim=True) - 1)  # never past the kept ones
        tokens = order.gather(1, position).squeeze(1)  # (N,)
        return scores.gather(1, tokens.unsqueeze(1)).squeeze(1), tokens

    return pick
