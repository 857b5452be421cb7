# ruff: noqa: F811 (the fixtures of test_import_hf, imported)
"""`nmt export --format hf`: a checkpoint as a Hugging Face MarianMT folder, checked against
transformers itself (a dev dependency; the package never imports it).

- round trip: each folder of tests/hf_marian.py (every variant transformers writes) through
  `nmt import` and `nmt export --format hf`: `MarianMTModel.from_pretrained` reports no missing,
  unexpected or mismatched key, every tensor equals the original folder's, the sentencepiece
  models are the same bytes, vocab.json the same mapping (plus the pad row's piece where the
  original left it implicit), and MarianTokenizer encodes as the original's does;
- a model nmt made (random, with MarianMT's settings: `positions: hf_marian`, `decoder_start:
  bos`, `norm_eps: 1e-5`): transformers' forced-decoding log-probabilities equal nmt's, and
  `generate()` with the folder's own generation_config.json finds what nmt's beam search finds;
- what MarianMT would compute differently is refused in one line naming the setting, and
  nothing is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import nmt_here, save_random_model
from hf_marian import VARIANTS
from test_import_hf import (  # noqa: F401 (fixtures)
    EosAtMaxLength,
    Models,
    hf_token_log_probs,
    models,
    sentences,
)
from transformers import LogitsProcessorList, MarianMTModel, MarianTokenizer

from nmt import Translator
from nmt.decoding.predict import score_token_lists
from nmt.tokenizer import Tokenizer

pytestmark = [
    pytest.mark.usefixtures("one_thread", "restore_logging"),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]

LOGPROB_TOL = 1e-4
MARIAN_SETTINGS = {
    "positions": "hf_marian",
    "decoder_start": "bos",
    "norm_eps": 1e-5,
    "activation": "swish",
    "output_bias": True,
}


def export_hf(checkpoint: Path, out: Path) -> Path:
    assert nmt_here("export", str(checkpoint), str(out), "--format", "hf") == 0
    return out


def loaded(folder: Path) -> MarianMTModel:
    """The folder's model, checked to load whole: no missing, unexpected or mismatched key."""
    model, info = MarianMTModel.from_pretrained(
        folder, attn_implementation="eager", output_loading_info=True
    )
    assert not any(
        info.get(kind) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
    ), info
    return model.eval()


@pytest.mark.parametrize("name", VARIANTS)
def test_a_hugging_face_folder_comes_back_as_it_was(models, sentences, tmp_path, name):
    variant = VARIANTS[name]
    folder = models.folder(variant)
    out = export_hf(models.checkpoint(variant), tmp_path / "hf")
    original, back = models.hf(variant)[0].state_dict(), loaded(out).state_dict()
    # transformers 5 keeps `shared` beside the encoder's and decoder's own tables when they are
    # shared but the output is untied: a third table that the model never reads and nmt does not
    # keep
    unread = (
        {"model.shared.weight"} if variant.share_embeddings and not variant.tie_output else set()
    )
    assert set(original) - set(back) == unread and set(back) <= set(original)
    assert [k for k in back if not torch.equal(back[k], original[k])] == []
    for spm in ("source.spm", "target.spm"):
        assert (out / spm).read_bytes() == (folder / spm).read_bytes()
    pad = json.loads((folder / "config.json").read_text())["pad_token_id"]
    for name in ("vocab.json", "target_vocab.json")[: 1 + variant.separate_vocabs]:
        before, after = (json.loads((f / name).read_text(encoding="utf-8")) for f in (folder, out))
        assert after == before | ({} if "<pad>" in before else {"<pad>": pad})
    assert (out / "target_vocab.json").exists() == variant.separate_vocabs
    src, tgt = sentences
    theirs, ours = MarianTokenizer.from_pretrained(folder), MarianTokenizer.from_pretrained(out)
    assert ours(src)["input_ids"] == theirs(src)["input_ids"]
    assert ours(text_target=tgt)["input_ids"] == theirs(text_target=tgt)["input_ids"]


@pytest.fixture(scope="module", params=["joint", "separate"])
def nmt_model(request, tmp_path_factory) -> Path:
    """A random nmt model with MarianMT's settings, exported; its checkpoint beside it. Of
    prepare-bpe's joint vocabulary, or of its --separate-vocab two (MarianMT's separate_vocabs)."""
    path = tmp_path_factory.mktemp("nmt-hf") / "model.pt"
    tokenizer = Tokenizer.from_file(
        request.getfixturevalue(f"prepared{'_separate' * (request.param == 'separate')}")[0]
        / "spm.model"
    )
    settings = MARIAN_SETTINGS | {"share_embeddings": request.param == "joint"}
    save_random_model(path, tokenizer, seed=3, model=settings, lenpen=1.0, lenpen_style="length")
    return export_hf(path, path.parent / "hf")


