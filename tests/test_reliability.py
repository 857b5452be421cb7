"""Faults and bad input (docs/reliability.md lists every fault and the test that covers it):
kill -9 during training and checkpoint writes, Ctrl-C, corrupt checkpoints on resume, a full
disk or unusable run directory, out-of-memory batches (also under DDP), flat memory, and
random bytes through `nmt translate`.

Tiny models on the conftest's prepared sample, on the CPU, one thread, dropout 0 where runs
are compared for equality. Each test runs in its tmp_path (conftest's isolated).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    THREADS,
    TINY,
    assert_equal_runs,
    assert_same_weights,
    ddp_settings,
    last_error_line,
    losses,
    make_trainer,
    needs_torchrun,
    nmt,
    nmt_here,
    records,
    save_random_model,
    set_args,
    tiny,
    torchrun_command,
    train_single,
    updates_per_epoch,
    weights,
    with_overrides,
)

from nmt import checkpoint as ckpt
from nmt.config import load_config
from nmt.training.oom import FAULT_OOM_ENV
from nmt.training.trainer import train

pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # conftest: temporary cwd, logging and threads undone


def train_sets(data_dir: Path, run_dir: Path, **extra: object) -> dict[str, object]:
    return {
        "data.dir": data_dir,
        "train.run_dir": run_dir,
        "train.log_interval": 1,
        "train.device": "cpu",
        "train.threads": THREADS,
        **extra,
    }


def nmt_train_here(sets: dict[str, object]) -> int:
    """`nmt train configs/tiny.yaml --set ...` in this process; its exit status."""
    return nmt_here("train", str(TINY), *set_args(sets))


def nmt_train_process(
    sets: dict[str, object], cwd: Path, stderr: Any = subprocess.PIPE
) -> subprocess.Popen:
    """`nmt train configs/tiny.yaml --set ...` in a subprocess (stderr: a pipe or an open file)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "nmt", "train", str(TINY), *set_args(sets)],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def temporaries(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob(".*.tmp-*"))


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


# ------------------------------------------------------------------ kill -9


KILL_MODEL = {"model.d_model": 128, "model.ffn_dim": 512, "model.heads": 4, "model.dropout": 0.0}


