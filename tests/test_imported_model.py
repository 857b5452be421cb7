"""Using an imported OPUS-MT model (issue 26): the README's fine-tuning recipe through the real
commands (`nmt import --config`, `prepare-bpe --tokenizer-from`, `nmt train`), checked against
the reference implementation the model comes from (transformers' MarianMTModel), shortlists
over its vocabulary, and a multilingual model's target language (`--target-lang`).

- update 0 of the fine-tuning run is the imported model: its NLL on the first batch equals the
  Hugging Face model's cross-entropy on the same pairs;
- resume equals never stopping (a run stopped after 2 updates and continued to 4 has the
  weights of a run of 4);
- data prepared with another tokenizer is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from helpers import assert_same_weights, make_trainer, nmt_here, with_overrides
from hf_marian import VARIANTS, train_spm_pair, write_hf_marian
from transformers import MarianMTModel

from nmt import Translator
from nmt import checkpoint as ckpt
from nmt import data as datamod
from nmt.config import load_config
from nmt.errors import NmtError
from nmt.tokenizer import leading_language_token
from nmt.training.loss import TranslationLoss
from nmt.training.trainer import train

pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # train writes .nmt-last-run, cli.main sets logging


@pytest.fixture(scope="module")
def imported(raw_corpus, tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(HF folder, imported checkpoint, fine-tuning config, data prepared with its tokenizer)."""
    root = tmp_path_factory.mktemp("ft-import")
    src, tgt = train_spm_pair(
        raw_corpus.lines("train", "en"), raw_corpus.lines("train", "de"), root / "spm"
    )
    folder = write_hf_marian(root / "hf", VARIANTS["swish"], src, tgt)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        assert nmt_here("import", str(folder), "-o", "opus.pt", "--config", "finetune.yaml") == 0
        assert (
            nmt_here(
                "prepare-bpe",
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                raw_corpus.prefix("train"),
                "--validpref",
                raw_corpus.prefix("val"),
                "--tokenizer-from",
                "opus.pt",
                "--destdir",
                "data-bin",
            )
            == 0
        )
    return folder, root / "opus.pt", root / "finetune.yaml", root / "data-bin"


def finetune_config(imported, run_dir: Path, **train):
    _, checkpoint, config, data = imported
    cfg = load_config(config)
    assert cfg.train.init_from == "opus.pt"  # relative to where nmt import ran
    return with_overrides(
        cfg,
        data={"dir": str(data)},
        train={
            "init_from": str(checkpoint),
            "run_dir": str(run_dir),
            "device": "cpu",
            "threads": 1,
            "log_interval": 1,
            **train,
        },
    )


def test_update_0_of_the_fine_tuning_run_is_the_hugging_face_model(imported, tmp_path):
    """The trainer's teacher-forced NLL of its first batch, with the imported weights, equals
    transformers' cross-entropy of the same sentence pairs (labels = target + </s>, decoder
    input = decoder_start + target, as MarianMTModel shifts them)."""
    folder = imported[0]
    trainer = make_trainer(
        finetune_config(imported, tmp_path / "run", label_smoothing=0.0, max_tokens=600)
    )
    try:
        tok = trainer.tokenizer
        batch = datamod.collate(trainer.train_data, trainer.epoch_updates(1)[0][0], tok.specials)
        trainer.model.eval()
        with torch.no_grad():
            _, nll = TranslationLoss(trainer.model, 0.0)(
                batch.src, batch.prev_output, batch.target_index, batch.target_tokens
            )
    finally:
        trainer.close()
    hf = MarianMTModel.from_pretrained(folder).eval()
    src_mask = batch.src != tok.specials.pad
    labels = batch.target.masked_fill(batch.target == tok.specials.pad, -100)
    with torch.no_grad():
        out = hf(input_ids=batch.src, attention_mask=src_mask.long(), labels=labels)
    reference = out.loss.item() * batch.num_target_tokens  # the mean over the real target tokens
    assert nll.item() == pytest.approx(reference, rel=1e-5)


def test_a_stopped_fine_tuning_run_resumes_as_if_it_had_never_stopped(imported, tmp_path):
    train(finetune_config(imported, tmp_path / "whole", max_updates=4, max_tokens=600))
    train(finetune_config(imported, tmp_path / "split", max_updates=2, max_tokens=600))
    train(finetune_config(imported, tmp_path / "split", max_updates=4, max_tokens=600))
    whole = ckpt.load_checkpoint(tmp_path / "whole" / "checkpoint_last.pt")
    split = ckpt.load_checkpoint(tmp_path / "split" / "checkpoint_last.pt")
    assert whole["update"] == split["update"] == 4
    assert_same_weights(split["model"], whole["model"], 0.0)
    start = ckpt.load_checkpoint(imported[1])["model"]
    assert any(not torch.equal(start[k], whole["model"][k]) for k in start)  # it did train


