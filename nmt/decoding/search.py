"""Beam search (beam 1 is greedy) and token-by-token search (sampling) over the model protocol
of docs/architecture.md.

The search knows the model only through `encode(src) -> state`,
`decode_step(tokens (N,), state) -> (log_probs (N, V), state)` and `reorder(state, index)`.
Rows are sentence-major: row `b * beam + k` is hypothesis k of sentence b. The log-probs
`decode_step` returns belong to the search, which masks them in place.

Beam search follows fairseq: each step takes the top 2*beam candidates of each sentence
(`nmt.decoding.candidates.top_candidates`) so that candidates ending in EOS (moved to the
finished list) never shrink the live beam; candidates are ranked by their raw log-probability,
finished hypotheses by the normalised score; sentences that are done leave the batch
(`model.reorder`), so a step costs less as sentences finish. Scores are accumulated in fp32
whatever the model computed in.

With lexical constraints (`nmt.decoding.constraints`: phrases to include or avoid, a forced
prefix) the candidates are more and taken in another order (`bank_candidates`, dynamic beam
allocation), and a hypothesis may end only once it has every phrase to include, or at the
maximum length, where `Hypothesis.unmet` counts the phrases it lacks. The search makes its
constraint moves through one object chosen per batch: the batch's `ConstraintTracker`, or
`_Unconstrained`, whose moves do nothing, so that a batch without constraints runs exactly the
plain search.

`BeamSearch` is the search step by step, which sentences can join between steps (continuous
batching, `nmt serve`): each sentence keeps its own step, and the model merges the states
(`merge`, docs/architecture.md). `beam_search` runs one batch through it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.decoding.candidates import top_candidates
from nmt.decoding.constraints import Constraints, ConstraintTracker

if TYPE_CHECKING:
    from nmt.config import DecodeConfig

# what a search raises (as a FloatingPointError) where the model computes NaN: weights that
# overflow the precision decoded in; a hypothesis would otherwise never end, and vanish
NAN_LOGPROBS = "the model computes NaN log-probabilities"


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
    """The divisor of a hypothesis' log-prob, log P(Y|X) / lp(|Y|) being what hypotheses are
    ranked by.

    `length` counts the output tokens including the final EOS (as fairseq), so it is at
    least 1. "gnmt": ((5 + length) / 6)^alpha (Wu et al. 2016; the Transformer paper uses
    alpha = 0.6); "length": length^alpha (fairseq / Marian normalisation; alpha = 1 ranks by
    the mean token log-prob); "none": 1 (the raw log-prob, which favours short outputs). A
    larger alpha favours longer outputs.
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


def max_output_lengths(src_len: Tensor, cfg: DecodeConfig, max_len: int | None) -> Tensor:
    """src_len (B,), the length of each source (its EOS included) -> (B,) CPU: the most tokens
    each output may have before its EOS.

    int(max_len_a * src_len + max_len_b), capped at max_len - 1 so that BOS + output fit in
    `max_len` positions.
    """
    src_len = src_len.cpu().double()
    # in doubles, capped below int64's limit: --max-len-b 1e30 or --max-len-a 1e308 mean "no limit",
    # and so does a max_len_b of 400 digits, too large for a double (it was an OverflowError)
    # .long() truncates as int() does
    out = (cfg.max_len_a * src_len + float(min(cfg.max_len_b, 2**62))).clamp(max=2.0**62).long()
    if max_len is not None:
        out = out.clamp(max=max_len - 1)
    return out.clamp(min=0)


