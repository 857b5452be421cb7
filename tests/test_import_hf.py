"""`nmt import` of Hugging Face MarianMT folders, checked against transformers itself.

The folders are tiny random models that transformers writes (tests/hf_marian.py), one per
`Variant`: each activation OPUS-MT models use, separate source/target embeddings, an untied
output projection, `</s>` at an id other than 0, pytorch_model.bin, a zero pad row. Each is
imported with the real command line (`nmt import`), and then:

- tokenization: `encode` / `encode_target` / `decode` give MarianTokenizer's ids and text;
- forced decoding: every token's log-probability is MarianMTModel's (log_softmax of its logits,
  the decoder fed the labels as transformers shifts them), batched with padding on both sides;
- search: greedy and beam outputs, n-best lists and their scores are `model.generate`'s, with
  settings that mean the same on both sides (`hf_generate`, which documents the mapping);
- the rest of nmt on an imported model: n-best, sampling, alignments and attention (against
  transformers' cross-attentions), int8, batch independence, averaging, CTranslate2 export
  (and CTranslate2's own converter of the same folder);
- refusals: what cannot be mapped, or must not be loaded, is one `nmt: error:` line.

transformers is a dev dependency (`pip install -e ".[dev]"`, which `make test` runs), so it is
imported, not skipped for; ctranslate2 likewise.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ctranslate2 as ct2
import numpy as np
import pytest
import safetensors.torch
import torch
from helpers import nmt_here
from hf_marian import LANGUAGE_TOKENS, VARIANTS, Variant, train_spm_pair, write_hf_marian
from transformers import LogitsProcessor, LogitsProcessorList, MarianMTModel, MarianTokenizer
from transformers import logging as hf_logging

from nmt import Translator
from nmt.checkpoint import load_checkpoint
from nmt.decoding.predict import score_token_lists

pytestmark = [
    pytest.mark.usefixtures("one_thread", "restore_logging"),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning"),
]  # a refusal's test data

LOGPROB_TOL = 1e-4  # per-token log-probabilities, nmt vs transformers (observed: below 1e-5)
MAX_OUT = 24  # tokens before </s>, both sides (`hf_generate`)
NEAR_TIE = 1e-4  # two searches may part only where their best scores are this close


# ------------------------------------------------------------ the models, made once for the module


@pytest.fixture(scope="module")
def sentences(raw_corpus) -> tuple[list[str], list[str]]:
    """Source and target lines of different lengths (Multi30k's test split, or the synthetic
    corpus), one source with a target-language token."""
    src, tgt = raw_corpus.lines("test", "en")[:7], raw_corpus.lines("test", "de")[:7]
    src[3] = f"{LANGUAGE_TOKENS[0]} {src[3]}"
    return src, tgt


class Models:
    """Folders, transformers models and imported checkpoints, each made once for the module."""

    def __init__(self, raw_corpus: Any, factory: pytest.TempPathFactory):
        self.factory = factory
        self.spm = train_spm_pair(
            raw_corpus.lines("train", "en"),
            raw_corpus.lines("train", "de"),
            factory.mktemp("hf-spm"),
        )
        self._folders: dict[Variant, Path] = {}
        self._hf: dict[Variant, tuple[MarianMTModel, MarianTokenizer]] = {}
        self._checkpoints: dict[Variant, Path] = {}

    def folder(self, variant: Variant) -> Path:
        if variant not in self._folders:
            self._folders[variant] = write_hf_marian(
                self.factory.mktemp("hf-marian"), variant, *self.spm
            )
        return self._folders[variant]

    def hf(self, variant: Variant) -> tuple[MarianMTModel, MarianTokenizer]:
        if variant not in self._hf:
            folder = self.folder(variant)
            model = MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
            self._hf[variant] = model, MarianTokenizer.from_pretrained(folder)
        return self._hf[variant]

    def checkpoint(self, variant: Variant) -> Path:
        """The folder through the real command line: `nmt import FOLDER -o CHECKPOINT`."""
        if variant not in self._checkpoints:
            out = self.factory.mktemp("imported") / "model.pt"
            assert nmt_here("import", str(self.folder(variant)), "-o", str(out)) == 0
            self._checkpoints[variant] = out
        return self._checkpoints[variant]


@pytest.fixture(scope="module")
def models(raw_corpus, tmp_path_factory) -> Any:
    """The module's `Models`; transformers' info messages and progress bars off meanwhile."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    yield Models(raw_corpus, tmp_path_factory)
    hf_logging.set_verbosity(verbosity)
    hf_logging.enable_progress_bar()