def test_transformers_scores_an_exported_model_as_nmt_does(nmt_model, sentences):
    """Forced decoding: every token's log-probability, sources and targets of several lengths
    in one padded batch on both sides."""
    hf = loaded(nmt_model)
    tr = Translator.load(nmt_model.parent / "model.pt", device="cpu")
    tok = tr.loaded.tokenizer
    # a model nmt trained has no >>xxx<< language tokens (MarianTokenizer would look one up whole)
    src, tgt = zip(
        *[(s, t) for s, t in zip(*sentences, strict=True) if not s.startswith(">>")], strict=True
    )
    sources, targets = [tok.encode(s) for s in src], [tok.encode_target(t) for t in tgt]
    ours = score_token_lists(tr.loaded.model, sources, targets, tr.decode, specials=tok.specials)
    theirs = hf_token_log_probs(hf, sources, targets)
    diff = max(
        abs(a - b) for o, t in zip(ours, theirs, strict=True) for a, b in zip(o, t, strict=True)
    )
    assert diff < LOGPROB_TOL
    hf_tok = MarianTokenizer.from_pretrained(nmt_model)
    assert hf_tok(list(src))["input_ids"] == [[*s, tok.specials.eos] for s in sources]


@pytest.mark.parametrize("beam", [1, 4])
def test_generate_with_the_exported_settings_finds_what_nmt_finds(nmt_model, sentences, beam):
    """generate() with the folder's generation_config.json (beam, length penalty, stopping,
    suppressed tokens) and nmt's length limit (the model's 6 tokens): the same tokens as nmt's
    search, sentence by sentence (a random model never ends on its own, so every output runs
    to the limit, where nmt forces </s> and generate() stops)."""
    hf = loaded(nmt_model)
    tr = Translator.load(nmt_model.parent / "model.pt", device="cpu", beam=beam, engine="torch")
    tok = tr.loaded.tokenizer
    src = [s for s in sentences[0] if not s.startswith(">>")]  # no language tokens, as above
    ours = [hyps[0].text for hyps in tr.translate_nbest(src)]
    hf_tok = MarianTokenizer.from_pretrained(nmt_model)
    theirs = []
    for text in src:  # nmt's limit: 6 tokens, then only </s> with its own log-prob (EosAtMaxLength)
        with torch.no_grad():
            out = hf.generate(
                **hf_tok([text], return_tensors="pt"),
                max_new_tokens=7,
                num_beams=beam,
                logits_processor=LogitsProcessorList([EosAtMaxLength(tok.specials.eos, 8)]),
            )
        theirs.append(
            tok.decode(
                t for t in out[0, 1:].tolist() if t not in (tok.specials.eos, tok.specials.pad)
            )
        )
    assert theirs == ours


@pytest.mark.parametrize(
    "setting, value",
    [("norm_first", True), ("positions", "nmt"), ("decoder_start", "zeros"), ("norm_eps", 1e-6)],
)
def test_what_marian_mt_computes_otherwise_is_refused(prepared, tmp_path, capfd, setting, value):
    path = save_random_model(
        tmp_path / "model.pt",
        Tokenizer.from_file(prepared[0] / "spm.model"),
        seed=1,
        model={**MARIAN_SETTINGS, setting: value},
    )
    capfd.readouterr()
    assert nmt_here("export", str(path), str(tmp_path / "hf"), "--format", "hf") == 1
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and f"model.{setting}=" in err and "MarianMT" in err, err
    assert not (tmp_path / "hf").exists()


def test_quantization_is_refused_with_hf(random_checkpoint, tmp_path, capfd):
    assert (
        nmt_here(
            "export",
            str(random_checkpoint),
            str(tmp_path / "hf"),
            "--format",
            "hf",
            "--quantization",
            "int8",
        )
        == 1
    )
    assert "--quantization is for --format ctranslate2" in capfd.readouterr().err


def test_every_file_of_the_folder_has_the_mode_the_umask_gives(prepared, tmp_path):
    """safetensors' save_file creates its file 0600: another account (a server's) could read the
    config but not the weights."""
    path = save_random_model(
        tmp_path / "model.pt",
        Tokenizer.from_file(prepared[0] / "spm.model"),
        seed=1,
        model=MARIAN_SETTINGS,
    )
    old = os.umask(0o022)
    try:
        folder = export_hf(path, tmp_path / "hf")
    finally:
        os.umask(old)
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in folder.iterdir()} == {
        f.name: "0o644" for f in folder.iterdir()
    }
