"""The trainer's promises: resuming equals never stopping, accumulation equals a big batch,
signals and non-finite losses leave a resumable run directory, checkpoints are kept and
chosen as configured, and a tiny model learns to copy.

Tiny models (configs/tiny.yaml) on the conftest's prepared Multi30k sample, on the CPU,
dropout 0 where exact equality is asserted.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers import (
    THREADS,
    TINY,
    assert_same_weights,
    losses,
    make_trainer,
    records,
    synthetic_pairs,
    tiny,
    updates_per_epoch,
    weights,
    with_overrides,
    write_parallel,
)

from nmt import checkpoint as ckpt
from nmt import data as datamod
from nmt.errors import NmtError
from nmt.prepare import PrepareOptions, prepare_bpe
from nmt.training.optim import DynamicLossScaler, dropout_at, lr_at
from nmt.training.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("in_tmp")


def snapshot(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run_dir.glob("*.pt"))}


# ------------------------------------------------------------------ resume


RESUME_CASES = {
    "mid-epoch": dict(update_freq=1, stop=lambda e: 4, total=lambda e: 9),
    "across-epoch-end": dict(update_freq=1, stop=lambda e: e - 2, total=lambda e: e + 3),
    "at-epoch-end": dict(update_freq=1, stop=lambda e: e, total=lambda e: e + 2),
    "update-freq-2": dict(update_freq=2, stop=lambda e: e - 1, total=lambda e: e + 2),
}


# (case, dropout); the other combinations run with the slow tests
FAST_RESUME = {
    ("mid-epoch", 0.0),
    ("mid-epoch", 0.3),
    ("across-epoch-end", 0.3),
    ("at-epoch-end", 0.0),
    ("update-freq-2", 0.0),
}


@pytest.mark.parametrize(
    "case, dropout",
    [
        pytest.param(
            case,
            dropout,
            id=f"{case}-{'dropout' if dropout else 'no-dropout'}",
            marks=() if (case, dropout) in FAST_RESUME else pytest.mark.slow,
        )
        for case in RESUME_CASES
        for dropout in (0.0, 0.3)
    ],
)
def test_resume_equals_uninterrupted(prepared, tmp_path, case, dropout):
    spec = RESUME_CASES[case]
    model = {
        "dropout": dropout,
        "attention_dropout": dropout / 2,
        "activation_dropout": dropout / 2,
    }
    cfg = tiny(
        prepared[0],
        tmp_path / "a",
        model,
        update_freq=spec["update_freq"],
        max_tokens=1024,
        validate_interval_updates=4,
    )
    per_epoch = updates_per_epoch(cfg)
    stop, total = spec["stop"](per_epoch), spec["total"](per_epoch)
    assert 0 < stop <= total and (case == "at-epoch-end" or stop < per_epoch)

    train(with_overrides(cfg, train={"max_updates": total}))
    run_b = tmp_path / "b"
    first = train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": stop}))
    assert first.update == stop
    state = ckpt.load_checkpoint(run_b / "checkpoint_last.pt")["train_state"]["progress"]
    assert (state["epoch"], state["updates_in_epoch"]) == (
        (1, stop) if stop < per_epoch else (2, 0)
    )
    second = train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": total}))
    assert second.update == total

    a, b = losses(tmp_path / "a"), losses(run_b)
    assert sorted(b) == list(range(1, total + 1))  # each update logged once
    assert a == pytest.approx(b, abs=1e-6)
    assert_same_weights(weights(tmp_path / "a"), weights(run_b))
    # the validations (every 3 updates and at the epoch end) happened once each, as in run A
    valid_a = {r["update"]: r["valid_loss"] for r in records(tmp_path / "a", "valid")}
    valid_b = [(r["update"], r["valid_loss"]) for r in records(run_b, "valid")]
    assert [u for u, _ in valid_b] == sorted(set(valid_a) | {stop})
    assert all(loss == pytest.approx(valid_a[u], abs=1e-6) for u, loss in valid_b if u in valid_a)
    elapsed = [
        r["elapsed"] for r in records(run_b, "valid")
    ]  # training seconds, over the resume too
    assert elapsed == sorted(elapsed) and all(r["valid_s"] > 0 for r in records(run_b, "valid"))


def test_dropout_ramp_applies_per_update_and_resumes_exactly(prepared, tmp_path):
    cfg = tiny(
        prepared[0],
        tmp_path / "a",
        {"dropout": 0.0},
        max_tokens=1024,
        dropout_ramp_start=2,
        dropout_ramp_end=6,
        dropout_ramp_to=0.4,
    )
    train(with_overrides(cfg, train={"max_updates": 8}))
    logged = {r["update"]: r["dropout"] for r in records(tmp_path / "a", "train")}
    assert logged == {u: pytest.approx(dropout_at(u, cfg.train, 0.0)) for u in range(1, 9)}
    assert logged[2] == 0.0 and logged[4] == pytest.approx(0.2) and logged[8] == pytest.approx(0.4)

    run_b = tmp_path / "b"  # stopped in the middle of the ramp
    train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": 4}))
    train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": 8}))
    assert losses(tmp_path / "a") == pytest.approx(losses(run_b), abs=1e-6)
    assert_same_weights(weights(tmp_path / "a"), weights(run_b))

    run_c = tmp_path / "c"  # no ramp: the same until the ramp starts, then different
    train(
        with_overrides(cfg, train={"run_dir": str(run_c), "max_updates": 3, "dropout_ramp_end": 0})
    )
    a, c = losses(tmp_path / "a"), losses(run_c)
    assert [a[1], a[2]] == pytest.approx([c[1], c[2]], abs=1e-6)
    assert abs(a[3] - c[3]) > 1e-4


def test_logged_loss_is_the_interval_mean_per_target_token(prepared, tmp_path):
    """With log_interval 3 each train record holds the token-weighted loss and nll of its 3
    updates and their mean gnorm (as fairseq logs), not the last batch's, which swings with
    the batch's sentence lengths. A save in between does not cut the interval."""
    cfg = tiny(
        prepared[0], tmp_path / "each", max_tokens=512, max_updates=6, save_interval_updates=2
    )
    train(cfg)
    each = records(tmp_path / "each", "train")
    assert [r["update"] for r in each] == list(range(1, 7))
    train(with_overrides(cfg, train={"run_dir": str(tmp_path / "every3"), "log_interval": 3}))
    every3 = records(tmp_path / "every3", "train")
    assert [r["update"] for r in every3] == [3, 6]
    for rec, window in zip(every3, (each[:3], each[3:]), strict=True):
        tokens = sum(r["tgt_tokens"] for r in window)
        assert rec["tgt_tokens"] == tokens and rec["updates_logged"] == 3
        for key in ("loss", "nll"):
            assert rec[key] == pytest.approx(
                sum(r[key] * r["tgt_tokens"] for r in window) / tokens, rel=1e-6
            )
        assert rec["gnorm"] == pytest.approx(sum(r["gnorm"] for r in window) / 3, rel=1e-6)
        assert rec["ppl"] == pytest.approx(2 ** rec["nll"])
        assert rec["lr"] == window[-1]["lr"]
    assert (
        len({round(r["loss"], 6) for r in each[:3]}) > 1
    )  # the batches differ: the mean is not trivial