def _kill_once(proc: subprocess.Popen, run_dir: Path, mode: str, rng: random.Random) -> None:
    """SIGKILL `proc` at a moment chosen by `mode`: 'write' while a checkpoint is being written,
    'train' a little after an update, 'any' at a random time after the start."""
    metrics = run_dir / "metrics.jsonl"
    if mode == "any":
        time.sleep(rng.uniform(0.2, 3.0))
    else:
        seen, deadline = count_lines(metrics), time.monotonic() + 60
        while count_lines(metrics) <= seen and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # training is under way: the restart's cleaning is done
        if mode == "train":
            time.sleep(rng.uniform(0.0, 0.3))
        else:
            while proc.poll() is None and time.monotonic() < deadline:
                if any(
                    e.name.startswith(".checkpoint_") and ".tmp-" in e.name
                    for e in os.scandir(run_dir)
                ):
                    break
                time.sleep(0.0005)
            time.sleep(rng.choice([0.0, rng.uniform(0.0, 0.01)]))
    assert proc.poll() is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_twenty_times_then_resume_equals_an_uninterrupted_run(prepared, tmp_path):
    rng = random.Random(6)
    total = 120
    run_dir = tmp_path / "killed"
    sets = train_sets(
        prepared[0],
        run_dir,
        **KILL_MODEL,
        **{"train.max_updates": total, "train.save_interval_updates": 1, "train.keep_last": 3},
    )
    landed_in_write, newest, leftovers = 0, 0, set()
    for i in range(20):
        # stderr to a file: a full pipe that nobody reads would stall the run
        with open(tmp_path / f"stderr-{i}.txt", "w") as stderr:
            proc = nmt_train_process(sets, tmp_path, stderr)
            try:
                mode = ("write", "train", "write", "any")[i % 4]
                _kill_once(proc, run_dir, mode, rng)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if mode != "any" and leftovers:
            assert not leftovers & set(temporaries(run_dir)), (
                "a restart left temporaries of a killed run"
            )
            leftovers.clear()
        own = {name for name in temporaries(run_dir) if f".tmp-{proc.pid}-" in name}
        landed_in_write += any(name.startswith(".checkpoint_") for name in own)
        leftovers |= own
        # every checkpoint under a final name is complete, and resuming takes the newest last or
        # numbered one (checkpoint_best.pt, written first at a save, may be one update ahead of
        # them where the kill landed right after it: resuming redoes that update)
        finals = list(run_dir.glob("checkpoint_*.pt"))
        assert all(ckpt.load_checkpoint(p) for p in finals)
        updates = [
            ckpt.load_checkpoint(p)["update"] for p in finals if p.name != "checkpoint_best.pt"
        ]
        state = ckpt.load_latest(run_dir)
        if updates:
            assert state is not None and state["update"] == max(updates) >= newest
            newest = state["update"]
    assert landed_in_write >= 3, f"only {landed_in_write} kills landed during a checkpoint write"
    assert newest < total

    proc = nmt_train_process(sets, tmp_path)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert temporaries(run_dir) == []
    assert all(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    cfg = load_config(TINY, [f"{k}={v}" for k, v in sets.items()])
    train(with_overrides(cfg, train={"run_dir": str(tmp_path / "straight")}))
    assert_same_weights(weights(tmp_path / "straight"), weights(run_dir))
    assert losses(tmp_path / "straight") == pytest.approx(losses(run_dir), abs=1e-6)


def test_incomplete_metrics_line_of_a_killed_run_is_cut_off(prepared, tmp_path, caplog):
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=2)
    train(cfg)
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "ab") as f:
        f.write(b'{"type": "train", "upd')  # killed mid-write
    train(with_overrides(cfg, train={"max_updates": 3}))
    assert [r["update"] for r in records(tmp_path / "run", "train")] == [1, 2, 3]
    assert "incomplete last line" in caplog.text


def test_resume_takes_a_checkpoint_newer_than_checkpoint_last(prepared, tmp_path, caplog):
    """A kill between writing checkpoint_<update>.pt and linking checkpoint_last.pt to it."""
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=3, save_interval_updates=1)
    train(cfg)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint_last.pt").unlink()
    os.link(run_dir / "checkpoint_2.pt", run_dir / "checkpoint_last.pt")
    caplog.set_level("INFO")
    train(with_overrides(cfg, train={"max_updates": 5}))
    assert "checkpoint_3.pt is newer than checkpoint_last.pt (update 2)" in caplog.text
    assert "resumed from update 3" in caplog.text
    assert (
        sorted(losses(run_dir)) == [1, 2, 3, 4, 5] and len(records(run_dir, "train")) == 5
    )  # nothing redone
    train(with_overrides(cfg, train={"run_dir": str(tmp_path / "straight"), "max_updates": 5}))
    assert_same_weights(weights(tmp_path / "straight"), weights(run_dir))


# ------------------------------------------------------------------ Ctrl-C


# ------------------------------------------------------------------ corrupt checkpoints


