"""`nmt import` of Marian releases (decoder.yml, model.npz, vocab.yml, source.spm, target.spm).

Tiny random releases are written as Marian lays them out (tests/marian_npz.py) and the import
is checked against two references:
- CTranslate2's own Marian converter (`ctranslate2.converters.MarianConverter`), a separate
  implementation of the same mapping. Its model has the sinusoid table of Hugging Face's
  MarianMT, not Marian's, so the comparisons with it build the imported model with
  `positions: hf_marian`; every other fact of the mapping is the import's. It maps every
  Marian gelu to x*sigmoid(1.702x), so models of Marian >= v1.12.3 with gelu are not compared
  with it.
- Marian's computation transcribed (`marian_log_probs`), for the import as it is: Marian's
  own positions and either gelu.

CTranslate2 decodes as nmt does with these settings (`ct2_translate`): nmt's beam, lenpen
alpha, lenpen_style length = CTranslate2's beam_size, length_penalty alpha (a score divided by
|Y|^alpha) and return_end_token=True (so that |Y| counts the EOS, as nmt's does; the EOS is
dropped after). Both finish a sentence once `beam` hypotheses have ended (fairseq's rule;
CTranslate2's whenever a length penalty is set). Two differences are kept out of the comparison:
- a token CTranslate2 disables (disable_unk, EOS before min_decoding_length) is removed before
  its softmax, which renormalises the others; nmt (as Marian) removes it after. So nmt's
  allow_unk and min_len 0 = CTranslate2's disable_unk=False and min_decoding_length 0 here;
- at the length limit CTranslate2 keeps a hypothesis as it is and nmt appends the EOS, so the
  model compared ends its outputs by itself (a trained one: `train_to_end`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, nmt_here
from marian_npz import (
    AWKWARD,
    CT2_MISREAD,
    Release,
    Variant,
    marian_greedy,
    marian_log_probs,
    marian_sinusoids,
    marian_vocabulary,
    model_yml,
    npz_text,
    rewrite_npz,
    sample_texts,
    train_to_end,
    write_release,
    write_vocab_yml,
)

from nmt import Translator
from nmt.api import clean_output
from nmt.checkpoint import atomic_save
from nmt.config import DecodeConfig
from nmt.convert.marian import import_model, imported_checkpoint, read_marian_vocab
from nmt.convert.table import PAD_LOGIT_BIAS
from nmt.decoding.predict import score_token_lists, translate_token_lists
from nmt.models.layers import sinusoids
from nmt.models.transformer import Transformer
from nmt.tokenizer import Tokenizer

try:
    import ctranslate2 as ct2
    from ctranslate2.converters import MarianConverter
    from ctranslate2.converters.marian import load_vocab
except ImportError:
    ct2 = None
needs_ctranslate2 = pytest.mark.skipif(
    ct2 is None, reason="ctranslate2 is not installed (pip install -e '.[dev]')"
)

pytestmark = pytest.mark.usefixtures(
    "one_thread", "restore_logging"
)  # conftest: torch on one thread

NEW_GELU = "v1.12.3 d225c24d 2023-03-01 13:48:09 +0000"  # the first Marian with the erf gelu

VARIANTS = {
    "post-norm, tied-embeddings-all, swish": Variant(),
    "pre-norm (n, da, top n)": Variant(pre_norm=True, seed=1),
    "tied-embeddings (separate Wemb), relu": Variant(tying="decoder", activation="relu", seed=2),
    "untied output _W (dim, V), gelu of v1.11": Variant(
        tying="none", untied_name="W", activation="gelu", seed=3
    ),
    "untied output _Wt (V, dim), dim 40, 5 heads": Variant(
        tying="none", untied_name="Wt", d_model=40, heads=5, ffn=72, seed=4
    ),
    "tied-embeddings-src, untied output": Variant(tying="src", seed=5),
    "</s> at id 7, 3+1 layers": Variant(eos_index=7, layers=(3, 1), seed=6),
    "pre-norm, gelu of v1.12.2 (still sigmoid)": Variant(
        pre_norm=True,
        activation="gelu",
        version="v1.12.2 a23cc77e 2023-02-27 21:53:41 +0000",
        seed=7,
    ),
    "gelu of v1.12.3 (erf)": Variant(activation="gelu", version=NEW_GELU, seed=8),
    "pre-norm, gelu of v1.12.43 (erf)": Variant(
        pre_norm=True,
        activation="gelu",
        version="v1.12.43 c9f287db 2025-06-23 19:47:45 +0000",
        seed=9,
    ),
    "pre-norm, top empty (no final LayerNorm)": Variant(pre_norm=True, top_norm=False, seed=10),
    "separate vocabularies (vocab.src.yml, vocab.trg.yml), tied-embeddings": Variant(
        tying="decoder", separate=True, seed=13
    ),
}
# CTranslate2's Marian converter maps gelu to the sigmoid form only, and refuses pre-norm without
# the top LayerNorm
CT2_VARIANTS = [name for name in VARIANTS if "erf" not in name and "top empty" not in name]


def build(imported, **changes) -> Transformer:
    tok = imported.tokenizer
    model = Transformer(
        dataclasses.replace(imported.model, **changes),
        tok.vocab_size,
        tok.specials.pad,
        tok.source_vocab_size,
    )
    model.load_state_dict(imported.weights)
    return model.eval()


def pieces(tok: Tokenizer, ids: list[int], side: int = 1) -> list[str]:
    """The pieces of target ids (`side` 0: of source ids)."""
    return [tok.vocabularies()[side][i] for i in ids]


def sentence_pairs(tok: Tokenizer, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Source and target ids of 8 pairs: one source with a language token, one pair with a
    character no vocabulary holds (<unk>)."""
    sources, targets = sample_texts(8, seed), sample_texts(8, seed + 1, "target")
    sources[0] = ">>fra<< " + sources[0]
    sources[1], targets[1] = sources[1] + " \u03a9", "\u03a9 " + targets[1]
    src, tgt = [tok.encode(s) for s in sources], [tok.encode_target(t) for t in targets]
    assert (
        src[0][0] == tok.vocabularies()[0].index(">>fra<<")
        and tok.specials.unk in src[1]
        and tok.specials.unk in tgt[1]
    )
    return src, tgt