def translator(models: Models, variant: Variant, **options: Any) -> Translator:
    """nmt's own search, as generate() searches: that CTranslate2's finds the same is
    tests/test_engine.py's to show, its log-probs within ~1e-3 a token of torch's."""
    options.setdefault("engine", "torch")
    return Translator.load(models.checkpoint(variant), device="cpu", **options)


# ------------------------------------------------------------------ tokenization


@pytest.mark.parametrize(
    "name",
    [
        "swish",
        "eos not 0, separate embeddings, untied output",
        "separate vocabularies, untied output",
    ],
)
def test_tokenization_equals_marian_tokenizer(models, sentences, name):
    """MarianTokenizer appends </s>, nmt's encode does not (the model adds it). Unknown
    characters are <unk> on both sides; a leading >>fra<< is one token. Decoding skips the
    special tokens (MarianTokenizer's skip_special_tokens) with the target model
    (use_source_tokenizer=False)."""
    _, hf_tok = models.hf(VARIANTS[name])
    tok = translator(models, VARIANTS[name]).loaded.tokenizer
    eos = tok.specials.eos
    assert hf_tok.eos_token_id == eos and hf_tok.unk_token_id == tok.specials.unk
    src, tgt = sentences
    unknown = "Ein Mann mit € und ☃ vor 你好."
    sources = [
        *src,
        f"{LANGUAGE_TOKENS[1]} {src[0]}",
        f"{LANGUAGE_TOKENS[0]}{src[1]}",
        unknown,
        "",
        "  two   spaces ",
    ]
    for text in sources:
        assert tok.encode(text) + [eos] == hf_tok(text)["input_ids"], text
    assert tok.encode(unknown).count(tok.specials.unk) >= 3
    assert tok.encode(f"{LANGUAGE_TOKENS[0]} {src[1]}")[0] == hf_tok.convert_tokens_to_ids(
        LANGUAGE_TOKENS[0]
    )
    for text in [*tgt, unknown, ""]:
        ids = hf_tok(text_target=text)["input_ids"]
        assert tok.encode_target(text) + [eos] == ids, text
        if (
            tok.specials.unk not in ids
        ):  # MarianTokenizer drops <unk> (a special token), nmt shows " ⁇ "
            assert tok.decode(ids) == hf_tok.decode(
                ids, skip_special_tokens=True, use_source_tokenizer=False
            )
    assert tok.decode(tok.encode_target(tgt[0])) == tgt[0]


# ------------------------------------------------------------------ forced decoding


def hf_log_probs(
    model: MarianMTModel, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """transformers' log-probabilities (T + 1, V) at each target token and the final </s>,
    one padded batch: sources end in </s> and are padded with pad (attention_mask 0 there);
    labels are padded with -100, which MarianMTModel shifts right behind
    decoder_start_token_id (pad) to make the decoder's input."""
    cfg = model.config
    srcs = [[*s, cfg.eos_token_id] for s in sources]
    labels = [[*t, cfg.eos_token_id] for t in targets]
    width, steps = max(map(len, srcs)), max(map(len, labels))
    input_ids = torch.tensor([s + [cfg.pad_token_id] * (width - len(s)) for s in srcs])
    label_ids = torch.tensor([t + [-100] * (steps - len(t)) for t in labels])
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            attention_mask=(input_ids != cfg.pad_token_id).long(),
            labels=label_ids,
        ).logits
    lprobs = torch.log_softmax(logits.float(), -1)
    return [lprobs[i, : len(t)] for i, t in enumerate(labels)]


def hf_token_log_probs(
    model: MarianMTModel, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> list[list[float]]:
    """transformers' log-probability of each target token and the final </s> (`hf_log_probs`)."""
    eos = model.config.eos_token_id
    return [
        lp.gather(1, torch.tensor([*t, eos]).unsqueeze(1)).squeeze(1).tolist()
        for lp, t in zip(hf_log_probs(model, sources, targets), targets, strict=True)
    ]


@pytest.mark.parametrize("name", VARIANTS)
def test_forced_decoding_equals_transformers(models, sentences, name):
    """Every variant: the per-token log-probs of nmt's forced decoding (score_token_lists, the
    path of `Translator.score`, one batch of sources and targets of different lengths) and the
    sentence scores `Translator.score` prints are transformers'."""
    variant = VARIANTS[name]
    hf, _ = models.hf(variant)
    tr = translator(models, variant)
    tok = tr.loaded.tokenizer
    src, tgt = sentences
    sources, targets = [tok.encode(s) for s in src], [tok.encode_target(t) for t in tgt]
    assert (
        len({len(s) for s in sources}) > 3 and len({len(t) for t in targets}) > 3
    )  # padding on both sides
    ours = score_token_lists(tr.loaded.model, sources, targets, tr.decode, specials=tok.specials)
    theirs = hf_token_log_probs(hf, sources, targets)
    diff = max(
        abs(a - b) for o, t in zip(ours, theirs, strict=True) for a, b in zip(o, t, strict=True)
    )
    assert all(len(o) == len(t) for o, t in zip(ours, theirs, strict=True))
    assert diff < LOGPROB_TOL, f"{name}: max |log-prob difference| {diff:.2e}"
    totals = tr.score(src, tgt)
    assert totals == pytest.approx([sum(t) for t in theirs], abs=LOGPROB_TOL * 10)
    print(f"\n{name}: max |log-prob difference| {diff:.2e} over {sum(map(len, theirs))} tokens")


# ------------------------------------------------------------------ search


class EosAtMaxLength(LogitsProcessor):
    """nmt's rule at an output's length limit: only </s> may follow, with its own log-prob.
    (transformers' forced_eos_token_id also forces </s> there, but gives it log-prob 0,
    which would re-rank the hypotheses that reach the limit.)"""

    def __init__(self, eos: int, max_length: int):
        self.eos, self.max_length = eos, max_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] == self.max_length - 1:  # the start token and MAX_OUT tokens
            keep = scores[:, self.eos].clone()
            scores[:] = -math.inf
            scores[:, self.eos] = keep
        return scores