def test_finished_run_started_again_changes_nothing(prepared, tmp_path, caplog):
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=5, save_interval_updates=2)
    train(cfg)
    before = snapshot(tmp_path / "run")
    metrics = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    assert {"checkpoint_2.pt", "checkpoint_4.pt", "checkpoint_5.pt", "checkpoint_last.pt"} <= set(
        before
    )
    caplog.set_level("INFO", logger="nmt.training.trainer")
    result = train(cfg)
    assert result.update == 5 and "max_updates=5" in result.reason
    assert "already finished" in caplog.text
    assert snapshot(tmp_path / "run") == before
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == metrics


def test_resume_refuses_a_changed_model_naming_the_key(prepared, tmp_path):
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=2)
    train(cfg)
    changed = with_overrides(cfg, model={"ffn_dim": 96}, train={"max_updates": 4})
    with pytest.raises(NmtError, match=r"model\.ffn_dim: 64 -> 96"):
        train(changed)


@pytest.fixture(scope="module")
def other_data(prepared, raw_corpus, tmp_path_factory) -> Path:
    """Different training data (the first 200 of the 300 pairs), same tokenizer."""
    raw = tmp_path_factory.mktemp("other")
    for lang in ("en", "de"):
        lines = raw_corpus.lines("train", lang)[:200]
        (raw / f"train.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    dest = raw / "data-bin"
    prepare_bpe(
        PrepareOptions(
            source_lang="en",
            target_lang="de",
            trainpref=str(raw / "train"),
            validpref=raw_corpus.prefix("val"),
            destdir=str(dest),
            spm_model=str(prepared[0] / "spm.model"),
            workers=1,
        ),
        progress=False,
    )
    return dest


def test_a_run_written_before_a_config_key_existed_resumes(prepared, tmp_path):
    """A newer nmt adds config keys with defaults (model.arch, train.pad_to_multiple, ...): a
    checkpoint written without them resumes, as if they had their defaults."""
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=2)
    train(cfg)
    last = tmp_path / "run" / "checkpoint_last.pt"
    state = torch.load(last, weights_only=True)
    for section, key in (
        ("model", "arch"),
        ("model", "cell"),
        ("train", "pad_to_multiple"),
    ):  # at defaults
        del state["config"][section][key]
    ckpt.atomic_save(state, last)
    assert train(with_overrides(cfg, train={"max_updates": 4})).update == 4