def ct2_convert(release: Release, out: Path) -> Path:
    return Path(
        MarianConverter(str(release.npz), list(map(str, release.vocab_files))).convert(str(out))
    )


def ct2_translate(
    model_dir: Path,
    tok: Tokenizer,
    sources: list[list[int]],
    beam: int,
    lenpen: float,
    max_len: int,
):
    """CTranslate2 with the settings that equal nmt's search (module docstring)."""
    translator = ct2.Translator(str(model_dir), device="cpu", intra_threads=1)
    return translator.translate_batch(
        [pieces(tok, s, 0) for s in sources],
        beam_size=beam,
        length_penalty=lenpen,
        return_end_token=True,
        disable_unk=False,
        min_decoding_length=0,
        max_decoding_length=max_len,
        return_scores=True,
    )


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


def one_line_error(capfd: pytest.CaptureFixture[str], needle: str) -> str:
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nmt: error: ") and needle in lines[0], lines
    return lines[0]


# ------------------------------------------------------------------ the vocabulary


@needs_ctranslate2
@pytest.mark.parametrize(
    "extra_styles", [False, True], ids=["yaml-cpp's", "with single quotes and ? keys"]
)
def test_vocabulary_reads_as_marian_and_ctranslate2_read_it(tmp_path, extra_styles):
    """vocab.yml as Marian's yaml-cpp writes it: quoted ("</s>", ">>fra<<", ":", "#x", "null"),
    escaped ("\\"\\\\", "\\x01") and plain (a:b, yes, 123, -x, ?x, <<, a backslash, raw DEL
    quoted, raw NEL / U+2028 / U+2029 plain); with `extra_styles` some entries as other writers
    put them ('single quoted', `? key` / `: id`)."""
    pieces_ = marian_vocabulary(eos_index=3)
    assert set(AWKWARD) <= set(pieces_)
    path = tmp_path / "vocab.yml"
    write_vocab_yml(path, pieces_, extra_styles=extra_styles)
    assert read_marian_vocab(path) == pieces_
    assert load_vocab(str(path)) == pieces_


def test_vocabulary_characters_pyyaml_alone_refuses(tmp_path):
    """yaml-cpp writes DEL raw (inside quotes) and NEL, U+2028, U+2029 raw (plain), and reads
    them as text; PyYAML refuses raw DEL and takes the others as line breaks."""
    pieces_ = ["</s>", "<unk>", "\x7f", "a\x7fb", "\x85", "\u2028", "a\u2029b", "\u2581x"]
    path = tmp_path / "vocab.yml"
    write_vocab_yml(path, pieces_)
    text = path.read_text(encoding="utf-8")
    assert (
        '"\x7f": 2' in text and "\x85: 4" in text and "\u2028: 5" in text
    )  # as yaml-cpp writes them
    assert read_marian_vocab(path) == pieces_