def hf_generate(
    model: MarianMTModel,
    tokenizer: MarianTokenizer,
    text: str,
    beam: int,
    style: str,
    nbest: int = 1,
) -> list[tuple[str, float]]:
    """`model.generate` of one source with the settings that mean nmt's (`nmt_settings`), the
    `nbest` best (text, score) pairs, best first.

    How transformers (5.x, GenerationMixin._beam_search) scores and stops, and nmt's equal:
    - each step log_softmaxes the logits and then applies the processors; a hypothesis'
      score is its summed log-prob (</s> included) divided by (generated length, </s>
      included)^length_penalty: nmt's `length` style, |Y| = tokens + </s>, alpha = lenpen;
      length_penalty 0 is nmt's `none`;
    - the top 2*beam continuations are taken, those ending in </s> among the top `beam` are
      finished, the best `beam` others continue: nmt's step, which follows fairseq;
    - early_stopping=True stops a sentence once `beam` hypotheses are finished, which is
      nmt's rule for alpha > 0; with length_penalty 0, early_stopping=False stops once the
      best live log-prob cannot beat the beam-th finished score, nmt's exact rule for `none`;
    - num_beams=1 is the argmax, as nmt's beam 1;
    - nmt never produces pad (the decoder's start token too) or <unk>: suppress_tokens;
      min_new_tokens=1 is nmt's min_len 1 (no empty output);
    - length: nmt allows MAX_OUT tokens (max_len_a 0, max_len_b MAX_OUT), then only </s> with
      its model log-prob: max_new_tokens MAX_OUT + 1 with `EosAtMaxLength` in place of
      forced_eos_token_id (see there).
    """
    cfg = model.config
    # generate() fills what its generation_config leaves None from the model's own, which has
    # forced_eos_token_id: the model's is swapped for the while
    saved, model.generation_config = model.generation_config, copy.deepcopy(model.generation_config)
    model.generation_config.forced_eos_token_id = None
    max_new = MAX_OUT + 1
    length_penalty, early_stopping = {"length": (1.0, True), "none": (0.0, False)}[style]
    inputs = tokenizer([text], return_tensors="pt")
    try:
        with torch.no_grad():
            out = model.generate(
                **inputs,
                num_beams=beam,
                do_sample=False,
                num_return_sequences=nbest,
                length_penalty=length_penalty,
                early_stopping=early_stopping if beam > 1 else False,
                max_new_tokens=max_new,
                min_new_tokens=1,
                suppress_tokens=[cfg.pad_token_id, tokenizer.unk_token_id],
                logits_processor=LogitsProcessorList(
                    [EosAtMaxLength(cfg.eos_token_id, 1 + max_new)]
                ),
                output_scores=True,
                output_logits=True,
                return_dict_in_generate=True,
            )
    finally:
        model.generation_config = saved
    texts = tokenizer.batch_decode(
        out.sequences, skip_special_tokens=True, use_source_tokenizer=False
    )
    if beam == 1:  # greedy: the chosen tokens' log-probs, from the logits before the processors
        steps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.logits], 1)[0]  # (T, V)
        tokens = out.sequences[0, 1 : 1 + steps.size(0)]
        total = steps.gather(1, tokens.unsqueeze(1)).sum().item()
        return [(texts[0], total / (len(tokens) ** length_penalty))]
    return list(zip(texts, out.sequences_scores.tolist(), strict=True))


def nmt_settings(beam: int, style: str) -> dict[str, Any]:
    return {
        "beam": beam,
        "lenpen": 1.0,
        "lenpen_style": style,
        "max_len_a": 0.0,
        "max_len_b": MAX_OUT,
        "min_len": 1,
    }


