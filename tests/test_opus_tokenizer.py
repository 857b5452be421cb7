"""`nmt import` of a published OPUS-MT model's shape and vocabulary, end to end against Hugging
Face transformers (issue 26).

`../shared/data/opus-mt-en-mg` (the NMT_OPUS_MT_EN_MG environment variable overrides) holds the
source.spm, target.spm, vocab.json, config.json and tokenizer_config.json of Helsinki-NLP's
opus-mt-en-mg, without its weights. transformers builds a randomly initialised MarianMTModel of
exactly that config (6+6 layers, d_model 512, swish, the whole 54,688-piece vocabulary: nothing
shrunk), perturbed so that its distributions are far from uniform, and writes it as an HF folder
with the real tokenizer files; `nmt import` (the command) turns it into a checkpoint. Then:
- the checkpoint's tokenizer gives MarianTokenizer's ids on varied English (punctuation, digits,
  accents, emoji, odd spaces, an empty line, a `>>xxx<<` prefix this model lacks) and, on the
  target side, on Malagasy; its special ids are config.json's; its decode is MarianTokenizer's;
- the imported model's log-probabilities under forced decoding are the HF model's;
- `nmt translate` on the checkpoint answers every input line.

Skipped where the data directory or transformers is absent. Two known differences from
MarianTokenizer are by design and asserted as such: a literal `</s>` / `<unk>` / `<pad>` in the
input is text (MarianTokenizer parses it as its special token, so user text could end a source
early), and `decode` shows an `<unk>` as ` ⁇ ` as every nmt tokenizer does (MarianTokenizer's
skip_special_tokens drops it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ROOT, nmt_here

from nmt import Translator
from nmt.checkpoint import ModelCheckpoint, load_model_checkpoint
from nmt.models.transformer import Transformer
from nmt.tokenizer import Tokenizer

OPUS_MT_EN_MG = Path(
    os.environ.get("NMT_OPUS_MT_EN_MG") or ROOT.parent / "shared/data/opus-mt-en-mg"
)
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

pytestmark = [
    pytest.mark.skipif(
        not all((OPUS_MT_EN_MG / f).is_file() for f in ("config.json", *TOKENIZER_FILES)),
        reason=f"{OPUS_MT_EN_MG}: no opus-mt-en-mg tokenizer files and config "
        "(set NMT_OPUS_MT_EN_MG to the folder)",
    ),
    pytest.mark.skipif(
        not HAVE_TRANSFORMERS, reason="transformers is not installed (pip install -e '.[dev]')"
    ),
    pytest.mark.usefixtures("one_thread"),
]

ENGLISH = [
    "A man in a blue shirt is standing on a ladder.",
    "Two dogs play in the snow.",
    "Hello, world!",
    "What time is it?",
    "It's 5:30 p.m. on 12/31/2024; the train leaves at 06:15.",
    "The price rose from $1,299.99 to €1.450,00 (+11.6%).",
    "Call +261 20 22 123 45 or e-mail info@example.mg.",
    "Visit https://www.example.com/path?q=1&lang=en#top now.",
    'She said: "Don\'t go!" — and left…',
    "“Curly quotes” and ‘single ones’ are typographic.",
    "Naïve café owners in Zürich serve crème brûlée.",
    "São Paulo, Kraków, Reykjavík and Ålesund are cities.",
    "Antananarivo is the capital of Madagascar.",
    "The lemur 🐒 jumped over the baobab 🌳!",
    "I ❤️ Madagascar 🇲🇬 and its vanilla 🍦.",
    "  Leading spaces.",
    "Trailing spaces.   ",
    "   Both sides, with   inner   runs   of spaces.   ",
    "\tA tab at the start\tand one inside.",
    "",
    "   ",
    "ALL CAPS SENTENCE WITH NUMBERS 1234567890.",
    "mixed CaSe WoRdS and camelCaseIdentifiers",
    "A sentence without a final full stop",
    "Semi-colons; colons: dashes - and en–dashes.",
    "Parentheses (like these), brackets [like these] and braces {like these}.",
    "Hash #tags, @mentions, 100% sure & more.",
    "3.14159 is pi, 2.71828 is e, and 1/3 is a fraction.",
    "The year 1896 saw France colonise the island.",
    "Full-width ＡＢＣ and ligatures like ﬁne and ½ cup.",
    "Greek αβγ, Cyrillic мир, Arabic سلام, Chinese 你好.",
    "A combining accent: e\u0301 versus é.",
    "A non\u00a0breaking space and a zero\u200bwidth one.",
    ">>fra<< This model has no French token.",
    ">>mlg<< Nor a Malagasy one.",
    ">>fra<<No space after the token.",
    "Mid-sentence >>fra<< tokens are ordinary text.",
    "What?!? Really??? Wow!!!",
    "....",
    "'",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Children are playing football on the beach at sunset.",
    "A woman with a red umbrella walks down a rainy street.",
    "Several people are waiting for the bus in the morning.",
    "The 3rd, 21st and 102nd runners finished in 2h03'45\".",
    "Email me at JOHN.DOE@EXAMPLE.ORG by Friday, 9 a.m.",
    "Tabs\tand\tmore\ttabs.",
    "Ellipsis... and a dash -- and an underscore_here.",
    "¿Qué? ¡Sí! — Spanish punctuation.",
    "Temperature: -5°C to +30°C, humidity ≥ 80%.",
    "One very long sentence " + "that goes on and on " * 12 + "and finally ends.",
]

MALAGASY = [
    "Manao ahoana ianao?",
    "Tonga soa eto Madagasikara.",
    "Misaotra betsaka, tompoko!",
    "Ny alika roa dia milalao ao anaty lanezy.",
    "Lehilahy iray manao akanjo manga mijoro eo amin'ny tohatra.",
    "Ankizy maro no milalao baolina eny amoron-dranomasina.",
    "Antananarivo no renivohitr'i Madagasikara.",
    "Tamin'ny taona 1896 no nanjanaka ny nosy i Frantsa.",
    "Ny vidiny dia 12 500 Ariary (Ar).",
    "Vehivavy mitondra elo mena mandeha eny an-dalana.",
    "Aiza ny fiantsonan'ny fiara fitateram-bahoaka?",
    "Tsara ny andro anio, hoy izy.",
    "  Misy elanelana eo am-piandohana sy eo am-piafarana.  ",
    "Ô ry tanindrazanay malala ô!",
    "Fanahy maha-olona — fihavanana sy fitiavana.",
    "Lemaka 🐒 sy baobab 🌳.",
    "",
]

HF_CONFIG = (
    json.loads((OPUS_MT_EN_MG / "config.json").read_text())
    if (OPUS_MT_EN_MG / "config.json").is_file()
    else {}
)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face MarianMT folder written by transformers: a random model of exactly
    opus-mt-en-mg's config, beside the model's real tokenizer files, with the model's beam in
    generation_config.json as the published folders have it. The weights are drawn with std 0.05
    (config init_std, for 0.02), the pad row (the decoder's start, zero after the init) with std
    1, and the biases, LayerNorms and final_logits_bias perturbed, so that the distributions are
    peaked and each part counts: with these, starting the decoder from zeros, Marian's sinusoid
    layout or gelu for swish each move some log-probability by more than 0.01, far beyond the
    1e-4 the forced-decoding test allows (HF's 0.02 init alone gives near-uniform distributions)."""
    from transformers import MarianConfig, MarianMTModel

    folder = tmp_path_factory.mktemp("opus-mt-en-mg-random")
    config = MarianConfig.from_pretrained(OPUS_MT_EN_MG)
    config.init_std = 0.05
    torch.manual_seed(26)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.normal_()
        model.get_input_embeddings().weight[config.pad_token_id].normal_(std=1.0)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p), alpha=0.1)
    model.generation_config.num_beams = HF_CONFIG["num_beams"]
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(OPUS_MT_EN_MG / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def imported(hf_folder: Path) -> ModelCheckpoint:
    """`nmt import` of the folder (the command line, in this process), loaded."""
    out = hf_folder.parent / "opus-mt-en-mg.pt"
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        assert nmt_here("import", str(hf_folder), "-o", str(out)) == 0
    finally:  # cli.main points the root logger at this test's captured streams
        root.handlers[:] = handlers
        root.setLevel(level)
    return load_model_checkpoint(out)


@pytest.fixture(scope="module")
def marian_tokenizer(hf_folder: Path):
    from transformers import MarianTokenizer

    with (
        warnings.catch_warnings()
    ):  # "Recommended: pip install sacremoses": its normalizer is not used
        warnings.simplefilter("ignore")
        return MarianTokenizer.from_pretrained(hf_folder)


def source_ids(tok: Tokenizer, text: str) -> list[int]:
    return [*tok.encode(text), tok.specials.eos]


def target_ids(tok: Tokenizer, text: str) -> list[int]:
    return [*tok.encode_target(text), tok.specials.eos]


# ------------------------------------------------------------------ tokenizer


def test_special_ids_and_shape_are_config_json(imported: ModelCheckpoint, marian_tokenizer) -> None:
    tok, model = imported.tokenizer, imported.config.model
    vocab = json.loads((OPUS_MT_EN_MG / "vocab.json").read_text(encoding="utf-8"))
    assert (
        tok.vocab_size == HF_CONFIG["vocab_size"] == len(vocab)
    )  # opus-mt-en-mg's vocab.json lists <pad>
    assert vocab["<pad>"] == tok.specials.pad
    assert tok.specials.pad == HF_CONFIG["pad_token_id"] == marian_tokenizer.pad_token_id
    assert (
        tok.specials.eos
        == HF_CONFIG["eos_token_id"]
        == vocab["</s>"]
        == marian_tokenizer.eos_token_id
    )
    assert tok.specials.unk == vocab["<unk>"] == marian_tokenizer.unk_token_id
    assert tok.specials.bos == HF_CONFIG["decoder_start_token_id"]
    assert [tok.piece(i) for i in range(tok.vocab_size)] == sorted(vocab, key=vocab.__getitem__)
    assert tok.language_tokens() == []
    assert (
        model.encoder_layers,
        model.decoder_layers,
        model.d_model,
        model.heads,
        model.ffn_dim,
    ) == (
        HF_CONFIG["encoder_layers"],
        HF_CONFIG["decoder_layers"],
        HF_CONFIG["d_model"],
        HF_CONFIG["encoder_attention_heads"],
        HF_CONFIG["encoder_ffn_dim"],
    )
    assert (model.activation, model.max_positions) == (
        HF_CONFIG["activation_function"],
        HF_CONFIG["max_position_embeddings"],
    )
    assert imported.config.decode.beam == HF_CONFIG["num_beams"]


@pytest.mark.parametrize("text", ENGLISH, ids=range(len(ENGLISH)))
def test_source_ids_are_marian_tokenizers(
    imported: ModelCheckpoint, marian_tokenizer, text: str
) -> None:
    assert source_ids(imported.tokenizer, text) == marian_tokenizer(text)["input_ids"]


def test_the_sentences_cover_what_they_claim(imported: ModelCheckpoint) -> None:
    """The English above reaches <unk> (pieces of the source model that the vocabulary lacks)
    and an unknown language token, looked up whole (one <unk>, not pieces of '>>fra<<')."""
    tok = imported.tokenizer
    assert tok.specials.unk in {i for text in ENGLISH[:33] for i in tok.encode(text)}
    assert tok.encode(">>fra<< x") == [tok.specials.unk, *tok.encode("x")]


@pytest.mark.parametrize("text", MALAGASY, ids=range(len(MALAGASY)))
def test_target_ids_are_marian_tokenizers(
    imported: ModelCheckpoint, marian_tokenizer, text: str
) -> None:
    assert target_ids(imported.tokenizer, text) == marian_tokenizer(text_target=text)["input_ids"]


def test_source_and_target_models_differ(imported: ModelCheckpoint) -> None:
    """The two sentencepiece models segment differently (else the target checks above would not
    tell them apart)."""
    tok = imported.tokenizer
    assert any(tok.encode(t) != tok.encode_target(t) for t in MALAGASY)


def test_decode_is_marian_tokenizers(imported: ModelCheckpoint, marian_tokenizer) -> None:
    """On the Malagasy's target ids (with EOS and the decoder start around them) and on random
    id sequences over the whole vocabulary, source-only pieces included; <unk> aside (below)."""
    tok = imported.tokenizer
    start, unk = tok.specials.bos, tok.specials.unk
    rng = torch.Generator().manual_seed(3)
    sequences = [[start, *(i for i in target_ids(tok, t) if i != unk)] for t in MALAGASY]
    for _ in range(200):
        ids = torch.randint(
            0, tok.vocab_size, (int(torch.randint(1, 16, (1,), generator=rng)),), generator=rng
        )
        sequences.append([i for i in ids.tolist() if i != unk])
    for ids in sequences:
        want = marian_tokenizer.decode(ids, skip_special_tokens=True, use_source_tokenizer=False)
        assert tok.decode(ids) == want, ids
    assert any(tok.decode(ids) for ids in sequences)


def test_unk_and_special_strings_are_nmts_own(imported: ModelCheckpoint, marian_tokenizer) -> None:
    """The two intended differences: decode shows <unk> as ' ⁇ ' (MarianTokenizer drops it); a
    literal '</s>' in the input is text, where MarianTokenizer would end the source there."""
    tok = imported.tokenizer
    ids = target_ids(tok, "Manao ahoana")
    with_unk = [*ids[:1], tok.specials.unk, *ids[1:]]
    assert marian_tokenizer.decode(
        with_unk, skip_special_tokens=True, use_source_tokenizer=False
    ) == tok.decode(ids)
    assert "⁇" in tok.decode(with_unk)
    text = "a </s> b"
    assert marian_tokenizer(text)["input_ids"].count(tok.specials.eos) == 2
    assert source_ids(tok, text).count(tok.specials.eos) == 1


# ------------------------------------------------------------------ the model


def test_forced_decoding_equals_hf(hf_folder: Path, imported: ModelCheckpoint) -> None:
    """Every log-probability of the whole vocabulary at every target position, within 1e-4, and
    `Translator.score` equals the sum of the HF model's log-probabilities of the target."""
    from transformers import MarianMTModel

    tok = imported.tokenizer
    hf = MarianMTModel.from_pretrained(hf_folder).eval()
    ours = Transformer(imported.config.model, tok.vocab_size, tok.specials.pad)
    zero_start = Transformer(
        dataclasses.replace(imported.config.model, decoder_start="zeros"),
        tok.vocab_size,
        tok.specials.pad,
    )
    for model in (ours, zero_start):
        imported.load_into(model)
        model.eval()
    pairs = list(zip(ENGLISH[:4] + [ENGLISH[33]], MALAGASY[:5], strict=True))
    hf_sums = []
    for src, tgt in pairs:
        s, t = torch.tensor([source_ids(tok, src)]), target_ids(tok, tgt)
        prev = torch.tensor([[HF_CONFIG["decoder_start_token_id"], *t[:-1]]])
        with torch.no_grad():
            want = torch.log_softmax(hf(input_ids=s, decoder_input_ids=prev).logits[0].float(), -1)
            got = torch.log_softmax(ours(s, prev)[0].float(), -1)
        assert (got - want).abs().max().item() < 1e-4, (src, tgt)
        hf_sums.append(want.gather(1, torch.tensor(t)[:, None]).sum().item())
        bias_alone = torch.log_softmax(hf.final_logits_bias[0].float(), -1)
        assert (want - bias_alone).abs().max() > 1.0  # the network counts, not just the output bias
        with torch.no_grad():  # and the check is sharp: a decoder started from zeros fails it
            from_zeros = torch.log_softmax(zero_start(s, prev)[0].float(), -1)
        assert (from_zeros - want).abs().max() > 1e-2
    translator = Translator.load(imported.path, device="cpu", threads=1)
    scores = translator.score([s for s, _ in pairs], [t for _, t in pairs])
    assert scores == pytest.approx(hf_sums, abs=1e-3)


def test_surfaces_are_what_decode_writes(imported: ModelCheckpoint) -> None:
    """Issue 33 (5): avoided phrases are matched against the bytes of the target tokens'
    surfaces; for random target ids of the real vocabulary (its language tokens, pieces the
    target model lacks, specials included), they are the decoded text."""
    tok, rng = imported.tokenizer, random.Random(0)
    surfaces = tok.surfaces()
    for _ in range(2000):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 10))]
        assert tok.decode(ids) == b"".join(surfaces[i] for i in ids).decode().strip(), ids