def test_vocabulary_escapes_are_read_as_yaml_means_them(tmp_path):
    """Escapes yaml-cpp writes that CTranslate2's line parser reads otherwise (\\t as "t", a
    \\x escape inside a longer piece left as it is): YAML's meaning is Marian's."""
    pieces_ = ["</s>", "<unk>", *CT2_MISREAD]
    path = tmp_path / "vocab.yml"
    write_vocab_yml(path, pieces_)
    assert "\\t" in path.read_text(encoding="utf-8")
    assert read_marian_vocab(path) == pieces_


OPUS_MT = Path(os.environ.get("NMT_OPUS_MT_EN_MG") or ROOT.parent / "shared/data/opus-mt-en-mg")


@needs_ctranslate2
@pytest.mark.slow  # 60k entries through PyYAML: ~5 s
@pytest.mark.skipif(
    not (OPUS_MT / "vocab.json").is_file(), reason=f"no OPUS-MT vocabulary at {OPUS_MT}"
)
def test_a_real_opus_mt_vocabulary_as_yml(tmp_path):
    """The 60k pieces of a real OPUS-MT model (Hugging Face's vocab.json of opus-mt-en-mg),
    written as Marian writes its vocab.yml."""
    import json

    vocab = json.loads((OPUS_MT / "vocab.json").read_text(encoding="utf-8"))
    pieces_ = sorted(vocab, key=vocab.__getitem__)
    path = tmp_path / "vocab.yml"
    write_vocab_yml(path, pieces_)
    assert read_marian_vocab(path) == pieces_ == load_vocab(str(path))


# ------------------------------------------------------------------ what the import makes


@pytest.mark.parametrize("variant", VARIANTS)
def test_imported_config_tokenizer_and_pad_row(variant, tmp_path):
    v = VARIANTS[variant]
    release = write_release(tmp_path / "rel", v)
    imp = import_model(release.folder)
    m, tok = imp.model, imp.tokenizer
    assert (m.positions, m.decoder_start, m.norm_eps, m.output_bias) == (
        "marian",
        "zeros",
        1e-6,
        True,
    )
    assert (m.norm_first, m.d_model, m.heads, m.ffn_dim) == (v.pre_norm, v.d_model, v.heads, v.ffn)
    assert m.final_norm == (
        not v.pre_norm or v.top_norm
    )  # post-norm keeps the default (it has no final norm)
    assert (m.encoder_layers, m.decoder_layers) == v.layers
    assert m.share_embeddings == (v.tying in ("all", "src"))
    assert m.tie_output == (v.tying in ("all", "decoder"))
    expected_act = {"relu": "relu", "swish": "swish"}.get(
        v.activation, "gelu" if "erf" in variant else "gelu_sigmoid"
    )
    assert m.activation == expected_act
    assert imp.decode == {
        "beam": 4,
        "lenpen": 1.0,
        "lenpen_style": "length",
    }  # decoder.yml: beam-size 4, normalize 1
    # Marian's vocabulary, then the pad row (also the BOS that is never fed: decoding starts from
    # zeros)
    V = len(release.pieces)
    assert tok.pieces[:V] == release.pieces and tok.vocab_size == V + 1
    assert tok.vocabularies()[0][:V] == (release.source_pieces or release.pieces)
    assert tok.source_vocab_size == (V + 1 if v.separate else None)
    assert (tok.specials.pad, tok.specials.bos) == (V, V)
    assert (tok.specials.eos, tok.specials.unk) == (release.eos, release.pieces.index("<unk>"))
    assert tok.files() == {
        "source.spm": (release.folder / "source.spm").read_bytes(),
        "target.spm": (release.folder / "target.spm").read_bytes(),
    }
    assert float(imp.weights["output_bias"][V]) == PAD_LOGIT_BIAS
    assert not imp.weights["src_embed.tokens.weight"][V].any()


def test_the_pad_row_never_has_probability(tmp_path):
    """The appended pad row's probability is exactly 0, so the other tokens' log-probabilities
    are those over Marian's vocabulary alone."""
    release = write_release(tmp_path / "rel", Variant(tying="none"))
    imp = import_model(release.folder)
    model, tok = build(imp), imp.tokenizer
    src, tgt = sentence_pairs(tok, seed=3)
    with torch.no_grad():
        logits = model(
            torch.tensor([src[2] + [tok.specials.eos]]), torch.tensor([[tok.specials.bos] + tgt[2]])
        )
    pad = tok.specials.pad
    assert torch.softmax(logits, -1)[..., pad].max() == 0
    torch.testing.assert_close(
        torch.log_softmax(logits, -1)[..., :pad],
        torch.log_softmax(logits[..., :pad], -1),
        rtol=0,
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "version, expected",
    [
        ("v1.9.56 d7d0d76 2020-09-14 07:58:22 +0100", "gelu_sigmoid"),
        ("v1.12.0 65bf82ff 2023-02-21 09:56:29 -0800", "gelu_sigmoid"),
        (
            "v1.12.2 a23cc77e 2023-02-27 21:53:41 +0000",
            "gelu_sigmoid",
        ),  # the last with x*sigmoid(1.702x)
        (NEW_GELU, "gelu"),
        ("v1.13.0", "gelu"),
        ("v2.0.0", "gelu"),
    ],
)
def test_gelu_follows_the_version_that_wrote_the_model(version, expected, tmp_path):
    release = write_release(tmp_path / "rel", Variant(activation="gelu", version=version))
    assert import_model(release.decoder_yml).model.activation == expected