def assert_same_search(
    ours: Sequence[Sequence[Any]], theirs: Sequence[Sequence[tuple[str, float]]], what: str
) -> int:
    """n-best lists equal in score at each place and in text, but where the two
    implementations' last-bit differences may reorder a near-tie (NEAR_TIE): a sentence whose
    best outputs differ must have best scores that close, two hypotheses may trade places only
    if one of them scores that close to another (or sits last, tying with one not returned).
    Returns how many sentences' best outputs differ."""
    parted = 0
    for i, (o, t) in enumerate(zip(ours, theirs, strict=True)):
        if o[0].text != t[0][0]:
            assert abs(o[0].score - t[0][1]) < NEAR_TIE, (what, i, o[0], t[0])
            parted += 1
            continue
        scores = [h.score for h in o]
        assert scores == pytest.approx([s for _, s in t], abs=LOGPROB_TOL), (what, i)
        for k, (h, (text, _)) in enumerate(zip(o, t, strict=True)):
            if h.text != text:
                tied = [j for j, s in enumerate(scores) if j != k and abs(s - scores[k]) < NEAR_TIE]
                assert tied or k == len(o) - 1, (what, i, k, h.text, text)
    return parted


SEARCHES = [(1, "length"), (4, "length"), (4, "none")]


def check_search(
    models: Models, sentences: tuple[list[str], list[str]], name: str, beam: int, style: str
) -> None:
    variant = VARIANTS[name]
    hf, hf_tok = models.hf(variant)
    src = sentences[0]
    nbest = beam
    tr = translator(models, variant, **nmt_settings(beam, style))
    ours = tr.translate_nbest(src, nbest=nbest)  # one batch: the sources padded to the longest
    theirs = [hf_generate(hf, hf_tok, text, beam, style, nbest=nbest) for text in src]
    parted = assert_same_search(ours, theirs, f"{name}, beam {beam}, {style}")
    assert parted <= 1, f"{parted} of {len(src)} outputs differ"
    if (
        name == "swish" and beam > 1
    ):  # the fixture's promise: outputs that end on their own, of several lengths
        assert len({len(tr.loaded.tokenizer.encode_target(o[0].text)) for o in ours}) > 1


@pytest.mark.parametrize(("beam", "style"), SEARCHES)
@pytest.mark.parametrize("name", VARIANTS)
def test_search_equals_generate(models, sentences, name, beam, style):
    """Greedy, beam 4 with nmt's default length normalisation, and beam 4 unnormalised
    (exact stopping), every variant: the same outputs, n-best lists and scores."""
    check_search(models, sentences, name, beam, style)


# ------------------------------------------------------------ the rest of nmt on an imported model

FEATURES = "eos not 0, separate embeddings, untied output"  # the least OPUS-like special ids


def test_nbest_batching_and_int8_on_an_imported_model(models, sentences):
    """n-best lists sorted and led by `translate`'s output; batch 1 gives batch N's results;
    an empty line gives "" beside the others; int8 translates and scores close to fp32."""
    variant = VARIANTS[FEATURES]
    src = sentences[0]
    settings = nmt_settings(4, "length")
    tr = translator(models, variant, **settings)
    nbest = tr.translate_nbest(src, nbest=4)
    assert all(len(hyps) == 4 for hyps in nbest)
    for hyps in nbest:
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True) and len({h.text for h in hyps}) > 1
    assert tr.translate(src) == [hyps[0].text for hyps in nbest]
    one = translator(models, variant, batch_size=1, **settings).translate_nbest(src, nbest=4)
    assert [[h.text for h in hs] for hs in one] == [[h.text for h in hs] for hs in nbest]
    assert [h.score for hs in one for h in hs] == pytest.approx(
        [h.score for hs in nbest for h in hs], abs=1e-5
    )
    assert tr.translate(["", *src[:2]]) == ["", *tr.translate(src[:2])]

    int8 = translator(models, variant, precision="int8", **settings)
    out = int8.translate(src)
    assert len(out) == len(src) and all(out)
    fp32, q = (
        tr.score(src, out),
        int8.score(src, out),
    )  # int8 scores within 2% of fp32's (observed: < 1%)
    assert all(
        math.isfinite(a) and abs(a - b) < 0.02 * abs(a) + 0.25 for a, b in zip(fp32, q, strict=True)
    ), (fp32, q)