def test_resume_on_changed_data_needs_reset_data(prepared, other_data, tmp_path):
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=3)
    train(cfg)
    moved = with_overrides(cfg, data={"dir": str(other_data)}, train={"max_updates": 6})
    with pytest.raises(NmtError, match="training data changed.*fingerprint.*--reset-data"):
        train(moved)
    result = train(moved, reset_data=True)
    assert result.update == 6
    progress = ckpt.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"][
        "progress"
    ]
    assert progress["updates_in_epoch"] == 3  # the epoch restarted at the reset
    assert progress["history"] == ["reset data at update 3"]


def test_resume_refuses_another_tokenizer_even_with_reset_data(prepared, tmp_path):
    raw = tmp_path / "raw"
    write_parallel(synthetic_pairs("copy", 50, seed=3), raw / "train", "en", "de")
    other = tmp_path / "copy-bin"
    prepare_bpe(
        PrepareOptions(
            source_lang="en",
            target_lang="de",
            trainpref=str(raw / "train"),
            destdir=str(other),
            vocab_size=24,
            byte_fallback=False,
            workers=1,
        ),
        progress=False,
    )
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=2)
    train(cfg)
    with pytest.raises(NmtError, match="tokenizer"):
        train(
            with_overrides(cfg, data={"dir": str(other)}, train={"max_updates": 4}), reset_data=True
        )


def test_reset_optimizer_restarts_the_schedule(prepared, tmp_path):
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=6, warmup_updates=4)
    train(cfg)
    train(with_overrides(cfg, train={"max_updates": 8}), reset_optimizer=True)
    lrs = {r["update"]: r["lr"] for r in records(tmp_path / "run", "train")}
    assert lrs[6] == pytest.approx(lr_at(6, cfg.train, cfg.model.d_model))
    assert lrs[7] == pytest.approx(lr_at(1, cfg.train, cfg.model.d_model))  # warm-up starts again
    assert lrs[8] == pytest.approx(lr_at(2, cfg.train, cfg.model.d_model))
    state = ckpt.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]
    assert state["progress"]["history"] == ["reset optimizer at update 6"]
    assert all(int(s["step"]) == 2 for s in state["optimizer"]["state"].values())  # a fresh Adam


