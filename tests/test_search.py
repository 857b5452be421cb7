"""Greedy and beam search on fake models: hand-written probability tables with exact expected
hypotheses and scores, and properties on random models (beam 1 = greedy, batched = one by
one, scores = teacher-forced log-probs)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import greedy_search

from nmt.config import DecodeConfig
from nmt.decoding.constraints import Constraints
from nmt.decoding.search import (
    BeamSearch,
    Hypothesis,
    beam_search,
    length_penalty,
    max_output_lengths,
    top_candidates,
)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
IDS = {
    "pad": PAD,
    "unk": UNK,
    "bos": BOS,
    "eos": EOS,
}  # the fake vocabulary's special ids, for beam_search
A, B, C, D, E, F = 4, 5, 6, 7, 8, 9
V = 10


class FakeModel:
    """Next-token log-probs from `logprobs(src, prefix) -> (V,)`.

    The state is each row's (source without pads, output prefix); `reorder` index-selects
    it. `rows` records how many rows each decode step received.
    """

    def __init__(self, logprobs, dtype=torch.float32):
        self.logprobs, self.dtype, self.rows = logprobs, dtype, []

    def encode(self, src):
        return [(tuple(t for t in row if t != PAD), None) for row in src.tolist()]

    def decode_step(self, tokens, state):
        new = []
        for (src, prefix), tok in zip(state, tokens.tolist(), strict=True):
            if prefix is None:
                assert tok == BOS
                new.append((src, ()))
            else:
                # blocked tokens may reach rows with no finite continuation, EOS never
                assert tok != EOS, "a finished hypothesis was continued"
                new.append((src, prefix + (tok,)))
        self.rows.append(len(new))
        return torch.stack([self.logprobs(s, p) for s, p in new]).to(self.dtype), new

    def reorder(self, state, index):
        return [state[i] for i in index.tolist()]

    def merge(self, a, b):
        return a + b


def table(rows):
    """{prefix: {token: prob}} -> logprobs(src, prefix); unlisted tokens get 0, unlisted
    prefixes end: {EOS: 1}."""

    def logprobs(src, prefix):
        p = torch.zeros(V, dtype=torch.float64)
        for tok, prob in rows.get(prefix, {EOS: 1.0}).items():
            p[tok] = prob
        return p.log().float()

    return logprobs


def random_logprobs(src, prefix):
    """A fixed random distribution per (source, prefix); EOS grows likelier with length."""
    g = torch.Generator().manual_seed(hash((src, prefix)) % 2**31)
    logits = torch.randn(V, generator=g, dtype=torch.float64) * 2
    logits[EOS] += 0.6 * len(prefix) - 2.0
    return logits.log_softmax(0).float()


def src_batch(*sentences):
    width = max(len(s) for s in sentences)
    return torch.tensor([list(s) + [PAD] * (width - len(s)) for s in sentences])


ONE = src_batch([A, B, EOS])  # one source sentence of 3 tokens
CFG = DecodeConfig(beam=2, lenpen=1.0, lenpen_style="none", max_len_a=0.0, max_len_b=10, min_len=1)


def search(rows, cfg=CFG, nbest=2, src=ONE, **kw):
    return beam_search(FakeModel(table(rows)), src, cfg, nbest=nbest, **IDS, **kw)[0]


def summary(hyps):
    return [(h.tokens, h.score) for h in hyps]


def approx(x):
    return pytest.approx(x, rel=1e-5, abs=1e-6)


def teacher_forced(model, src, tokens):
    """Per-token log-probs of `tokens` + EOS for a one-sentence src (1, S)."""
    state = model.encode(src)
    out = []
    for prev, tok in zip([BOS, *tokens], [*tokens, EOS], strict=True):
        lprobs, state = model.decode_step(torch.tensor([prev]), state)
        out.append(lprobs[0, tok].float().item())
    return out


# ------------------------------------------------------------------ length penalty


def test_length_penalty_formulas():
    assert length_penalty(4, 0.6, "gnmt") == pytest.approx((9 / 6) ** 0.6)
    assert length_penalty(1, 0.6, "gnmt") == pytest.approx(1.0)
    assert length_penalty(4, 0.5, "length") == pytest.approx(2.0)
    assert length_penalty(4, 0.0, "length") == 1.0
    assert length_penalty(4, 2.0, "none") == 1.0
    with pytest.raises(ValueError):
        length_penalty(4, 1.0, "average")
    assert "EOS" in length_penalty.__doc__ and "gnmt" in length_penalty.__doc__


def test_max_output_lengths():
    src = src_batch([A, EOS], [A, B, C, D, EOS])
    cfg = replace(CFG, max_len_a=1.5, max_len_b=1)
    src_len = (src != PAD).sum(1)
    assert max_output_lengths(src_len, cfg, None).tolist() == [4, 8]  # int(1.5 * len + 1)
    assert max_output_lengths(src_len, cfg, 6).tolist() == [4, 5]  # BOS + 5 fill 6 positions


# ------------------------------------------------------------------ hand-written tables

# K=2. Step 1: [A] EOS (.36) is the best candidate and finishes; the beam stays full with
# [B C] (.32) and [A C] (.24), and [A C] EOS (.24) becomes the second best hypothesis.
REFILL = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.6, C: 0.4},
    (B,): {C: 0.8, EOS: 0.2},
    (A, C): {EOS: 1.0},
    (B, C): {EOS: 0.6, D: 0.4},
}


def test_finished_candidates_do_not_shrink_the_beam():
    model = FakeModel(table(REFILL))
    hyps = beam_search(model, ONE, CFG, nbest=2, **IDS)[0]
    assert summary(hyps) == [([A], approx(math.log(0.36))), ([A, C], approx(math.log(0.24)))]
    assert model.rows[:3] == [1, 2, 2]  # step 0 on one row per sentence; step 2 still decodes two


def test_length_normalisation_reorders_hypotheses():
    hyps = search(REFILL, replace(CFG, lenpen_style="length", lenpen=1.0))
    # log(.24)/3 = -0.476 beats log(.36)/2 = -0.511
    assert summary(hyps) == [
        ([A, C], approx(math.log(0.24) / 3)),
        ([A], approx(math.log(0.36) / 2)),
    ]
    for h in hyps:
        assert h.logprob == approx(h.score * (len(h.tokens) + 1))


# [A] EOS has probability .52, [B C D] EOS .48: the raw log-prob prefers the short one, a
# GNMT penalty with alpha 1 the long one: log(.52)/(7/6) = -0.561 < log(.48)/(9/6) = -0.489.
SHORT_LONG = {
    (): {A: 0.52, B: 0.48},
    (A,): {EOS: 1.0},
    (B,): {C: 1.0},
    (B, C): {D: 1.0},
}


@pytest.mark.parametrize(
    "style,alpha", [("gnmt", 0.0), ("gnmt", -0.5), ("none", 1.0), ("length", 0.0)]
)
def test_shorter_wins_without_length_bonus(style, alpha):
    hyps = search(SHORT_LONG, replace(CFG, lenpen_style=style, lenpen=alpha))
    assert [h.tokens for h in hyps] == [[A], [B, C, D]]
    assert hyps[0].score == approx(math.log(0.52) / length_penalty(2, alpha, style))
    assert hyps[1].score == approx(math.log(0.48) / length_penalty(4, alpha, style))


def test_gnmt_penalty_favours_the_longer_hypothesis():
    hyps = search(SHORT_LONG, replace(CFG, lenpen_style="gnmt", lenpen=1.0))
    assert summary(hyps) == [
        ([B, C, D], approx(math.log(0.48) / 1.5)),
        ([A], approx(math.log(0.52) / (7 / 6))),
    ]
    assert hyps[0].positional_scores == [approx(math.log(0.48)), 0.0, 0.0, 0.0]


# Step 1 finishes [X] (.495); step 2 finishes [Y V] (.162) while [Y W U] (.243) is live.
# With raw log-probs the search goes on and finds [Y W U] EOS (.243); with alpha > 0 it
# stops at two finished hypotheses, as fairseq does.
STOP = {
    (): {A: 0.55, B: 0.45},
    (A,): {EOS: 0.9, F: 0.1},
    (B,): {C: 0.6, D: 0.4},
    (B, C): {E: 0.9, EOS: 0.1},
    (B, D): {EOS: 0.9, F: 0.1},
    (B, C, E): {EOS: 1.0},
    (B, D, F): {EOS: 1.0},
}


def test_stopping_rule_is_exact_for_raw_logprobs():
    hyps = search(STOP)
    assert summary(hyps) == [([A], approx(math.log(0.495))), ([B, C, E], approx(math.log(0.243)))]


def test_stopping_rule_with_length_normalisation_stops_at_beam_finished():
    hyps = search(STOP, replace(CFG, lenpen_style="length", lenpen=1.0))
    assert summary(hyps) == [
        ([A], approx(math.log(0.495) / 2)),
        ([B, D], approx(math.log(0.162) / 3)),
    ]


# ------------------------------------------------------------------ token rules

LOOP = {(): {A: 0.69, B: 0.3, EOS: 0.01}}  # below: every prefix continues like ()


def looping(src, prefix):
    return table({prefix: LOOP[()]})(src, prefix)


def test_max_length_forces_eos_and_scores_it():
    cfg = replace(CFG, max_len_b=2)
    for beam in (1, 3):
        hyp = beam_search(FakeModel(looping), ONE, replace(cfg, beam=beam), **IDS)[0][0]
        assert hyp.tokens == [A, A]
        assert hyp.positional_scores == [approx(math.log(0.69))] * 2 + [approx(math.log(0.01))]
        assert hyp.logprob == approx(2 * math.log(0.69) + math.log(0.01))
    assert greedy_search(FakeModel(looping), ONE, cfg) == [[A, A]]
    # the model's positions cap the length too: BOS + 1 token fill 2 positions
    assert beam_search(FakeModel(looping), ONE, CFG, max_len=2, **IDS)[0][0].tokens == [A]
    assert greedy_search(FakeModel(looping), ONE, CFG, max_len=2) == [[A]]
    # max_len_a * src_len + max_len_b, src_len counting non-pad tokens incl. EOS (3 here)
    cfg = replace(CFG, max_len_a=1.0, max_len_b=1)
    assert greedy_search(FakeModel(looping), ONE, cfg) == [[A] * 4]


EARLY_EOS = {(): {EOS: 0.6, A: 0.4}, (A,): {EOS: 0.7, B: 0.3}, (A, B): {EOS: 1.0}}


@pytest.mark.parametrize("min_len,expected", [(0, []), (1, [A]), (2, [A, B])])
def test_min_len_blocks_eos(min_len, expected):
    cfg = replace(CFG, min_len=min_len)
    assert greedy_search(FakeModel(table(EARLY_EOS)), ONE, cfg) == [expected]
    assert search(EARLY_EOS, cfg, nbest=1)[0].tokens == expected


@pytest.mark.parametrize("min_len", [5, 10**30])  # 10**30: more than an int64 holds
def test_max_length_wins_over_min_len(min_len):
    cfg = replace(CFG, min_len=min_len, max_len_b=1)
    assert search(EARLY_EOS, cfg, nbest=1)[0].tokens == [A]


SPECIALS = {(): {UNK: 0.4, PAD: 0.2, BOS: 0.2, A: 0.15, EOS: 0.05}, (A,): {UNK: 0.9, EOS: 0.1}}


def test_unk_only_when_allowed_and_never_pad_or_bos():
    assert greedy_search(FakeModel(table(SPECIALS)), ONE, CFG) == [[A]]
    assert [h.tokens for h in search(SPECIALS)] == [[A]]  # nothing else has a finite score
    cfg = replace(CFG, allow_unk=True)
    assert greedy_search(FakeModel(table(SPECIALS)), ONE, cfg) == [[UNK]]
    assert search(SPECIALS, cfg)[0].tokens == [UNK]


def alternating(src, prefix):
    """A B A B ... unless blocked; after C, EOS."""
    nxt = {
        None: {A: 0.9, EOS: 0.1},
        A: {B: 0.8, C: 0.15, EOS: 0.05},
        B: {A: 0.8, C: 0.15, EOS: 0.05},
        C: {EOS: 0.9, A: 0.1},
    }
    return table({prefix: nxt[prefix[-1] if prefix else None]})(src, prefix)


@pytest.mark.parametrize("n,expected", [(0, [A, B] * 5), (2, [A, B, A, C]), (3, [A, B, A, B, C])])
def test_no_repeat_ngram(n, expected):
    cfg = replace(CFG, no_repeat_ngram_size=n)
    assert greedy_search(FakeModel(alternating), ONE, cfg) == [expected]
    assert (
        beam_search(FakeModel(alternating), ONE, replace(cfg, beam=1), **IDS)[0][0].tokens
        == expected
    )


def ngrams(tokens, n):
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def test_no_repeat_ngram_holds_for_every_hypothesis():
    cfg = replace(CFG, beam=4, no_repeat_ngram_size=2, max_len_b=12)
    src = src_batch([A, B, EOS], [C, EOS], [D, E, F, A, EOS])
    for hyps in beam_search(FakeModel(random_logprobs), src, cfg, nbest=4, **IDS):
        for h in hyps:
            assert len(set(ngrams(h.tokens, 2))) == len(ngrams(h.tokens, 2))


# ------------------------------------------------------------------ properties on random models

SOURCES = [[A, B, EOS], [C, EOS], [D, E, F, A, B, C, EOS], [F, F, EOS], [B, EOS]]
RANDOM_CFGS = [
    DecodeConfig(beam=1, lenpen_style="none", max_len_a=1.0, max_len_b=3),
    DecodeConfig(beam=1, lenpen_style="length", lenpen=1.0, min_len=2, no_repeat_ngram_size=2),
    DecodeConfig(beam=1, lenpen_style="gnmt", lenpen=0.6, max_len_b=4, allow_unk=True),
]


@pytest.mark.parametrize("cfg", RANDOM_CFGS)
def test_beam_one_equals_greedy(cfg):
    src = src_batch(*SOURCES)
    greedy = greedy_search(FakeModel(random_logprobs), src, cfg)
    beam = beam_search(FakeModel(random_logprobs), src, cfg, **IDS)
    assert [hyps[0].tokens for hyps in beam] == greedy
    assert any(len(g) > 1 for g in greedy)


@pytest.mark.parametrize("style,alpha", [("none", 1.0), ("length", 1.0), ("gnmt", -0.3)])
def test_batch_equals_one_by_one(style, alpha):
    cfg = DecodeConfig(beam=3, lenpen_style=style, lenpen=alpha, max_len_a=1.0, max_len_b=3)
    batched = beam_search(FakeModel(random_logprobs), src_batch(*SOURCES), cfg, nbest=3, **IDS)
    for sentence, hyps in zip(SOURCES, batched, strict=True):
        alone = beam_search(FakeModel(random_logprobs), src_batch(sentence), cfg, nbest=3, **IDS)[0]
        assert hyps == alone
    # greedy too, with pads in the batch and none alone
    greedy = greedy_search(FakeModel(random_logprobs), src_batch(*SOURCES), cfg)
    assert greedy == [
        greedy_search(FakeModel(random_logprobs), src_batch(s), cfg)[0] for s in SOURCES
    ]


@pytest.mark.parametrize("style,alpha", [("none", 1.0), ("length", 1.0), ("gnmt", 0.6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scores_equal_teacher_forced_logprobs(style, alpha, dtype):
    cfg = DecodeConfig(beam=4, lenpen_style=style, lenpen=alpha, max_len_a=1.0, max_len_b=3)
    model = FakeModel(random_logprobs, dtype)
    batched = beam_search(model, src_batch(*SOURCES), cfg, nbest=4, **IDS)
    for sentence, hyps in zip(SOURCES, batched, strict=True):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4
        for h in hyps:
            assert isinstance(h, Hypothesis)
            assert all(t not in (PAD, BOS, EOS, UNK) for t in h.tokens)
            forced = teacher_forced(model, src_batch(sentence), h.tokens)
            assert h.positional_scores == [approx(x) for x in forced]
            assert h.logprob == approx(sum(forced))
            assert h.score == approx(h.logprob / length_penalty(len(h.tokens) + 1, alpha, style))


@pytest.mark.parametrize(
    "cfg",
    [
        DecodeConfig(
            beam=3, lenpen_style="none", max_len_a=1.0, max_len_b=3
        ),  # the exact stopping rule
        DecodeConfig(
            beam=3, lenpen_style="gnmt", lenpen=0.6, min_len=3, no_repeat_ngram_size=2, max_len_b=6
        ),
        DecodeConfig(
            beam=2, lenpen_style="length", lenpen=1.0, max_len_a=0.0, max_len_b=4, allow_unk=True
        ),
    ],
)
def test_sentences_joining_a_running_search_get_what_they_get_alone(cfg):
    """Continuous batching (nmt serve): sentences join between steps, each at its own step, and
    end with exactly the hypotheses they have when decoded alone (length limits, min_len and
    repeated n-grams counted per sentence)."""
    model = FakeModel(random_logprobs)
    search = BeamSearch(model, cfg, nbest=2, **IDS, max_len=9)
    joins = {
        0: [0, 1],
        1: [2],
        3: [3, 4],
        4: [1],
    }  # step -> the sentences (of SOURCES) that join; 1 twice
    got, step = [], 0
    while step in joins or step < max(joins) or len(search):
        if step in joins:
            search.add(
                src_batch(*[SOURCES[i] for i in joins[step]]), [(step, i) for i in joins[step]]
            )
        got += search.step() if len(search) else []
        step += 1
    assert sorted(tag for tag, _ in got) == sorted((t, i) for t, ids in joins.items() for i in ids)
    assert max(model.rows) > 2 * cfg.beam  # sentences of different steps shared steps
    for (_, i), hyps in got:
        assert (
            hyps
            == beam_search(
                FakeModel(random_logprobs), src_batch(SOURCES[i]), cfg, nbest=2, **IDS, max_len=9
            )[0]
        )
    search.add(ONE, ["x"])
    with pytest.raises(ValueError, match="constraints"):
        search.add(ONE, ["y"], [Constraints(include=((A,),))])


def test_finished_sentences_leave_the_batch():
    def no_eos(src, prefix):  # EOS only when forced at the maximum length
        lp = random_logprobs(src, prefix)
        lp[EOS] = -30.0
        return lp

    model = FakeModel(no_eos)
    cfg = DecodeConfig(beam=3, lenpen_style="none", max_len_a=1.0, max_len_b=0)
    hyps = beam_search(
        model, src_batch([A, EOS], [A, B, C, D, EOS]), cfg, **IDS
    )  # max 2 and 5 tokens
    assert [len(h[0].tokens) for h in hyps] == [2, 5]
    assert model.rows == [2, 6, 6, 3, 3, 3]  # step 0: one row per sentence
    model = FakeModel(no_eos)
    greedy_search(model, src_batch([A, EOS], [A, B, C, D, EOS]), cfg)
    assert model.rows == [2, 2, 2, 1, 1, 1]


def test_nbest_must_fit_the_beam_and_empty_batch():
    with pytest.raises(ValueError):
        beam_search(FakeModel(random_logprobs), ONE, CFG, nbest=3, **IDS)
    empty = torch.empty(0, 4, dtype=torch.long)
    assert beam_search(FakeModel(random_logprobs), empty, CFG, **IDS) == []
    assert greedy_search(FakeModel(random_logprobs), empty, CFG) == []


# ------------------------------------------------------------------ candidate selection


def reference_top(lprobs, scores, k):
    """Each sentence's k best (score, index) by sorting Python floats: score descending, then
    the lower index (row of the sentence * V + token)."""
    n_sent, width = scores.shape
    vocab = lprobs.size(1)
    cand = (scores.view(-1, 1) + lprobs).view(n_sent, -1).tolist()
    out = [sorted(range(width * vocab), key=lambda i: (-row[i], i))[:k] for row in cand]
    return [[row[i] for i in idx] for row, idx in zip(cand, out)], out


@pytest.mark.parametrize("vocab,chunk", [(256, 64), (257, 64), (300, 7), (40, 1), (41, 3), (33, 8)])
@pytest.mark.parametrize("width,k", [(1, 1), (1, 6), (5, 10), (3, 40)])
def test_top_candidates_equal_a_full_sort(vocab, chunk, width, k):
    gen = torch.Generator().manual_seed(vocab * 100 + chunk * 10 + width)
    n_sent = 4
    # integer log-probs: many exact ties, within a row and across the rows of a sentence
    lprobs = -torch.randint(0, 6, (n_sent * width, vocab), generator=gen).float()
    lprobs[torch.rand(lprobs.shape, generator=gen) < 0.3] = -math.inf
    lprobs[1] = -math.inf  # a row with no finite continuation
    scores = -torch.randint(0, 3, (n_sent, width), generator=gen).float()
    if width > 1:
        scores[0, 1] = -math.inf  # a dead row
    values, index = top_candidates(lprobs, scores, k, chunk=chunk)
    ref_values, ref_index = reference_top(lprobs, scores, k)
    assert index.tolist() == ref_index
    assert values.tolist() == ref_values
    # the one-stage path (chunk larger than a quarter of the vocabulary) agrees
    flat_values, flat_index = top_candidates(lprobs, scores, k, chunk=vocab)
    assert flat_index.tolist() == ref_index and flat_values.tolist() == ref_values


def test_top_candidates_rank_negative_zero_as_zero():
    lprobs = torch.tensor([[-1.0, -0.0, 0.0, -2.0] * 8])
    values, index = top_candidates(lprobs, torch.zeros(1, 1), 3, chunk=2)
    assert index.tolist() == [[1, 2, 5]] and values.tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "cfg", [*RANDOM_CFGS, DecodeConfig(beam=4, lenpen_style="length", lenpen=1.0)]
)
def test_search_with_two_stage_selection_equals_one_stage(cfg, monkeypatch):
    src = src_batch(*SOURCES)
    nbest = cfg.beam
    one_stage = beam_search(FakeModel(random_logprobs), src, cfg, nbest=nbest, **IDS)
    greedy = greedy_search(FakeModel(random_logprobs), src, cfg)
    monkeypatch.setattr("nmt.decoding.candidates.CHUNK", 2)  # V = 10: 5 chunks of 2 columns
    assert beam_search(FakeModel(random_logprobs), src, cfg, nbest=nbest, **IDS) == one_stage
    assert greedy_search(FakeModel(random_logprobs), src, cfg) == greedy


def test_an_expired_sentence_ends_at_the_next_step_and_the_others_decode_as_alone():
    """nmt serve ends the sentences nobody waits for any more (a 504, a client gone): each ends at
    the next step, as at its length limit, and leaves the others' hypotheses as they would be."""
    cfg = DecodeConfig(beam=3, lenpen_style="none", max_len_a=1.0, max_len_b=3)
    search = BeamSearch(FakeModel(random_logprobs), cfg, nbest=2, **IDS, max_len=9)
    search.add(src_batch(SOURCES[2], SOURCES[0]), ["kept", "gone"])
    assert search.step() == []  # neither ends at step 0
    search.expire(["gone"])
    ended = search.step()
    assert [tag for tag, _ in ended] == ["gone"] and all(len(h.tokens) <= 2 for h in ended[0][1])
    rest = []
    while len(search):
        rest += search.step()
    alone = beam_search(
        FakeModel(random_logprobs), src_batch(SOURCES[2]), cfg, nbest=2, **IDS, max_len=9
    )[0]
    assert rest == [("kept", alone)]