def _block_(
    scores: Tensor,
    steps: Tensor,
    history: Tensor,
    at_max: Tensor | None,
    cfg: DecodeConfig,
    pad: int,
    unk: int,
    bos: int,
    eos: int,
) -> None:
    """Set to -inf, in place, the scores of the next tokens the search may not produce.

    scores (N, V) of the next token of N hypotheses, steps (N,) (or () for all) the tokens each
    has, history (N, T) their tokens, the last `steps` of each row (those before: `pad`),
    at_max (N,) bool: rows at their maximum length (None: no row), where only EOS is allowed,
    with its model score, whatever min_len says.
    """
    model_eos = scores[:, eos].clone()  # (N,)
    scores[:, [pad, bos]] = -math.inf
    if not cfg.allow_unk:
        scores[:, unk] = -math.inf
    # --min-len 1e30 is more than int64 holds, and than any output's length
    scores[:, eos].masked_fill_(steps < min(cfg.min_len, 2**62), -math.inf)
    n = cfg.no_repeat_ngram_size
    history_len = history.size(1)
    # an n-gram through the pad before a row's tokens matches none of its own
    if n and history_len >= n:
        grams = history.unfold(1, n, 1)  # (N, T - n + 1, n)
        # (N, 1, n - 1): the n-gram to come
        prefix = history[:, history_len - n + 1 :].unsqueeze(1)
        seen = (grams[:, :, :-1] == prefix).all(2)  # (N, T - n + 1)
        vocab = scores.size(1)
        banned = torch.where(seen, grams[:, :, -1], vocab)  # index V: a spare column
        mask = scores.new_zeros(scores.size(0), vocab + 1, dtype=torch.bool)
        scores.masked_fill_(mask.scatter_(1, banned, True)[:, :vocab], -math.inf)
    if at_max is not None:
        scores.masked_fill_(at_max.unsqueeze(1), -math.inf)
        scores[:, eos] = torch.where(at_max, model_eos, scores[:, eos])