def test_sampling_on_an_imported_model(models, sentences):
    """Sampling repeats with its seed whatever the batching, changes with it, and with
    topk 1 is greedy search."""
    variant = VARIANTS[FEATURES]
    src = sentences[0]
    settings = {"max_len_a": 0.0, "max_len_b": MAX_OUT}
    first = translator(models, variant, sampling=True, seed=5, **settings).translate(src)
    again = translator(models, variant, sampling=True, seed=5, batch_size=2, **settings).translate(
        src
    )
    other = translator(models, variant, sampling=True, seed=6, **settings).translate(src)
    assert first == again and first != other and all(first)
    greedy = translator(models, variant, beam=1, **settings).translate(src)
    assert (
        translator(models, variant, sampling=True, topk=1, seed=9, **settings).translate(src)
        == greedy
    )


def test_alignment_and_attention_equal_transformers_cross_attention(models, sentences):
    """The attention nmt reports (per decoder layer and head) is transformers' cross-attention
    of the same teacher-forced output; the hard alignment indexes the pieces."""
    variant = VARIANTS[FEATURES]
    hf, _ = models.hf(variant)
    tr = translator(models, variant, beam=2, max_len_a=0.0, max_len_b=MAX_OUT)
    tok = tr.loaded.tokenizer
    src = sentences[0][:4]
    results = [hyps[0] for hyps in tr.translate_nbest(src, alignment=True, attention=True)]
    ids = {tok.piece(i): i for i in range(tok.vocab_size)}
    for text, t in zip(src, results, strict=True):
        att = t.attention
        source, target = tok.encode(text), [ids[p] for p in att.target[:-1]]
        assert (
            att.source == [tok.piece(i) for i in [*source, tok.specials.eos]]
            and att.target[-1] == "</s>"
        )
        assert tok.decode(target) == t.text
        assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)
        assert t.alignment and all(
            0 <= i < len(source) and 0 <= j < len(target) for i, j in t.alignment
        )
        with torch.no_grad():
            out = hf(
                input_ids=torch.tensor([[*source, tok.specials.eos]]),
                labels=torch.tensor([[*target, tok.specials.eos]]),
                output_attentions=True,
            )
        theirs = torch.stack([a[0] for a in out.cross_attentions]).numpy()  # (L, H, T, S)
        assert np.abs(att.weights - theirs).max() < 1e-5


def average(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        k: (a[k].double() + b[k].double()).div(2).to(a[k].dtype)
        if a[k].is_floating_point()
        else a[k]
        for k in a
    }


def test_average_checkpoints_of_two_imports(models, sentences, tmp_path):
    """Two imports of one architecture and vocabulary (other seeds): `nmt average-checkpoints`
    gives the mean weights, which compute what MarianMTModel with the mean weights computes."""
    a, b = (replace(VARIANTS["swish"], seed=s) for s in (11, 12))
    out = tmp_path / "avg.pt"
    assert (
        nmt_here(
            "average-checkpoints",
            str(models.checkpoint(a)),
            str(models.checkpoint(b)),
            "-o",
            str(out),
        )
        == 0
    )
    ca, cb, avg = (load_checkpoint(p) for p in (models.checkpoint(a), models.checkpoint(b), out))
    assert avg["tokenizer"] == ca["tokenizer"]
    for key, value in avg["model"].items():
        assert torch.allclose(value, (ca["model"][key] + cb["model"][key]) / 2, atol=1e-6), key
    hf = copy.deepcopy(models.hf(a)[0])
    hf.load_state_dict(average(models.hf(a)[0].state_dict(), models.hf(b)[0].state_dict()))
    tr = Translator.load(out, device="cpu")
    tok = tr.loaded.tokenizer
    src, tgt = sentences
    sources, targets = [tok.encode(s) for s in src], [tok.encode_target(t) for t in tgt]
    ours = score_token_lists(tr.loaded.model, sources, targets, tr.decode, specials=tok.specials)
    theirs = hf_token_log_probs(hf, sources, targets)
    assert (
        max(
            abs(x - y) for o, t in zip(ours, theirs, strict=True) for x, y in zip(o, t, strict=True)
        )
        < LOGPROB_TOL
    )


# ------------------------------------------------------------------ CTranslate2


def ct2_greedy_and_scores(
    model_dir: Path,
    piece_ids: dict[str, int],
    sources: Sequence[Sequence[str]],
    targets: Sequence[Sequence[str]],
    **options: Any,
) -> tuple[list[list[int]], list[list[float]]]:
    """CTranslate2's greedy outputs (token ids of `piece_ids`) and forced-decoding log-probs
    (</s> included), with nmt's settings: no <unk>, at most MAX_OUT tokens (CTranslate2 stops
    there, where nmt adds </s>: the same tokens)."""
    translator = ct2.Translator(str(model_dir), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        list(map(list, sources)),
        beam_size=1,
        disable_unk=True,
        max_decoding_length=MAX_OUT,
        max_input_length=0,
        **options,
    )
    outputs = [[piece_ids[p] for p in r.hypotheses[0] if p != "</s>"] for r in results]
    scored = translator.score_batch(list(map(list, sources)), list(map(list, targets)))
    return outputs, [s.log_probs for s in scored]


