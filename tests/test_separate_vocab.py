"""Separate source and target vocabularies in models nmt trains (issue 37): `prepare-bpe
--separate-vocab` learns a sentencepiece model per side, and the model, its checkpoint,
translation (shortlists, constraints, alignments), fine-tuning with `--tokenizer-from` and
`--dry-run` use each side's own ids. The imports and exports of such models are tested with
theirs (test_import_hf, test_import_marian, test_export, test_export_hf)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY, assert_one_line, nmt, nmt_here, set_args

from nmt import Translator
from nmt import checkpoint as ckpt
from nmt.data import ParallelData
from nmt.decoding.shortlist import Shortlist
from nmt.tokenizer import NMT_SPECIALS, Tokenizer, VocabTokenizer

pytestmark = pytest.mark.usefixtures("isolated")


def train_args(data_dir: Path, run_dir: Path, **sets: object) -> list[str]:
    base = {
        "data.dir": data_dir,
        "train.run_dir": run_dir,
        "train.device": "cpu",
        "train.threads": 1,
        "train.max_updates": 3,
        "train.max_tokens": 1024,
        "model.share_embeddings": False,
    }
    return ["train", str(TINY), *set_args(base | sets)]


@pytest.fixture(scope="module")
def trained(prepared_separate, tmp_path_factory) -> Path:
    """checkpoint_last.pt of 3 updates of the tiny model on `prepared_separate`."""
    run = tmp_path_factory.mktemp("separate") / "run"
    assert nmt_here(*train_args(prepared_separate[0], run)) == 0
    return run / "checkpoint_last.pt"


def test_prepare_learns_one_model_per_side_and_numbers_each_side_with_its_own(
    prepared_separate, raw_corpus
):
    data, report = prepared_separate
    tok = Tokenizer.from_file(data / "spm.model")
    src_spm, tgt_spm = (Tokenizer.from_file(data / f"spm.{lang}.model") for lang in ("en", "de"))
    assert isinstance(tok, VocabTokenizer) and tok.specials == NMT_SPECIALS
    assert (report["vocab_size"], report["source_vocab_size"]) == (
        tok.vocab_size,
        tok.source_vocab_size,
    )
    assert (tok.source_vocab_size, tok.vocab_size) == (
        500,
        400,
    )  # --vocab-size, --target-vocab-size
    train = ParallelData.load(data, "train")
    src, tgt = raw_corpus.lines("train", "en")[:20], raw_corpus.lines("train", "de")[:20]
    assert (
        [tok.encode(s) for s in src]
        == [src_spm.encode(s) for s in src]
        == [train.src(i).tolist() for i in range(20)]
    )
    assert (
        [tok.encode_target(t) for t in tgt]
        == [tgt_spm.encode(t) for t in tgt]
        == [train.tgt(i).tolist() for i in range(20)]
    )
    assert any(
        tok.encode(t) != tok.encode_target(t) for t in tgt
    )  # a side's ids are not the other's
    assert [tok.decode(tok.encode_target(t)) for t in tgt] == [
        tgt_spm.decode(tgt_spm.encode(t)) for t in tgt
    ]


@pytest.mark.parametrize(
    "extra, needle",
    [
        (
            ["--separate-vocab", "--spm-model", "x.model"],
            "--separate-vocab learns two models; it cannot be combined",
        ),
        (
            ["--separate-vocab", "--tokenizer-from", "x.pt"],
            "it cannot be combined with --spm-model or --tokenizer-from",
        ),
        (["--target-vocab-size", "100"], "--target-vocab-size needs --separate-vocab"),
    ],
)
def test_separate_vocab_options_that_conflict_are_one_line(
    raw_corpus, tmp_path, capsys, extra, needle
):
    args = [
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        raw_corpus.prefix("test"),
        "--destdir",
        str(tmp_path / "out"),
        *extra,
    ]
    assert_one_line(nmt_here(*args), capsys.readouterr().err, needle)
    assert not (tmp_path / "out").exists()


def test_a_shared_embedding_is_refused_naming_the_key(prepared_separate, tmp_path, capsys):
    run = tmp_path / "run"
    assert_one_line(
        nmt_here(*train_args(prepared_separate[0], run, **{"model.share_embeddings": True})),
        capsys.readouterr().err,
        "model.share_embeddings must be false",
        "separate",
    )
    assert not (run / "checkpoint_last.pt").exists()


def test_dry_run_sizes_each_table_by_its_vocabulary(prepared_separate):
    data, report = prepared_separate
    r = nmt(*train_args(data, Path("unused"), **{"model.d_model": 16}), "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"{report['source_vocab_size'] * 16:,}" in out.split("src_embed")[1].split("\n")[0]
    assert f"{report['vocab_size'] * 16:,}" in out.split("tgt_embed")[1].split("\n")[0]


def test_the_model_reads_source_ids_with_its_source_table(trained):
    """The checkpoint's tables have each vocabulary's rows; translation, alignment and a
    constraint (a target-side phrase) go through the command line."""
    loaded = ckpt.load_model_checkpoint(trained)
    tok = loaded.tokenizer
    assert loaded.weights["src_embed.tokens.weight"].shape[0] == tok.source_vocab_size
    assert loaded.weights["tgt_embed.tokens.weight"].shape[0] == tok.vocab_size
    r = nmt("translate", "-c", str(trained), "--alignment", stdin="A dog runs.\nTwo men.\n")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    assert all(
        re.fullmatch(r"[^\t]*\t\d+-\d+( \d+-\d+)*", line) for line in r.stdout.splitlines()
    ), r.stdout
    source, target = tok.vocabularies()
    text = "A zebra, 42 zebras!"
    result = Translator.load(trained, device="cpu").translate_nbest([text], attention=True)[0][0]
    ids = tok.encode(text)
    assert max(ids) >= tok.vocab_size  # a source id past the target vocabulary's end
    assert result.attention is not None and result.attention.source == [source[i] for i in ids] + [
        "</s>"
    ]
    assert (
        tok.decode([target.index(p) for p in result.attention.target[:-1]]) == result.text
    )  # the target's pieces
    assert "Hund" not in nmt("translate", "-c", str(trained), stdin="A dog runs.\n").stdout
    request = json.dumps({"text": "A dog runs.", "constraints": ["Hund"]})
    r = nmt("translate", "-c", str(trained), "--json-input", stdin=request + "\n")
    assert r.returncode == 0 and "Hund" in r.stdout, r.stderr


def test_a_shortlist_maps_source_tokens_to_target_ids(prepared_separate, trained, tmp_path):
    """Candidates are learned per source id (the source vocabulary's rows); a source token's own
    piece is allowed as the target token of that piece, not as the target id of its number."""
    data, report = prepared_separate
    out = tmp_path / "sl.pt"
    assert nmt_here("shortlist", str(data), "-o", str(out), "--top", "5", "--frequent", "10") == 0
    translator = Translator.load(trained, device="cpu", shortlist=out)
    sl, tok = translator.shortlist, translator.loaded.tokenizer
    assert isinstance(sl, Shortlist) and sl.candidates.shape == (report["source_vocab_size"], 5)
    source, target = tok.vocabularies()
    assert sl.copies is not None and [target[i] for i in sl.copies.tolist() if i >= 0] == [
        p for p in source if p in target
    ]
    piece = next(
        p
        for p in source
        if p in target and source.index(p) != target.index(p) and source.index(p) > 3
    )
    empty = Shortlist(
        torch.full((len(source), 1), -1),
        torch.tensor([], dtype=torch.long),
        tok.vocab_size,
        "",
        "",
        "",
        sl.copies,
    )
    allowed = empty.allowed(torch.tensor([[source.index(piece), tok.specials.eos]]), tok.specials)
    assert allowed[0].nonzero().view(-1).tolist() == sorted(
        {*tok.specials.ids(), target.index(piece)}
    )
    assert len(translator.translate(["A dog runs."])) == 1


def test_fine_tuning_data_comes_from_the_checkpoints_two_models(trained, raw_corpus, tmp_path):
    data = tmp_path / "ft"
    assert (
        nmt_here(
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            raw_corpus.prefix("test"),
            "--workers",
            "1",
            "--tokenizer-from",
            str(trained),
            "--destdir",
            str(data),
        )
        == 0
    )
    assert (data / "spm.model").read_bytes() == ckpt.load_checkpoint(trained)["tokenizer"]["model"]
    assert json.loads((data / "prepare.json").read_text())["source_vocab_size"] is not None
    assert (
        nmt_here(
            *train_args(
                data, tmp_path / "run", **{"train.init_from": trained, "train.max_updates": 1}
            )
        )
        == 0
    )
    tuned = ckpt.load_model_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert tuned.tokenizer.sha256 == ckpt.load_model_checkpoint(trained).tokenizer.sha256
    assert not np.array_equal(
        tuned.weights["src_embed.tokens.weight"].numpy(),
        ckpt.load_model_checkpoint(trained).weights["src_embed.tokens.weight"].numpy(),
    )


def test_a_student_that_would_share_the_teachers_two_vocabularies_is_refused_first(
    trained, raw_corpus, tmp_path, capsys
):
    out = tmp_path / "distill"
    assert_one_line(
        nmt_here(
            "distill",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            raw_corpus.prefix("test"),
            "--teacher",
            str(trained),
            "--config",
            str(TINY),
            "--out",
            str(out),
        ),
        capsys.readouterr().err,
        f"--config {TINY}: model.share_embeddings must be false",
        str(trained),
    )
    assert not out.exists()


def test_an_rnn_reads_source_ids_with_its_source_table(prepared_separate, tmp_path):
    run = tmp_path / "rnn"
    assert (
        nmt_here(
            *train_args(prepared_separate[0], run, **{"model.arch": "rnn", "train.max_updates": 1})
        )
        == 0
    )
    loaded = ckpt.load_model_checkpoint(run / "checkpoint_last.pt")
    assert loaded.weights["src_tokens.weight"].shape[0] == prepared_separate[1]["source_vocab_size"]
    assert loaded.weights["tgt_tokens.weight"].shape[0] == prepared_separate[1]["vocab_size"]
    assert (
        len(Translator.load(run / "checkpoint_last.pt", device="cpu").translate(["A dog runs."]))
        == 1
    )
