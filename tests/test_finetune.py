"""Fine-tuning (issue 26): `train.init_from` starts a new run from a checkpoint's weights with a
fresh optimizer, schedule and data position, and `prepare-bpe --tokenizer-from` prepares data
with that checkpoint's own vocabulary.

The checkpoint fine-tuned is a real training checkpoint (Adam moments, progress, RNG states
inside, none of which may reach the new run) of a tiny model trained a few updates with
another seed than the runs that start from it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    TINY,
    assert_equal_runs,
    assert_one_line,
    assert_same_weights,
    make_trainer,
    nmt_here,
    set_args,
    tiny,
    with_overrides,
)

from nmt import checkpoint as ckpt
from nmt import data as datamod
from nmt.models.transformer import build_model
from nmt.tokenizer import Tokenizer
from nmt.training.loss import TranslationLoss
from nmt.training.trainer import train

pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # train writes .nmt-last-run, cli.main sets logging


@pytest.fixture(scope="module")
def base(prepared, tmp_path_factory) -> Path:
    """checkpoint_last.pt of 3 updates on `prepared`, seed 7 (a fresh seed-1 model differs)."""
    root = tmp_path_factory.mktemp("base")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        try:
            train(tiny(prepared[0], root / "run", max_updates=3, seed=7, max_tokens=1024))
        finally:
            torch.set_num_threads(threads)
    return root / "run" / "checkpoint_last.pt"


# ------------------------------------------------------------------ train.init_from


def test_a_new_run_starts_from_the_checkpoint_and_takes_one_fresh_adam_step(
    prepared, base, tmp_path
):
    """Update 0 of the run is the checkpoint's model: its loss on the first batch is the
    checkpoint model's (the trainer's loss function, teacher-forced). The first update is one
    step of a fresh Adam at the schedule's first lr: the same as a hand-made run that loads
    the checkpoint's weights into a new model, although the checkpoint holds Adam moments and
    progress of its own."""
    source = ckpt.load_model_checkpoint(base)
    assert (
        source.config.train.seed == 7
        and ckpt.load_checkpoint(base)["train_state"]["optimizer"]["state"]
    )
    cfg = tiny(prepared[0], tmp_path / "ft", init_from=str(base), max_tokens=1024)
    trainer = make_trainer(cfg)
    hand = make_trainer(tiny(prepared[0], tmp_path / "hand", max_tokens=1024))
    try:
        assert (
            trainer.progress.update,
            trainer.progress.epoch,
            trainer.progress.updates_in_epoch,
        ) == (0, 1, 0)
        assert trainer.optimizer.state_dict()["state"] == {}
        assert_same_weights(trainer.model.state_dict(), source.weights, 0.0)
        group = trainer.epoch_updates(1)[0]

        reference = build_model(
            source.config.model, source.tokenizer.vocab_size, source.tokenizer.specials.pad
        )
        source.load_into(reference)
        batch = datamod.collate(trainer.train_data, group[0], trainer.tokenizer.specials)
        with torch.no_grad():
            loss, _ = TranslationLoss(reference.train(), cfg.train.label_smoothing)(
                batch.src, batch.prev_output, batch.target_index, batch.target_tokens
            )

        stats = trainer.train_update(group)
        assert stats is not None and float(stats.loss_sum) == pytest.approx(float(loss), rel=1e-6)

        hand.model.load_state_dict(source.weights)
        assert hand.train_update(group) is not None
        assert_same_weights(
            dict(trainer.model.named_parameters()), dict(hand.model.named_parameters()), 0.0
        )
        moved = trainer.model.state_dict()
        assert any(
            not torch.equal(moved[k], source.weights[k]) for k in source.weights
        )  # a step was taken
    finally:
        trainer.close()
        hand.close()


def test_resuming_a_fine_tuning_run_equals_never_stopping(prepared, base, tmp_path, caplog):
    """With checkpoints in the run directory, init_from is ignored (logged once): the run
    resumes, even where the checkpoint it started from has gone, and ends as a run that never
    stopped. Dropout differs from the checkpoint's (0): a training-only key may."""
    source = tmp_path / "c.pt"
    shutil.copyfile(base, source)
    model = {"dropout": 0.3, "attention_dropout": 0.1, "activation_dropout": 0.1}
    cfg = tiny(
        prepared[0],
        tmp_path / "a",
        model,
        init_from=str(source),
        max_tokens=1024,
        validate_interval_updates=3,
        save_interval_updates=2,
    )
    train(with_overrides(cfg, train={"max_updates": 7}))
    run_b = tmp_path / "b"
    assert train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": 3})).update == 3
    source.rename(tmp_path / "gone.pt")
    caplog.set_level("INFO", logger="nmt.training.trainer")
    assert train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": 7})).update == 7
    ignored = [r.getMessage() for r in caplog.records if "init_from" in r.getMessage()]
    assert len(ignored) == 1 and "ignored" in ignored[0] and str(source) in ignored[0], ignored
    assert_equal_runs(tmp_path / "a", run_b)
    history = ckpt.load_checkpoint(run_b / "checkpoint_last.pt")["train_state"]["progress"][
        "history"
    ]
    assert history == [f"initialized from {source.resolve()}"]