@pytest.mark.parametrize(
    "name",
    [
        "swish",
        "eos not 0, separate embeddings, untied output",
        "separate vocabularies, untied output",
    ],
)
def test_ctranslate2_export_of_an_import(models, sentences, tmp_path, name):
    """`nmt export` of an imported model: CTranslate2's greedy outputs are nmt's, its
    forced-decoding log-probs nmt's (and so transformers')."""
    variant = VARIANTS[name]
    out = tmp_path / "ct2"
    assert nmt_here("export", str(models.checkpoint(variant)), str(out)) == 0
    assert {"source.spm", "target.spm", "model.bin"} <= {p.name for p in out.iterdir()}
    tr = translator(models, variant, beam=1, max_len_a=0.0, max_len_b=MAX_OUT)
    tok = tr.loaded.tokenizer
    src, tgt = sentences
    sources, targets = [tok.encode(s) for s in src], [tok.encode_target(t) for t in tgt]
    greedy = [hyps[0] for hyps in tr.translate_nbest(src)]
    source_pieces, target_pieces = tok.vocabularies()  # one list, or two (separate vocabularies)
    pieces = [[source_pieces[i] for i in s] for s in sources]
    ids = {p: i for i, p in enumerate(target_pieces)}
    # nmt's search never produces pad (the decoder's start); CTranslate2 has no such rule, so
    # it is told (without, an exported import may emit <pad>: one of these models does, once)
    got, log_probs = ct2_greedy_and_scores(
        out,
        ids,
        pieces,
        [[tok.piece(i) for i in t] for t in targets],
        suppress_sequences=[[tok.piece(tok.specials.pad)]],
    )
    assert [tok.decode(g) for g in got] == [t.text for t in greedy]
    expected = score_token_lists(
        tr.loaded.model, sources, targets, tr.decode, specials=tok.specials
    )
    for g, e in zip(log_probs, expected, strict=True):
        assert g == pytest.approx(e, abs=2e-4)


def test_ctranslate2_own_converter_agrees(models, sentences, tmp_path):
    """CTranslate2's TransformersConverter of the same folder and `nmt export` of its import
    give the same greedy outputs, and log-probs that differ only as documented here.

    Its converter starts the decoder from a zero vector, which is the pad row only where that
    row is zero (as in every model converted from Marian, which has no pad row: hence the
    zero-pad-row variant); it drops the pad row from the vocabulary, so that its softmax
    leaves out the pad token, which transformers' (and nmt's) includes: each of its
    log-probs is transformers' minus log(1 - p(pad)) at that step. Its model expects the
    source's </s> in the input (add_source_eos false), ours adds it."""
    variant = VARIANTS["zero pad row"]
    theirs_dir, ours_dir = tmp_path / "converter", tmp_path / "export"
    ct2.converters.TransformersConverter(str(models.folder(variant))).convert(str(theirs_dir))
    assert nmt_here("export", str(models.checkpoint(variant)), str(ours_dir)) == 0
    tok = translator(models, variant).loaded.tokenizer
    src, tgt = sentences
    sources, targets = [tok.encode(s) for s in src], [tok.encode_target(t) for t in tgt]
    pieces = [[tok.piece(i) for i in s] for s in sources]
    target_pieces = [[tok.piece(i) for i in t] for t in targets]
    ids = {tok.piece(i): i for i in range(tok.vocab_size)}
    ours = ct2_greedy_and_scores(
        ours_dir, ids, pieces, target_pieces, suppress_sequences=[["<pad>"]]
    )
    theirs = ct2_greedy_and_scores(theirs_dir, ids, [[*p, "</s>"] for p in pieces], target_pieces)
    assert ours[0] == theirs[0]
    pad = tok.specials.pad
    for a, b, lp in zip(
        ours[1], theirs[1], hf_log_probs(models.hf(variant)[0], sources, targets), strict=True
    ):
        without_pad = torch.tensor(a) - torch.log1p(-lp[:, pad].exp())
        assert b == pytest.approx(without_pad.tolist(), abs=2e-4)
        assert a != pytest.approx(b, abs=2e-4)  # the difference is there to be explained


# ------------------------------------------------------------------ refusals


def one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nmt: error: ") and "Traceback" not in err, lines
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def edit_config(**changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **changes}))

    return edit


def other_vocabulary(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(share_encoder_decoder_embeddings=False, decoder_vocab_size=cfg["vocab_size"] + 8)
    (folder / "config.json").write_text(json.dumps(cfg))


def corrupt_header(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:8] + b"{not json" + data[17:])