# ------------------------------------------------------------------ accumulation


def test_accumulation_equals_one_big_batch(prepared, tmp_path):
    # adam_eps well above the gradients' rounding noise: Adam's first step is lr * g / (|g| + eps),
    # which turns a difference of 1e-12 in a near-zero gradient into one of lr when eps is 1e-9.
    cfg = tiny(
        prepared[0],
        tmp_path / "acc",
        update_freq=2,
        label_smoothing=0.1,
        clip_norm=0.0,
        adam_eps=1e-3,
    )
    accumulating = make_trainer(cfg)
    big = make_trainer(
        with_overrides(cfg, train={"run_dir": str(tmp_path / "big"), "update_freq": 1})
    )
    b1, b2 = accumulating.epoch_updates(1)[0]
    specials = big.tokenizer.specials
    assert (
        len(b1) != len(b2)
        or datamod.collate(big.train_data, b1, specials).num_target_tokens
        != datamod.collate(big.train_data, b2, specials).num_target_tokens
    )  # unequal batches: a mean of means would differ

    grads: dict[str, dict[str, torch.Tensor]] = {}
    for name, trainer in (("acc", accumulating), ("big", big)):
        step = trainer.optimizer.step

        def recording_step(name: str = name, trainer: Trainer = trainer, step: Any = step) -> Any:
            grads[name] = {
                k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None
            }
            return step()

        trainer.optimizer.step = recording_step  # type: ignore[method-assign]
    stats_acc = accumulating.train_update([b1, b2])
    stats_big = big.train_update([list(b1) + list(b2)])
    accumulating.close()
    big.close()
    assert stats_acc is not None and stats_big is not None
    assert (
        stats_acc["tokens"] == stats_big["tokens"]
        and stats_acc["sentences"] == stats_big["sentences"]
    )
    assert stats_acc["loss"] == pytest.approx(stats_big["loss"], rel=1e-6)
    assert stats_acc["gnorm"] == pytest.approx(stats_big["gnorm"], rel=1e-5)
    for key, g in grads["big"].items():
        assert torch.allclose(grads["acc"][key], g, rtol=1e-4, atol=1e-7), key
    assert_same_weights(
        dict(accumulating.model.named_parameters()), dict(big.model.named_parameters()), 1e-5
    )


def test_the_dummy_batch_adds_nothing_to_the_gradients(prepared, tmp_path):
    """What a DDP rank without a batch of its own runs where the gradients are all-reduced
    (test_ddp runs it under torchrun): one empty pair, backpropagated with weight 0."""
    trainer = make_trainer(tiny(prepared[0], tmp_path / "run"))
    try:
        assert len(trainer.dummy) == 1 and trainer.dummy.num_target_tokens == 1  # just EOS
        sums = trainer._forward_backward(trainer.dummy, 0.0, all_reduce=False)
    finally:
        trainer.close()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)
    assert torch.isfinite(sums).all() and sums[0] > 0  # a real forward pass, weighted 0