def test_the_position_table_is_marians(tmp_path):
    """The import's table is Marian's formula (its float64 transcription); CTranslate2's (Hugging
    Face's) agrees with it at position 0 only."""
    for dim in (32, 40):
        release = write_release(tmp_path / f"rel{dim}", Variant(d_model=dim, heads=4, ffn=48))
        model = build(import_model(release.folder))
        table = model.src_embed.sinusoids[
            :256
        ]  # (further on, float32's rounding of position * frequency shows)
        torch.testing.assert_close(
            table.double(), marian_sinusoids(len(table), dim), rtol=0, atol=2e-5
        )
        hf = sinusoids(len(table), dim, "hf_marian")
        torch.testing.assert_close(table[0], hf[0], rtol=0, atol=0)
        assert (table[1:] - hf[1:]).abs().amax(1).min() > 1e-3  # every later position differs


# ------------------------------------------------------------------ forced decoding


@pytest.mark.parametrize("variant", VARIANTS)
def test_log_probs_equal_marians_computation(variant, tmp_path):
    """The import as it is (Marian's positions, either gelu) against Marian's computation
    transcribed in float64. Max abs difference when written: 1.2e-6 to 2.5e-6."""
    release = write_release(tmp_path / "rel", VARIANTS[variant])
    imp = import_model(release.folder)
    tok = imp.tokenizer
    src, tgt = sentence_pairs(tok, seed=11)
    ours = score_token_lists(build(imp), src, tgt, DecodeConfig(), specials=tok.specials)
    eos = [release.eos]
    reference = [marian_log_probs(release, s + eos, t + eos) for s, t in zip(src, tgt, strict=True)]
    assert max_diff(ours, reference) < 1e-4


@needs_ctranslate2
@pytest.mark.parametrize("variant", CT2_VARIANTS)
def test_log_probs_equal_ctranslate2s(variant, tmp_path):
    """Per-token log-probabilities of forced decoding against CTranslate2's conversion of the
    same release (its vocabulary has no pad row). Max abs difference when written: 1.9e-5 to
    3.7e-5. With the import's real positions the two differ (by ~0.1): CTranslate2's table is
    not Marian's."""
    release = write_release(tmp_path / "rel", VARIANTS[variant])
    imp = import_model(release.folder)
    tok = imp.tokenizer
    src, tgt = sentence_pairs(tok, seed=21)
    translator = ct2.Translator(
        str(ct2_convert(release, tmp_path / "ct2")), device="cpu", intra_threads=1
    )
    got = translator.score_batch([pieces(tok, s, 0) for s in src], [pieces(tok, t) for t in tgt])
    for g, t in zip(got, tgt, strict=True):
        assert g.tokens == [*pieces(tok, t), "</s>"]
    theirs = [g.log_probs for g in got]
    as_ct2 = score_token_lists(
        build(imp, positions="hf_marian"), src, tgt, DecodeConfig(), specials=tok.specials
    )
    assert max_diff(as_ct2, theirs) < 1e-4
    real = score_token_lists(build(imp), src, tgt, DecodeConfig(), specials=tok.specials)
    assert max_diff(real, theirs) > 1e-2


# ------------------------------------------------------------------ search


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Release, Path, Path]:
    """A release trained to end its outputs (`train_to_end`, ~3 s), its nmt checkpoint with
    positions hf_marian, and CTranslate2's conversion of it."""
    root = tmp_path_factory.mktemp("trained")
    release = write_release(root / "release", Variant(seed=12, eos_index=5))
    train_to_end(release)
    imp = import_model(release.folder)
    imp.model = dataclasses.replace(imp.model, positions="hf_marian")
    atomic_save(imported_checkpoint(imp), root / "as_ct2.pt")
    return release, root / "as_ct2.pt", ct2_convert(release, root / "ct2")


