"""The candidates of a beam search step: the best continuations of each sentence
(`top_candidates`), and with lexical constraints the larger pool taken bank by bank
(`bank_candidates`, dynamic beam allocation).

The best candidates are found in two stages: the maximum of each chunk of 64 vocabulary
columns, then the best chunks' columns only. On the CPU a top-k over width * V scores cost as
much as a tenth of a step; the chunk maxima are one vectorised pass. Ties are broken by the
lower (row, token) index in both stages, so the result is exactly that of one top-k over all
continuations, and does not depend on the batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from nmt.decoding.constraints import ConstraintTracker, EosBlocked, RowState

CHUNK = 64  # vocabulary columns per chunk in the first stage of `top_candidates`


def _rank_keys(values: Tensor, index: Tensor) -> Tensor:
    """int64 keys that order float32 `values` descending, then `index` (< 2^32) ascending.

    A top-k over the keys is deterministic, and equal scores always resolve to the lower index
    (torch.topk leaves the order of ties to the implementation). The float's bits are mapped to
    an int32 of the same order (-0.0 is first made +0.0), placed above the inverted index.
    """
    bits = (values + 0.0).view(torch.int32).long()  # + 0.0: a fresh tensor, and -0.0 -> +0.0
    magnitude = bits & 0x7FFFFFFF
    order = torch.where(bits < 0, -1 - magnitude, magnitude)  # same order as the floats
    return order * 2**32 + (2**32 - 1 - index)


def repeats(values: Tensor) -> Tensor:
    """(R, C) -> (R, C) bool: whether each value equals the one before it in its row (in a
    sorted row: a repeat)."""
    return torch.cat(
        [torch.zeros_like(values[:, :1], dtype=torch.bool), values[:, 1:] == values[:, :-1]], 1
    )


def top_candidates(
    lprobs: Tensor, scores: Tensor, k: int, chunk: int | None = None
) -> tuple[Tensor, Tensor]:
    """The k best continuations of each sentence: their scores and indices, best first.

    lprobs (Bn*width, V) contiguous next-token log-probs of Bn sentences' `width` rows each,
    scores (Bn, width) the rows' log-probs; `chunk` columns per chunk. A continuation (row j
    of its sentence, token t) scores scores[b, j] + lprobs[b*width + j, t] and has index
    j*V + t. Returns (Bn, k) scores and indices, by score descending, equal scores by lower
    index; k <= width * V.

    With V >= 4 chunks, two stages: the score of each chunk of `chunk` columns is its maximum
    (adding a row's score preserves the order of its log-probs, also in float32), and the k
    best continuations lie in the k best chunks, ranked the same way (each chunk ranked
    before a continuation's own holds a continuation ranked before it). Else one top-k.
    """
    n_sent, width = scores.shape
    vocab = lprobs.size(1)
    chunk = chunk or CHUNK  # read at each call: a test sets CHUNK to reach the two stages
    if vocab < 4 * chunk:
        cand = (scores.view(-1, 1) + lprobs).view(n_sent, width * vocab)
        index = torch.arange(width * vocab, device=lprobs.device).expand(n_sent, -1)
        pick = _rank_keys(cand, index).topk(k).indices
        return cand.gather(1, pick), pick
    full = vocab // chunk  # chunks of `chunk` columns, then one shorter chunk if any columns remain
    maxima = lprobs[:, : full * chunk].view(-1, full, chunk).amax(2)  # (Bn*width, full)
    if vocab > full * chunk:
        maxima = torch.cat([maxima, lprobs[:, full * chunk :].amax(1, keepdim=True)], 1)
    per_row = maxima.size(1)
    chunk_scores = (scores.view(-1, 1) + maxima).view(n_sent, width * per_row)
    chunk_index = torch.arange(width * per_row, device=lprobs.device).expand(n_sent, -1)
    best = _rank_keys(chunk_scores, chunk_index).topk(min(k, width * per_row)).indices  # (Bn, c)
    row = best // per_row  # row of the sentence, first column
    first = best % per_row * chunk
    cols = first.unsqueeze(2) + torch.arange(chunk, device=lprobs.device)  # (Bn, c, chunk)
    outside = cols >= vocab  # the shorter last chunk's padding
    cols = cols.clamp(max=vocab - 1)
    # (Bn, c) of lprobs
    rows = row + torch.arange(n_sent, device=lprobs.device).unsqueeze(1) * width
    lp = lprobs[rows.unsqueeze(2), cols].masked_fill_(outside, -math.inf)
    cand = (scores.view(-1)[rows].unsqueeze(2) + lp).view(n_sent, -1)  # (Bn, c * chunk)
    index = ((row * vocab).unsqueeze(2) + cols).view(n_sent, -1)
    pick = _rank_keys(cand, index.masked_fill(outside.view(n_sent, -1), 2**32 - 1)).topk(k).indices
    return cand.gather(1, pick), index.gather(1, pick)


def bank_candidates(
    lprobs: Tensor, scores: Tensor, k: int, cons: ConstraintTracker, blocked: EosBlocked
) -> tuple[Tensor, Tensor, RowState]:
    """The candidates of each sentence in the order a constrained search takes them: dynamic
    beam allocation (Post & Vilar 2018), vectorised over sentences x rows (Hu et al. 2019).

    lprobs (Bn*width, V) and scores (Bn, width) as for `top_candidates`, lprobs masked by
    `ConstraintTracker.block_`. The pool: the k best continuations, each row's best, and each
    row's next tokens of the phrases it works on (`ConstraintTracker.next_tokens`: at most k),
    so that a hypothesis can always take a constraint further. A continuation that
    comes twice counts once. Each candidate's bank is the number of constraint tokens it has
    produced (`ConstraintTracker.bank`), and the pool is taken round-robin over the banks,
    highest first: the best of each bank, then the second best of each, and so on. The beam
    is thus shared about evenly among the banks, the highest getting the remainder, and a
    bank's places that it cannot fill go to the others; hypotheses that have met more
    constraints are not pruned away by likelier ones that have met fewer. Candidates with a
    -inf score come last.

    A row with no finite continuation because EOS is blocked before its constraints are met
    (`blocked`, what `ConstraintTracker.block_` took away) gets EOS back
    (`ConstraintTracker.unblock_stuck_`): it may end, its output then says what it lacks.

    Returns scores (Bn, C), indices (Bn, C) (row of the sentence * V + token, as
    `top_candidates`) and the candidates' constraint states (Bn, C, M). A sentence without
    constraints has one bank: its candidates come in the order of `top_candidates`, and its
    first k are those.
    """
    n_sent, width = scores.shape
    vocab = lprobs.size(1)
    device = lprobs.device
    row_scores = scores.reshape(-1, 1)  # (N, 1)
    best_score, best_tok = top_candidates(lprobs, row_scores, 1)  # (N, 1): each row's best
    eos = cons.eos
    stuck = cons.unblock_stuck_(lprobs, best_score.view(-1), blocked).unsqueeze(1)
    best_score = torch.where(stuck, row_scores + lprobs[:, eos : eos + 1], best_score)
    best_tok = best_tok.masked_fill(stuck, eos)
    top_scores, top_idx = top_candidates(lprobs, scores, k)  # (Bn, k)
    need = cons.next_tokens(lprobs, k)  # (N, M'), -1: none
    need_scores = torch.where(
        need >= 0, row_scores + lprobs.gather(1, need.clamp(min=0)), -math.inf
    )
    # index of each row's token 0
    first = (torch.arange(width, device=device) * vocab).view(1, width, 1)
    cand = torch.cat([top_scores, best_score.view(n_sent, width), need_scores.view(n_sent, -1)], 1)
    index = torch.cat(
        [
            top_idx,
            (first + best_tok.view(n_sent, width, 1)).view(n_sent, width),
            (first + need.clamp(min=0).view(n_sent, width, -1)).view(n_sent, -1),
        ],
        1,
    )

    # best first: score descending, then the lower index; of a repeated continuation the first
    # counts
    by_score = _rank_keys(cand, index).argsort(dim=1, descending=True, stable=True)
    cand = cand.gather(1, by_score)
    index = index.gather(1, by_score)
    by_index = index.argsort(dim=1, stable=True)
    repeat = repeats(index.gather(1, by_index))
    dead = torch.zeros_like(repeat).scatter_(1, by_index, repeat) | cand.isneginf()
    cand = cand.masked_fill(dead, -math.inf)  # a repeat may neither end nor live twice

    # each candidate's constraint state and bank; the dead form a bank of their own, the last
    sentence_row = torch.arange(n_sent, device=device).unsqueeze(1) * width
    state = cons.advance(sentence_row + index // vocab, index % vocab)  # (Bn, C, M)
    bank = cons.bank(state).masked_fill(dead, -1)

    # round robin: sorted by bank (stable, so by score within a bank), then by rank in the bank
    by_bank = bank.argsort(dim=1, descending=True, stable=True)
    bank = bank.gather(1, by_bank)
    position = torch.arange(bank.size(1), device=device).expand_as(bank)
    new_bank = ~repeats(bank)
    rank = position - torch.where(new_bank, position, 0).cummax(1).values
    top = cons.total
    key = torch.where(bank >= 0, rank * (top + 1) + top - bank, (top + 1) * bank.size(1) + position)
    taken = by_bank.gather(1, key.argsort(dim=1, stable=True))
    return cand.gather(1, taken), index.gather(1, taken), state.gather(taken)