def test_an_update_reads_nothing_back_from_the_device(prepared, tmp_path, monkeypatch):
    """What would make the host wait for a GPU (item, tolist, float(), bool(), int(), nonzero
    on a tensor) happens nowhere in a one-process fp32/bf16 update; `check_finite` then
    reads all the updates' losses and norms at once. (test_gpu.py checks the same on CUDA
    with torch.cuda.set_sync_debug_mode, which also sees reads inside torch's kernels.)"""
    trainer = make_trainer(tiny(prepared[0], tmp_path / "run", clip_norm=1.0, update_freq=2))
    groups = trainer.epoch_updates(1)[:3]
    reads: list[str] = []

    def spy(name: str) -> Any:
        real = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads.append(name)
            return real(self, *args, **kwargs)

        return read

    for name in ("item", "tolist", "__float__", "__bool__", "__int__", "__index__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, spy(name))
    try:
        stats = [trainer.train_update(g) for g in groups]
    finally:
        monkeypatch.undo()
    assert reads == [] and all(s is not None for s in stats)
    assert trainer.unchecked.updates() == [1, 2, 3]
    trainer.check_finite()
    assert trainer.unchecked.updates() == []
    trainer.close()
    assert all(
        math.isfinite(s["loss"]) and s["loss"] > 0 and math.isfinite(s["gnorm"]) for s in stats
    )


# ------------------------------------------------------------------ signals, NaN, overflow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_a_checkpoint_and_resume_finishes_like_an_uninterrupted_run(
    prepared, tmp_path, sig
):
    """SIGTERM (schedulers, torchrun) and Ctrl-C: the update in progress is saved, exit 128+N
    without a traceback, and resuming ends where an uninterrupted run ends."""
    run_dir = tmp_path / "run"
    # 256-token batches: ~100 updates an epoch, so the signal lands mid-epoch even when this
    # process is slow to see the child's third update on a loaded machine.
    sets = [
        f"data.dir={prepared[0]}",
        f"train.run_dir={run_dir}",
        "train.max_updates=100000",
        "train.log_interval=1",
        "train.device=cpu",
        "train.max_tokens=256",
        f"train.threads={THREADS}",
    ]
    cmd = [sys.executable, "-m", "nmt", "train", str(TINY)] + [
        a for s in sets for a in ("--set", s)
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = run_dir / "metrics.jsonl"  # complete lines only: the child is writing it
            if metrics.is_file() and metrics.read_text().count('"type": "train"') >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err, err
    last = ckpt.load_latest(run_dir)
    assert last is not None
    stopped_at = last["update"]
    cfg = tiny(prepared[0], run_dir, max_updates=stopped_at + 3, max_tokens=256)
    assert (
        3 <= stopped_at == max(losses(run_dir)) < updates_per_epoch(cfg)
    )  # the update it was in, mid-epoch
    assert last["train_state"]["progress"]["updates_in_epoch"] == stopped_at
    assert_same_weights(weights(run_dir, f"checkpoint_{stopped_at}.pt"), last["model"], 0.0)

    assert train(cfg).update == stopped_at + 3
    train(with_overrides(cfg, train={"run_dir": str(tmp_path / "straight")}))
    assert_same_weights(weights(tmp_path / "straight"), weights(run_dir))
    assert losses(tmp_path / "straight") == pytest.approx(losses(run_dir), abs=1e-6)


def test_nan_loss_stops_naming_the_update_and_leaves_checkpoints_intact(
    prepared, tmp_path, monkeypatch
):
    import nmt.training.loss as lossmod

    cfg = tiny(prepared[0], tmp_path / "run", max_updates=3, save_interval_updates=2)
    train(cfg)
    before = snapshot(tmp_path / "run")
    real_loss = lossmod.projected_smoothed_loss

    def nan_loss(*args: Any) -> Any:
        loss, nll = real_loss(*args)
        return (loss * float("nan"), nll) if torch.is_grad_enabled() else (loss, nll)

    monkeypatch.setattr(lossmod, "projected_smoothed_loss", nan_loss)
    with pytest.raises(NmtError, match="non-finite loss at update 4"):
        train(with_overrides(cfg, train={"max_updates": 10}))
    assert snapshot(tmp_path / "run") == before
    assert ckpt.load_latest(tmp_path / "run")["update"] == 3


def test_overflow_with_a_loss_scaler_skips_the_update(prepared, tmp_path):
    trainer = make_trainer(tiny(prepared[0], tmp_path / "run", max_updates=4, warmup_updates=100))
    trainer.scaler = DynamicLossScaler(init_scale=8.0, min_scale=1e-4)
    backward_calls = 0

    def poison(grad: torch.Tensor) -> torch.Tensor:
        nonlocal backward_calls
        backward_calls += 1
        return grad * float("inf") if backward_calls == 2 else grad

    next(trainer.model.parameters()).register_hook(poison)
    try:
        trainer.run()
    finally:
        trainer.close()
    p = trainer.progress
    assert (p.update, p.skipped_overflow, p.updates_in_epoch) == (4, 1, 5)
    assert trainer.scaler.scale == 4.0
    lrs = [r["lr"] for r in records(tmp_path / "run", "train")]
    assert lrs == pytest.approx(
        [lr_at(u, trainer.cfg.train, trainer.cfg.model.d_model) for u in (1, 2, 3, 4)]
    )
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    saved = ckpt.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]
    assert saved["scaler"] == {"scale": 4.0, "clean_updates": 3}