@needs_ctranslate2
@pytest.mark.parametrize("beam, lenpen", [(1, 1.0), (4, 1.0), (5, 0.6)])
def test_greedy_and_beam_equal_ctranslate2s(trained, beam, lenpen):
    """Outputs (token ids) and their scores, on 16 sentences. When written: 16 of 16 equal,
    scores within 1e-5; greedy search ran into the length limit on one sentence (repeating a
    piece), where both cut it after the same tokens (nmt then scores its forced EOS)."""
    release, checkpoint, ct2_dir = trained
    max_len = 100
    ours = Translator.load(
        checkpoint,
        device="cpu",
        beam=beam,
        lenpen=lenpen,
        lenpen_style="length",
        min_len=0,
        max_len_a=0,
        max_len_b=max_len,
    )
    tok = ours.loaded.tokenizer
    sources = [tok.encode(t) for t in sample_texts(16, 31)]
    hyps = translate_token_lists(
        ours.loaded.model,
        sources,
        dataclasses.replace(ours.decode, allow_unk=True),
        specials=tok.specials,
        max_positions=ours.loaded.max_positions,
    )
    results = ct2_translate(ct2_dir, tok, sources, beam, lenpen, max_len=max_len)
    ended = []
    for h, r in zip(hyps, results, strict=True):
        theirs = r.hypotheses[0]
        if theirs[-1] == "</s>":
            ended.append(len(h[0].tokens))
            assert pieces(tok, h[0].tokens) == theirs[:-1]
            assert h[0].score == pytest.approx(r.scores[0], abs=1e-4)
        else:  # the limit bound: only greedy search keeps the same tokens then
            assert beam == 1 and pieces(tok, h[0].tokens) == theirs and len(theirs) == max_len
    assert len(ended) >= 14 and len(set(ended)) > 5  # outputs of varied lengths, ended by the model


# ------------------------------------------------------------------ the command line


@needs_ctranslate2
def test_import_translate_and_export_through_the_command_line(trained, tmp_path, capfd):
    """`nmt import` of the release (Marian's positions), `nmt translate` greedy = Marian's
    computation greedy, `nmt export` = the checkpoint's log-probabilities in CTranslate2
    (the export carries Marian's table)."""
    release = trained[0]
    checkpoint = tmp_path / "m.pt"
    assert nmt_here("import", str(release.folder), "-o", str(checkpoint)) == 0
    assert "positions marian" in capfd.readouterr().out
    texts = sample_texts(4, 41)
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    assert (
        nmt_here(
            "translate",
            "-c",
            str(checkpoint),
            "-i",
            str(tmp_path / "in.txt"),
            "-o",
            str(tmp_path / "out.txt"),
            "--device",
            "cpu",
            "--beam",
            "1",
            "--max-len-a",
            "0",
            "--max-len-b",
            "30",
        )
        == 0
    )
    imp = import_model(release.folder)
    tok = imp.tokenizer
    expected = [
        clean_output(
            tok.decode(
                marian_greedy(release, tok.encode(t) + [release.eos], 30, unk=tok.specials.unk)
            )
        )
        for t in texts
    ]
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected

    out = tmp_path / "ct2"
    assert nmt_here("export", str(checkpoint), str(out)) == 0
    assert {"source.spm", "target.spm", "model.bin", "config.json"} <= {
        p.name for p in out.iterdir()
    }
    src, tgt = sentence_pairs(tok, seed=51)
    ours = score_token_lists(build(imp), src, tgt, DecodeConfig(), specials=tok.specials)
    got = ct2.Translator(str(out), device="cpu", intra_threads=1).score_batch(
        [pieces(tok, s, 0) for s in src], [pieces(tok, t) for t in tgt]
    )
    assert max_diff(ours, [g.log_probs for g in got]) < 1e-4


# ------------------------------------------------------------------ refusals


def _ensemble(r: Release) -> None:
    text = r.decoder_yml.read_text(encoding="utf-8")
    r.decoder_yml.write_text(
        text.replace("  - model.npz\n", "  - model.npz\n  - model.npz\n"), encoding="utf-8"
    )


def _separate_vocabularies(r: Release, fewer: int = 0) -> None:
    """vocab.src.yml the release's vocabulary; vocab.trg.yml two pieces swapped, `fewer` left
    off."""
    write_vocab_yml(r.folder / "vocab.src.yml", r.pieces)
    swapped = [r.pieces[0], r.pieces[1], r.pieces[3], r.pieces[2], *r.pieces[4:]]
    write_vocab_yml(r.folder / "vocab.trg.yml", swapped[: len(swapped) - fewer])
    text = r.decoder_yml.read_text(encoding="utf-8")
    r.decoder_yml.write_text(
        text.replace("  - vocab.yml\n  - vocab.yml\n", "  - vocab.src.yml\n  - vocab.trg.yml\n"),
        encoding="utf-8",
    )


