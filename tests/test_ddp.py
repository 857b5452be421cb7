"""Data-parallel training (torchrun, gloo, 2 CPU processes) equals one process with the
same batches accumulated: with world size 2 and max_tokens M, rank r takes batches r, r+2,
...; one process with update_freq 2 and the same M groups batches (0, 1), (2, 3), ...: the
same update, so the same parameters. Rank 0 alone writes the run directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt import checkpoint as ckpt
from nmt import data as datamod
from nmt.config import Config, load_config
from nmt.train import train

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs/tiny.yaml"
TORCHRUN = Path(sys.executable).with_name("torchrun")

pytestmark = pytest.mark.skipif(not TORCHRUN.exists() or not torch.distributed.is_available(),
                                reason="needs torchrun and torch.distributed")


def settings(data_dir: Path, run_dir: Path, max_updates: int, max_tokens: int = 1024) -> dict[str, object]:
    # dropout 0: each rank has its own dropout masks, one process draws them in another order
    return {"data.dir": str(data_dir), "train.run_dir": str(run_dir), "train.max_updates": max_updates,
            "train.max_tokens": max_tokens, "train.log_interval": 1, "train.device": "cpu", "train.threads": 1,
            "train.save_interval_updates": 3, "train.validate_interval_updates": 4, "model.dropout": 0.0}


def torchrun(sets: dict[str, object], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "-m", "nmt", "train", str(TINY)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_single(prepared, run_dir: Path, max_updates: int, max_tokens: int = 1024) -> Config:
    """One process seeing both ranks' batches: update_freq 2 over the same batch stream."""
    sets = settings(prepared[0], run_dir, max_updates, max_tokens)
    cfg = load_config(TINY, [f"{k}={v}" for k, v in sets.items()] + ["train.update_freq=2"])
    threads = torch.get_num_threads()
    try:
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    return cfg


def run_both(prepared, tmp_path: Path, max_updates: int, max_tokens: int = 1024) -> tuple[Path, Path]:
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    done = torchrun(settings(prepared[0], ddp_dir, max_updates, max_tokens), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    train_single(prepared, single_dir, max_updates, max_tokens)
    return ddp_dir, single_dir


def assert_equal_runs(ddp_dir: Path, single_dir: Path) -> None:
    a = ckpt.load_checkpoint(ddp_dir / "checkpoint_last.pt")
    b = ckpt.load_checkpoint(single_dir / "checkpoint_last.pt")
    assert a["update"] == b["update"] and a["epoch"] == b["epoch"]
    assert not any(k.startswith("module.") for k in a["model"])  # the bare model, no DDP prefix
    for key, value in b["model"].items():
        assert torch.allclose(a["model"][key], value, rtol=0, atol=1e-5), key
    train_a = [r for r in records(ddp_dir) if r["type"] == "train"]
    train_b = [r for r in records(single_dir) if r["type"] == "train"]
    assert [r["update"] for r in train_a] == [r["update"] for r in train_b]  # logged once, by rank 0
    for ra, rb in zip(train_a, train_b, strict=True):
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    valid_a = [r for r in records(ddp_dir) if r["type"] == "valid"]
    valid_b = [r for r in records(single_dir) if r["type"] == "valid"]
    assert [r["update"] for r in valid_a] == [r["update"] for r in valid_b]
    assert sorted(p.name for p in ddp_dir.glob("*.pt")) == sorted(p.name for p in single_dir.glob("*.pt"))


def test_two_ranks_equal_one_process_with_update_freq_2(prepared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ddp_dir, single_dir = run_both(prepared, tmp_path, max_updates=5)
    assert_equal_runs(ddp_dir, single_dir)
    log = (ddp_dir / "train.log").read_text()
    assert log.count("saved checkpoint_3.pt") == 1  # one writer
    assert not list(ddp_dir.glob(".*.tmp-*"))


@pytest.mark.slow
def test_two_ranks_across_an_epoch_with_an_odd_batch_count_and_resume(prepared, tmp_path, monkeypatch):
    """The last update of an epoch with an odd number of batches has a dummy batch on rank 1;
    a run stopped and resumed with torchrun still equals the single process."""
    monkeypatch.chdir(tmp_path)
    meta = datamod.read_meta(prepared[0])
    d = datamod.ParallelData.load(prepared[0], "train", meta["source_lang"], meta["target_lang"])
    counts = {m: len(datamod.make_batches(d.src_sizes, d.tgt_sizes, m, seed=1, epoch=1, max_positions=256))
              for m in range(900, 1400, 10)}
    max_tokens, n = next((m, n) for m, n in counts.items() if n % 2 == 1)
    per_epoch = -(-n // 2)
    ddp_dir, single_dir = run_both(prepared, tmp_path, per_epoch + 2, max_tokens)
    assert_equal_runs(ddp_dir, single_dir)
    # resume: stop the torchrun run mid-epoch and continue it
    resumed = tmp_path / "resumed"
    for limit in (per_epoch - 1, per_epoch + 2):
        done = torchrun(settings(prepared[0], resumed, limit, max_tokens), tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = (ckpt.load_checkpoint(p / "checkpoint_last.pt")["model"] for p in (resumed, single_dir))
    for key in b:
        assert torch.allclose(a[key], b[key], rtol=0, atol=1e-5), key
    shutil.rmtree(resumed)