def huge_header(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


def edit_weights(
    change: Callable[[dict[str, torch.Tensor]], None], bin: bool = False
) -> Callable[[Path], None]:
    """Rewrite the folder's weights after `change(state)` (names as the file has them), as
    model.safetensors or, with `bin`, as pytorch_model.bin instead."""

    def edit(folder: Path) -> None:
        state = safetensors.torch.load_file(folder / "model.safetensors")
        change(state)
        if bin:
            (folder / "model.safetensors").unlink()
            torch.save(state, folder / "pytorch_model.bin")
        else:
            safetensors.torch.save_file(
                state, folder / "model.safetensors", metadata={"format": "pt"}
            )

    return edit


def write(name: str, text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text(text)


def not_regular(name: str, kind: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).unlink()
        os.mkfifo(folder / name) if kind == "fifo" else (folder / name).symlink_to("/dev/zero")

    return edit


def safetensors_header(header: Any) -> Callable[[Path], None]:
    data = json.dumps(header).encode()
    return lambda folder: (folder / "model.safetensors").write_bytes(
        struct.pack("<Q", len(data)) + data
    )


Q, K = (
    "model.encoder.layers.0.self_attn.q_proj.weight",
    "model.encoder.layers.0.self_attn.k_proj.weight",
)
D = 40  # hf_marian's d_model
REFUSALS: dict[str, tuple[Callable[[Path], None], str]] = {
    "model_type": (edit_config(model_type="bart"), "model_type 'bart', not marian"),
    "activation": (edit_config(activation_function="tanh"), "activation_function 'tanh'"),
    "decoder_vocab_size": (
        other_vocabulary,
        "separate_vocabs is not true, but config.json's decoder_vocab_size",
    ),
    "separate_vocabs, shared embeddings": (
        write("tokenizer_config.json", '{"separate_vocabs": true}'),
        "separate_vocabs is true, but config.json shares the embeddings",
    ),
    "pre-norm": (edit_config(normalize_before=True), "normalize_before"),
    "no vocab.json": (lambda f: (f / "vocab.json").unlink(), "vocab.json: not found"),
    "no source.spm": (lambda f: (f / "source.spm").unlink(), "source.spm: not found"),
    "no target.spm": (lambda f: (f / "target.spm").unlink(), "target.spm: not found"),
    "no weights": (
        lambda f: (f / "model.safetensors").unlink(),
        "neither model.safetensors nor pytorch_model.bin",
    ),
    "corrupt safetensors header": (
        corrupt_header,
        "model.safetensors: not a readable safetensors file",
    ),
    "safetensors header past the end": (
        huge_header,
        "model.safetensors: not a readable safetensors file",
    ),
    # issue 33, item 6: imported numbers pass nmt's validation; no weight is dropped
    "NaN output bias": (
        edit_weights(lambda w: w["final_logits_bias"].__setitem__((0, 3), math.nan)),
        "final_logits_bias holds NaN or infinite values",
    ),
    "+inf output bias": (
        edit_weights(lambda w: w["final_logits_bias"].__setitem__((0, 3), math.inf)),
        "final_logits_bias holds NaN or infinite values",
    ),
    "encoder_layers 0": (
        edit_config(encoder_layers=0),
        "config.json (encoder_layers): model.encoder_layers must be at least 1",
    ),
    "encoder_layers -1": (
        edit_config(encoder_layers=-1),
        "config.json (encoder_layers): model.encoder_layers must be",
    ),
    "heads -4": (
        edit_config(encoder_attention_heads=-4, decoder_attention_heads=-4),
        "config.json (encoder_attention_heads): model.heads must be at least 1",
    ),
    "max_position_embeddings 0": (
        edit_config(max_position_embeddings=0),
        "(max_position_embeddings): model.max_positions",
    ),
    "max_position_embeddings 10^9": (
        edit_config(max_position_embeddings=10**9),
        "config.json (max_position_embeddings): 1000000000 positions, more than nmt imports",
    ),
    "a layer the config does not count": (
        edit_config(encoder_layers=1),
        "weight model.encoder.layers.1.fc1.bias (and 15 more) is not part of the model",
    ),
    "a weight nothing reads": (
        edit_weights(lambda w: w.__setitem__("model.encoder.extra.weight", torch.ones(2))),
        "weight model.encoder.extra.weight is not part of the model",
    ),
    # item 7: the wrong shape of a file, a key or a weight
    "config.json a list": (
        write("config.json", "[1, 2]"),
        "config.json: not a mapping of keys (it is a list)",
    ),
    "config.json nested 100,000 deep": (
        write("config.json", "[" * 100_000 + "]" * 100_000),
        "config.json: nested too deeply",
    ),
    "d_model a string": (
        edit_config(d_model="512"),
        "config.json: d_model is '512', not an integer",
    ),
    "vocab_size 1e400": (
        edit_config(vocab_size=1e400),
        "config.json: vocab_size is inf, not an integer",
    ),
    "tokenizer_config.json null": (
        write("tokenizer_config.json", "null"),
        "tokenizer_config.json: not a mapping",
    ),
    "vocab.json ids true": (
        write("vocab.json", '{"</s>": true, "<unk>": 1}'),
        "vocab.json: not a mapping of pieces to ids",
    ),
    "safetensors header a list": (
        safetensors_header([1, 2]),
        "model.safetensors: not a readable safetensors file",
    ),
    "safetensors int8 weight": (
        edit_weights(lambda w: w.__setitem__(Q, w[Q].to(torch.int8))),
        f"{Q} holds I8",
    ),
    "k_proj (d, d+1), fused after": (
        edit_weights(lambda w: w.__setitem__(K, torch.zeros(D, D + 1))),
        f"{K} has shape ({D}, {D + 1}), not ({D}, {D})",
    ),
    "a sparse tensor in pytorch_model.bin": (
        edit_weights(lambda w: w.__setitem__(Q, w[Q].to_sparse()), bin=True),
        f"{Q} holds a torch.sparse_coo tensor",
    ),
    "a quantized tensor in pytorch_model.bin": (
        edit_weights(
            lambda w: w.__setitem__(Q, torch.quantize_per_tensor(w[Q], 0.1, 0, torch.qint8)),
            bin=True,
        ),
        f"{Q} holds qint8",
    ),
    # item 8: regular files only, never blocking or reading without end
    "vocab.json a FIFO": (
        not_regular("vocab.json", "fifo"),
        "vocab.json: a JSON file is not a regular file",
    ),
    "source.spm a FIFO": (
        not_regular("source.spm", "fifo"),
        "source.spm: a sentencepiece model is not a regular file",
    ),
    "model.safetensors a FIFO": (
        not_regular("model.safetensors", "fifo"),
        "model.safetensors: the weights file is not a",
    ),
    "config.json a symlink to /dev/zero": (
        not_regular("config.json", "zero"),
        "config.json: a JSON file is not a regular",
    ),
    "target.spm a symlink to /dev/zero": (
        not_regular("target.spm", "zero"),
        "target.spm: a sentencepiece model is not",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_are_one_line(models, tmp_path, capsys, case):
    edit, needle = REFUSALS[case]
    folder = tmp_path / "model"
    shutil.copytree(models.folder(VARIANTS["swish"]), folder)
    edit(folder)
    capsys.readouterr()
    out = tmp_path / "out.pt"
    assert nmt_here("import", str(folder), "-o", str(out)) == 1
    one_line_error(capsys, needle, str(folder))
    assert not out.exists()


def test_a_bin_with_position_tables_and_a_tied_lm_head_imports_as_the_safetensors(models, tmp_path):
    """Older OPUS-MT uploads' pytorch_model.bin hold every tensor of the state dict: the sinusoid
    tables transformers recomputes (embed_positions) and the lm_head tied to the embeddings. They
    are names the import knows, not refused as unused; the checkpoint is the safetensors
    folder's."""
    folder = tmp_path / "model"
    shutil.copytree(models.folder(VARIANTS["swish"]), folder)
    state = models.hf(VARIANTS["swish"])[0].state_dict()
    assert {"model.encoder.embed_positions.weight", "lm_head.weight"} <= set(state)
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    assert nmt_here("import", str(folder), "-o", str(tmp_path / "bin.pt")) == 0
    ours, reference = (
        load_checkpoint(p)["model"]
        for p in (tmp_path / "bin.pt", models.checkpoint(VARIANTS["swish"]))
    )
    assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)


class Planted:
    """Unpickling this calls open(path, "w"): it creates a file."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_pickled_object_in_pytorch_model_bin_is_not_run(models, tmp_path, capsys):
    """A pytorch_model.bin holding a pickled object besides its tensors is refused, and the
    object's code does not run (torch.load(weights_only=True)); the same file does run it
    with a plain torch.load, so the plant is live."""
    folder = tmp_path / "model"
    shutil.copytree(models.folder(VARIANTS["swish"]), folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "planted"
    state = {"model.shared.weight": torch.zeros(2, 2), "x": Planted(marker)}
    torch.save(state, folder / "pytorch_model.bin")
    capsys.readouterr()
    assert nmt_here("import", str(folder), "-o", str(tmp_path / "out.pt")) == 1
    one_line_error(capsys, "pytorch_model.bin", "weights_only")
    assert not marker.exists()
    torch.load(folder / "pytorch_model.bin", weights_only=False)["x"].close()
    assert marker.exists()