class _Canary:
    """Unpickling it creates the file `path`: proof that a pickle ran."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def _decoder_yml(old: str, new: str):
    def edit(r: Release) -> None:
        r.decoder_yml.write_text(
            r.decoder_yml.read_text(encoding="utf-8").replace(old, new), encoding="utf-8"
        )

    return edit


def _not_regular(name: str, kind: str):
    def edit(r: Release) -> None:
        (r.folder / name).unlink()
        os.mkfifo(r.folder / name) if kind == "fifo" else (r.folder / name).symlink_to("/dev/zero")

    return edit


def _padded_member(r: Release) -> None:
    """decoder_l1_ffn_b2 as a .npy of its shape followed by 16 MB it never declares (deflated: 16
    kB)."""
    rewrite_npz(r, drop=["decoder_l1_ffn_b2"])
    with (
        zipfile.ZipFile(r.npz, "a", zipfile.ZIP_DEFLATED) as z,
        z.open("decoder_l1_ffn_b2.npy", "w") as f,
    ):
        np.lib.format.write_array(f, r.weights["decoder_l1_ffn_b2"])
        f.write(bytes(1 << 24))


D = Variant().d_model
REFUSALS = {
    "type s2s": (lambda r: rewrite_npz(r, options={"type": "s2s"}), "type 's2s'"),
    "rnn autoregression": (
        lambda r: rewrite_npz(r, options={"transformer-decoder-autoreg": "rnn"}),
        "transformer-decoder-autoreg 'rnn'",
    ),
    "LayerNorm on the embeddings": (
        lambda r: rewrite_npz(r, options={"transformer-postprocess-emb": "n"}),
        "transformer-postprocess-emb 'n'",
    ),
    "activation": (
        lambda r: rewrite_npz(r, options={"transformer-ffn-activation": "leakyrelu"}),
        "transformer-ffn-activation 'leakyrelu'",
    ),
    "no positions": (
        lambda r: rewrite_npz(r, options={"transformer-disable-position-embeddings": True}),
        "transformer-disable-position-embeddings",
    ),
    "universal language representation": (
        lambda r: rewrite_npz(r, options={"ulr": True}),
        "ulr is true",
    ),
    "transformer-pool": (
        lambda r: rewrite_npz(r, options={"transformer-pool": True}),
        "transformer-pool is true",
    ),
    "factored vocabulary": (
        lambda r: rewrite_npz(r, options={"factors-dim-emb": 8, "factors-combine": "concat"}),
        "factors-dim-emb / factors-combine are set",
    ),
    "post-norm with a top LayerNorm": (
        lambda r: rewrite_npz(r, options={"transformer-postprocess-top": "n"}),
        "post-norm options 'dan'/'n'",
    ),
    "ensemble": (_ensemble, "2 models"),
    "no source.spm": (lambda r: (r.folder / "source.spm").unlink(), "source.spm is missing"),
    "separate vocabularies, tied-embeddings-all": (
        _separate_vocabularies,
        "tied-embeddings-all or tied-embeddings-src with separate source and target vocabularies",
    ),
    "separate vocabularies of two sizes": (
        lambda r: _separate_vocabularies(r, 1),
        "pieces; nmt import maps separate vocabularies of one size",
    ),
    "no special:model.yml": (lambda r: np.savez(r.npz, **r.weights), "no special:model.yml"),
    "missing parameter": (
        lambda r: rewrite_npz(r, drop=["decoder_l2_context_Wv"]),
        "no weight decoder_l2_context_Wv",
    ),
    "wrong shape": (
        lambda r: rewrite_npz(r, replace={"encoder_l1_self_Wq": np.zeros((D + 1, D), np.float32)}),
        f"encoder_l1_self_Wq has shape ({D + 1}, {D}), not ({D}, {D})",
    ),
    "wrong shape (3-d)": (
        lambda r: rewrite_npz(r, replace={"Wemb": r.weights["Wemb"][..., None]}),
        "Wemb has shape",
    ),
    "integers": (
        lambda r: rewrite_npz(r, replace={"decoder_l1_ffn_b2": np.zeros((1, D), np.int64)}),
        "decoder_l1_ffn_b2 holds int64",
    ),
    # issue 33, item 6: imported numbers pass nmt's validation; no weight is dropped
    "enc-depth 0": (
        lambda r: rewrite_npz(r, options={"enc-depth": 0}),
        "special:model.yml (enc-depth): model.encoder_layers must be at least 1",
    ),
    "enc-depth -1": (
        lambda r: rewrite_npz(r, options={"enc-depth": -1}),
        "(enc-depth): model.encoder_layers must be",
    ),
    "heads -4": (
        lambda r: rewrite_npz(r, options={"transformer-heads": -4}),
        "special:model.yml (transformer-heads): model.heads must be at least 1",
    ),
    "dropout 1.5": (
        lambda r: rewrite_npz(r, options={"transformer-dropout": 1.5}),
        "(transformer-dropout): model.dropout must be in [0, 1)",
    ),
    "a layer the options do not count": (
        lambda r: rewrite_npz(r, options={"enc-depth": 1}),
        "weight encoder_l2_ffn_W1 (and 15 more) is not part of the model",
    ),
    "a parameter nothing reads": (
        lambda r: rewrite_npz(r, replace={"decoder_l1_extra": np.ones((1, D), np.float32)}),
        "weight decoder_l1_extra is not part of the model",
    ),
    "an output matrix beside tied-embeddings-all": (
        lambda r: rewrite_npz(r, replace={"decoder_ff_logit_out_Wt": r.weights["Wemb"]}),
        "weight decoder_ff_logit_out_Wt is not part of the model",
    ),
    "NaN output bias": (
        lambda r: rewrite_npz(
            r,
            replace={
                "decoder_ff_logit_out_b": r.weights["decoder_ff_logit_out_b"] * np.float32("nan")
            },
        ),
        "decoder_ff_logit_out_b holds NaN or infinite values",
    ),
    # item 7: the wrong shape of a file or a key
    "decoder.yml a list": (
        lambda r: r.decoder_yml.write_text("[1, 2]\n"),
        "decoder.yml: not a mapping of keys (it is a list)",
    ),
    "special:model.yml a list": (
        lambda r: rewrite_npz(r, model_yml_text="- 1\n- 2\n"),
        "special:model.yml: not a mapping of keys (it is a list)",
    ),
    "special:model.yml nested 100,000 deep": (
        lambda r: rewrite_npz(r, model_yml_text="[" * 100_000 + "]" * 100_000),
        "special:model.yml: nested too deeply",
    ),
    "dim-emb a string": (
        lambda r: rewrite_npz(r, options={"dim-emb": "x32"}),
        "dim-emb is 'x32', not an integer",
    ),
    "a .npy named .npz": (
        lambda r: (
            np.save(r.npz.with_suffix(".npy"), r.weights["Wemb"])
            or r.npz.with_suffix(".npy").replace(r.npz)
        ),
        "model.npz: not a .npz archive",
    ),
    # item 15: decoder.yml's lists
    "models: a string": (
        _decoder_yml("models:\n  - model.npz\n", "models: model.npz\n"),
        "decoder.yml: models is 'model.npz', not a list of file names",
    ),
    "vocabs: a string": (
        _decoder_yml("vocabs:\n  - vocab.yml\n  - vocab.yml\n", "vocabs: vocab.yml\n"),
        "decoder.yml: vocabs is 'vocab.yml', not a list of file names",
    ),
    # item 8: regular files only, each member of the .npz no bigger than its shape
    "model.npz a FIFO": (
        _not_regular("model.npz", "fifo"),
        "model.npz: the model file is not a regular file",
    ),
    "source.spm a FIFO": (
        _not_regular("source.spm", "fifo"),
        "source.spm: a sentencepiece model is not a regular file",
    ),
    "vocab.yml a symlink to /dev/zero": (
        _not_regular("vocab.yml", "zero"),
        "vocab.yml: a Marian vocabulary is not a",
    ),
    "a member bigger than its shape": (
        _padded_member,
        f"decoder_l1_ffn_b2 stores {(1 << 24) + 128 + 4 * D:,} bytes",
    ),
    # item 11: an empty or truncated model is a damaged file, not an interrupt
    "model.npz empty": (
        lambda r: r.npz.write_bytes(b""),
        "model.npz: not a .npz archive of arrays",
    ),
    "model.npz truncated": (
        lambda r: r.npz.write_bytes(r.npz.read_bytes()[:5000]),
        "model.npz: not a .npz archive",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_release_nmt_cannot_map_is_refused_in_one_line(case, tmp_path, capfd):
    mutate, needle = REFUSALS[case]
    release = write_release(tmp_path / "rel", Variant())
    mutate(release)
    out = tmp_path / "m.pt"
    assert nmt_here("import", str(release.folder), "-o", str(out)) == 1
    one_line_error(capfd, needle)
    assert not out.exists()


@pytest.mark.parametrize(
    "member", ["objects", "decoder_l1_ffn_b2"], ids=["an unused member", "a weight"]
)
def test_a_pickled_object_in_the_npz_is_refused_unrun(tmp_path, capfd, member):
    """An array of pickled objects, as a member the mapping never reads (refused by its name, never
    decompressed) or in place of a weight it reads (refused by its header, before its data)."""
    release = write_release(tmp_path / "rel", Variant())
    canary = tmp_path / "canary"
    objects = np.empty(1, dtype=object)
    objects[0] = _Canary(canary)
    np.savez(
        release.npz,
        **{
            **release.weights,
            member: objects,
            "special:model.yml": npz_text(model_yml(release.options)),
        },
    )
    assert nmt_here("import", str(release.folder), "-o", str(tmp_path / "m.pt")) == 1
    one_line_error(
        capfd,
        f"{member} is not part of the model"
        if member == "objects"
        else f"{member} holds Python objects",
    )
    assert not canary.exists()
    with np.load(
        release.npz, allow_pickle=True
    ) as npz:  # what loading it with pickles would have done
        npz[member]
    assert canary.exists()


# ---------------------------------------------------------- what the import reads, it never writes


@pytest.fixture
def elsewhere(tmp_path) -> tuple[Release, Path]:
    """A release in `b/` and a decoder.yml in `a/` that names b's model and vocabularies."""
    release = write_release(tmp_path / "b", Variant())
    (tmp_path / "a").mkdir()
    decoder = tmp_path / "a" / "decoder.yml"
    decoder.write_text(
        release.decoder_yml.read_text(encoding="utf-8")
        .replace("model.npz", "../b/model.npz")
        .replace("vocab.yml", "../b/vocab.yml"),
        encoding="utf-8",
    )
    return release, decoder


