"""Lexically constrained beam search (nmt.decoding.constraints, beam_search(constraints=...)):
hand-written probability tables where the result is worked out in the comments (and checked
against an exhaustive search where the beam finds the constrained optimum), and properties on random
models: every phrase to include appears when it fits, no avoided phrase ever appears, batch 1 =
batch N, scores = teacher-forced log-probs, and no constraints = exactly the plain search."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
import torch
from test_search import (
    CFG,
    EOS,
    IDS,
    ONE,
    SOURCES,
    A,
    B,
    C,
    D,
    E,
    F,
    FakeModel,
    approx,
    random_logprobs,
    src_batch,
    table,
    teacher_forced,
)

from nmt.config import DecodeConfig
from nmt.decoding.constraints import AvoidText, Constraints, ConstraintTracker, RowState
from nmt.decoding.search import beam_search, max_output_lengths
from nmt.terminology import Surfaces

CONTENT = (A, B, C, D, E, F)
# A vocabulary's text of one byte a content token: avoiding a text is avoiding a token sequence
LETTERS = Surfaces([b"", b"", b"", b"", b"A", b"B", b"C", b"D", b"E", b"F"])


def avoid_ids(phrases):
    """Token-id phrases to avoid, as texts over LETTERS; None for none."""
    return AvoidText(tuple(LETTERS.text(p) for p in phrases), LETTERS) if phrases else None


def occurs(tokens, phrase, start=0):
    """The first index >= start where `phrase` begins in `tokens`, or -1."""
    n = len(phrase)
    return next(
        (i for i in range(start, len(tokens) - n + 1) if tuple(tokens[i : i + n]) == tuple(phrase)),
        -1,
    )


def lacking(tokens, c):
    """The phrases of c.include that `tokens` lacks: unordered, each anywhere; ordered, one
    after another without overlapping (the earliest occurrence of each is the best choice)."""
    if not c.ordered:
        return sum(occurs(tokens, p) < 0 for p in c.include)
    start = met = 0
    for p in c.include:
        i = occurs(tokens, p, start)
        if i < 0:
            break
        start, met = i + len(p), met + 1
    return len(c.include) - met


def has_avoided(tokens, c):
    """Whether an avoided text (over LETTERS) ends in `tokens` past the forced prefix."""
    text = LETTERS.text(tokens)
    return any(
        occurs(text, p, i) == i and i + len(p) > len(c.prefix)
        for p in (c.avoid_text.texts if c.avoid_text else ())
        for i in range(len(text))
    )


def exhaustive(logprobs, src, c, max_out):
    """Every output of finite probability with at most `max_out` tokens (EOS forced there)
    that starts with c.prefix and has no avoided phrase, as (tokens, log-prob), ranked like the
    constrained search ranks finished hypotheses (fewer phrases lacking, then log-prob)."""
    found = []

    def grow(prefix, logprob):
        lp = logprobs(tuple(t for t in src if t), tuple(prefix)).double()
        if len(prefix) == max_out or (lacking(prefix, c) == 0 and len(prefix) >= len(c.prefix)):
            found.append((prefix, logprob + lp[EOS].item()))
        if len(prefix) < max_out:
            for t in CONTENT:
                nxt = [*prefix, t]
                if (
                    lp[t] > -math.inf
                    and not has_avoided(nxt, c)
                    and (len(prefix) >= len(c.prefix) or t == c.prefix[len(prefix)])
                ):
                    grow(nxt, logprob + lp[t].item())

    grow([], 0.0)
    return sorted(found, key=lambda f: (lacking(f[0], c), -f[1]))


def constrained(rows, c, cfg=CFG, nbest=2, src=ONE):
    return beam_search(FakeModel(table(rows)), src, cfg, nbest=nbest, **IDS, constraints=[c])[0]


def optimum(rows, c, cfg=CFG, src=ONE):
    max_out = int(max_output_lengths((src != IDS["pad"]).sum(1), cfg, None)[0])
    return exhaustive(table(rows), src[0].tolist(), c, max_out)[0]


# ------------------------------------------------------------------ the Constraints value


def test_constraints_value():
    c = Constraints(include=[[A, B], [C]], prefix=[E])  # lists are stored as tuples
    assert c.include == ((A, B), (C,)) and c.prefix == (E,)
    assert not c.is_empty() and Constraints().is_empty() and Constraints(ordered=True).is_empty()
    assert c.tokens() == {A, B, C, E}
    assert c.mapped([E, C, B, A]) == Constraints(((3, 2), (1,)), False, (0,))  # by column
    with pytest.raises(ValueError, match="empty include"):
        Constraints(include=((A,), ()))
    with pytest.raises(ValueError, match="negative"):
        Constraints(prefix=(-1,))


def test_bad_constraints_for_the_search():
    def run(constraints, src=ONE):
        return beam_search(FakeModel(random_logprobs), src, CFG, **IDS, constraints=constraints)

    with pytest.raises(ValueError, match="2 constraints for a batch of 1"):
        run([None, Constraints(include=((A,),))])
    with pytest.raises(ValueError, match="EOS"):
        run([Constraints(include=((A, EOS),))])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run([Constraints(include=((10,),))])


def longest_start(tokens, phrase):
    """The length of the longest proper start of `phrase` that ends `tokens`."""
    return max(k for k in range(len(phrase)) if k == 0 or tuple(tokens[-k:]) == tuple(phrase[:k]))


def expected_state(tokens, c):
    """Per phrase of c.include: (progress, met) after `tokens`, worked out from the text."""
    if not c.ordered:
        return [
            (0, True) if occurs(tokens, p) >= 0 else (longest_start(tokens, p), False)
            for p in c.include
        ]
    out, start = [], 0
    for p in c.include:
        i = occurs(tokens, p, start) if start is not None else -1
        if i >= 0:
            out.append((0, True))
            start = i + len(p)
        else:  # the first unmet phrase is tracked from the end of the previous one
            out.append((longest_start(tokens[start:], p) if start is not None else 0, False))
            start = None
    return out


@pytest.mark.parametrize("seed", range(4))
def test_tracker_follows_every_phrase(seed):
    """Feeding random texts over few tokens (many repeats and false starts) token by token,
    the tracker's progress is the longest start of each phrase that ends the text, and a
    phrase is met once the text has it (ordered: after the previous one)."""
    rng = random.Random(seed)
    for _ in range(25):
        include = tuple(
            tuple(rng.choice((A, B, C)) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        )
        c = Constraints(include=include, ordered=rng.random() < 0.5)
        tracker = ConstraintTracker.build([c], 1, EOS, torch.device("cpu"))
        tokens = []
        for _ in range(12):
            tokens.append(rng.choice((A, B, C)))
            row, token = torch.tensor([[0]]), torch.tensor([[tokens[-1]]])
            tracker.choose(tracker.advance(row, token), torch.zeros_like(row), row, token)
            state = list(
                zip(tracker.state.progress[0].tolist(), tracker.state.met[0].tolist(), strict=True)
            )
            assert state == expected_state(tokens, c), (c, tokens)
            bank = tracker.bank(
                RowState(tracker.state.progress[None], tracker.state.met[None])
            ).item()
            assert bank == sum(len(p) for p, (_, met) in zip(include, state) if met) + max(
                s[0] for s in state
            )


# ---------------------------------------------------------------- no constraints: the plain search


@pytest.mark.parametrize(
    "cfg",
    [
        DecodeConfig(beam=3, lenpen_style="none", max_len_a=1.0, max_len_b=3),
        DecodeConfig(beam=4, lenpen_style="length", lenpen=1.0, no_repeat_ngram_size=2),
        DecodeConfig(beam=1, lenpen_style="gnmt", lenpen=0.6, min_len=2),
    ],
)
def test_no_constraints_is_the_plain_search(cfg):
    src = src_batch(*SOURCES)
    plain = beam_search(FakeModel(random_logprobs), src, cfg, nbest=cfg.beam, **IDS)
    for constraints in (None, [None] * len(SOURCES), [Constraints()] * len(SOURCES)):
        model = FakeModel(random_logprobs)
        assert beam_search(model, src, cfg, nbest=cfg.beam, **IDS, constraints=constraints) == plain
    assert all(h.unmet == 0 for hyps in plain for h in hyps)


# ------------------------------------------------------------------ hand-written tables

# Outputs and their probabilities: [A B] .27 (the plain best), [D] .2, [C] .18, [A C] .15,
# [C A] .084, [A] .05, [C A B] .036, [A B C] .03.
T1 = {
    (): {A: 0.5, C: 0.3, D: 0.2},
    (A,): {B: 0.6, C: 0.3, EOS: 0.1},
    (A, B): {EOS: 0.9, C: 0.1},
    (C,): {EOS: 0.6, A: 0.4},
    (C, A): {EOS: 0.7, B: 0.3},
}
BEAM3 = replace(CFG, beam=3)


@pytest.mark.parametrize(
    "include,expected",
    [
        (((A, B),), [A, B]),  # the plain best already has it: nothing changes
        (((C,),), [C]),  # met early: the first token, the model's second choice
        (((A, C),), [A, C]),  # its first token is already the best
        (((B, C),), [A, B, C]),  # met late: after the plain best, before its EOS
        (((B,), (C,)), [C, A, B]),  # two phrases, in the order the model likes best
    ],
)
def test_positive_constraints(include, expected):
    c = Constraints(include=include)
    hyps = constrained(T1, c, BEAM3)
    assert hyps[0].tokens == expected == optimum(T1, c)[0]
    assert hyps[0].unmet == 0
    assert hyps[0].positional_scores == [
        approx(x) for x in teacher_forced(FakeModel(table(T1)), ONE, expected)
    ]
    assert all(lacking(h.tokens, c) == h.unmet for h in hyps)  # the second may lack it (stuck)


def test_ordered_and_unordered():
    unordered = Constraints(include=((B,), (C,)))
    assert constrained(T1, unordered, BEAM3)[0].tokens == [C, A, B]  # .036 > [A B C] .03
    ordered = replace(unordered, ordered=True)
    assert constrained(T1, ordered, BEAM3)[0].tokens == [A, B, C] == optimum(T1, ordered)[0]
    reverse = Constraints(include=((C,), (B,)), ordered=True)
    assert constrained(T1, reverse, BEAM3)[0].tokens == [C, A, B]
    # beam 2 is an approximation: after the first step [A B], [A C] and [C A] have each met
    # one phrase (one bank), and the two likeliest stay: [C A B] is lost
    assert constrained(T1, unordered)[0].tokens == [A, B, C]


def test_ordered_phrases_do_not_overlap():
    # [A B C] contains "A B" and "B C", overlapping: enough unordered, not ordered
    rows = {**T1, (A, B, C): {EOS: 0.5, B: 0.3, A: 0.2}, (A, B, C, B): {C: 1.0}}
    unordered = Constraints(include=((A, B), (B, C)))
    assert constrained(rows, unordered)[0].tokens == [A, B, C]
    ordered = replace(unordered, ordered=True)
    assert constrained(rows, ordered)[0].tokens == [A, B, C, B, C] == optimum(rows, ordered)[0]


def test_overlapping_constraints_fit_where_separate_ones_would_not():
    # 4 constraint tokens in 3 output tokens: only [A B C] has both phrases
    cfg = replace(CFG, max_len_b=3)
    hyps = constrained(T1, Constraints(include=((A, B), (B, C))), cfg)
    assert hyps[0].tokens == [A, B, C] and hyps[0].unmet == 0


# [B] 0.4; [A C D E] .6 * .5 * .8 * .9 = .216 (C D in the middle), [A C D] .024, [A B] .18
MIDDLE = {
    (): {A: 0.6, B: 0.4},
    (A,): {C: 0.5, B: 0.3, EOS: 0.2},
    (A, C): {D: 0.8, EOS: 0.2},
    (A, C, D): {E: 0.9, EOS: 0.1},
}


def test_constraint_met_in_the_middle_of_another_hypothesis():
    c = Constraints(include=((C, D),))
    hyps = constrained(MIDDLE, c)
    # the phrase is met on the way, and the hypothesis ends where the model likes
    assert [h.tokens for h in hyps] == [[A, C, D, E], [A, C, D]]
    assert hyps[0].logprob == approx(math.log(0.216))
    assert [h.tokens for h in hyps] == [
        f[0] for f in exhaustive(table(MIDDLE), [A, B, EOS], c, 10)[:2]
    ]


# The model likes [A A A B] (.5832); [A A B] (.162) is the other output with "A A B".
REPEATS = {
    (): {A: 0.9, B: 0.1},
    (A,): {A: 0.9, B: 0.1},
    (A, A): {A: 0.8, B: 0.2},
    (A, A, A): {B: 0.9, EOS: 0.1},
}


def test_a_phrase_found_after_a_false_start():
    # "A A A B" has "A A B" from its second token: after "A A", another A is no match for B,
    # but "A A" still ends the output (a restart from the first token would lose one A)
    for phrase in ((A, A, B), (A, B), (A, A, A, B)):
        hyps = constrained(REPEATS, Constraints(include=(phrase,)))
        assert hyps[0].tokens == [A, A, A, B] and hyps[0].unmet == 0
        assert hyps[0].logprob == approx(math.log(0.5832))


def test_an_unmeetable_constraint_is_reported():
    cfg = replace(CFG, max_len_b=2)  # 3 tokens cannot fit in 2
    c = Constraints(include=((C, A, B), (A,)))
    hyps = constrained(T1, c, cfg)
    assert hyps  # the output still comes back, at the maximum length, saying what it lacks
    # step 0 keeps A (bank 1: it has (A,)) and D (the best of bank 0, second in the round
    # robin) over C (bank 1's second); step 1 [A C] (bank 2) and [A B] (bank 1) over [D] EOS
    # (bank 0, stuck: the table has only EOS after D); both end at the maximum length
    assert [h.tokens for h in hyps] == [[A, B], [A, C]]
    assert [h.unmet for h in hyps] == [1, 1] == [lacking(h.tokens, c) for h in hyps]
    # a token the model never produces (probability 0): the hypotheses end when they are stuck
    hyps = constrained(T1, Constraints(include=((E,),)), replace(CFG, beam=3), nbest=3)
    assert len(hyps) == 3 and all(h.unmet == 1 for h in hyps)
    assert all(h.logprob > -math.inf for h in hyps)
    # a hypothesis ends only when EOS is all it has left: [A B] goes on to [A B C] (.03),
    # [D] (.2) and [A C] (.15) end at once
    assert [h.tokens for h in hyps] == [[D], [A, C], [C, A, B]]


# [A B] .42, [A C] .18, [B A] .14, [B A B] .14 (the second by index), [B] .12
T2 = {
    (): {A: 0.6, B: 0.4},
    (A,): {B: 0.7, C: 0.3},
    (B,): {EOS: 0.3, A: 0.7},
    (B, A): {B: 0.5, EOS: 0.5},
}


@pytest.mark.parametrize(
    "avoid,expected",
    [
        (((A,),), [B]),  # a single token, the argmax at the first step
        (((B,),), [A, C]),  # the argmax at the second step
        (((A, B),), [A, C]),  # a phrase: A is fine, A B is not, also as in [B A B]
        (((B, A), (C,)), [A, B]),  # not in the way: the plain best
        (((A, B), (A, C)), [B, A]),
    ],
)
def test_avoid_lists(avoid, expected):
    c = Constraints(avoid_text=avoid_ids(avoid))
    hyps = constrained(T2, c, nbest=2)
    assert hyps[0].tokens == expected == optimum(T2, c)[0]
    assert not any(has_avoided(h.tokens, c) for h in hyps)


def test_prefix_longer_than_the_greedy_output():
    c = Constraints(prefix=(C, A, B))
    hyps = constrained(T1, c)
    assert [h.tokens for h in hyps] == [[C, A, B]]  # the only output that starts so
    assert hyps[0].positional_scores == [approx(math.log(x)) for x in (0.3, 0.4, 0.3, 1.0)]
    # the search goes on after the prefix; here [C] .18 beats [C A] .084
    assert constrained(T1, Constraints(prefix=(C,)))[0].tokens == [C]
    # a prefix counts toward the phrases to include
    assert constrained(T1, Constraints(include=((A,), (C,)), prefix=(C,)))[0].tokens == [C, A]
    # an avoided phrase may not end right after the prefix either
    c = Constraints(prefix=(A,), avoid_text=avoid_ids([(A, B)]))
    assert constrained(T2, c)[0].tokens == [A, C]
    # the forced tokens keep their model log-probs, whatever the token rules say
    hyps = constrained(T1, Constraints(prefix=(C, A)), replace(CFG, min_len=3))
    assert hyps[0].tokens == [C, A, B] and hyps[0].logprob == approx(math.log(0.036))


def test_prefix_is_cut_at_the_maximum_length():
    hyps = constrained(T1, Constraints(prefix=(C, A, B)), replace(CFG, max_len_b=2))
    assert hyps[0].tokens == [C, A]


def test_nbest_with_constraints():
    cfg = DecodeConfig(beam=4, lenpen_style="length", lenpen=1.0, max_len_a=1.0, max_len_b=4)
    c = Constraints(include=((B, C), (E,)), avoid_text=avoid_ids([(A, A)]))
    src = src_batch([A, B, C, EOS])
    hyps = beam_search(FakeModel(random_logprobs), src, cfg, nbest=4, **IDS, constraints=[c])[0]
    assert len(hyps) == 4 and len({tuple(h.tokens) for h in hyps}) == 4
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    for h in hyps:
        assert h.unmet == lacking(h.tokens, c) == 0 and not has_avoided(h.tokens, c)


# ------------------------------------------------------------------ properties on random models


def random_constraints(rng, avoid_tokens):
    """A sentence's constraints: phrases to include over A B C, to avoid over `avoid_tokens`,
    sometimes a prefix, sometimes none at all."""
    if rng.random() < 0.2:
        return None

    def phrases(tokens, most, longest):
        return tuple(
            tuple(rng.choice(tokens) for _ in range(rng.randint(1, longest)))
            for _ in range(rng.randint(0, most))
        )

    prefix = (
        tuple(rng.choice(CONTENT) for _ in range(rng.randint(0, 3))) if rng.random() < 0.3 else ()
    )
    return Constraints(
        include=phrases((A, B, C), 3, 3),
        ordered=rng.random() < 0.4,
        avoid_text=avoid_ids(phrases(avoid_tokens, 2, 2)),
        prefix=prefix,
    )


def check(src, constraints, hyps, cfg, model, guaranteed):
    max_out = max_output_lengths((src != IDS["pad"]).sum(1), cfg, None).tolist()
    for i, (c, hs) in enumerate(zip(constraints, hyps, strict=True)):
        c = c or Constraints()
        assert hs and len({tuple(h.tokens) for h in hs}) == len(hs)
        assert [(h.unmet, -h.score) for h in hs] == sorted((h.unmet, -h.score) for h in hs)
        for h in hs:
            assert h.unmet == lacking(h.tokens, c)
            assert not has_avoided(h.tokens, c)
            n = min(len(c.prefix), max_out[i])
            assert h.tokens[:n] == list(c.prefix[:n])
            assert len(h.tokens) <= max_out[i]
            if h.unmet:
                assert len(h.tokens) == max_out[i]  # only the maximum length ends it unmet
            forced = teacher_forced(model, src[i : i + 1], h.tokens)
            assert h.positional_scores == [approx(x) for x in forced]
        if guaranteed and len(c.prefix) + sum(map(len, c.include)) <= max_out[i]:
            assert hs[0].unmet == 0, (c, hs[0])


@pytest.mark.parametrize("seed", range(30))
def test_random_constraints(seed):
    """Random models, decode settings and constraints, 4 sentences: with avoided tokens apart
    from the phrases to include, every phrase appears whenever the phrases (and the prefix)
    fit in the length limit; with any avoided phrases, none appears; batch 1 = batch N."""
    rng = random.Random(seed)
    guaranteed = seed % 2 == 0
    cfg = DecodeConfig(
        beam=rng.randint(1, 4),
        lenpen_style=rng.choice(["none", "length", "gnmt"]),
        lenpen=rng.choice([0.0, 0.6, 1.0]),
        max_len_a=rng.choice([0.0, 1.0]),
        max_len_b=rng.randint(2, 6),
        min_len=rng.randint(0, 2),
    )
    sources = rng.sample(SOURCES, 4)
    avoid_tokens = (D, E, F) if guaranteed else CONTENT
    constraints = [random_constraints(rng, avoid_tokens) for _ in sources]
    src = src_batch(*sources)
    model = FakeModel(random_logprobs)
    hyps = beam_search(model, src, cfg, nbest=cfg.beam, **IDS, constraints=constraints)
    check(src, constraints, hyps, cfg, model, guaranteed)
    for sentence, c, batched in zip(sources, constraints, hyps, strict=True):
        alone = beam_search(
            model, src_batch(sentence), cfg, nbest=cfg.beam, **IDS, constraints=[c]
        )[0]
        assert alone == batched


def test_batch_of_constrained_and_unconstrained_sentences():
    cfg = DecodeConfig(beam=3, lenpen_style="length", lenpen=1.0, max_len_a=1.0, max_len_b=3)
    constraints = [
        Constraints(include=((C, D),)),
        None,
        Constraints(avoid_text=avoid_ids([(A,)]), prefix=(F, F)),
        Constraints(include=((E,), (A, B)), ordered=True),
        Constraints(),
    ]
    src = src_batch(*SOURCES)
    batched = beam_search(
        FakeModel(random_logprobs), src, cfg, nbest=3, **IDS, constraints=constraints
    )
    for sentence, c, hyps in zip(SOURCES, constraints, batched, strict=True):
        alone = src_batch(sentence)
        assert (
            hyps
            == beam_search(FakeModel(random_logprobs), alone, cfg, nbest=3, **IDS, constraints=[c])[
                0
            ]
        )
        if (
            c is None or c.is_empty()
        ):  # the plain search's result, although batched with constraints
            assert hyps == beam_search(FakeModel(random_logprobs), alone, cfg, nbest=3, **IDS)[0]
    check(src, constraints, batched, cfg, FakeModel(random_logprobs), True)


def test_bfloat16_model_and_sentences_leaving_the_batch():
    # different maximum lengths: sentences leave the batch while others decode on
    cfg = DecodeConfig(beam=2, lenpen_style="none", max_len_a=1.0, max_len_b=0)
    src = src_batch([A, EOS], [A, B, C, D, E, EOS], [B, C, EOS])
    constraints = [
        Constraints(include=((F,),)),
        Constraints(include=((A, B, C),), avoid_text=avoid_ids([(D,)])),
        None,
    ]
    model = FakeModel(random_logprobs, torch.bfloat16)
    hyps = beam_search(model, src, cfg, nbest=2, **IDS, constraints=constraints)
    check(src, constraints, hyps, cfg, model, True)


# ------------------------------------------------------------ what is asked, and memory (issue 33)


def tensor_elements(obj, seen=None):
    """The elements of every tensor `obj` holds (attributes, lists, dicts), each tensor once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(tensor_elements(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_elements(v, seen) for v in obj)
    return (
        sum(tensor_elements(v, seen) for v in vars(obj).values()) if hasattr(obj, "__dict__") else 0
    )


def test_the_tracker_tables_grow_linearly_with_the_phrases():
    """One long phrase and many one-token ones, to include and to avoid: twice as many tokens
    asked take about twice the memory (padding every phrase to the longest, or a table of
    prefix pairs per phrase, took 4 to 8 times as much)."""

    def elements(n):
        long = tuple([A, B] * (n // 2))
        text = AvoidText((b"st" * (n // 2), *[b"a"] * n), SURFACES)
        c = Constraints(include=(long, *[(C,)] * n), avoid_text=text)
        return tensor_elements(ConstraintTracker.build([c], 1, EOS, torch.device("cpu")))

    assert elements(400) <= 2.2 * elements(200)


def test_the_candidate_pool_does_not_grow_with_the_phrases():
    """Post & Vilar's pool holds each row's next token of every phrase it works on, and every
    candidate a state of every phrase: with hundreds of phrases, memory quadratic in them. A
    row offers at most k tokens of its phrases (a step keeps at most k candidates of a
    sentence): the pool of 500 phrases is that of 2k."""
    vocab, k = 600, 6
    lprobs = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0)).log_softmax(1)
    pools = []
    for m in (2 * k, 500):
        cons = ConstraintTracker.build(
            [Constraints(include=[(4 + i,) for i in range(m)])], 1, EOS, torch.device("cpu")
        )
        masked = lprobs.clone()
        blocked = cons.block_(masked, None, None)
        scores, index, state = cons.candidates(masked, torch.zeros(1, 1), k, blocked)
        pools.append(index.size(1))
        # the likeliest tokens of the phrases are still offered
        best = (lprobs[0, 4 : 4 + m].topk(k).indices + 4).tolist()
        assert set(best) <= set(index[0].tolist())
    assert pools[0] == pools[1]


def test_min_length_is_a_lower_bound_of_every_output_holding_the_phrases():
    """Over random phrases: the shortest token sequence that holds them all (a brute force over
    the tokens they use) is never shorter than `min_length`."""
    rng = random.Random(3)
    for _ in range(60):
        include = tuple(
            tuple(rng.choice((A, B, C)) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 4))
        )
        c = Constraints(include=include, ordered=rng.random() < 0.5)
        shortest = next(
            n
            for n in range(1, 13)
            if any(lacking(list(t), c) == 0 for t in itertools.product((A, B, C), repeat=n))
        )
        assert c.min_length() <= shortest, (c, shortest)


# A fake vocabulary's text (pad, unk, bos, eos, then A..F): "stand" is s+t+and, st+and, s+t+a+nd ...
SURFACES = Surfaces([b"", " \u2047 ".encode(), b"", b"", b"s", b"t", b"st", b"and", b"a", b"nd"])

# [C D] "st"+"and" .42 (the plain best), [A B D] "s"+"t"+"and" .288, [C] "st" .18, [A B E F] .0648
STAND = {
    (): {C: 0.6, A: 0.4},
    (C,): {D: 0.7, EOS: 0.3},
    (A,): {B: 0.9, EOS: 0.1},
    (A, B): {D: 0.8, E: 0.2},
    (A, B, E): {F: 0.9, EOS: 0.1},
}


def avoiding(*texts, **kw):
    return Constraints(avoid_text=AvoidText(tuple(texts), SURFACES), **kw)


def test_an_avoided_text_is_avoided_however_it_is_spelled():
    assert constrained(STAND, Constraints(), BEAM3)[0].tokens == [C, D]
    # [A B D] spells "stand" too
    assert SURFACES.text([A, B, D]) == b"stand"
    # the text: no spelling of it; "st" .18 is the best output that lacks it
    assert constrained(STAND, avoiding(b"stand"), BEAM3)[0].tokens == [C]
    # inside a token ("n" in "and") or across tokens ("ta" in "st"+"and")
    assert constrained(STAND, avoiding(b"n"), BEAM3)[0].tokens == [C]
    assert constrained(STAND, avoiding(b"ta"), BEAM3)[0].tokens == [C]


@pytest.mark.parametrize("seed", range(20))
def test_an_avoided_text_never_appears_in_any_output(seed):
    """Random models, settings and texts over the fake vocabulary: no hypothesis' text holds an
    avoided text, whatever its tokens; scores are the model's; batch 1 = batch N. The same
    settings without them write them (counted over all seeds in the next test)."""
    rng = random.Random(seed)
    cfg = DecodeConfig(
        beam=rng.randint(1, 4),
        lenpen_style=rng.choice(["none", "length"]),
        lenpen=1.0,
        max_len_a=0.0,
        max_len_b=rng.randint(3, 8),
        min_len=rng.randint(0, 3),
    )
    texts = tuple(rng.sample([b"stand", b"ta", b"ts", b"nda", b"s", b"and", b"tt", b"dst"], 2))
    sources = rng.sample(SOURCES, 4)
    constraints = [avoiding(*texts, include=((C,),) if rng.random() < 0.3 else ()) for _ in sources]
    model = FakeModel(random_logprobs)
    hyps = beam_search(
        model, src_batch(*sources), cfg, nbest=cfg.beam, **IDS, constraints=constraints
    )
    for sentence, c, hs in zip(sources, constraints, hyps, strict=True):
        assert hs
        for h in hs:
            assert not any(t in SURFACES.text(h.tokens) for t in texts), (
                texts,
                SURFACES.text(h.tokens),
            )
            assert h.positional_scores == [
                approx(x) for x in teacher_forced(model, src_batch(sentence), h.tokens)
            ]
        assert (
            beam_search(model, src_batch(sentence), cfg, nbest=cfg.beam, **IDS, constraints=[c])[0]
            == hs
        )


def test_the_plain_search_writes_what_the_previous_test_avoids():
    written = 0
    for seed in range(20):
        rng = random.Random(seed)
        cfg = DecodeConfig(
            beam=rng.randint(1, 4),
            lenpen_style=rng.choice(["none", "length"]),
            lenpen=1.0,
            max_len_a=0.0,
            max_len_b=rng.randint(3, 8),
            min_len=rng.randint(0, 3),
        )
        texts = tuple(rng.sample([b"stand", b"ta", b"ts", b"nda", b"s", b"and", b"tt", b"dst"], 2))
        hyps = beam_search(
            FakeModel(random_logprobs),
            src_batch(*rng.sample(SOURCES, 4)),
            cfg,
            nbest=cfg.beam,
            **IDS,
        )
        written += sum(any(t in SURFACES.text(h.tokens) for t in texts) for hs in hyps for h in hs)
    assert written >= 20