def test_an_unknown_language_token_is_read_as_unk_with_one_warning(
    imported: ModelCheckpoint, caplog
) -> None:
    """Issue 33 (15): this model has no language tokens; a source that starts with one is read as
    <unk>, as MarianTokenizer reads it, and said once a token, naming the first text."""
    translator = Translator.load(
        imported.path, device="cpu", threads=1, beam=1, max_len_a=0.0, max_len_b=2
    )
    with caplog.at_level(logging.WARNING):
        translator.translate([">>fra<< Hello.", ">>fra<< A dog.", "Hello."])
    warnings = [
        r.getMessage() for r in caplog.records if "not a token of this model" in r.getMessage()
    ]
    assert len(warnings) == 1 and warnings[0].startswith(
        "texts[0]: >>fra<< is not a token of this model"
    )


@pytest.mark.usefixtures("isolated")  # conftest: cli.main sets logging and threads; undone after
def test_translate_answers_every_line(imported: ModelCheckpoint, tmp_path: Path) -> None:
    """`nmt translate` on the checkpoint (the command line, in this process; beam 2 and a few
    tokens: a random model never ends on its own) writes one line per input line, empty for the
    blank inputs."""
    src, out = tmp_path / "input.en", tmp_path / "output.mg"
    src.write_text("".join(line + "\n" for line in ENGLISH), encoding="utf-8")
    assert (
        nmt_here(
            "translate",
            "-c",
            str(imported.path),
            "-i",
            str(src),
            "-o",
            str(out),
            "--beam",
            "2",
            "--max-len-a",
            "0",
            "--max-len-b",
            "4",
            "--threads",
            "1",
        )
        == 0
    )
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(ENGLISH)
    for line, text in zip(lines[:-1], ENGLISH, strict=True):
        assert (line == "") == (text.strip() == ""), (text, line)