@pytest.mark.parametrize("option", ["-o", "--config"])
@pytest.mark.parametrize("name", ["model.npz", "vocab.yml", "source.spm"])
def test_no_output_is_a_file_the_import_reads_in_another_folder(
    elsewhere, tmp_path, capfd, name, option
):
    """Issue 33, item 3: decoder.yml names its files in another folder; `-o` (or `--config`) one of
    them is refused before anything is written, and the file is kept."""
    release, decoder = elsewhere
    target, before = release.folder / name, (release.folder / name).read_bytes()
    outputs = (
        {"-o": target, "--config": tmp_path / "new.pt"}
        if option == "-o"
        else {"-o": tmp_path / "new.pt", "--config": target}
    )
    assert (
        nmt_here(
            "import", str(decoder), *(str(a) for o, path in outputs.items() for a in (o, path))
        )
        == 1
    )
    one_line_error(
        capfd,
        f"{option} {target} is a file of the model being imported (SOURCE "
        f"{decoder.parent}/../b/{name})",
    )
    assert target.read_bytes() == before and not (tmp_path / "new.pt").exists()


@pytest.mark.parametrize(
    "config",
    ["{tmp}/", "{tmp}/missing/finetune.yaml", "{tmp}/m.pt"],
    ids=["a directory", "in no directory", "the checkpoint's name"],
)
def test_a_config_that_cannot_be_written_leaves_no_checkpoint(tmp_path, capfd, config):
    """Item 13: `nmt import -o m.pt --config bad` checks both outputs before it writes either."""
    release = write_release(tmp_path / "rel", Variant())
    args = (
        "import",
        str(release.folder),
        "-o",
        str(tmp_path / "m.pt"),
        "--config",
        config.format(tmp=tmp_path),
    )
    assert nmt_here(*args) == 1
    assert not (tmp_path / "m.pt").exists()
    one_line_error(capfd, "--config")


def test_only_the_members_the_mapping_reads_are_decompressed(tmp_path, capfd, monkeypatch):
    """Item 8: a .npz with a big unused member (16 MB of zeros, deflated to 16 kB) is refused by
    that member's name; the member is never opened, so never decompressed."""
    release = write_release(tmp_path / "rel", Variant())
    with zipfile.ZipFile(release.npz, "a", zipfile.ZIP_DEFLATED) as z, z.open("junk.npy", "w") as f:
        np.lib.format.write_array(f, np.zeros(1 << 22, np.float32))
    opened = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):
        opened.append(name.filename if isinstance(name, zipfile.ZipInfo) else name)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    assert nmt_here("import", str(release.folder), "-o", str(tmp_path / "m.pt")) == 1
    one_line_error(capfd, "weight junk is not part of the model")
    assert "junk.npy" not in opened and "Wemb.npy" in opened
