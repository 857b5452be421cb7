"""Lexical constraints for the beam search (`nmt.decoding.search.beam_search`): target phrases
the output must contain (`include`), phrases it must never contain (`avoid`) and a forced
start (`prefix`), all as target token ids, segmented by the caller exactly as the output
would be.

This module keeps the books; the search decides. `ConstraintTracker` holds the constraints
of a batch's live sentences as padded tensors and, for every live row (hypothesis), how far
it is through each positive phrase, all vectorised over sentences x rows:

- `progress` (N, M): for each positive phrase, the length of its longest prefix that ends the
  row's output (a KMP automaton per phrase, so "A A B" is found in "A A A B": when the next
  token does not continue a phrase, progress falls back to the longest prefix that is still a
  suffix instead of starting over);
- `met` (N, M): the phrases the row's output already contains. Unordered, every phrase is
  tracked at once and may overlap another ("A B" and "B C" are both met by "A B C").
  Ordered, only the first unmet phrase is tracked, from the token after the previous one's
  end: the phrases appear one after another, in the given order, without overlapping.

A row's bank (Post & Vilar 2018) is the number of constraint tokens it has produced: the
lengths of its met phrases plus its longest progress into an unmet one. Avoided phrases
need no state: a row may not produce the token that completes one after its last tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Phrases = tuple[tuple[int, ...], ...]

_NEVER = -3  # history padding before the first output token: equals no token of a phrase
_ANY = -2  # the part of an avoided phrase's padded head that is not the phrase: matches anything


@dataclass(frozen=True)
class Constraints:
    """The lexical constraints of one sentence, as target token ids (in the numbering of the
    model's output: over a shortlist, its columns; see `mapped`).

    include: phrases that must appear in the output, in any order (`ordered`: one after
        another in the given order, without overlapping). The output's end (EOS) is allowed
        only once all appear; one that cannot appear before the maximum length leaves the
        hypothesis ending without it, counted in `Hypothesis.unmet`. Unordered, a phrase
        listed twice is met by one occurrence; ordered, it must occur twice.
    avoid: phrases that must never appear (also not across the prefix).
    prefix: the output's first tokens, taken whatever the model and the other rules say
        (their log-probs count in the score); they count toward `include`.
    """

    include: Phrases = ()
    ordered: bool = False
    avoid: Phrases = ()
    prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("include", "avoid"):  # lists are welcome: stored as tuples
            phrases = tuple(tuple(int(t) for t in phrase) for phrase in getattr(self, name))
            if any(not phrase for phrase in phrases):
                raise ValueError(f"an empty {name} phrase")
            object.__setattr__(self, name, phrases)
        object.__setattr__(self, "prefix", tuple(int(t) for t in self.prefix))
        if any(t < 0 for t in self.tokens()):
            raise ValueError("a negative token id in the constraints")

    def is_empty(self) -> bool:
        return not (self.include or self.avoid or self.prefix)

    def tokens(self) -> set[int]:
        """Every token id the constraints name (e.g. to keep them in a shortlist)."""
        return {t for phrase in (*self.include, *self.avoid, self.prefix) for t in phrase}

    def mapped(self, column: Callable[[int], int]) -> Constraints:
        """The same constraints with every token id replaced by `column(id)` (e.g. its column
        in a shortlisted batch's vocabulary)."""

        def phrases(ps: Phrases) -> Phrases:
            return tuple(tuple(column(t) for t in p) for p in ps)

        return Constraints(phrases(self.include), self.ordered, phrases(self.avoid),
                           tuple(column(t) for t in self.prefix))


def _borders(phrase: Sequence[int], width: int) -> list[list[bool]]:
    """(width+1, width+1), for a phrase of at most `width` tokens: [p][q] is True when the
    phrase's first q tokens end its first p (q <= p <= len): the states a KMP automaton may
    fall back to from state p. Padding is False."""
    n = len(phrase)
    return [[q <= p <= n and tuple(phrase[:q]) == tuple(phrase[p - q : p]) for q in range(width + 1)]
            for p in range(width + 1)]


def _pad(tokens: Sequence[int], width: int, fill: int, *, left: bool = False) -> list[int]:
    padding = [fill] * (width - len(tokens))
    return padding + list(tokens) if left else list(tokens) + padding


@dataclass
class RowState:
    """Constraint state of some rows or candidates (..., M): progress and met (see the module)."""

    progress: Tensor  # long
    met: Tensor  # bool

    def gather(self, index: Tensor) -> RowState:
        """(Bn, C, M) -> (Bn, K, M): the candidates `index` (Bn, K) names."""
        index = index.unsqueeze(2).expand(-1, -1, self.met.size(2))
        return RowState(self.progress.gather(1, index), self.met.gather(1, index))


class ConstraintTracker:
    """The constraints of a batch's live sentences (Bn) and the state of its live rows
    (N = Bn * width, sentence-major like the search's rows).

    Sentence tables, padded to the batch's largest: positive phrases `phrases` (Bn, M, L)
    (-1 after a phrase's end; a missing phrase has length 0 and counts as met), `lengths`
    (Bn, M), `borders` (Bn, M, L+1, L+1) (see `_borders`), `ordered` (Bn,); avoided phrases as
    `avoid_head` (Bn, P, A-1) (all but the last token, right-aligned, `_ANY` before) and
    `avoid_last` (Bn, P) (-1: no phrase); the prefixes `prefix` (Bn, F) (-1 after the end).
    """

    def __init__(self, constraints: Sequence[Constraints], device: torch.device) -> None:
        def tensor(data: list[Any], dtype: torch.dtype = torch.long) -> Tensor:
            return torch.tensor(data, dtype=dtype, device=device)

        # () pads the lists of phrases to the same number, at least one: no phrase, met from the start
        m = max(1, *(len(c.include) for c in constraints))
        include = [list(c.include) + [()] * (m - len(c.include)) for c in constraints]  # (Bn, M)
        width = max(1, *(len(q) for phrases in include for q in phrases))  # L
        self.phrases = tensor([[_pad(q, width, -1) for q in phrases] for phrases in include])
        self.lengths = tensor([[len(q) for q in phrases] for phrases in include])
        self.borders = tensor([[_borders(q, width) for q in phrases] for phrases in include], torch.bool)
        self.ordered = tensor([c.ordered for c in constraints], torch.bool)
        self.total = int(self.lengths.sum(1).max())  # the highest bank

        p = max(1, *(len(c.avoid) for c in constraints))
        avoid = [list(c.avoid) + [()] * (p - len(c.avoid)) for c in constraints]  # (Bn, P)
        before = max(0, *(len(q) - 1 for phrases in avoid for q in phrases))
        self.avoid_head = tensor([[_pad(q[:-1], before, _ANY, left=True) for q in phrases] for phrases in avoid])
        self.avoid_last = tensor([[q[-1] if q else -1 for q in phrases] for phrases in avoid])
        self.has_avoid = any(c.avoid for c in constraints)

        self.prefix_len = max(len(c.prefix) for c in constraints)
        self.prefix = tensor([_pad(c.prefix, self.prefix_len, -1) for c in constraints])  # (Bn, F)
        self.max_token = max(max(c.tokens(), default=-1) for c in constraints)

        # step 0: one row per sentence (the search's first reorder makes `beam` of it)
        self.state = RowState(torch.zeros_like(self.lengths), self.lengths == 0)
        self._eos_blocked: Tensor | None = None  # rows whose EOS `block_` took away, and its log-prob
        self._model_eos: Tensor | None = None

    @staticmethod
    def build(constraints: Sequence[Constraints | None] | None, bsz: int, eos: int,
              device: torch.device) -> ConstraintTracker | None:
        """The tracker of a batch of `bsz` sentences, or None when no sentence has a constraint
        (the search then runs exactly as without). Raises ValueError for a list of the wrong
        length or a constraint naming EOS; the search checks `max_token` against the vocabulary."""
        if constraints is None:
            return None
        if len(constraints) != bsz:
            raise ValueError(f"{len(constraints)} constraints for a batch of {bsz} sentences")
        cons = [c or Constraints() for c in constraints]
        if all(c.is_empty() for c in cons):
            return None
        if any(eos in c.tokens() for c in cons):
            raise ValueError(f"a constraint names EOS ({eos})")
        return ConstraintTracker(cons, device)

    # ---------------------------------------------------------------- shapes

    def _sentence_of(self, rows: Tensor) -> Tensor:
        """The sentence of each of `rows` (flat row indices of the live rows)."""
        return rows // (self.state.met.size(0) // self.lengths.size(0))

    def _rows(self) -> Tensor:
        return torch.arange(self.state.met.size(0), device=self.lengths.device)

    def _active(self, met: Tensor, sentence: Tensor) -> Tensor:
        """(..., M) the phrases a row is working on: unmet ones, ordered only the first."""
        first = (~met).long().cumsum(-1) == 1
        return ~met & (first | ~self.ordered[sentence].unsqueeze(-1))

    # ---------------------------------------------------------------- token rules

    def prefix_logprobs(self, lprobs: Tensor, step: int) -> tuple[Tensor, Tensor] | None:
        """Before the search's token rules: each row's prefix token at `step` (-1: none) and its
        model log-prob, for `block_` to force; None past every prefix."""
        if step >= self.prefix_len:
            return None
        token = self.prefix[self._sentence_of(self._rows()), step]  # (N,)
        return token, lprobs.gather(1, token.clamp(min=0).unsqueeze(1)).squeeze(1)

    def block_(self, lprobs: Tensor, history: Tensor, at_max: Tensor | None, eos: int,
               forced: tuple[Tensor, Tensor] | None) -> None:
        """After the search's token rules, set to -inf in place (lprobs (N, V) of the live rows,
        history (N, step) their tokens): the token that would complete an avoided phrase,
        EOS while a positive phrase is unmet (not at the maximum length, `at_max`), and at a
        prefix step every token but the prefix's (`forced`, from `prefix_logprobs`, which
        then keeps its model log-prob)."""
        n, vocab = lprobs.shape
        sentence = self._sentence_of(self._rows())
        if self.has_avoid:
            head = self.avoid_head[sentence]  # (N, P, A-1)
            before = head.size(2)
            recent = history[:, max(0, history.size(1) - before):]
            recent = torch.cat([recent.new_full((n, before - recent.size(1)), _NEVER), recent], 1)
            match = ((head == recent.unsqueeze(1)) | (head == _ANY)).all(2)  # (N, P)
            last = self.avoid_last[sentence]
            banned = torch.where(match & (last >= 0), last, vocab)  # index V: a spare column
            mask = lprobs.new_zeros(n, vocab + 1, dtype=torch.bool).scatter_(1, banned, True)
            lprobs.masked_fill_(mask[:, :vocab], -math.inf)
        blocked = (~self.state.met).any(1)
        if at_max is not None:
            blocked &= ~at_max
        self._eos_blocked, self._model_eos = blocked, lprobs[:, eos].clone()
        lprobs[:, eos] = lprobs[:, eos].masked_fill(blocked, -math.inf)
        if forced is not None:
            token, logprob = forced
            rows = token >= 0
            if at_max is not None:  # the maximum length wins: a longer prefix is cut there
                rows &= ~at_max
            column = token.clamp(min=0).unsqueeze(1)
            kept = torch.where(rows, logprob, lprobs.gather(1, column).squeeze(1))
            lprobs.masked_fill_(rows.unsqueeze(1), -math.inf).scatter_(1, column, kept.unsqueeze(1))

    def unblock_stuck_(self, lprobs: Tensor, best: Tensor, eos: int) -> Tensor:
        """Rows left with no finite continuation (`best` (N,) their best score is -inf) only
        because `block_` took EOS away may end unmet after all: their EOS log-prob comes back
        in `lprobs`. Returns those rows (N,) bool."""
        assert self._eos_blocked is not None and self._model_eos is not None
        stuck = self._eos_blocked & best.isneginf() & self._model_eos.isfinite()
        lprobs[:, eos] = torch.where(stuck, self._model_eos, lprobs[:, eos])
        return stuck

    # ---------------------------------------------------------------- positive phrases

    def next_tokens(self) -> Tensor:
        """(N, M) the token that takes each row further into each phrase it works on (starts
        it, for a phrase not yet begun); -1 for the others."""
        sentence = self._sentence_of(self._rows())
        progress, met = self.state.progress, self.state.met
        phrases = self.phrases[sentence]  # (N, M, L)
        token = phrases.gather(2, progress.clamp(max=phrases.size(2) - 1).unsqueeze(2)).squeeze(2)
        return torch.where(self._active(met, sentence), token, -1)

    def advance(self, rows: Tensor, tokens: Tensor) -> RowState:
        """The state after each row of `rows` (any shape, flat indices of the live rows) takes
        the token of `tokens` (same shape): (..., M)."""
        sentence = self._sentence_of(rows)
        progress, met = self.state.progress[rows], self.state.met[rows]  # (..., M)
        m = torch.arange(self.lengths.size(1), device=rows.device)
        fallback = self.borders[sentence.unsqueeze(-1), m, progress]  # (..., M, L+1): states to fall back to
        phrases = self.phrases[sentence]  # (..., M, L)
        # state q can take the token when phrase[q] is the token: it goes to q + 1; the longest wins
        takes = fallback[..., :-1] & (phrases == tokens.unsqueeze(-1).unsqueeze(-1))
        steps = torch.arange(1, phrases.size(-1) + 1, device=rows.device)
        new = (takes * steps).amax(-1)  # (..., M)
        active = self._active(met, sentence)
        complete = active & (new == self.lengths[sentence])
        return RowState(torch.where(active & ~complete, new, 0), met | complete)

    def bank(self, state: RowState) -> Tensor:
        """(Bn, C) for candidate states (Bn, C, M): the constraint tokens each has produced,
        the lengths of its met phrases plus its longest progress into an unmet one."""
        return (state.met.long() * self.lengths.unsqueeze(1)).sum(-1) + state.progress.amax(-1)

    def unmet(self, state: RowState) -> Tensor:
        """(...) the positive phrases not met."""
        return (~state.met).sum(-1)

    # ---------------------------------------------------------------- the search's moves

    def choose(self, state: RowState) -> None:
        """The new live rows' state (Bn, width, M), sentence-major."""
        self.state = RowState(state.progress.reshape(-1, state.progress.size(-1)),
                              state.met.reshape(-1, state.met.size(-1)))

    def keep(self, sentences: Tensor) -> None:
        """Only `sentences` (indices of the live ones) go on; call after `choose`."""
        width = self.state.met.size(0) // self.lengths.size(0)
        rows = (sentences.unsqueeze(1) * width + torch.arange(width, device=sentences.device)).view(-1)
        self.state = RowState(self.state.progress[rows], self.state.met[rows])
        for name in ("phrases", "lengths", "borders", "ordered", "avoid_head", "avoid_last", "prefix"):
            setattr(self, name, getattr(self, name)[sentences])