@pytest.mark.usefixtures("isolated")
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("four", "num_beams is 'four', not an integer"),
        (0, "num_beams must be at least 1, got 0"),
        (True, "num_beams is True, not an integer"),
    ],
)
def test_a_bad_num_beams_is_one_line(
    hf_folder: Path, tmp_path: Path, capsys, value, reason
) -> None:
    """generation_config.json's num_beams is the checkpoint's beam (checked above); a value that
    is not a positive integer is an error naming the file and the key, not a traceback."""
    folder = tmp_path / "folder"
    folder.mkdir()
    for path in hf_folder.iterdir():
        (folder / path.name).symlink_to(path)
    (folder / "generation_config.json").unlink()
    (folder / "generation_config.json").write_text(
        json.dumps({"num_beams": value}), encoding="utf-8"
    )
    assert nmt_here("import", str(folder), "-o", str(tmp_path / "out.pt")) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"nmt: error: {folder / 'generation_config.json'}: {reason}"
    assert not (tmp_path / "out.pt").exists()


# ------------------------------------------------------------------ separate vocabularies


@pytest.fixture(scope="module")
def separate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Any]:
    """opus-mt-en-mg's two sentencepiece models as a model with separate vocabularies, as the
    opus-mt-tc releases with `separate_vocabs` have them: vocab.json the source model's pieces,
    target_vocab.json the target model's (`</s>` 0, `<unk>` 1, `<pad>` 2 in both; two sizes),
    a small random MarianMTModel over them written by transformers (tests/hf_marian.py), imported
    by `nmt import`; beside it MarianTokenizer with `separate_vocabs` on the same folder."""
    from hf_marian import Variant, write_hf_marian
    from transformers import MarianTokenizer

    folder = tmp_path_factory.mktemp("opus-mt-en-mg-separate")
    write_hf_marian(
        folder / "hf",
        Variant(share_embeddings=False, tie_output=False, separate_vocabs=True),
        OPUS_MT_EN_MG / "source.spm",
        OPUS_MT_EN_MG / "target.spm",
    )
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        assert nmt_here("import", str(folder / "hf"), "-o", str(folder / "model.pt")) == 0
    finally:  # cli.main points the root logger at this test's captured streams
        root.handlers[:] = handlers
        root.setLevel(level)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = MarianTokenizer.from_pretrained(folder / "hf")
    assert hf.separate_vocabs
    return load_model_checkpoint(folder / "model.pt").tokenizer, hf