# ------------------------------------------------------------------ checkpoints and validation


def fake_validation(monkeypatch: pytest.MonkeyPatch, loss: list[float], bleu: list[float]) -> None:
    calls = iter(range(100))

    def validate(self: Trainer) -> dict[str, float]:
        i = next(calls)
        return {
            "valid_loss": loss[i],
            "valid_nll": loss[i],
            "valid_ppl": 2 ** loss[i],
            "valid_bleu": bleu[i],
        }

    monkeypatch.setattr(Trainer, "validate", validate)


def test_keep_last_prunes_numbered_checkpoints_but_never_the_best(
    prepared, tmp_path, monkeypatch, caplog
):
    caplog.set_level("INFO")  # the CLI sets INFO; train.log gets what the root logger lets through
    fake_validation(monkeypatch, loss=[1.0, 2.0, 3.0], bleu=[9.0, 8.0, 7.0])
    run_dir = tmp_path / "run"
    train(
        tiny(
            prepared[0],
            run_dir,
            max_updates=12,
            save_interval_updates=2,
            validate_interval_updates=4,
            keep_last=2,
            best_metric="loss",
        )
    )
    names = sorted(p.name for p in run_dir.glob("*.pt"))
    assert names == [
        "checkpoint_10.pt",
        "checkpoint_12.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
    ]
    assert ckpt.load_checkpoint(run_dir / "checkpoint_best.pt")["update"] == 4
    assert ckpt.load_checkpoint(run_dir / "checkpoint_last.pt")["update"] == 12
    valid = records(run_dir, "valid")
    assert [r["update"] for r in valid] == [4, 8, 12] and valid[-1]["best"] == 1.0
    assert len(records(run_dir, "train")) == 12
    assert (run_dir / "config.yaml").is_file() and (run_dir / "spm.model").is_file()
    assert "saved checkpoint_12.pt" in (run_dir / "train.log").read_text()


@pytest.mark.parametrize("metric, best_update", [("bleu", 9), ("loss", 6)])
def test_best_checkpoint_follows_the_configured_metric(
    prepared, tmp_path, monkeypatch, metric, best_update
):
    fake_validation(monkeypatch, loss=[2.0, 1.0, 1.5, 3.0], bleu=[10.0, 11.0, 20.0, 5.0])
    run_dir = tmp_path / "run"
    train(
        tiny(prepared[0], run_dir, max_updates=12, validate_interval_updates=3, best_metric=metric)
    )
    assert ckpt.load_checkpoint(run_dir / "checkpoint_best.pt")["update"] == best_update


def test_patience_stops_after_validations_without_improvement(prepared, tmp_path, monkeypatch):
    fake_validation(monkeypatch, loss=[2.0, 1.0, 1.2, 1.1, 0.5], bleu=[0.0] * 5)
    result = train(
        tiny(
            prepared[0],
            tmp_path / "run",
            max_updates=100,
            validate_interval_updates=2,
            best_metric="loss",
            patience=2,
        )
    )
    assert result.update == 8 and "no improvement in 2 validations" in result.reason
    again = train(
        tiny(
            prepared[0],
            tmp_path / "run",
            max_updates=100,
            validate_interval_updates=2,
            best_metric="loss",
            patience=2,
        )
    )
    assert again.update == 8  # a run stopped by patience is finished