@pytest.mark.parametrize(
    "damage", ["last-replaced-by-a-truncated-copy", "last-and-its-links-garbled", "all"]
)
def test_resume_past_corrupt_checkpoints_or_stop_naming_them(prepared, tmp_path, capfd, damage):
    run_dir = tmp_path / "run"
    sets = train_sets(
        prepared[0], run_dir, **{"train.max_updates": 4, "train.save_interval_updates": 2}
    )
    assert nmt_train_here(sets) == 0
    last = run_dir / "checkpoint_last.pt"
    assert last.samefile(run_dir / "checkpoint_4.pt")  # a hard link: one inode, two names
    if damage == "last-replaced-by-a-truncated-copy":
        data = last.read_bytes()
        last.unlink()
        last.write_bytes(data[: len(data) // 2])
        resumed_from, passed_over = 4, ["checkpoint_last.pt"]
    else:
        last.write_bytes(b"PK\x03\x04 garbage")  # through the shared inode: checkpoint_4.pt too
        resumed_from, passed_over = 2, ["checkpoint_last.pt", "checkpoint_4.pt"]
        if damage == "all":  # checkpoint_best.pt, the last resort, too
            for name in ("checkpoint_2.pt", "checkpoint_best.pt"):
                (run_dir / name).write_bytes(b"")
    capfd.readouterr()
    code = nmt_train_here({**sets, "train.max_updates": 6})
    err = capfd.readouterr().err
    if damage == "all":
        assert code == 1
        last_error_line(
            err,
            "no checkpoint loads",
            "checkpoint_last.pt",
            "checkpoint_4.pt",
            "checkpoint_2.pt",
            "checkpoint_best.pt",
        )
        return
    assert code == 0, err
    assert all(f"{name}: corrupt or truncated" in err for name in passed_over), err
    assert f"resumed from update {resumed_from}" in err
    assert "checkpoint_last.pt: corrupt or truncated" in (run_dir / "train.log").read_text()
    cfg = tiny(prepared[0], tmp_path / "straight", max_updates=6, save_interval_updates=2)
    train(cfg)
    assert_same_weights(weights(tmp_path / "straight"), weights(run_dir))


# --------------------------------------------------------------- disk full, unusable run directory


def _enospc(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _enospc_on(path: Path) -> Any:
    """os.write that fails with ENOSPC on descriptors of `path`, and writes the rest."""
    write = os.write

    def enospc_on(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            _enospc()
        return write(fd, data)

    return enospc_on


@pytest.mark.parametrize(
    "fault", ["checkpoint", "metrics", "log", "config", "run-dir-under-a-file"]
)
def test_write_failure_stops_with_one_line_naming_the_path(
    prepared, tmp_path, capfd, monkeypatch, fault
):
    run_dir = tmp_path / "run"
    sets = train_sets(
        prepared[0], run_dir, **{"train.max_updates": 2, "train.save_interval_updates": 1}
    )
    assert nmt_train_here(sets) == 0
    sets["train.max_updates"] = 4
    expected = {
        "checkpoint": run_dir
        / "checkpoint_3.pt: cannot write checkpoint (No space left on device)",
        "metrics": run_dir / "metrics.jsonl: cannot write metrics (No space left on device)",
        "log": run_dir / "train.log: cannot write the training log (No space left on device)",
        "config": run_dir / "config.yaml: cannot write the config (No space left on device)",
        "run-dir-under-a-file": tmp_path / "a-file/run: cannot write the run directory",
    }[fault]
    if fault == "run-dir-under-a-file":
        (tmp_path / "a-file").write_text("not a directory\n")
        sets["train.run_dir"] = tmp_path / "a-file" / "run"
    capfd.readouterr()
    with monkeypatch.context() as patch:
        if fault == "checkpoint":
            patch.setattr(torch, "save", _enospc)
        elif fault == "config":
            patch.setattr(os, "replace", _enospc)
        elif fault in (
            "metrics",
            "log",
        ):  # a run directory's file cannot be a link to /dev/full: writes to it fail
            patch.setattr(
                os,
                "write",
                _enospc_on(run_dir / {"metrics": "metrics.jsonl", "log": "train.log"}[fault]),
            )
        code = nmt_train_here(sets)
    err = capfd.readouterr().err
    assert code == 1, err
    last_error_line(err, str(expected))
    assert (
        ckpt.load_checkpoint(run_dir / "checkpoint_last.pt")["update"] == 2
    )  # the previous one, intact
    assert ckpt.load_latest(run_dir)["update"] == 2
    assert temporaries(run_dir) == []


# ------------------------------------------------------------------ out of memory


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory (simulated)"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 140737488355328 bytes. Error code 12 (Cannot allocate "
            "memory)"
        ),  # torch's CPU text
    ],
    ids=["cuda", "cpu"],
)
def test_oom_skips_the_update_clears_gradients_and_does_not_count_it(prepared, tmp_path, error):
    cfg = tiny(prepared[0], tmp_path / "oom", update_freq=2, max_tokens=1024)
    oomed, clean = (
        make_trainer(cfg),
        make_trainer(with_overrides(cfg, train={"run_dir": str(tmp_path / "clean")})),
    )
    try:
        groups = oomed.epoch_updates(1)
        real_forward, calls = oomed.model.decoder_states, []  # the forward pass of training

        def forward(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 4:  # the second batch of update 2, after the first one's backward
                raise error
            return real_forward(*args, **kwargs)

        oomed.model.decoder_states = forward  # type: ignore[method-assign]
        assert oomed.train_update(groups[0]) is not None
        assert oomed.train_update(groups[1]) is None
        assert all(p.grad is None for p in oomed.model.parameters())
        assert (oomed.progress.update, oomed.progress.oom_skipped) == (1, 1)
        after_oom = oomed.train_update(groups[2])
        clean.train_update(groups[0])
        expected = clean.train_update(groups[2])
    finally:
        oomed.close()
        clean.close()
    assert after_oom == pytest.approx(expected, rel=1e-6)  # same lr (update 2), same gradients
    assert_same_weights(
        dict(oomed.model.named_parameters()), dict(clean.model.named_parameters()), 0.0
    )


def torchrun_or_kill(sets: dict[str, object], cwd: Path, timeout: float) -> tuple[int, str]:
    """test_ddp's torchrun, in its own process group: a hang fails the test and leaves no
    workers."""
    proc = subprocess.Popen(
        torchrun_command(sets),
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"torchrun hung for {timeout} s: {err[-3000:]}")
    return proc.returncode, err


@needs_torchrun
def test_oom_on_one_ddp_rank_makes_every_rank_skip_the_update(
    prepared, tmp_path, monkeypatch, caplog
):
    """Rank 1 runs out of memory at update 3 (the NMT_FAULT_OOM_AT seam): both ranks skip it and
    the run equals one process with update_freq 2 that skips the same batches; no hang."""
    monkeypatch.chdir(tmp_path)
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    monkeypatch.setenv(FAULT_OOM_ENV, "1:3")
    returncode, err = torchrun_or_kill(ddp_settings(prepared[0], ddp_dir, 6), tmp_path, timeout=180)
    assert returncode == 0, err[-3000:]
    assert "out of memory at update 3 on rank 1" in err
    monkeypatch.setenv(FAULT_OOM_ENV, "0:3")
    cfg = train_single(prepared, single_dir, 6)
    assert_equal_runs(ddp_dir, single_dir)
    assert "update 3 skipped: out of memory on 1 rank(s)" in (ddp_dir / "train.log").read_text()
    assert [r["oom_skipped"] for r in records(ddp_dir, "train")] == [0, 0, 1, 1, 1, 1]
    progress = ckpt.load_checkpoint(ddp_dir / "checkpoint_last.pt")["train_state"]["progress"]
    assert (progress["update"], progress["oom_skipped"]) == (6, 1)
    consumed = (progress["epoch"] - 1) * updates_per_epoch(cfg) + progress["updates_in_epoch"]
    assert consumed == 7  # the skipped update's batches are used up, not retried


# ------------------------------------------------------------------ memory


@pytest.mark.slow
def test_memory_stays_flat_over_2000_updates(prepared, tmp_path):
    run_dir = tmp_path / "run"
    proc = nmt_train_process(
        train_sets(prepared[0], run_dir, **{"train.max_updates": 2000, "train.log_interval": 250}),
        tmp_path,
    )
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    rss = {r["update"]: r["rss_mb"] for r in records(run_dir, "train")}
    assert rss[2000] <= 1.05 * rss[500], rss


# ------------------------------------------------------------------ translation fuzz


def _fuzz_line(rng: random.Random) -> bytes:
    kind = rng.randrange(9)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))).replace(b"\n", b"")
    if kind == 1:
        return b""
    if kind == 2:
        return rng.choice([b" ", b"\t", b"\r", b" \t\r", "\u3000\u00a0".encode()]) * rng.randrange(
            1, 5
        )
    pools = {
        3: "\x00\x01\x07\x0b\x0c\x1b\x1c\x7f\r\u0085\u2028\u2029\u200b\u200d\ufeff\ufffe",
        4: "😀🎉👍🏽👩‍👩‍👧🇩🇪🧪✨🤖" + "a b ",
        5: "漢字仮名交じり文中文日本語한국어 ",
        6: "مرحبا שלום Ελληνικά Привет e\u0301\u0308 ",
        7: "A man is riding a bike . , ! ? ",
    }
    if kind in pools:
        return "".join(rng.choice(pools[kind]) for _ in range(rng.randrange(1, 60))).encode(
            "utf-8", "surrogatepass"
        )
    words = ["A", "dog", "runs", "in", "the", "park", "😀", "漢字", "\x00", "\u2028", "é"]
    return " ".join(
        rng.choice(words) for _ in range(rng.randrange(2000, 8000))
    ).encode()  # very long