def test_data_prepared_with_another_tokenizer_is_refused_in_one_line(
    imported, prepared, tmp_path, capsys
):
    config = tmp_path / "ft.yaml"
    raw = yaml.safe_load(Path(imported[2]).read_text())
    raw["data"]["dir"], raw["train"]["init_from"] = str(prepared[0]), str(imported[1])
    raw["train"]["run_dir"], raw["train"]["device"] = str(tmp_path / "run"), "cpu"
    config.write_text(yaml.safe_dump(raw))
    assert nmt_here("train", str(config)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert (
        len(err) == 1
        and err[0].startswith("nmt: error: train.init_from")
        and "tokenizer differs" in err[0]
    )
    assert not (tmp_path / "run" / "checkpoint_last.pt").exists()


def test_a_shortlist_learned_on_the_imported_models_data_decodes_with_it(
    imported, raw_corpus, tmp_path
):
    """`nmt shortlist` on data prepared with the imported tokenizer (pad is the last id there,
    not 0) and `translate --shortlist` with the imported checkpoint: one line out per line in,
    and a shortlist of all tokens changes nothing."""
    _, checkpoint, _, data = imported
    src = tmp_path / "src.en"
    src.write_text("\n".join(raw_corpus.lines("test", "en")[:8]) + "\n\n")
    assert (
        nmt_here(
            "shortlist", str(data), "-o", str(tmp_path / "sl.pt"), "--top", "5", "--frequent", "20"
        )
        == 0
    )
    common = ["translate", "-c", str(checkpoint), "-i", str(src), "--beam", "3", "--max-len-b", "8"]
    assert (
        nmt_here(*common, "-o", str(tmp_path / "short.de"), "--shortlist", str(tmp_path / "sl.pt"))
        == 0
    )
    assert len((tmp_path / "short.de").read_text().split("\n")) == 10
    vocab = ckpt.load_model_checkpoint(checkpoint).tokenizer.vocab_size
    assert (
        nmt_here("shortlist", str(data), "-o", str(tmp_path / "all.pt"), "--frequent", str(vocab))
        == 0
    )
    assert (
        nmt_here(*common, "-o", str(tmp_path / "all.de"), "--shortlist", str(tmp_path / "all.pt"))
        == 0
    )
    assert nmt_here(*common, "-o", str(tmp_path / "full.de")) == 0
    assert (tmp_path / "all.de").read_text() == (tmp_path / "full.de").read_text()


# ------------------------------------------------------------------ --target-lang


def test_target_lang_puts_the_language_token_first(imported, raw_corpus, tmp_path, capsys):
    """--target-lang fra translates each line as ">>fra<< line" would be (a line with its own
    token keeps it), through the command, the API's load option and its per-call argument,
    and translate_stream; the token is in the source ids, looked up whole."""
    checkpoint = imported[1]
    lines = raw_corpus.lines("test", "en")[:6]
    settings = {"beam": 2, "max_len_a": 0.0, "max_len_b": 6}
    plain = Translator.load(checkpoint, **settings)
    tok = plain.loaded.tokenizer
    assert tok.encode(">>fra<< " + lines[0])[0] == tok.pieces.index(">>fra<<")
    expected = plain.translate([f">>fra<< {line}" for line in lines[:5]] + [f">>deu<< {lines[5]}"])
    assert expected != plain.translate(lines)  # the token changes the translations
    assert (
        Translator.load(checkpoint, target_lang="fra", **settings).translate(
            lines[:5] + [f">>deu<< {lines[5]}"]
        )
        == expected
    )
    assert plain.translate(lines[:5], target_lang=">>fra<<") == expected[:5]
    streamed = Translator.load(checkpoint, target_lang="fra", **settings).translate_stream(
        iter(lines[:5])
    )
    assert list(streamed) == expected[:5]
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines[:5]) + "\n\n")
    assert (
        nmt_here(
            "translate",
            "-c",
            str(checkpoint),
            "-i",
            str(src),
            "-o",
            str(tmp_path / "out"),
            "--target-lang",
            "fra",
            "--beam",
            "2",
            "--max-len-a",
            "0",
            "--max-len-b",
            "6",
        )
        == 0
    )
    assert (tmp_path / "out").read_text().split("\n") == [*expected[:5], "", ""]


def test_a_language_token_has_no_space_in_it(imported):
    """Issue 34: one rule for what a source's language token is (`leading_language_token`: ">>",
    no whitespace, "<<"). The tokenizer took ">>a b<< x" as an unknown token (refused on this
    model) where the API saw none (and put --target-lang's before it); now both see text."""
    assert leading_language_token(">>fra<< x") == leading_language_token(">>fra<<x") == ">>fra<<"
    assert (
        leading_language_token(">>a b<< x") is None and leading_language_token("x >>fra<<") is None
    )
    settings = {"beam": 2, "max_len_a": 0.0, "max_len_b": 4}
    plain = Translator.load(imported[1], **settings)
    assert plain.loaded.tokenizer.unknown_language(">>a b<< x") is None
    assert plain.loaded.tokenizer.unknown_language(">>frx<< x") == ">>frx<<"
    assert Translator.load(imported[1], target_lang="fra", **settings).translate(
        [">>a b<< x"]
    ) == plain.translate([">>fra<< >>a b<< x"])


@pytest.mark.parametrize(
    "lang, message",
    [
        ("frx", "no >>frx<< token (did you mean fra?)"),
        ("a b", "must be a language code such as fra"),
    ],
)
def test_an_unknown_target_language_is_one_line(imported, tmp_path, capsys, lang, message):
    src = tmp_path / "in.en"
    src.write_text("A dog.\n")
    out = tmp_path / "out"
    assert (
        nmt_here(
            "translate",
            "-c",
            str(imported[1]),
            "-i",
            str(src),
            "-o",
            str(out),
            "--target-lang",
            lang,
        )
        == 1
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("nmt: error: --target-lang") and message in err[0], (
        err
    )
    assert not out.exists()
    with pytest.raises(NmtError, match="translate: target_lang"):
        Translator.load(imported[1], beam=2).translate(["A dog."], target_lang="xx")


def test_target_lang_is_refused_for_a_model_without_language_tokens(prepared, tmp_path):
    from helpers import save_random_model

    from nmt.tokenizer import Tokenizer

    path = save_random_model(tmp_path / "m.pt", Tokenizer.from_file(prepared[0] / "spm.model"), 1)
    with pytest.raises(NmtError, match="target_lang= fra: the model has no target-language tokens"):
        Translator.load(path, target_lang="fra")