def test_separate_vocabularies_segment_and_number_as_marian_tokenizer(separate) -> None:
    """Segmentation (the pieces), ids and de-segmentation, each side against its own vocabulary."""
    tok, hf = separate
    source_pieces, target_pieces = tok.vocabularies()
    assert tok.source_vocab_size == len(hf.encoder) != tok.vocab_size == len(hf.target_encoder)
    assert (tok.specials.pad, tok.specials.eos, tok.specials.unk) == (
        hf.pad_token_id,
        hf.eos_token_id,
        hf.unk_token_id,
    )
    for text in ENGLISH:
        ids = hf(text)["input_ids"]
        assert source_ids(tok, text) == ids, text
        pieces = hf.tokenize(text)  # <unk>: a piece the source vocabulary lacks
        assert [source_pieces[i] for i in ids[:-1]] == [
            p if p in hf.encoder else "<unk>" for p in pieces
        ], text
    assert tok.specials.unk in {i for text in ENGLISH for i in tok.encode(text)}  # >>fra<< at least
    for text in MALAGASY:
        ids = hf(text_target=text)["input_ids"]
        assert target_ids(tok, text) == ids, text
        assert [target_pieces[i] for i in ids] == hf.convert_ids_to_tokens(ids), text
        if tok.specials.unk not in ids:
            assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
    # the two vocabularies number a piece differently: a source id is no target id
    common = set(source_pieces) & set(target_pieces) - {"</s>", "<unk>", "<pad>"}
    assert any(source_pieces.index(p) != target_pieces.index(p) for p in common)
