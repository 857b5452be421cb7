"""Lexical constraints for the beam search (`nmt.decoding.search.beam_search`): target phrases
the output must contain (`include`), texts it must never contain (`avoid_text`, whatever
tokens spell them) and a forced start (`prefix`).

This module keeps the books; the search decides. `ConstraintTracker` holds the constraints of
a batch's live sentences and, for every live row (hypothesis), its state in each phrase,
vectorised over sentences x rows x phrases: a KMP automaton (Knuth, Morris & Pratt 1977) over
units, the length of the phrase's longest start that ends the row's output ("A A B" is found
in "A A A B": a unit that does not continue the phrase falls back to the longest start that
still ends the output, not to 0).

- To include, over tokens: `progress` (N, M) and `met` (N, M), the phrases the output holds.
  Unordered, every phrase is tracked at once and may overlap another ("A B" and "B C" are both
  met by "A B C"); ordered, only the first unmet one, from the token after the previous one's
  end: they appear one after another, in order, without overlapping. A row's bank (Post &
  Vilar 2018) is the number of constraint tokens it has produced: the lengths of its met
  phrases plus its longest progress into an unmet one.
- To avoid, over the bytes of the output's text (`avoid_text`, each token adding its surface:
  `nmt.terminology.Surfaces`): a row may not produce a token whose surface
  starts with the rest of a phrase after the row's state, or after a shorter start that also
  ends the output, or holds a whole phrase. The tokens whose surfaces start with a text are a
  range of the vocabulary sorted by surface: a row's banned tokens cost one pass over it.

Memory is linear in what is asked: a batch's phrases lie one after another (`_Table`), a row
keeps one state per phrase and offers the search at most k tokens of them (`next_tokens`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

import torch
from torch import Tensor

from nmt.data import pad_rows
from nmt.decoding.candidates import bank_candidates, repeats
from nmt.terminology import Surfaces

Phrases = tuple[tuple[int, ...], ...]
# `block_`'s: the rows (N,) whose EOS it took away, EOS's log-prob (N,) before
EosBlocked = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class Constraints:
    """The lexical constraints of one sentence, as target token ids (in the numbering of the
    model's output: over a shortlist, its columns; see `mapped`).

    include: phrases that must appear in the output, in any order (`ordered`: one after
        another in the given order, without overlapping). The output's end (EOS) is allowed
        only once all appear; one that cannot appear before the maximum length leaves the
        hypothesis ending without it, counted in `Hypothesis.unmet`. Unordered, a phrase
        listed twice is met by one occurrence; ordered, it must occur twice.
    prefix: the output's first tokens, taken whatever the model and the other rules say
        (their log-probs count in the score); they count toward `include`.
    avoid_text: texts that must never occur in the output's text, also inside a word or
        across tokens (see `AvoidText`), also not across the prefix.
    texts: the text each `include` phrase was asked as, for messages (or ()).
    """

    include: Phrases = ()
    ordered: bool = False
    prefix: tuple[int, ...] = ()
    avoid_text: AvoidText | None = None
    texts: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # lists are welcome: stored as tuples
        include = tuple(tuple(int(t) for t in phrase) for phrase in self.include)
        if not all(include):
            raise ValueError("an empty include phrase")
        object.__setattr__(self, "include", include)
        object.__setattr__(self, "prefix", tuple(int(t) for t in self.prefix))
        if any(t < 0 for t in self.tokens()):
            raise ValueError("a negative token id in the constraints")

    def is_empty(self) -> bool:
        return not (self.include or self.prefix or self.avoid_text)

    def tokens(self) -> set[int]:
        """Every token id the constraints name (e.g. to keep them in a shortlist)."""
        return {t for phrase in (*self.include, self.prefix) for t in phrase}

    def min_length(self) -> int:
        """A lower bound on the output tokens that hold every phrase to include: ordered, the
        sum of their lengths (they do not overlap); unordered (overlapping phrases share
        tokens), the number of distinct tokens they use, and for each length l, l - 1 more than
        the number of distinct phrases of that length (each starts somewhere else)."""
        if self.ordered:
            return sum(map(len, self.include))
        lengths = Counter(map(len, set(self.include)))
        return max(
            0,
            len({t for phrase in self.include for t in phrase}),
            *(n + k - 1 for n, k in lengths.items()),
        )

    def mapped(self, vocab: Sequence[int]) -> Constraints:
        """The same constraints over the columns of a shortlisted batch's vocabulary, `vocab`
        the token id of each column (KeyError for a token outside)."""
        column = {t: i for i, t in enumerate(vocab)}
        return Constraints(
            tuple(tuple(column[t] for t in p) for p in self.include),
            self.ordered,
            tuple(column[t] for t in self.prefix),
            self.avoid_text and replace(self.avoid_text, columns=tuple(vocab)),
            self.texts,
        )


@dataclass(frozen=True)
class AvoidText:
    """Texts (UTF-8) the output must never contain: the bytes of its tokens' `surfaces`, one
    after another, never hold one of `texts`, wherever it starts or ends. `columns`: over a
    shortlist, the token id of each column of the search."""

    texts: tuple[bytes, ...]
    surfaces: Surfaces
    columns: tuple[int, ...] | None = None


def _tensors(surfaces: Surfaces, device: torch.device) -> tuple[Tensor, Tensor]:
    """Kept by device: units (V, W) of each token, -1 after its surface, and rank (V,), each
    token's place in the vocabulary sorted by surface."""
    if device not in surfaces.tensors:
        lengths = torch.tensor([len(p) for p in surfaces.pieces], dtype=torch.long)
        row = torch.arange(surfaces.size).repeat_interleave(lengths)
        column = torch.arange(row.numel()) - torch.repeat_interleave(
            lengths.cumsum(0) - lengths, lengths
        )
        units = torch.full((surfaces.size, max(1, surfaces.width)), -1, dtype=torch.long)
        units[row, column] = torch.tensor(list(b"".join(surfaces.pieces)), dtype=torch.long)
        rank = torch.empty(surfaces.size, dtype=torch.long)
        rank[torch.tensor(surfaces.order, dtype=torch.long)] = torch.arange(surfaces.size)
        surfaces.tensors[device] = units.to(device), rank.to(device)
    return surfaces.tensors[device]


def _borders(phrase: Sequence[int]) -> tuple[list[int], list[int], int, int]:
    """KMP's tables of a phrase: at each unit q, `fail` the length of the longest start of
    the phrase that properly ends its first q units (-1 at q = 0) and `skip` the same past
    the starts followed by unit q too (Knuth's `next`: a unit unlike unit q is unlike theirs);
    and the longest chain of each (the most units a mismatch compares)."""
    n = len(phrase)
    fail = [-1] * n
    skip = [-1] * n
    fails = [1] * n
    skips = [1] * n
    for q in range(1, n):
        k = fail[q - 1]
        while k >= 0 and phrase[k] != phrase[q - 1]:
            k = fail[k]
        fail[q] = k + 1
        skip[q] = skip[k + 1] if phrase[k + 1] == phrase[q] else k + 1
        fails[q] = 1 + fails[k + 1]
        skips[q] = 1 + (skips[skip[q]] if skip[q] >= 0 else 0)
    return fail, skip, max(fails, default=1), max(skips, default=1)


class _Table:
    """The phrases of a batch's sentences one after another, for their automata: `units` (T,)
    (then a -1), `offset` (Bn, P) where phrase p of a sentence starts, `length` (Bn, P) (0:
    none), `fail` and `skip` (T,) (`_borders`), `chain` and `depth` their longest chains."""

    def __init__(self, sentences: Sequence[Sequence[Sequence[int]]], device: torch.device) -> None:
        phrases = [phrase for ps in sentences for phrase in ps]
        tables = [_borders(phrase) for phrase in phrases]
        self.chain = max((t[2] for t in tables), default=1)
        self.depth = max((t[3] for t in tables), default=1)
        self.units, self.fail, self.skip = (
            torch.tensor([*x, -1], dtype=torch.long, device=device)
            for x in (
                [u for p in phrases for u in p],
                [f for t in tables for f in t[0]],
                [k for t in tables for k in t[1]],
            )
        )
        # (Bn, P), P at least 1: a sentence without phrases has one of length 0
        starts = accumulate(map(len, phrases), initial=0)
        self.offset = pad_rows([[next(starts) for _ in ps] or [0] for ps in sentences], 0).to(
            device
        )
        self.length = pad_rows([[len(p) for p in ps] or [0] for ps in sentences], 0).to(device)

    def step(self, offset: Tensor, state: Tensor, unit: Tensor) -> Tensor:
        """The states (..., P) of phrases at `offset` (..., P) after one more unit (broadcast)."""
        q = state
        for _ in range(self.depth):
            at = offset + q.clamp(min=0)
            q = torch.where((q >= 0) & (self.units[at] != unit), self.skip[at], q)
        return q + 1

    def keep(self, sentences: Tensor) -> None:
        self.offset = self.offset[sentences]
        self.length = self.length[sentences]


class _Avoided:
    """Phrases of a batch's sentences that must not be completed, over the units of `surfaces`
    (over a shortlist, `columns` (K,) the token id of each column), and `state` (N, P): each
    live row's state in each (never the whole phrase)."""

    def __init__(
        self,
        sentences: Sequence[Sequence[bytes]],
        surfaces: Surfaces,
        columns: Sequence[int] | None,
        device: torch.device,
    ) -> None:
        self.surfaces = surfaces
        self.table = _Table(sentences, device)
        self.columns = (
            None if columns is None else torch.tensor(columns, dtype=torch.long, device=device)
        )
        found = [
            (b, surfaces.index(phrase)) for b, phrases in enumerate(sentences) for phrase in phrases
        ]
        # (T,) the range of tokens completing a phrase from each state
        self.lo, self.hi = (
            torch.tensor([x for _, f in found for x in f[i]] + [0], dtype=torch.long, device=device)
            for i in (0, 1)
        )
        inside = torch.zeros(len(sentences), surfaces.size, dtype=torch.bool)
        for b, f in found:
            inside[b, f[2]] = True
        self.inside = inside.to(device)  # (Bn, V) tokens that hold a whole phrase
        self.state = torch.zeros_like(self.table.length)
        # a token completes a phrase from a start at most W units short of its end: the first W of a
        # chain
        self.walk = min(self.table.chain, surfaces.width)

    def banned(self, sentence: Tensor) -> Tensor:
        """(N, V or K) the tokens each live row (of `sentence` (N,)) may not produce."""
        t = self.table
        size = self.surfaces.size
        offset = t.offset[sentence]
        length = t.length[sentence]
        j = self.state
        # +1 at lo, -1 at hi
        ends = torch.zeros(j.size(0), size + 1, dtype=torch.long, device=j.device)
        for _ in range(self.walk):  # j: the state, then the starts that also end the output
            on = (j >= 0) & (length > 0) & (length - j <= self.surfaces.width)
            at = offset + j.clamp(min=0)
            ends.scatter_add_(1, torch.where(on, self.lo[at], size), on.long())
            ends.scatter_add_(1, torch.where(on, self.hi[at], size), -on.long())
            j = torch.where(j >= 0, t.fail[at], j)
        rank = _tensors(self.surfaces, j.device)[1].expand(j.size(0), -1)
        banned = (ends[:, :size].cumsum(1) > 0).gather(1, rank) | self.inside[sentence]
        return banned if self.columns is None else banned[:, self.columns]

    def advance(self, rows: Tensor, tokens: Tensor, sentence: Tensor) -> None:
        """The live rows are now `rows` (N,) of the previous ones, each with its token of
        `tokens`."""
        t = self.table
        offset = t.offset[sentence]
        state = self.state[rows]
        table = _tensors(self.surfaces, tokens.device)[0]
        units = table[tokens if self.columns is None else self.columns[tokens]]
        for w in range(int((units >= 0).sum(1).max())):
            unit = units[:, w : w + 1]
            state = torch.where(unit >= 0, t.step(offset, state, unit), state)
        # only a dead row gets there
        self.state = torch.minimum(state, (t.length[sentence] - 1).clamp(min=0))

    def keep(self, sentences: Tensor, rows: Tensor) -> None:
        self.table.keep(sentences)
        self.inside = self.inside[sentences]
        self.state = self.state[rows]


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
    """The constraints of a batch's live sentences (Bn), the state of its live rows (N = Bn * width,
    sentence-major) and the beam search's moves with them (`search._Unconstrained`'s: without).

    Sentence tables: the phrases to include (`include`, a `_Table`; `lengths` (Bn, M), a
    missing phrase has length 0 and counts as met), `ordered` (Bn,), the avoided texts
    (`avoided`, with its rows' states; None: none), the prefixes `prefix` (Bn, F) (-1 after
    the end).
    """

    def __init__(self, constraints: Sequence[Constraints], eos: int, device: torch.device) -> None:
        self.eos = eos
        self.include = _Table([c.include for c in constraints], device)
        self.ordered = torch.tensor(
            [c.ordered for c in constraints], dtype=torch.bool, device=device
        )
        self.total = int(self.lengths.sum(1).max())  # the highest bank
        self.avoided: _Avoided | None = None
        if texts := [c.avoid_text for c in constraints if c.avoid_text is not None]:
            if any(
                a.surfaces is not texts[0].surfaces or a.columns != texts[0].columns for a in texts
            ):
                raise ValueError("avoided texts over different vocabularies in one batch")
            self.avoided = _Avoided(
                [c.avoid_text.texts if c.avoid_text else () for c in constraints],
                texts[0].surfaces,
                texts[0].columns,
                device,
            )
        self.prefix = pad_rows([c.prefix for c in constraints], -1).to(device)  # (Bn, F)
        self.max_token = max(max(c.tokens(), default=-1) for c in constraints)

        # step 0: one row per sentence (the search's first reorder makes `beam` of it)
        self.state = RowState(torch.zeros_like(self.lengths), self.lengths == 0)

    @property
    def lengths(self) -> Tensor:
        return self.include.length

    @staticmethod
    def build(
        constraints: Sequence[Constraints | None] | None, bsz: int, eos: int, device: torch.device
    ) -> ConstraintTracker | None:
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
        return ConstraintTracker(cons, eos, device)

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
        if step >= self.prefix.size(1):
            return None
        token = self.prefix[self._sentence_of(self._rows()), step]  # (N,)
        return token, lprobs.gather(1, token.clamp(min=0).unsqueeze(1)).squeeze(1)

    def block_(
        self, lprobs: Tensor, at_max: Tensor | None, forced: tuple[Tensor, Tensor] | None
    ) -> EosBlocked:
        """After the search's token rules, set to -inf in place (lprobs (N, V) of the live rows):
        the tokens that would complete an avoided phrase or text, EOS while a positive phrase is
        unmet (not at the maximum length, `at_max`), and at a prefix step every token but the
        prefix's (`forced`, from `prefix_logprobs`, which then keeps its model log-prob).
        Returns what it took of EOS, for `candidates` (`unblock_stuck_`)."""
        eos = self.eos
        sentence = self._sentence_of(self._rows())
        if self.avoided is not None:
            banned = self.avoided.banned(sentence)
            lprobs[:, : banned.size(1)].masked_fill_(banned, -math.inf)
        blocked = (~self.state.met).any(1)
        if at_max is not None:
            blocked &= ~at_max
        model_eos = lprobs[:, eos].clone()
        lprobs[:, eos].masked_fill_(blocked, -math.inf)
        if forced is not None:
            token, logprob = forced
            rows = token >= 0
            if at_max is not None:  # the maximum length wins: a longer prefix is cut there
                rows &= ~at_max
            column = token.clamp(min=0).unsqueeze(1)
            kept = torch.where(rows, logprob, lprobs.gather(1, column).squeeze(1))
            lprobs.masked_fill_(rows.unsqueeze(1), -math.inf).scatter_(1, column, kept.unsqueeze(1))
        return blocked, model_eos

    def unblock_stuck_(self, lprobs: Tensor, best: Tensor, blocked: EosBlocked) -> Tensor:
        """Rows left with no finite continuation (`best` (N,) their best score is -inf) only
        because `block_` took EOS away (`blocked`, what it returned) may end unmet after all:
        their EOS log-prob comes back in `lprobs`. Returns those rows (N,) bool."""
        rows, model_eos = blocked
        stuck = rows & best.isneginf() & model_eos.isfinite()
        lprobs[:, self.eos] = torch.where(stuck, model_eos, lprobs[:, self.eos])
        return stuck

    # ---------------------------------------------------------------- positive phrases

    def next_tokens(self, lprobs: Tensor, k: int) -> Tensor:
        """(N, K) the tokens that take each row further into a phrase it works on (start it, for
        a phrase not yet begun), -1 for none. Post & Vilar offer them all, a pool that grows with
        the phrases; past k phrases (a step keeps at most k candidates of a sentence) a row
        offers k distinct ones: those that continue a begun phrase, then the likeliest
        (lprobs (N, V))."""
        sentence = self._sentence_of(self._rows())
        progress = self.state.progress
        active = self._active(self.state.met, sentence)
        # (N, M) the next token of each phrase a row works on
        token = torch.where(
            active, self.include.units[self.include.offset[sentence] + progress], -1
        )
        if token.size(1) <= k:
            return token
        begun = active & (progress > 0)
        order = (token * 2 + (~begun).long()).argsort(dim=1)  # by token, a begun phrase's first
        token = token.gather(1, order)
        begun = begun.gather(1, order)
        repeat = repeats(token)
        token = token.masked_fill(repeat, -1)
        begun = begun & ~repeat
        score = torch.where(token >= 0, lprobs.gather(1, token.clamp(min=0)), -math.inf)
        by_score = score.argsort(dim=1, descending=True, stable=True)
        token = token.gather(1, by_score)
        begun = begun.gather(1, by_score)
        return token.gather(1, (~begun).long().argsort(dim=1, stable=True)[:, :k])

    def advance(self, rows: Tensor, tokens: Tensor) -> RowState:
        """The state after each row of `rows` (any shape, flat indices of the live rows) takes
        the token of `tokens` (same shape): (..., M)."""
        sentence = self._sentence_of(rows)
        progress = self.state.progress[rows]  # (..., M)
        met = self.state.met[rows]
        new = self.include.step(self.include.offset[sentence], progress, tokens.unsqueeze(-1))
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

    def candidates(
        self, lprobs: Tensor, scores: Tensor, k: int, blocked: EosBlocked
    ) -> tuple[Tensor, Tensor, RowState]:
        """A step's candidates in the order of the banks
        (`nmt.decoding.candidates.bank_candidates`)."""
        return bank_candidates(lprobs, scores, k, self, blocked)

    def choose(self, state: RowState, order: Tensor, rows: Tensor, tokens: Tensor) -> None:
        """The new live rows (Bn, width), sentence-major: candidates `order` (Bn, width) of those
        whose states are `state` (Bn, C, M), the rows they extend (indices of the previous live
        rows) and their tokens."""
        state = state.gather(order)
        self.state = RowState(state.progress.flatten(0, 1), state.met.flatten(0, 1))
        sentence = self._sentence_of(self._rows())
        if self.avoided is not None:
            self.avoided.advance(rows.reshape(-1), tokens.reshape(-1), sentence)

    def keep(self, sentences: Tensor) -> None:
        """Only `sentences` (indices of the live ones) go on; call after `choose`."""
        rows = self._rows().view(self.lengths.size(0), -1)[sentences].view(-1)
        self.state = RowState(self.state.progress[rows], self.state.met[rows])
        self.include.keep(sentences)
        self.ordered = self.ordered[sentences]
        self.prefix = self.prefix[sentences]
        if self.avoided is not None:
            self.avoided.keep(sentences, rows)
