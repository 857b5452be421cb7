"""`model.arch: rnn` (nmt.models.rnn) through the real pipeline: trained by the same trainer,
averaged, decoded by the same beam search from the CLI; what does not apply is refused in one
line (export, int8); and a small RNN with attention learns the copy task (slow).

The protocol properties (cached == full, padding, causality, batching) are the Transformer's
tests parametrized over both architectures: tests/test_model.py and tests/test_translate.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers import ROOT, nmt, records, tiny

from nmt.config import load_config
from nmt.models.rnn import RNN
from nmt.models.transformer import build_model, num_parameters, summary
from nmt.tokenizer import NMT_SPECIALS
from nmt.training.trainer import dry_run, train

ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
RNN_MODEL = {"arch": "rnn", "rnn_hidden": 32}

pytestmark = pytest.mark.usefixtures("in_tmp")


def test_config_builds_the_rnn_and_its_summary():
    cfg = load_config(ROOT / "configs/rnn_multi30k.yaml").model
    with torch.device("meta"):
        model = build_model(cfg, 8000, pad_id=NMT_SPECIALS.pad)
    assert isinstance(model, RNN)
    D, H = cfg.d_model, cfg.rnn_hidden
    gru = 3 * (H * D + H * H + 2 * H)  # one direction of the encoder
    expected = (
        8000 * D
        + 2 * gru
        + (2 * H * H + H)
        + (H * H + 2 * H * H + H + H)
        + 3 * (H * (D + 2 * H) + H * H + 2 * H)
        + (3 * H + D) * D
        + D
    )
    assert num_parameters(model) == expected
    text = summary(model)
    assert (
        text.startswith("RNN encoder-decoder: bidirectional GRU") and "attention bahdanau" in text
    )
    none = load_config(ROOT / "configs/rnn_multi30k.yaml", ["model.attention=none"]).model
    assert "attention none" in dry_run(
        load_config(ROOT / "configs/rnn_multi30k.yaml", ["model.attention=none"]), 8000
    )
    with torch.device("meta"):
        assert num_parameters(build_model(none, 8000, pad_id=NMT_SPECIALS.pad)) == expected - (
            H * H + 2 * H * H + H + H
        )


def test_train_average_translate_an_rnn_through_the_cli(prepared, raw_corpus, tmp_path):
    run = tmp_path / "run"
    cfg = tiny(
        prepared[0],
        run,
        model=RNN_MODEL,
        max_updates=6,
        save_interval_updates=2,
        validate_interval_updates=3,
        valid_bleu=True,
    )
    train(cfg)
    assert [r["update"] for r in records(run, "valid")] == [3, 6]
    avg = tmp_path / "avg.pt"
    r = nmt("average-checkpoints", str(run), "--last", "3", "-o", str(avg), env=ENV)
    assert r.returncode == 0, r.stderr
    lines = raw_corpus.lines("test", "en")[:6]
    r = nmt("translate", "-c", str(avg), "--beam", "3", stdin="\n".join(lines) + "\n", env=ENV)
    assert r.returncode == 0 and r.stdout.count("\n") == len(lines), r.stderr
    # resuming an RNN run continues it
    train(tiny(prepared[0], run, model=RNN_MODEL, max_updates=8, save_interval_updates=2))
    assert records(run, "train")[-1]["update"] == 8


def test_what_does_not_apply_to_an_rnn_is_one_line(prepared, tmp_path):
    run = tmp_path / "run"
    train(tiny(prepared[0], run, model=RNN_MODEL, max_updates=1))
    ckpt = run / "checkpoint_last.pt"
    r = nmt("export", str(ckpt), str(tmp_path / "ct2"), env=ENV)
    assert r.returncode == 1 and "model.arch rnn cannot be exported" in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0
    r = nmt(
        "translate",
        "-c",
        str(ckpt),
        "--precision",
        "int8",
        "--device",
        "cpu",
        stdin="A dog.\n",
        env=ENV,
    )
    assert r.returncode == 1 and "int8" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = nmt(
        "train",
        str(ROOT / "configs/rnn_multi30k.yaml"),
        "--set",
        "model.cell=rnn",
        "--dump-config",
        env=ENV,
    )
    assert r.returncode == 1 and "model.cell" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_small_rnn_with_attention_learns_to_copy(copy_data, tmp_path, cell):
    cfg = tiny(
        copy_data,
        tmp_path / "run",
        model={"arch": "rnn", "cell": cell, "d_model": 64, "rnn_hidden": 64},
        max_tokens=1024,
        lr=3e-3,
        warmup_updates=100,
        max_updates=700,
        validate_interval_updates=700,
        valid_bleu=True,
        log_interval=50,
        clip_norm=1.0,
    )
    train(cfg)
    valid = records(tmp_path / "run", "valid")
    assert valid[-1]["valid_bleu"] > 80, valid