Pick = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""(scores (N, V) of the live rows' next token, sentence of each row (N,) CPU) -> the chosen
tokens' log-probs (N,) and the tokens (N,): a sample, or (the tests' greedy search) the first
maximum."""


def token_search(
    model: SearchModel,
    src: Tensor,
    cfg: DecodeConfig,
    pick: Pick,
    *,
    pad: int,
    unk: int,
    bos: int,
    eos: int,
    max_len: int | None = None,
    source_pad: int | None = None,
    gone: Callable[[int], bool] | None = None,
) -> list[Hypothesis]:
    """src (B, S) -> one hypothesis per sentence, one token per step chosen by `pick` (sampling:
    `nmt.decoding.sampling.sampler`; the tests' greedy search: the first maximum) among the
    tokens the rules allow.

    Same length limits and token rules as `beam_search`, `gone` too. Scores are those of the model's
    log-probs (normalised by the length penalty of `cfg`, as beam search ranks them).
    """
    bsz = src.size(0)
    device = src.device
    # (N,) CPU, the most tokens of each output
    src_pad = pad if source_pad is None else source_pad
    max_out = max_output_lengths((src != src_pad).sum(1), cfg, max_len)
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
        nan = scores.isnan().any().view(1)  # read with the step's one copy to the host
        if gone is not None:  # as at their length limit (beam_search)
            left = torch.tensor([gone(i) for i in sent_ids.tolist()], dtype=torch.bool)  # (N,)
            max_out = max_out.masked_fill(left, step)
        ending = max_out <= step
        at_max = ending.to(device) if ending.any() else None
        _block_(scores, torch.tensor(step, device=device), tokens, at_max, cfg, pad, unk, bos, eos)
        best_score, best = pick(scores, sent_ids)  # (N,)
        # a row ends with EOS, or when every token is blocked (no finite continuation)
        flags = torch.cat([(best == eos) | best_score.isneginf(), nan]).cpu()  # one copy
        if flags[-1]:
            raise FloatingPointError(NAN_LOGPROBS)
        tokens = torch.cat([tokens, best.unsqueeze(1)], 1)
        pos_scores = torch.cat([pos_scores, best_score.unsqueeze(1)], 1)
        done = flags[:-1] | ending
        # an ended row's last pick (EOS, or -inf where all was blocked) counts in its scores only
        if done.any():
            ended = done.to(device)
            for i, toks, pos in zip(
                sent_ids[done].tolist(),
                tokens[ended, :-1].tolist(),
                pos_scores[ended].tolist(),
                strict=True,
            ):
                logprob = sum(pos)
                out[i] = Hypothesis(
                    toks,
                    logprob / length_penalty(len(pos), cfg.lenpen, cfg.lenpen_style),
                    logprob,
                    pos,
                )
            keep = (~done).nonzero().view(-1)
            if not keep.numel():
                break
            sent_ids = sent_ids[keep]
            max_out = max_out[keep]
            keep = keep.to(device)
            tokens = tokens[keep]
            pos_scores = pos_scores[keep]
            state = model.reorder(state, keep)
        last = tokens[:, -1]
    return out


class _Unconstrained:
    """The constraint moves of a batch without constraints (`ConstraintTracker` makes them for
    one with): the plain candidates; every other move does nothing (and returns None)."""

    max_token = -1  # the highest token id a constraint names

    def candidates(
        self, lprobs: Tensor, scores: Tensor, k: int, blocked: Any
    ) -> tuple[Tensor, Tensor, Any]:
        return (*top_candidates(lprobs, scores, k), None)

    def _nothing(self, *args: Any) -> Any:
        return None

    prefix_logprobs = block_ = choose = unmet = keep = _nothing


class _Candidates:
    """A step's candidates (Bn, C) of the live sentences, in the order the search takes them,
    from their `scores` and `index` (row of the sentence * V + token) as `top_candidates` gives
    them: `rows`, the live row each extends (a row of the step's `lprobs`), `tokens`, the token
    it adds, `lp`, that token's log-prob. `ends` (Bn, beam) bool: those of the top `beam` that
    end in EOS with a finite score, which finish a hypothesis (fairseq); `order` (Bn, beam):
    the new live beam, the best `beam` that do not end in EOS, in their order (by score, or the
    banks'; at most `beam` of the 2*beam end in EOS, one per row; a repeat is -inf)."""

    def __init__(
        self,
        scores: Tensor,
        index: Tensor,
        lprobs: Tensor,
        rows_per_sentence: int,
        beam: int,
        eos: int,
    ) -> None:
        vocab = lprobs.size(1)
        self.scores = scores
        self.tokens = index % vocab
        first_rows = torch.arange(scores.size(0), device=scores.device) * rows_per_sentence
        self.rows = index // vocab + first_rows.unsqueeze(1)
        self.lp = lprobs[self.rows, self.tokens]
        is_eos = self.tokens == eos
        self.ends = is_eos[:, :beam] & scores[:, :beam].isfinite()
        self.order = is_eos.long().argsort(dim=1, stable=True)[:, :beam]  # the first not EOS


class _Sentences:
    """The beam search's books: each sentence's finished hypotheses (`lists`, by sentence tag, best
    first, at most `beam`) and, for each live sentence (Bn,), on the CPU: `tags`, `steps` the
    tokens its hypotheses have, `max_out` the most tokens its outputs may have, `worst` (float64)
    its beam-th finished score (-inf until there are `beam`)."""

    def __init__(self, cfg: DecodeConfig) -> None:
        self.cfg = cfg
        self.max_out = torch.empty(0, dtype=torch.long)
        self.steps = torch.empty(0, dtype=torch.long)
        self.worst = torch.empty(0, dtype=torch.float64)
        self.tags: list[Hashable] = []
        self.lists: dict[Hashable, list[Hypothesis]] = {}

    def join(self, max_out: Tensor, tags: Sequence[Hashable]) -> None:
        """New sentences, of no tokens yet, each its tag and `max_out`."""
        self.tags += tags
        self.lists.update((tag, []) for tag in tags)
        self.max_out = torch.cat([self.max_out, max_out])
        self.steps = torch.cat([self.steps, torch.zeros_like(max_out)])
        self.worst = torch.cat(
            [self.worst, torch.full((len(tags),), -math.inf, dtype=torch.float64)]
        )

    def lenpen(self, length: int) -> float:
        return length_penalty(length, self.cfg.lenpen, self.cfg.lenpen_style)

    def add(
        self,
        ends: Tensor,
        cand: _Candidates,
        unmet: Tensor | None,
        tokens: Tensor,
        pos_scores: Tensor,
    ) -> None:
        """Move the candidates `ends` (Bn, beam; a CPU bool tensor) marks (EOS among a sentence's
        top `beam`) of the rows `tokens` / `pos_scores` (N, T; a row's last `steps` are its own)
        to their sentences' lists, keep each list's best `beam`, and update `worst`. The
        hypotheses come to the host in one copy (tokens, token log-probs and score side by side
        in float64, exact for token ids below 2^53).

        With constraints, `unmet` (Bn, C) the positive phrases each candidate lacks: a list ranks
        the hypotheses that lack fewer first, and `worst` counts only hypotheses that lack none."""
        b, c = ends.nonzero(as_tuple=True)
        bd = b.to(cand.rows.device)
        cd = c.to(cand.rows.device)
        rows = cand.rows[bd, cd]
        history_len = tokens.size(1)
        beam = self.cfg.beam
        lacks = cand.lp.new_zeros(len(b)) if unmet is None else unmet[bd, cd]
        packed = torch.cat(
            [
                tokens[rows].double(),
                pos_scores[rows].double(),
                *(t.double().unsqueeze(1) for t in (cand.lp[bd, cd], cand.scores[bd, cd], lacks)),
            ],
            1,
        ).tolist()  # (k, 2 * T + 3)
        steps = self.steps.tolist()
        for i, row in zip(b.tolist(), packed, strict=True):
            n = steps[i]
            toks = [int(x) for x in row[history_len - n : history_len]]
            pos = row[2 * history_len - n : 2 * history_len + 1]
            logprob = row[-2]
            self.lists[self.tags[i]].append(
                Hypothesis(toks, logprob / self.lenpen(n + 1), logprob, pos, int(row[-1]))
            )
        for i in set(b.tolist()):
            hyps = self.lists[self.tags[i]]
            # those that lack fewer constraints first, then by score (stable: ties keep the earlier)
            hyps.sort(key=lambda h: (h.unmet, -h.score))
            del hyps[beam:]
            if len(hyps) == beam and not hyps[-1].unmet:
                self.worst[i] = hyps[-1].score

    def done(self, best_live: Tensor) -> Tensor:
        """(Bn,) bool, the sentences done after this step, best_live (Bn,) float64 the best log-prob
        of each one's live rows (-inf when none is finite): those at their maximum length, and
        those with `beam` finished hypotheses (lacking no constraint) where
        - style "none" or alpha <= 0 (exact): no live hypothesis can beat the beam-th best
          finished score. Here the normalised score of a hypothesis can only fall as it grows,
          so the bound is the best live log-prob divided by the penalty of one more token;
        - alpha > 0 with "gnmt" or "length" (as fairseq): at once. A live hypothesis might still
          overtake after normalisation, but its only bound (its log-prob over the penalty at
          maximum length) is so loose that the exact rule would decode every sentence to its
          maximum length."""
        ending = self.max_out <= self.steps
        if self.cfg.lenpen_style == "none" or self.cfg.lenpen <= 0:
            bound = torch.tensor(
                [self.lenpen(n + 2) for n in self.steps.tolist()], dtype=torch.float64
            )
            return ending | (best_live / bound <= self.worst)
        return ending | (best_live <= self.worst) | (self.worst > -math.inf)

    def keep(self, done: Tensor, nbest: int) -> list[tuple[Hashable, list[Hypothesis]]]:
        """The sentences `done` (Bn,) leave: their tags and `nbest` best hypotheses."""
        out = [(tag, self.lists.pop(tag)[:nbest]) for tag, d in zip(self.tags, done.tolist()) if d]
        keep = (~done).nonzero().view(-1)
        self.tags = [self.tags[i] for i in keep.tolist()]
        self.max_out = self.max_out[keep]
        self.worst = self.worst[keep]
        self.steps = self.steps[keep]
        return out


class BeamSearch:
    """A beam search that sentences can join between its steps (continuous batching: nmt serve);
    `beam_search` runs one batch through it.

    `add(src, tags)` encodes sentences: the first ones start the search, one row each until
    its first step; later ones join it through the model's `merge(state, state)`, with `beam`
    rows of which all but the first start at -inf (what the one row gives), each at its own
    step. `step()` decodes one token of every live sentence and returns the sentences that
    ended, each as (tag, its `nbest` best hypotheses). Sentences with constraints cannot join
    a running search. Arguments as `beam_search`'s.
    """

    def __init__(
        self,
        model: SearchModel,
        cfg: DecodeConfig,
        *,
        nbest: int = 1,
        pad: int,
        unk: int,
        bos: int,
        eos: int,
        max_len: int | None = None,
        source_pad: int | None = None,
    ) -> None:
        if not 1 <= nbest <= cfg.beam:
            raise ValueError(f"nbest ({nbest}) must be between 1 and the beam size ({cfg.beam})")
        self.model = model
        self.cfg = cfg
        self.nbest = nbest
        self.max_len = max_len
        self.pad = pad
        self.unk = unk
        self.bos = bos
        self.eos = eos
        self.source_pad = pad if source_pad is None else source_pad
        self.books = _Sentences(cfg)
        self.state = None
        self.cons: _Unconstrained | ConstraintTracker = _Unconstrained()

    def __len__(self) -> int:
        """The live sentences."""
        return len(self.books.tags)

    def add(
        self,
        src: Tensor,
        tags: Sequence[Hashable],
        constraints: Sequence[Constraints | None] | None = None,
    ) -> None:
        """Sentences src (B, S) join the search, tagged `tags`, with their `constraints` (only into
        an empty search)."""
        bsz = src.size(0)
        device = src.device
        if not bsz:
            return
        max_out = max_output_lengths((src != self.source_pad).sum(1), self.cfg, self.max_len)
        cons = ConstraintTracker.build(constraints, bsz, self.eos, device)
        state = self.model.encode(src)
        scores = torch.zeros(bsz, 1, device=device)
        # Step 0 runs on one row per sentence; the first reorder expands it to `beam`
        if self.state is None:
            self.state = state
            self.cons = cons or _Unconstrained()
            self.rows_per_sentence = 1
            # (Bn, rows_per_sentence) log-probs of the live rows
            self.scores = scores
            # (Bn*rows_per_sentence, T): each row's history, T columns
            self.tokens = torch.empty(bsz, 0, dtype=torch.long, device=device)
            self.pos_scores = torch.empty(bsz, 0, device=device)
            self.last = torch.full((bsz,), self.bos, dtype=torch.long, device=device)
        else:
            if cons is not None or not isinstance(self.cons, _Unconstrained):
                raise ValueError("sentences with lexical constraints cannot join a running search")
            rows = bsz * self.rows_per_sentence
            history_len = self.tokens.size(1)
            if self.rows_per_sentence > 1:
                state = self.model.reorder(
                    state,
                    torch.arange(bsz, device=device).repeat_interleave(self.rows_per_sentence),
                )
            self.state = self.model.merge(self.state, state)  # type: ignore[attr-defined]
            self.scores = torch.cat(
                [self.scores, F.pad(scores, (0, self.rows_per_sentence - 1), value=-math.inf)]
            )
            self.tokens = torch.cat(
                [self.tokens, self.tokens.new_full((rows, history_len), self.pad)]
            )
            self.pos_scores = torch.cat(
                [self.pos_scores, self.pos_scores.new_zeros(rows, history_len)]
            )
            self.last = torch.cat([self.last, self.last.new_full((rows,), self.bos)])
        self.books.join(max_out, tags)

    def expire(self, tags: Sequence[Hashable]) -> None:
        """End the sentences `tags` at the next step, as at their length limit (nobody waits for
        them)."""
        gone = torch.tensor([tag in tags for tag in self.books.tags], dtype=torch.bool)
        self.books.max_out[gone] = self.books.steps[gone]

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Decode one token of every live sentence; the sentences that ended, with their
        hypotheses."""
        books = self.books
        cons = self.cons
        beam = self.cfg.beam
        rows_per_sentence = self.rows_per_sentence
        lprobs, state = self.model.decode_step(self.last, self.state)
        lprobs = lprobs.float().contiguous()  # (Bn*rows_per_sentence, V), masked in place below
        nan = lprobs.isnan().any().view(1)  # read with the step's one copy to the host
        device = lprobs.device
        vocab = lprobs.size(1)
        if vocab <= beam:  # step 0 takes the beam from one row's candidates
            raise ValueError(f"the beam ({beam}) must be smaller than the vocabulary ({vocab})")
        if cons.max_token >= vocab:
            raise ValueError(
                f"constraint token {cons.max_token} is outside the vocabulary ({vocab})"
            )
        ending = books.max_out <= books.steps
        at_max = ending.repeat_interleave(rows_per_sentence).to(device) if ending.any() else None
        # read before the token rules mask them
        forced = cons.prefix_logprobs(lprobs, int(books.steps[0]))
        _block_(
            lprobs,
            books.steps.repeat_interleave(rows_per_sentence).to(device),
            self.tokens,
            at_max,
            self.cfg,
            self.pad,
            self.unk,
            self.bos,
            self.eos,
        )
        # avoided phrases, EOS before the phrases to include
        blocked = cons.block_(lprobs, at_max, forced)

        # continuations scores[row] + lprobs[row, token], best 2*beam (constraints: more, by bank)
        top_scores, top_idx, picked = cons.candidates(
            lprobs, self.scores, min(2 * beam, rows_per_sentence * vocab), blocked
        )
        cand = _Candidates(top_scores, top_idx, lprobs, rows_per_sentence, beam, self.eos)
        ends = cand.ends  # those that finish a hypothesis, and the new live beam
        order = cand.order
        rows, scores, new_tok, new_lp = (
            t.gather(1, order) for t in (cand.rows, cand.scores, cand.tokens, cand.lp)
        )
        cons.choose(picked, order, rows, new_tok)

        # the step's one copy to the host: which candidates end, each sentence's best live log-prob
        host = torch.cat([ends.view(-1).float(), scores.max(1).values.float(), nan.float()]).cpu()
        if host[-1]:  # NaN ranks below -inf (`_rank_keys`): the candidates alone need not show it
            raise FloatingPointError(NAN_LOGPROBS)
        ends_host = host[: ends.numel()].view_as(ends).bool()
        best_live = host[ends.numel() : -1].double()
        if ends_host.any():
            books.add(ends_host, cand, cons.unmet(picked), self.tokens, self.pos_scores)
        done = books.done(best_live)
        finished = books.keep(done, self.nbest) if done.any() else []
        if done.all():
            self.state = None
            return finished
        if done.any():
            keep = (~done).nonzero().view(-1).to(device)
            rows, scores, new_tok, new_lp = (t[keep] for t in (rows, scores, new_tok, new_lp))
            cons.keep(keep)
        books.steps += 1  # the live sentences' hypotheses are one token longer
        rows = rows.view(-1)  # (Bn'*beam,) rows of the old beam, sentence-major
        history_len = int(books.steps.max())  # the history columns still needed
        self.tokens = torch.cat([self.tokens[rows], new_tok.view(-1, 1)], 1)[:, -history_len:]
        self.pos_scores = torch.cat([self.pos_scores[rows], new_lp.view(-1, 1)], 1)[
            :, -history_len:
        ]
        self.state = self.model.reorder(state, rows)
        self.scores = scores
        self.last = new_tok.view(-1)
        self.rows_per_sentence = beam
        return finished


def beam_search(
    model: SearchModel,
    src: Tensor,
    cfg: DecodeConfig,
    *,
    nbest: int = 1,
    pad: int,
    unk: int,
    bos: int,
    eos: int,
    max_len: int | None = None,
    source_pad: int | None = None,
    constraints: Sequence[Constraints | None] | None = None,
    gone: Callable[[int], bool] | None = None,
) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its `nbest` best hypotheses, best first, distinct.
    pad, unk, bos, eos: the special ids of the model's vocabulary (`nmt.tokenizer.SpecialIds`),
    as the model's outputs number them: over a shortlist, their columns; `source_pad` is then
    the padding id of `src` (by default `pad`).

    An output has at most int(max_len_a * src_len + max_len_b) tokens before its EOS (EOS
    is forced there), at most `max_len` - 1 when the model has `max_len` positions, and at
    least `cfg.min_len`. Fewer than `nbest` come back only when the token rules leave no
    finite-probability continuation. When a sentence stops: `_Sentences.done`. A model that
    computes NaN log-probabilities raises FloatingPointError (`NAN_LOGPROBS`).

    `constraints`: one `Constraints` (or None) per sentence of `src`, as token ids of the
    model's outputs (over a shortlist, columns): see the module docstring. Without any
    constraint (None, or every one empty) the search is exactly the plain one.

    `gone(i)`: whether nobody waits for sentence i any more (nmt serve: a 504, a client gone),
    asked before each step; such a sentence ends at that step, as at its length limit.
    """
    search = BeamSearch(
        model,
        cfg,
        nbest=nbest,
        pad=pad,
        unk=unk,
        bos=bos,
        eos=eos,
        max_len=max_len,
        source_pad=source_pad,
    )
    search.add(src, range(src.size(0)), constraints)
    done: dict[Hashable, list[Hypothesis]] = {}
    while len(search):
        if gone is not None:
            search.expire([i for i in range(src.size(0)) if gone(i)])
        done.update(search.step())
    return [done[i] for i in range(src.size(0))]
