"""Data-parallel training (torchrun, gloo, 2 CPU processes) equals one process with the
same batches accumulated: with world size 2 and max_tokens M, rank r takes batches r, r+2,
...; one process with update_freq 2 and the same M groups batches (0, 1), (2, 3), ...: the
same update, so the same parameters. Rank 0 alone writes the run directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import assert_equal_runs, ddp_settings, needs_torchrun, torchrun_command, train_single

from nmt import checkpoint as ckpt
from nmt import data as datamod

pytestmark = needs_torchrun


def torchrun(sets: dict[str, object], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        torchrun_command(sets), cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def run_both(
    prepared, tmp_path: Path, max_updates: int, max_tokens: int = 1024
) -> tuple[Path, Path]:
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    done = torchrun(ddp_settings(prepared[0], ddp_dir, max_updates, max_tokens), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    train_single(prepared, single_dir, max_updates, max_tokens)
    return ddp_dir, single_dir


def test_two_ranks_equal_one_process_with_update_freq_2(prepared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ddp_dir, single_dir = run_both(prepared, tmp_path, max_updates=5)
    assert_equal_runs(ddp_dir, single_dir)
    log = (ddp_dir / "train.log").read_text()
    assert log.count("saved checkpoint_3.pt") == 1  # one writer
    assert not list(ddp_dir.glob(".*.tmp-*"))


@pytest.mark.slow
def test_two_ranks_across_an_epoch_with_an_odd_batch_count_and_resume(
    prepared, tmp_path, monkeypatch
):
    """The last update of an epoch with an odd number of batches has a dummy batch on rank 1;
    a run stopped and resumed with torchrun still equals the single process."""
    monkeypatch.chdir(tmp_path)
    meta = datamod.read_meta(prepared[0])
    d = datamod.ParallelData.load(prepared[0], "train", meta["source_lang"], meta["target_lang"])
    counts = {
        m: len(
            datamod.make_batches(d.src_sizes, d.tgt_sizes, m, seed=1, epoch=1, max_positions=256)
        )
        for m in range(900, 1400, 10)
    }
    max_tokens, n = next((m, n) for m, n in counts.items() if n % 2 == 1)
    per_epoch = -(-n // 2)
    ddp_dir, single_dir = run_both(prepared, tmp_path, per_epoch + 2, max_tokens)
    assert_equal_runs(ddp_dir, single_dir)
    # resume: stop the torchrun run mid-epoch and continue it
    resumed = tmp_path / "resumed"
    for limit in (per_epoch - 1, per_epoch + 2):
        done = torchrun(ddp_settings(prepared[0], resumed, limit, max_tokens), tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = (ckpt.load_checkpoint(p / "checkpoint_last.pt")["model"] for p in (resumed, single_dir))
    for key in b:
        assert torch.allclose(a[key], b[key], rtol=0, atol=1e-5), key
    shutil.rmtree(resumed)