@pytest.mark.slow
def test_translate_fuzz_one_well_formed_line_per_input_line(test_tokenizer, tmp_path):
    from nmt.api import Translator
    from nmt.decoding.predict import load_models, translate_token_lists
    from nmt.translate import format_line, read_chunks

    tokenizer = test_tokenizer
    model = save_random_model(tmp_path / "random.pt", tokenizer, seed=1)
    rng = random.Random(7)
    lines = [_fuzz_line(rng) for _ in range(1000)]
    lines[0] = b"\xef\xbb\xbf" + lines[0]  # a BOM
    args = [
        "--beam",
        "5",
        "--nbest",
        "5",
        "--scores",
        "--max-len-a",
        "0",
        "--max-len-b",
        "4",
        "--threads",
        "1",
    ]
    done = nmt(
        "translate",
        "-c",
        str(model),
        *args,
        stdin=b"\n".join(lines) + b"\n",
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.decode("utf-8")  # strict: valid UTF-8
    rows = out.split("\n")
    assert rows[-1] == "" and len(rows) - 1 == len(lines)

    torch.set_num_threads(1)  # as the command: the same floats, the same choices among near-ties
    loaded = load_models([model], torch.device("cpu"))
    cfg = dataclasses.replace(loaded.config.decode, beam=5, max_len_a=0.0, max_len_b=4)
    texts = [
        t
        for chunk in read_chunks(io.BytesIO(b"\n".join(lines) + b"\n"), "fuzz", 4096)
        for t in chunk
    ]
    seqs = [loaded.tokenizer.encode(t) if t.strip() else [] for t in texts]
    results = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=loaded.tokenizer.specials,
        nbest=5,
        max_positions=loaded.max_positions,
    )
    api = Translator(loaded, cfg, device=torch.device("cpu")).translate_nbest(texts, 5)
    for row, seq, hyps, translations in zip(rows, seqs, results, api):
        assert format_line(translations, 5, True) == row  # the CLI prints what the library found
        assert [t.score for t in translations] == [h.score for h in hyps]
        if not seq:
            assert row == "" and hyps == []
            continue
        fields = row.split("\t")
        assert len(fields) == 10, repr(row)
        assert not any(c in field for field in fields for c in "\r\n\u2028\u2029\x0b\x0c\x85"), (
            repr(row)
        )
        scores = [float(s) for s in fields[0::2]]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5  # no duplicate token sequences
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