def test_validate_returns_loss_perplexity_and_bleu(prepared, tmp_path):
    trainer = make_trainer(tiny(prepared[0], tmp_path / "run", valid_bleu=True))
    try:
        result = trainer.validate()
    finally:
        trainer.close()
    assert set(result) == {"valid_loss", "valid_nll", "valid_ppl", "valid_bleu"}
    assert result["valid_ppl"] == pytest.approx(2 ** result["valid_nll"])
    assert result["valid_loss"] > result["valid_nll"] > 0  # label smoothing costs extra
    assert 0.0 <= result["valid_bleu"] <= 100.0


def test_run_directory_files_are_closed_after_train(prepared, tmp_path):
    import logging

    handlers = list(logging.getLogger().handlers)
    train(tiny(prepared[0], tmp_path / "run", max_updates=2))
    assert logging.getLogger().handlers == handlers
    assert Path(".nmt-last-run").read_text().strip() == str((tmp_path / "run").resolve())


# ------------------------------------------------------------------ learning


@pytest.mark.slow
def test_tiny_model_learns_to_copy(copy_data, tmp_path):
    cfg = tiny(
        copy_data,
        tmp_path / "run",
        model={"encoder_layers": 2, "decoder_layers": 2, "d_model": 64, "ffn_dim": 128, "heads": 4},
        max_tokens=1024,
        lr=3e-3,
        warmup_updates=100,
        max_updates=700,
        validate_interval_updates=700,
        valid_bleu=True,
        log_interval=50,
    )
    train(cfg)
    valid = records(tmp_path / "run", "valid")
    assert valid[-1]["valid_bleu"] > 80, valid


@pytest.mark.parametrize(
    "configured, native, trained, why",
    [
        ("auto", True, "bf16", "computes bf16 natively"),
        ("auto", False, "fp32", "has no native bf16"),
        ("bf16", False, "bf16", "as configured"),
        ("fp32", True, "fp32", "as configured"),
    ],
)
def test_precision_auto_is_bf16_only_where_the_device_computes_it_natively(
    prepared, tmp_path, monkeypatch, caplog, configured, native, trained, why
):
    """Only the capability check is mocked: the trainer's autocast, validation's search and the
    run's records follow its answer; an explicit precision is honoured whatever it says."""
    import nmt.device
    import nmt.training.trainer as trainer_module
    import nmt.training.validate as validate_module

    monkeypatch.setattr(nmt.device, "native_bf16", lambda device: native)
    used = {"train": set(), "valid": set()}
    real_autocast = trainer_module.autocast
    real_search = validate_module.translate_token_lists

    def autocast(device, precision):
        used["train"].add(precision)
        return real_autocast(device, precision)

    def search(*args, **kwargs):
        used["valid"].add(kwargs["precision"])
        return real_search(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "autocast", autocast)
    monkeypatch.setattr(validate_module, "translate_token_lists", search)
    run = tmp_path / "run"
    caplog.set_level("INFO", logger="nmt.training.trainer")
    train(tiny(prepared[0], run, max_updates=2, precision=configured, valid_bleu=True))
    assert used == {"train": {trained}, "valid": {trained}}
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["type"] == "start"
    assert first["precision"] == trained
    assert why in first["precision_reason"]
    assert f"precision {trained} (" in caplog.text
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == configured


@pytest.mark.parametrize("avx512_bf16, amx", [(True, False), (False, True), (False, False)])
def test_a_cpu_computes_bf16_natively_with_avx512_bf16_or_amx(monkeypatch, avx512_bf16, amx):
    from nmt.device import native_bf16

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_bf16(torch.device("cpu")) is (avx512_bf16 or amx)
