"""Beam search (beam 1 is greedy) and token-by-token search (sampling) over the model protocol
of docs/architecture.md.

The search knows the model only through `encode(src) -> state`,
`decode_step(tokens (N,), state) -> (log_probs (N, V), state)` and `reorder(state, index)`.
Rows are sentence-major: row `b * beam + k` is hypothesis k of sentence b. The log-probs
`decode_step` returns belong to the search, which masks them in place.

Beam search follows fairseq: each step takes the top 2*beam candidates of each sentence so
that candidates ending in EOS (moved to the finished list) never shrink the live beam;
candidates are ranked by their raw log-probability, finished hypotheses by the normalised
score; sentences that are done leave the batch (`model.reorder`), so a step costs less as
sentences finish. Scores are accumulated in fp32 whatever the model computed in.

The best candidates of a step are found in two stages (`top_candidates`): the maximum of each
chunk of 64 vocabulary columns, then the best chunks' columns only. On the CPU a top-k over
width * V scores cost as much as a tenth of a step; the chunk maxima are one vectorised pass.
Ties are broken by the lower (row, token) index in both stages, so the result is exactly that
of one top-k over all continuations, and does not depend on the batch.

With lexical constraints (`nmt.decoding.constraints`: phrases to include or avoid, a forced
prefix) the candidates are more and taken in another order (`bank_candidates`, dynamic beam
allocation); a batch without any runs exactly the code above.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from nmt.decoding.constraints import Constraints, ConstraintTracker, RowState

if TYPE_CHECKING:
    from nmt.config import DecodeConfig

LENPEN_HELP = (
    "Hypotheses are ranked by log P(Y|X) / lp(|Y|), |Y| = output tokens including the final "
    "EOS. gnmt: lp = ((5 + |Y|) / 6)^alpha (Wu et al. 2016; the Transformer paper uses "
    "alpha = 0.6); length: lp = |Y|^alpha (fairseq, Marian; alpha = 1 ranks by mean token "
    "log-prob); none: lp = 1 (raw log-prob, favours short outputs). A larger alpha favours "
    "longer outputs."
)


class SearchModel(Protocol):
    def encode(self, src: Tensor) -> Any: ...
    def decode_step(self, tokens: Tensor, state: Any) -> tuple[Tensor, Any]: ...
    def reorder(self, state: Any, index: Tensor) -> Any: ...


@dataclass
class Hypothesis:
    tokens: list[int]  # output tokens, without the final EOS
    score: float  # logprob / length_penalty(len(tokens) + 1): what hypotheses are ranked by
    logprob: float  # sum of the token log-probs, EOS included
    positional_scores: list[float]  # log-prob of each token, EOS included (len(tokens) + 1)
    unmet: int = 0  # positive constraints (`Constraints.include` phrases) the output lacks


def length_penalty(length: int, alpha: float, style: str) -> float:
    """The divisor of a hypothesis' log-prob: see `LENPEN_HELP`.

    `length` counts the output tokens including the final EOS (as fairseq), so it is at
    least 1. "gnmt": ((5 + length) / 6)^alpha (Wu et al. 2016); "length": length^alpha
    (fairseq / Marian normalisation); "none": 1.
    """
    base = (5.0 + length) / 6.0 if style == "gnmt" else float(length)
    if style in ("gnmt", "length"):
        try:
            return base**alpha
        except OverflowError:  # an absurd --lenpen (1e308): every score becomes 0, no crash
            return math.inf
    if style == "none":
        return 1.0
    raise ValueError(f"unknown length penalty style {style!r} (gnmt, length or none)")


def max_output_lengths(src: Tensor, cfg: DecodeConfig, pad: int, max_len: int | None) -> Tensor:
    """src (B, S) -> (B,) CPU: the most tokens each output may have before its EOS.

    int(max_len_a * src_len + max_len_b), src_len counting the non-pad source tokens (its
    EOS included); capped at max_len - 1 so that BOS + output fit in `max_len` positions.
    """
    src_len = (src != pad).sum(1).cpu().double()
    # in doubles, capped below int64's limit: --max-len-b 1e30 or --max-len-a 1e308 mean "no limit"
    out = (cfg.max_len_a * src_len + float(cfg.max_len_b)).clamp(max=2.0**62).long()  # truncates like int()
    if max_len is not None:
        out = out.clamp(max=max_len - 1)
    return out.clamp(min=0)


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


def top_candidates(lprobs: Tensor, scores: Tensor, k: int, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """The k best continuations of each sentence: their scores and indices, best first.

    lprobs (Bn*width, V) contiguous next-token log-probs of Bn sentences' `width` rows each,
    scores (Bn, width) the rows' log-probs; `chunk` defaults to CHUNK. A continuation (row j
    of its sentence, token t) scores scores[b, j] + lprobs[b*width + j, t] and has index
    j*V + t. Returns (Bn, k) scores and indices, by score descending, equal scores by lower
    index; k <= width * V.

    With V >= 4 chunks, two stages: the score of each chunk of `chunk` columns is its maximum
    (adding a row's score preserves the order of its log-probs, also in float32), and the k
    best continuations lie in the k best chunks, ranked the same way (each chunk ranked
    before a continuation's own holds a continuation ranked before it). Else one top-k.
    """
    chunk = chunk or CHUNK
    n_sent, width = scores.shape
    vocab = lprobs.size(1)
    if vocab < 4 * chunk:
        cand = (scores.view(-1, 1) + lprobs).view(n_sent, width * vocab)
        index = torch.arange(width * vocab, device=lprobs.device).expand(n_sent, -1)
        pick = _rank_keys(cand, index).topk(k).indices
        return cand.gather(1, pick), pick
    full = vocab // chunk  # chunks of `chunk` columns, then one shorter chunk if any columns remain
    maxima = lprobs[:, : full * chunk].view(-1, full, chunk).amax(2)  # (Bn*width, full)
    if vocab > full * chunk:
        maxima = torch.cat([maxima, lprobs[:, full * chunk:].amax(1, keepdim=True)], 1)
    per_row = maxima.size(1)
    chunk_scores = (scores.view(-1, 1) + maxima).view(n_sent, width * per_row)
    chunk_index = torch.arange(width * per_row, device=lprobs.device).expand(n_sent, -1)
    best = _rank_keys(chunk_scores, chunk_index).topk(min(k, width * per_row)).indices  # (Bn, c)
    row, first = best // per_row, best % per_row * chunk  # row of the sentence, first column
    cols = first.unsqueeze(2) + torch.arange(chunk, device=lprobs.device)  # (Bn, c, chunk)
    outside = cols >= vocab  # the shorter last chunk's padding
    cols = cols.clamp(max=vocab - 1)
    rows = row + torch.arange(n_sent, device=lprobs.device).unsqueeze(1) * width  # (Bn, c) of lprobs
    lp = lprobs.view(-1)[(rows * vocab).unsqueeze(2) + cols].masked_fill_(outside, -math.inf)
    cand = (scores.view(-1)[rows].unsqueeze(2) + lp).view(n_sent, -1)  # (Bn, c * chunk)
    index = ((row * vocab).unsqueeze(2) + cols).view(n_sent, -1)
    pick = _rank_keys(cand, index.masked_fill(outside.view(n_sent, -1), 2**32 - 1)).topk(k).indices
    return cand.gather(1, pick), index.gather(1, pick)


def bank_candidates(lprobs: Tensor, scores: Tensor, k: int, cons: ConstraintTracker,
                    eos: int) -> tuple[Tensor, Tensor, RowState]:
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
    gets EOS back (`ConstraintTracker.unblock_stuck_`): it may end, its output then says what
    it lacks.

    Returns scores (Bn, C), indices (Bn, C) (row of the sentence * V + token, as
    `top_candidates`) and the candidates' constraint states (Bn, C, M). A sentence without
    constraints has one bank: its candidates come in the order of `top_candidates`, and its
    first k are those.
    """
    n_sent, width = scores.shape
    vocab, device = lprobs.size(1), lprobs.device
    row_scores = scores.reshape(-1, 1)  # (N, 1)
    best_score, best_tok = top_candidates(lprobs, row_scores, 1)  # (N, 1): each row's best
    stuck = cons.unblock_stuck_(lprobs, best_score.view(-1), eos).unsqueeze(1)
    best_score = torch.where(stuck, row_scores + lprobs[:, eos : eos + 1], best_score)
    best_tok = best_tok.masked_fill(stuck, eos)
    top_scores, top_idx = top_candidates(lprobs, scores, k)  # (Bn, k)
    need = cons.next_tokens(lprobs, k)  # (N, M'), -1: none
    need_scores = torch.where(need >= 0, row_scores + lprobs.gather(1, need.clamp(min=0)), -math.inf)
    first = (torch.arange(width, device=device) * vocab).view(1, width, 1)  # index of each row's token 0
    cand = torch.cat([top_scores, best_score.view(n_sent, width), need_scores.view(n_sent, -1)], 1)
    index = torch.cat([top_idx, (first + best_tok.view(n_sent, width, 1)).view(n_sent, width),
                       (first + need.clamp(min=0).view(n_sent, width, -1)).view(n_sent, -1)], 1)

    # best first: score descending, then the lower index; of a repeated continuation the first counts
    by_score = _rank_keys(cand, index).argsort(dim=1, descending=True, stable=True)
    cand, index = cand.gather(1, by_score), index.gather(1, by_score)
    by_index = index.argsort(dim=1, stable=True)
    grouped = index.gather(1, by_index)
    repeat = torch.cat([torch.zeros_like(grouped[:, :1], dtype=torch.bool), grouped[:, 1:] == grouped[:, :-1]], 1)
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
    new_bank = torch.cat([torch.ones_like(bank[:, :1], dtype=torch.bool), bank[:, 1:] != bank[:, :-1]], 1)
    rank = position - torch.where(new_bank, position, 0).cummax(1).values
    top = cons.total
    key = torch.where(bank >= 0, rank * (top + 1) + top - bank, (top + 1) * bank.size(1) + position)
    taken = by_bank.gather(1, key.argsort(dim=1, stable=True))
    return cand.gather(1, taken), index.gather(1, taken), state.gather(taken)


def _block_(scores: Tensor, step: int, history: Tensor, at_max: Tensor | None,
            cfg: DecodeConfig, pad: int, unk: int, bos: int, eos: int) -> None:
    """Set to -inf, in place, the scores of the next tokens the search may not produce.

    scores (N, V) of the next token of N hypotheses of `step` tokens each, history (N, step)
    their tokens, at_max (N,) bool: rows at their maximum length (None: no row), where
    only EOS is allowed, with its model score, whatever min_len says.
    """
    model_eos = scores[:, eos].clone()  # (N,)
    scores[:, pad] = -math.inf
    scores[:, bos] = -math.inf
    if not cfg.allow_unk:
        scores[:, unk] = -math.inf
    if step < cfg.min_len:
        scores[:, eos] = -math.inf
    n = cfg.no_repeat_ngram_size
    if n and step >= n:
        grams = history.unfold(1, n, 1)  # (N, step - n + 1, n)
        prefix = history[:, step - n + 1:].unsqueeze(1)  # (N, 1, n - 1): the n-gram to come
        seen = (grams[:, :, :-1] == prefix).all(2)  # (N, step - n + 1)
        vocab = scores.size(1)
        banned = torch.where(seen, grams[:, :, -1], vocab)  # index V: a spare column
        mask = scores.new_zeros(scores.size(0), vocab + 1, dtype=torch.bool)
        scores.masked_fill_(mask.scatter_(1, banned, True)[:, :vocab], -math.inf)
    if at_max is not None:
        scores.masked_fill_(at_max.unsqueeze(1), -math.inf)
        scores[:, eos] = torch.where(at_max, model_eos, scores[:, eos])


Pick = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""(scores (N, V) of the live rows' next token, sentence of each row (N,) CPU) -> the chosen
tokens' log-probs (N,) and the tokens (N,): a sample, or (the tests' greedy search) the first maximum."""


def token_search(model: SearchModel, src: Tensor, cfg: DecodeConfig, pick: Pick, *, pad: int,
                 unk: int, bos: int, eos: int, max_len: int | None = None,
                 source_pad: int | None = None) -> list[Hypothesis]:
    """src (B, S) -> one hypothesis per sentence, one token per step chosen by `pick` (sampling:
    `nmt.decoding.sampling.sampler`; the tests' greedy search: the first maximum) among the
    tokens the rules allow.

    Same length limits and token rules as `beam_search`. Scores are those of the model's
    log-probs (normalised by the length penalty of `cfg`, as beam search ranks them).
    """
    bsz, device = src.size(0), src.device
    max_out = max_output_lengths(src, cfg, pad if source_pad is None else source_pad, max_len)  # (N,) CPU
    out: list[Hypothesis] = [Hypothesis([], 0.0, 0.0, []) for _ in range(bsz)]
    sent_ids = torch.arange(bsz)  # (N,) CPU: sentence of each live row
    tokens = torch.empty(bsz, 0, dtype=torch.long, device=device)  # (N, step)
    pos_scores = torch.empty(bsz, 0, device=device)  # (N, step)
    last = torch.full((bsz,), bos, dtype=torch.long, device=device)
    if not bsz:
        return out
    state = model.encode(src)
    for step in itertools.count():
        lprobs, state = model.decode_step(last, state)
        scores = lprobs.float().contiguous()  # (N, V), ours (see above): masked in place below
        ending = max_out <= step
        at_max = ending.to(device) if ending.any() else None
        _block_(scores, step, tokens, at_max, cfg, pad, unk, bos, eos)
        best_score, best = pick(scores, sent_ids)  # (N,)
        # a row ends with EOS, or when every token is blocked (no finite continuation)
        done = ((best == eos) | best_score.isneginf()).cpu() | ending
        if done.any():
            ended = done.to(device)
            finals = torch.cat([pos_scores[ended], best_score[ended].unsqueeze(1)], 1).tolist()
            for i, toks, pos in zip(sent_ids[done].tolist(), tokens[ended].tolist(), finals, strict=True):
                logprob = sum(pos)
                out[i] = Hypothesis(toks, logprob / length_penalty(len(pos), cfg.lenpen, cfg.lenpen_style),
                                    logprob, pos)
            keep = (~done).nonzero().view(-1)
            if not keep.numel():
                break
            sent_ids, max_out = sent_ids[keep], max_out[keep]
            keep = keep.to(device)
            tokens, pos_scores, best, best_score = tokens[keep], pos_scores[keep], best[keep], best_score[keep]
            state = model.reorder(state, keep)
        tokens = torch.cat([tokens, best.unsqueeze(1)], 1)
        pos_scores = torch.cat([pos_scores, best_score.unsqueeze(1)], 1)
        last = best
    return out


def _finish(ends: Tensor, top_rows: Tensor, top_scores: Tensor, top_lp: Tensor, tokens: Tensor,
            pos_scores: Tensor, sent_ids: Tensor, penalty: float, beam: int,
            finished: list[list[Hypothesis]], worst: Tensor, unmet: Tensor | None = None) -> None:
    """Move the candidates `ends` (Bn, beam; a CPU bool tensor) marks (EOS among a sentence's
    top `beam`) to the sentences' finished lists, keep each list's best `beam`, and update
    `worst` (Bn,), the beam-th finished score of each live sentence. The hypotheses come to
    the host in one copy (tokens, token log-probs and score side by side in float64, exact
    for token ids below 2^53).

    With constraints, `unmet` (Bn, C) the positive phrases each candidate lacks: a list ranks
    the hypotheses that lack fewer first, and `worst` counts only hypotheses that lack none."""
    b, c = ends.nonzero(as_tuple=True)
    device = top_rows.device
    bd, cd = b.to(device), c.to(device)
    rows = top_rows[bd, cd]
    step = tokens.size(1)
    columns = [tokens[rows].double(), pos_scores[rows].double(), top_lp[bd, cd].double().unsqueeze(1),
               top_scores[bd, cd].double().unsqueeze(1)]
    if unmet is not None:
        columns.append(unmet[bd, cd].double().unsqueeze(1))
    packed = torch.cat(columns, 1).tolist()  # (k, 2 * step + 2 or 3)
    ids = sent_ids.tolist()
    for i, row in zip(b.tolist(), packed, strict=True):
        toks, pos, logprob = [int(x) for x in row[:step]], row[step : 2 * step + 1], row[2 * step + 1]
        lacks = int(row[-1]) if unmet is not None else 0
        finished[ids[i]].append(Hypothesis(toks, logprob / penalty, logprob, pos, lacks))
    for i in set(b.tolist()):
        hyps = finished[ids[i]]
        hyps.sort(key=lambda h: h.score, reverse=True)  # stable: ties keep the earlier
        if unmet is not None:
            hyps.sort(key=lambda h: h.unmet)
        del hyps[beam:]
        if len(hyps) == beam and not hyps[-1].unmet:
            worst[i] = hyps[-1].score


# Long (~100 lines, a fifth of them the docstring) because one step of the search should read
# top to bottom: candidates, finished hypotheses, the live beam, the stopping rule, pruning.
def beam_search(model: SearchModel, src: Tensor, cfg: DecodeConfig, *, nbest: int = 1,
                pad: int, unk: int, bos: int, eos: int,
                max_len: int | None = None, source_pad: int | None = None,
                constraints: Sequence[Constraints | None] | None = None) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its `nbest` best hypotheses, best first, distinct.
    pad, unk, bos, eos: the special ids of the model's vocabulary (`nmt.tokenizer.SpecialIds`),
    as the model's outputs number them: over a shortlist, their columns; `source_pad` is then
    the padding id of `src` (by default `pad`).

    An output has at most int(max_len_a * src_len + max_len_b) tokens before its EOS (EOS
    is forced there), at most `max_len` - 1 when the model has `max_len` positions, and at
    least `cfg.min_len`. Fewer than `nbest` come back only when the token rules leave no
    finite-probability continuation.

    Stopping rule for a sentence: it is done at its maximum length, or once it has `beam`
    finished hypotheses and
    - style "none" or alpha <= 0 (exact): no live hypothesis can beat the beam-th best
      finished score. Here the normalised score of a hypothesis can only fall as it grows,
      so the bound is the best live log-prob divided by the penalty of one more token;
    - alpha > 0 with "gnmt" or "length" (as fairseq): at once. A live hypothesis might still
      overtake after normalisation, but its only bound (its log-prob over the penalty at
      maximum length) is so loose that the exact rule would decode every sentence to its
      maximum length.

    `constraints`: one `Constraints` (or None) per sentence of `src`, as token ids of the
    model's outputs (over a shortlist, columns). Phrases to include, in any or the given order,
    phrases to avoid, a forced prefix: see `nmt.decoding.constraints`. The beam is then shared
    among hypotheses by the number of constraint tokens they have met (`bank_candidates`); a
    hypothesis may end only once it has every phrase to include, or at the maximum length,
    where `Hypothesis.unmet` counts the phrases it lacks (a list ranks those that lack fewer
    first; the stopping rule counts only finished hypotheses that lack none). Without any
    constraint (None, or every one empty) the search is exactly the plain one.
    """
    beam = cfg.beam
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam size ({beam})")
    bsz, device = src.size(0), src.device
    if not bsz:
        return []
    exact = cfg.lenpen_style == "none" or cfg.lenpen <= 0

    def lenpen(length: int) -> float:
        return length_penalty(length, cfg.lenpen, cfg.lenpen_style)

    max_out = max_output_lengths(src, cfg, pad if source_pad is None else source_pad, max_len)  # (Bn,) CPU
    sent_ids = torch.arange(bsz)  # (Bn,) CPU: original index of each live sentence
    worst = torch.full((bsz,), -math.inf, dtype=torch.float64)  # (Bn,) beam-th finished score
    finished: list[list[Hypothesis]] = [[] for _ in range(bsz)]
    cons = ConstraintTracker.build(constraints, bsz, eos, device)  # None: no constraints

    # Step 0 runs on one row per sentence (every hypothesis starts as BOS); the first
    # reorder expands each sentence to `beam` rows. `width` = rows per sentence.
    state = model.encode(src)
    width = 1
    scores = torch.zeros(bsz, 1, device=device)  # (Bn, width) log-probs of the live rows
    tokens = torch.empty(bsz, 0, dtype=torch.long, device=device)  # (Bn*width, step)
    pos_scores = torch.empty(bsz, 0, device=device)  # (Bn*width, step)
    last = torch.full((bsz,), bos, dtype=torch.long, device=device)
    ncand = 2 * beam
    for step in itertools.count():
        n_sent = sent_ids.numel()
        lprobs, state = model.decode_step(last, state)
        lprobs = lprobs.float().contiguous()  # (Bn*width, V), masked in place below
        vocab = lprobs.size(1)
        if vocab <= beam:  # step 0 takes the beam from one row's candidates
            raise ValueError(f"the beam ({beam}) must be smaller than the vocabulary ({vocab})")
        if step == 0 and cons is not None and cons.max_token >= vocab:
            raise ValueError(f"constraint token {cons.max_token} is outside the vocabulary ({vocab})")
        ending = max_out <= step
        at_max = ending.repeat_interleave(width).to(device) if ending.any() else None
        forced = cons.prefix_logprobs(lprobs, step) if cons is not None else None
        _block_(lprobs, step, tokens, at_max, cfg, pad, unk, bos, eos)
        if cons is not None:  # avoided phrases, EOS before the phrases to include, the prefix
            cons.block_(lprobs, at_max, eos, forced)

        # the log-prob of each continuation, scores[row] + lprobs[row, token], best 2*beam
        # (with constraints, more candidates, in the order of the banks)
        k = min(ncand, width * vocab)
        if cons is None:
            top_scores, top_idx = top_candidates(lprobs, scores, k)
        else:
            top_scores, top_idx, cand_state = bank_candidates(lprobs, scores, k, cons, eos)
        top_rows = top_idx // vocab + torch.arange(n_sent, device=device).unsqueeze(1) * width
        top_tok = top_idx % vocab  # (Bn, 2*beam), and top_rows: the row each extends
        top_lp = lprobs.view(-1)[top_rows * vocab + top_tok]  # the new token's log-prob
        is_eos = top_tok == eos

        # EOS among the top `beam` candidates finishes a hypothesis (fairseq)
        ends = is_eos[:, :beam] & top_scores[:, :beam].isfinite()

        # the live beam: the best `beam` candidates that do not end in EOS, in score order (or
        # the banks'; at most `beam` of the 2*beam end in EOS, one per row; a repeat is -inf)
        order = (is_eos.long() * is_eos.size(1) + torch.arange(is_eos.size(1), device=device))
        order = order.topk(beam, largest=False).indices  # (Bn, beam)
        rows = top_rows.gather(1, order)
        scores, new_tok, new_lp = (t.gather(1, order) for t in (top_scores, top_tok, top_lp))
        if cons is not None:
            cons.choose(cand_state.gather(order), rows, new_tok)

        # the step's one copy to the host: which candidates end, each sentence's best live log-prob
        host = torch.cat([ends.view(-1).float(), scores.max(1).values.float()]).cpu()
        ends_host, bound = host[: ends.numel()].view_as(ends).bool(), host[ends.numel() :].double()
        if ends_host.any():
            _finish(ends_host, top_rows, top_scores, top_lp, tokens, pos_scores, sent_ids, lenpen(step + 1),
                    beam, finished, worst, cons.unmet(cand_state) if cons is not None else None)
        if exact:
            bound = bound / lenpen(step + 2)
        done = ending | (bound <= worst)  # (bound is -inf when no live row is finite)
        if not exact:
            done |= worst > -math.inf
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().view(-1)
            sent_ids, max_out, worst = sent_ids[keep], max_out[keep], worst[keep]
            keep = keep.to(device)
            rows, scores, new_tok, new_lp = (t[keep] for t in (rows, scores, new_tok, new_lp))
            if cons is not None:
                cons.keep(keep)
        rows = rows.view(-1)  # (Bn'*beam,) rows of the old beam, sentence-major
        tokens = torch.cat([tokens[rows], new_tok.view(-1, 1)], 1)
        pos_scores = torch.cat([pos_scores[rows], new_lp.view(-1, 1)], 1)
        state = model.reorder(state, rows)
        last = new_tok.view(-1)
        width = beam
    return [hyps[:nbest] for hyps in finished]