def run_args(data_dir: Path, run_dir: Path, init_from: Path | str, **model: object) -> list[str]:
    sets = {
        "data.dir": data_dir,
        "train.run_dir": run_dir,
        "train.init_from": init_from,
        "train.device": "cpu",
        "train.threads": 1,
        "train.max_updates": 1,
        **{f"model.{k}": v for k, v in model.items()},
    }
    return ["train", str(TINY), *set_args(sets)]


@pytest.mark.parametrize("case", ["missing", "directory", "not a checkpoint", "model config"])
def test_a_bad_init_from_is_one_line_and_writes_nothing(prepared, base, tmp_path, capsys, case):
    paths = {
        "missing": tmp_path / "none.pt",
        "directory": base.parent,
        "not a checkpoint": tmp_path / "notes.txt",
        "model config": base,
    }
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    needles = {
        "missing": "checkpoint not found",
        "directory": "is a directory, not a file",
        "not a checkpoint": "corrupt or truncated checkpoint",
        "model config": "model.ffn_dim is 64 in the checkpoint but 96 in this run's config",
    }
    model = {"ffn_dim": 96, "dropout": 0.2} if case == "model config" else {}
    run = tmp_path / "run"
    assert_one_line(
        nmt_here(*run_args(prepared[0], run, paths[case], **model)),
        capsys.readouterr().err,
        f"train.init_from {paths[case]}: ",
        needles[case],
    )
    assert not run.exists()


# ------------------------------------------------------------------ prepare-bpe --tokenizer-from


def test_data_prepared_with_tokenizer_from_passes_the_check_and_a_learned_tokenizer_is_refused(
    raw_corpus, base, tmp_path, capsys
):
    """--tokenizer-from copies the checkpoint's sentencepiece model byte for byte, learns
    nothing, and the run that fine-tunes the checkpoint on that data starts; data prepared
    with a sentencepiece model of its own is refused in one line naming the checkpoint and
    the data."""
    prepare = [
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        raw_corpus.prefix("test"),
        "--workers",
        "1",
    ]
    ours, learned = tmp_path / "ours", tmp_path / "learned"
    assert nmt_here(*prepare, "--tokenizer-from", str(base), "--destdir", str(ours)) == 0
    model_bytes = ckpt.load_checkpoint(base)["tokenizer"]["model"]
    assert (ours / "spm.model").read_bytes() == model_bytes
    assert json.loads((ours / "prepare.json").read_text())["spm"]["source"] == str(base)
    assert nmt_here(*run_args(ours, tmp_path / "run", base)) == 0
    assert ckpt.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["update"] == 1

    assert nmt_here(*prepare, "--vocab-size", "400", "--destdir", str(learned)) == 0
    assert (
        Tokenizer.from_file(learned / "spm.model").sha256
        != Tokenizer.from_file(ours / "spm.model").sha256
    )
    capsys.readouterr()
    assert_one_line(
        nmt_here(*run_args(learned, tmp_path / "refused", base)),
        capsys.readouterr().err,
        f"train.init_from {base}: tokenizer differs",
        str(learned),
        "--tokenizer-from",
    )
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize(
    "case, extra, needle",
    [
        ("missing", [], "--tokenizer-from {path}: "),
        ("directory", [], "--tokenizer-from {path}: "),
        ("not a checkpoint", [], "--tokenizer-from {path}: "),
        ("base", ["--vocab-size", "400"], "--vocab-size cannot be combined with --tokenizer-from"),
        ("base", ["--spm-model", "x.model"], "--tokenizer-from and --spm-model cannot be combined"),
    ],
    ids=["missing", "directory", "not a checkpoint", "with --vocab-size", "with --spm-model"],
)
def test_a_bad_tokenizer_from_is_one_line(raw_corpus, base, tmp_path, capsys, case, extra, needle):
    """A --tokenizer-from that is no checkpoint, or given with an option that chooses another
    vocabulary: one line, nothing written."""
    paths = {
        "missing": tmp_path / "none.pt",
        "directory": base.parent,
        "not a checkpoint": tmp_path / "notes.txt",
        "base": base,
    }
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    args = [
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        raw_corpus.prefix("test"),
        "--tokenizer-from",
        str(paths[case]),
        "--destdir",
        str(tmp_path / "out"),
        *extra,
    ]
    assert_one_line(nmt_here(*args), capsys.readouterr().err, needle.format(path=paths[case]))
    assert not (tmp_path / "out").exists()
