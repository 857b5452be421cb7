"""Hostile and careless use (issue 19): the run-directory lock, --set values as written, the
direction in the data fingerprint, average-checkpoints never overwriting what training owns,
one line for every mistake, quiet broken pipes, stale temporaries, kept file metadata, score.

docs/reliability.md lists each case with the test here that proves it.
"""

from __future__ import annotations

import ctypes
import gzip
import io
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    INFO_RECORD,
    ROOT,
    TINY,
    assert_one_line,
    dead_pid,
    last_error_line,
    nmt,
    nmt_here,
    records,
    set_args,
    tiny,
    with_overrides,
)

from nmt.api import Translator
from nmt.atomic import atomic_write_bytes, clean_temporaries
from nmt.checkpoint import atomic_save, average_checkpoints, load_checkpoint
from nmt.config import config_to_dict, load_config
from nmt.device import resolve_device
from nmt.errors import ConfigError, NmtError
from nmt.models.transformer import build_model
from nmt.textio import TextStats, iter_lines
from nmt.training.rundir import RunDir, lock_run_dir
from nmt.training.trainer import train

pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # conftest: temporary cwd, logging and threads undone


def run_here(capfd: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """`nmt ARGS` in this process: (exit status, stdout, stderr)."""
    capfd.readouterr()
    code = nmt_here(*args)
    out, err = capfd.readouterr()
    return code, out, err


def run_process(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    """`nmt ARGS` in a subprocess whose stdout is a given file (helpers.nmt captures it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "nmt", *args], env=env, timeout=120, **kwargs)


def _save(path: Path, checkpoint: Path, **changes: Any) -> Path:
    """`checkpoint` (conftest's random_checkpoint) saved at `path` with some of its entries
    replaced."""
    atomic_save({**load_checkpoint(checkpoint), **changes}, path)
    return path


def tiny_sets(data_dir: Path, run_dir: Path, **extra: object) -> list[str]:
    return set_args(
        {
            "data.dir": data_dir,
            "train.run_dir": run_dir,
            "train.device": "cpu",
            "train.threads": 1,
            "train.max_updates": 1,
            **extra,
        }
    )


# ------------------------------------------------------------------ 1. the run-directory lock


def test_second_trainer_on_a_run_directory_is_refused_naming_it_and_the_holder_pid(
    prepared, tmp_path, capfd
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from nmt.training.rundir import "
            "lock_run_dir; "
            "lock_run_dir(Path(sys.argv[1])); print('locked', flush=True); time.sleep(120)",
            str(run_dir),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        code, _, err = run_here(capfd, "train", str(TINY), *tiny_sets(prepared[0], run_dir))
        assert_one_line(code, err, str(run_dir), f"pid {holder.pid}")
        assert not (run_dir / "checkpoint_last.pt").exists()
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the lock must go with the process
        holder.wait()
    lock = lock_run_dir(run_dir)
    lock.release()


def test_the_lock_is_held_while_the_run_directory_is_open(tmp_path):
    first = RunDir(tmp_path / "run")
    first.open(b"spm")
    try:
        with pytest.raises(NmtError, match=rf"{tmp_path / 'run'}.*pid {os.getpid()}"):
            RunDir(tmp_path / "run").open(b"spm")
    finally:
        first.close()
    second = RunDir(tmp_path / "run")  # closed: free again
    second.open(b"spm")
    second.close()


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory"])
def test_a_lock_that_is_not_a_regular_file_is_refused_and_nothing_is_written_through_it(
    prepared, tmp_path, capfd, planted
):
    """Issue 25: `ln -s victim.txt RUN/train.lock` made training truncate victim.txt."""
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("precious\n")
    lock = run_dir / "train.lock"
    {
        "symlink": lambda: lock.symlink_to(victim),
        "fifo": lambda: os.mkfifo(lock),
        "directory": lock.mkdir,
    }[planted]()
    code, _, err = run_here(capfd, "train", str(TINY), *tiny_sets(prepared[0], run_dir))
    assert_one_line(
        code, err, str(lock), "symbolic link" if planted == "symlink" else "regular file"
    )
    assert victim.read_text() == "precious\n" and not (run_dir / "checkpoint_last.pt").exists()


@pytest.mark.parametrize(
    "name", ["metrics.jsonl", "train.log", "config.yaml", "spm.model", "checkpoint_1.pt"]
)
def test_no_file_of_a_run_directory_is_written_through_a_symlink(prepared, tmp_path, capfd, name):
    """Issue 33: `ln -s victim RUN/metrics.jsonl` (or train.log) made training cut the victim's
    last line and append its records; a checkpoint, config.yaml or spm.model was replaced
    through the link. Each is refused in one line naming it, and the victim is untouched."""
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_bytes(b"precious\nlast line without a newline")
    (run_dir / name).symlink_to(victim)
    code, _, err = run_here(capfd, "train", str(TINY), *tiny_sets(prepared[0], run_dir))
    assert_one_line(code, err, str(run_dir / name), "symbolic link")
    assert victim.read_bytes() == b"precious\nlast line without a newline"


def test_the_last_run_marker_is_not_written_through_a_symlink(prepared, tmp_path, caplog):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    Path(".nmt-last-run").symlink_to(victim)
    train(
        tiny(prepared[0], tmp_path / "run", max_updates=1)
    )  # a convenience only: training goes on
    assert victim.read_text() == "precious\n" and Path(".nmt-last-run").is_symlink()
    assert (
        "not recording the run: .nmt-last-run: the last-run marker is a symbolic link"
        in caplog.text
    )


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_translate_reads_the_last_run_marker_only_from_a_regular_file(tmp_path, kind):
    """Without --checkpoint, translate reads .nmt-last-run: a FIFO there hung it (no writer ever
    comes), and a symlink was followed to a path of anyone's choosing. Both are one line now."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(str(tmp_path / "some-run") + "\n")
    if kind == "fifo":
        os.mkfifo(tmp_path / ".nmt-last-run")
    else:
        (tmp_path / ".nmt-last-run").symlink_to(elsewhere)
    r = nmt("translate", cwd=tmp_path, stdin="A dog.\n", timeout=60)
    what = "is not a regular file" if kind == "fifo" else "is a symbolic link"
    assert_one_line(r.returncode, r.stderr, ".nmt-last-run", what)


def test_a_tensorboard_path_that_is_a_file_is_one_line_and_kept(prepared, tmp_path, capfd):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("notes\n")
    code, _, err = run_here(
        capfd, "train", str(TINY), *tiny_sets(prepared[0], run_dir, **{"train.tensorboard": True})
    )
    assert_one_line(code, err, str(run_dir / "tensorboard"), "not a directory", "train.tensorboard")
    assert (run_dir / "tensorboard").read_text() == "notes\n"


def test_train_compile_without_a_compiler_is_one_line_naming_the_key(prepared, tmp_path):
    """train.compile (configs/big.yaml's default) on a machine with no C++ compiler: a line that
    names the key before any update, not inductor's traceback from inside the first one."""
    run_dir = tmp_path / "run"
    r = nmt(
        "train",
        str(TINY),
        *tiny_sets(prepared[0], run_dir, **{"train.compile": True}),
        "--device",
        "cpu",
        env={
            "CXX": str(tmp_path / "no-such-g++"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        },
        stdin="",
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    last_error_line(r.stderr, "train.compile", "no-such-g++", "train.compile=false")
    assert not list(run_dir.glob("checkpoint_*.pt"))


def test_a_copied_run_trains_the_copy_not_the_original(prepared, tmp_path, capfd):
    """Issue 25: `cp -r orig copy; nmt train copy/config.yaml` added checkpoints to orig (the saved
    train.run_dir is orig's path)."""
    orig, copy = tmp_path / "orig", tmp_path / "copy"
    assert run_here(capfd, "train", str(TINY), *tiny_sets(prepared[0], orig))[0] == 0
    shutil.copytree(orig, copy)
    before = {p.name: p.stat().st_mtime_ns for p in orig.iterdir()}
    code, _, err = run_here(
        capfd, "train", str(copy / "config.yaml"), "--set", "train.max_updates=2"
    )
    assert {p.name: p.stat().st_mtime_ns for p in orig.iterdir()} == before
    assert code == 0 and f"resumed from update 1 in {copy} " in err, err
    assert (copy / "checkpoint_2.pt").exists() and load_config(
        copy / "config.yaml"
    ).train.run_dir == str(copy)
    code, _, err = run_here(
        capfd, "train", str(copy / "config.yaml"), "--run-dir", str(tmp_path / "new")
    )
    assert code == 0 and f"new run in {tmp_path / 'new'}" in err  # --run-dir still chooses another
    assert {p.name: p.stat().st_mtime_ns for p in orig.iterdir()} == before


# ------------------------------------------------------------------ 2. --set values and paths


def test_set_values_of_string_keys_are_taken_as_written():
    cfg = load_config(
        TINY,
        [
            "train.run_dir=runs/exp #2",
            "data.dir=2024",
            "train.lr=7e-4",
            "decode.beam=3",
            "data.source_lang=no",
            "train.device=cpu",
        ],
    )
    assert (
        cfg.train.run_dir == "runs/exp #2"
        and cfg.data.dir == "2024"
        and cfg.data.source_lang == "no"
    )
    assert cfg.train.lr == 7e-4 and cfg.decode.beam == 3


def test_run_dir_option_is_a_path_and_its_errors_name_the_option(capfd):
    code, out, err = run_here(capfd, "train", str(TINY), "--run-dir", "2024", "--dump-config")
    assert code == 0 and "run_dir: '2024'" in out, err
    code, out, _ = run_here(capfd, "train", str(TINY), "--run-dir", "runs/exp #2", "--dump-config")
    assert code == 0 and "run_dir: 'runs/exp #2'" in out
    code, _, err = run_here(capfd, "train", str(TINY), "--run-dir", "", "--dump-config")
    line = assert_one_line(code, err, "--run-dir", "train.run_dir")
    assert "--set" not in line


def test_unknown_key_is_suggested_from_its_own_section():
    with pytest.raises(NmtError) as e:
        load_config(TINY, ["train.foo=1"])
    assert "did you mean train?" not in str(e.value) and "train.foo" in str(e.value)
    with pytest.raises(NmtError, match=r"did you mean train\.lr\?"):
        load_config(TINY, ["train.lrr=1"])


# ------------------------------------------------------------------ 3. the direction


def test_resume_on_the_reversed_direction_is_refused_naming_both(prepared, tmp_path):
    data, run_dir = prepared[0], tmp_path / "run"
    cfg = tiny(data, run_dir, max_updates=1)
    train(cfg)
    reversed_data = tmp_path / "de-en"
    shutil.copytree(data, reversed_data)  # the same files, fingerprint and sentencepiece model
    meta = json.loads((reversed_data / "prepare.json").read_text())
    meta["source_lang"], meta["target_lang"] = meta["target_lang"], meta["source_lang"]
    (reversed_data / "prepare.json").write_text(json.dumps(meta))
    more = with_overrides(cfg, data={"dir": str(reversed_data)}, train={"max_updates": 2})
    with pytest.raises(NmtError, match=r"resume refused.*en->de.*de->en.*--reset-data"):
        train(more)
    assert train(more, reset_data=True).update == 2


def test_reset_data_starts_a_new_best_and_patience(prepared, tmp_path, caplog):
    """Issue 25: after --reset-data onto the reverse direction, the best score (and so
    checkpoint_best.pt) and patience still came from the old direction."""
    caplog.set_level(logging.INFO, logger="nmt")
    data, run_dir = prepared[0], tmp_path / "run"
    cfg = tiny(data, run_dir, max_updates=1, patience=1)
    train(cfg)
    state = load_checkpoint(
        run_dir / "checkpoint_last.pt"
    )  # an old best no validation can beat, patience spent
    state["train_state"]["progress"].update(best=-1.0, bad_validations=1)
    atomic_save(state, run_dir / "checkpoint_last.pt")
    more = with_overrides(cfg, train={"max_updates": 2})
    assert train(more).update == 1  # as it stands: patience is spent
    assert train(more, reset_data=True).update == 2
    valid = records(run_dir, "valid")[-1]
    assert valid["update"] == 2 and valid["best"] == valid["valid_loss"]
    assert load_checkpoint(run_dir / "checkpoint_best.pt")["update"] == 2
    assert "--reset-data: the best validation so far (-1.000)" in caplog.text


# ------------------------------------------------------------------ 4. average-checkpoints


def test_average_refuses_an_output_that_is_one_of_its_inputs(random_checkpoint, tmp_path, capfd):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    shutil.copy(random_checkpoint, a)
    os.link(a, b)  # another name of the same file counts too
    before = a.read_bytes()
    (tmp_path / "link.pt").symlink_to(a)
    for out in (a, b, tmp_path / "." / "a.pt", tmp_path / "link.pt"):
        code, _, err = run_here(
            capfd, "average-checkpoints", str(a), str(tmp_path / "b.pt"), "-o", str(out)
        )
        assert_one_line(code, err, "-o", "one of the checkpoints")
    assert a.read_bytes() == before


@pytest.mark.parametrize("name", ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_7.pt"])
def test_average_refuses_the_names_training_owns_in_a_run_directory(
    random_checkpoint, tmp_path, name
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    shutil.copy(random_checkpoint, run_dir / "checkpoint_5.pt")
    with pytest.raises(NmtError, match=rf"{name}.*nmt train.*checkpoint_avg\.pt"):
        average_checkpoints([run_dir / "checkpoint_5.pt"], run_dir / name)
    assert not (run_dir / name).exists()
    average_checkpoints([run_dir / "checkpoint_5.pt"], run_dir / "checkpoint_avg.pt")
    average_checkpoints([run_dir / "checkpoint_5.pt"], tmp_path / name)  # not a run directory: fine


# ------------------------------------------------------------------ 5. one line for every mistake


@pytest.mark.parametrize(
    "args",
    [
        ("translate", "-c", "{ckpt}", "-i", os.devnull, "-o", "."),
        ("average-checkpoints", "{ckpt}", "-o", "."),
        ("shortlist", "{data}", "-o", "."),
        ("translate", "-c", "{ckpt}", "-i", os.devnull, "-o", "{tmp}"),
    ],
    ids=["translate", "average-checkpoints", "shortlist", "translate-absolute"],
)
def test_output_that_is_a_directory_is_one_line(random_checkpoint, prepared, tmp_path, capfd, args):
    paths = {"ckpt": random_checkpoint, "data": prepared[0], "tmp": tmp_path}
    code, _, err = run_here(capfd, *(a.format(**paths) for a in args))
    assert_one_line(code, err, "is a directory")


@pytest.mark.parametrize("under", ["file", "proc"])
def test_destdir_that_cannot_be_created_is_one_line(prepared, raw_corpus, tmp_path, capfd, under):
    (tmp_path / "file").write_text("x")
    dest = tmp_path / "file" / "out" if under == "file" else Path("/proc/nmt-out")
    code, _, err = run_here(
        capfd,
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        raw_corpus.prefix("train"),
        "--spm-model",
        str(prepared[0] / "spm.model"),
        "--destdir",
        str(dest),
    )
    assert_one_line(code, err, "--destdir", str(dest))


DECODE_MISTAKES = [
    (("--beam", "501"), "--beam"),  # the vocabulary is 500
    (("--max-len-b", "-5"), "--max-len-b"),
    (("--max-len-a", "-1"), "--max-len-a"),
    (("--min-len", "-1"), "--min-len"),
    (("--no-repeat-ngram-size", "-1"), "--no-repeat-ngram-size"),
    (("--threads", "-1"), "--threads"),
]


@pytest.mark.parametrize(
    ("args", "needle"), DECODE_MISTAKES, ids=[a[0] for a, _ in DECODE_MISTAKES]
)
def test_translate_option_out_of_bounds_is_one_line(random_checkpoint, capfd, args, needle):
    code, _, err = run_here(
        capfd, "translate", "-c", str(random_checkpoint), "-i", os.devnull, *args
    )
    assert_one_line(code, err, needle)


@pytest.mark.parametrize("device", ["meta", "mps", "xla", "cpu:0", "cuda:01", "cuda:99999999999"])
def test_a_device_nmt_does_not_run_on_is_refused_by_one_rule_everywhere(
    random_checkpoint, capfd, device
):
    """Issue 25: translate --device meta was a NotImplementedError, mps and xla a RuntimeError."""
    code, _, err = run_here(
        capfd, "translate", "-c", str(random_checkpoint), "-i", os.devnull, "--device", device
    )
    assert_one_line(code, err, f"unknown device {device!r}", "auto, cpu, cuda or cuda:N")
    with pytest.raises(NmtError, match=f"unknown device {device!r}"):
        Translator.load(random_checkpoint, device=device)
    code, _, err = run_here(capfd, "train", str(TINY), "--device", device, "--dump-config")
    assert_one_line(code, err, "--device", "train.device must be auto, cpu, cuda or cuda:N")


def test_a_cuda_device_beyond_the_last_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(NmtError, match=r"'cuda:2' asked for, but there are 2 CUDA devices"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


TOO_BIG = [
    {"model.ffn_dim": 10**9},
    {"model.d_model": 10**8},
    {"model.arch": "rnn", "model.rnn_hidden": 10**8},
    {"model.encoder_layers": 10**6},
    {"model.max_positions": 10**9},
    {"model.decoder_layers": 10**400},
]


@pytest.mark.parametrize(
    "sets", TOO_BIG, ids=lambda sets: ",".join(f"{k}={str(v)[:12]}" for k, v in sets.items())
)
def test_a_model_too_big_for_the_device_is_one_line_naming_its_keys(
    prepared, tmp_path, capfd, monkeypatch, sets
):
    """Issue 25: an allocator traceback after the data loaded (or, for 10^6 layers, minutes of
    building)."""
    monkeypatch.setattr(
        "nmt.device.memory_bytes", lambda device: 8 << 30, raising=False
    )  # any machine: 8 GiB
    code, _, err = run_here(
        capfd, "train", str(TINY), *tiny_sets(prepared[0], tmp_path / "run", **sets)
    )
    assert_one_line(
        code,
        err,
        *(f"{key}={value}" for key, value in sets.items() if key != "model.arch"),
        "8 GiB",
        "lower them",
    )
    assert not (tmp_path / "run").exists()


def test_a_model_whose_shapes_overflow_is_one_line_in_training_and_dry_run(
    prepared, tmp_path, capfd
):
    for args in (tiny_sets(prepared[0], tmp_path / "run"), ["--dry-run", "--vocab-size", "500"]):
        code, _, err = run_here(
            capfd, "train", str(TINY), *args, "--set", "model.d_model=1000000000"
        )
        assert_one_line(code, err, "model.d_model=1000000000", "cannot even be sized")


def test_a_model_that_fails_to_allocate_is_one_line_naming_its_keys(
    prepared, tmp_path, capfd, monkeypatch
):
    """The estimate passed, the allocation did not (memory in use, a container's limit)."""
    from nmt.training import sizing

    def allocator_fails(*args: Any, **kwargs: Any) -> Any:
        if torch.empty(0).device.type == "meta":  # sizing: shapes only
            return build_model(*args, **kwargs)
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 128000000000 bytes. Error code 12 (Cannot allocate "
            "memory)"
        )

    monkeypatch.setattr(sizing, "build_model", allocator_fails)
    code, _, err = run_here(capfd, "train", str(TINY), *tiny_sets(prepared[0], tmp_path / "run"))
    assert_one_line(
        code,
        err,
        "model.d_model=32, model.ffn_dim=64",
        "cannot be allocated on cpu",
        "can't allocate",
    )


def test_a_checkpoints_stored_decode_setting_is_named_as_its_key(
    random_checkpoint, tmp_path, capfd
):
    cfg = config_to_dict(load_config(TINY))
    cfg["decode"]["beam"] = 0
    bad = _save(tmp_path / "beam0.pt", random_checkpoint, config=cfg)
    code, _, err = run_here(capfd, "translate", "-c", str(bad), "-i", os.devnull)
    line = assert_one_line(code, err, str(bad), "decode.beam")
    assert "--beam" not in line
    code, _, err = run_here(capfd, "translate", "-c", str(bad), "-i", os.devnull, "--beam", "2")
    assert code == 0, err


def _inconsistent() -> dict[str, dict[str, Any]]:
    cfg = config_to_dict(load_config(TINY))
    wider = {**cfg, "model": {**cfg["model"], "d_model": 64, "ffn_dim": 128}}
    return {
        "tokenizer missing": {"tokenizer": None},
        "tokenizer not sentencepiece": {"tokenizer": {"model": b"garbage", "sha256": "0"}},
        "config not matching the weights": {"config": wider},
        "vocab size changed": {"vocab_size": 499},
        "model not a dict": {"model": [torch.zeros(1)]},
        "config not a dict": {"config": "model"},
    }


@pytest.mark.parametrize("case", list(_inconsistent()))
def test_checkpoint_that_loads_but_is_inconsistent_is_one_line(
    random_checkpoint, tmp_path, capfd, case
):
    bad = _save(tmp_path / "bad.pt", random_checkpoint, **_inconsistent()[case])
    code, _, err = run_here(capfd, "translate", "-c", str(bad), "-i", os.devnull)
    assert_one_line(code, err, str(bad))
    code, _, err = run_here(
        capfd, "average-checkpoints", str(bad), str(bad), "-o", str(tmp_path / "avg.pt")
    )
    if case in ("model not a dict", "config not a dict"):
        assert_one_line(code, err, str(bad))


@pytest.mark.parametrize("damage", ["no progress", "weights of another shape"])
def test_training_checkpoint_that_loads_but_cannot_be_resumed_is_one_line(
    prepared, tmp_path, capfd, damage
):
    run_dir = tmp_path / "run"
    sets = tiny_sets(prepared[0], run_dir)
    assert run_here(capfd, "train", str(TINY), *sets)[0] == 0
    state = load_checkpoint(run_dir / "checkpoint_last.pt")
    if damage == "no progress":
        del state["train_state"]["progress"]
    else:
        key = next(iter(state["model"]))
        state["model"][key] = torch.zeros(3)
    for name in ("checkpoint_last.pt", "checkpoint_1.pt"):
        (run_dir / name).unlink(missing_ok=True)
    atomic_save(state, run_dir / "checkpoint_last.pt")
    code, _, err = run_here(
        capfd, "train", str(TINY), *tiny_sets(prepared[0], run_dir, **{"train.max_updates": 2})
    )
    assert_one_line(code, err, str(run_dir), "cannot be resumed")


@pytest.mark.parametrize(
    "meta",
    [
        [1, 2],
        {"source_lang": "en"},
        {"source_lang": 1, "target_lang": "de", "vocab_size": "x", "splits": {}},
    ],
)
def test_prepare_json_of_the_wrong_shape_is_one_line(prepared, tmp_path, capfd, meta):
    data = tmp_path / "data"
    shutil.copytree(prepared[0], data)
    (data / "prepare.json").write_text(json.dumps(meta))
    code, _, err = run_here(capfd, "train", str(TINY), *tiny_sets(data, tmp_path / "run"))
    assert_one_line(code, err, str(data / "prepare.json"))
    code, _, err = run_here(capfd, "shortlist", str(data), "-o", str(tmp_path / "s.pt"))
    assert_one_line(code, err, str(data / "prepare.json"))


@pytest.mark.parametrize("marker", ["directory", "not utf-8"])
def test_unreadable_last_run_marker_is_one_line(tmp_path, capfd, marker):
    if marker == "directory":
        (tmp_path / ".nmt-last-run").mkdir()
    else:
        (tmp_path / ".nmt-last-run").write_bytes(b"\xff\xfe runs\n")
    code, _, err = run_here(capfd, "translate", "-i", os.devnull)
    assert_one_line(code, err, ".nmt-last-run", "--checkpoint")


@pytest.mark.parametrize("stream", ["stdin", "stdout"])
def test_closed_standard_stream_is_one_line(random_checkpoint, stream):
    redirect = "<&-" if stream == "stdin" else ">&- </dev/null"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m nmt translate -c "{random_checkpoint}" {redirect}'],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line(
        r.returncode, r.stderr, f"standard {'input' if stream == 'stdin' else 'output'}"
    )


def _full_stdout_commands(ckpt: Path, tmp_path: Path) -> dict[str, tuple[list[str], bytes]]:
    ref = tmp_path / "ref.txt"
    ref.write_text("a b c\n" * 3)
    return {
        "translate": (["translate", "-c", str(ckpt)], b"\n" * 10000 + b"a house\n"),
        "score": (["score", "--ref", str(ref)], b"a b c\n" * 3),
        "dump-config": (["train", str(TINY), "--dump-config"], b""),
    }


@pytest.mark.parametrize("command", ["translate", "score", "dump-config"])
@pytest.mark.parametrize("limit", ["/dev/full", "file size limit"])
def test_standard_output_that_cannot_be_written_is_one_line(
    random_checkpoint, tmp_path, command, limit
):
    args, stdin = _full_stdout_commands(random_checkpoint, tmp_path)[command]
    if limit == "/dev/full":
        with open("/dev/full", "wb") as out:
            r = run_process(*args, input=stdin, stdout=out, stderr=subprocess.PIPE)
    else:
        import resource

        def small_files() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))

        with open(tmp_path / "out.txt", "wb") as out:
            r = run_process(
                *args, input=stdin, stdout=out, stderr=subprocess.PIPE, preexec_fn=small_files
            )
    assert_one_line(r.returncode, r.stderr.decode(), "standard output")


@pytest.mark.parametrize("planted", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("role", ["checkpoint", "shortlist", "prepare.json", "metrics"])
def test_a_file_read_whole_is_a_regular_file_never_a_fifo_or_a_device(
    prepared, random_checkpoint, tmp_path, planted, role
):
    """Issue 33: a FIFO where nmt expects a file blocked forever, a link to /dev/zero read until
    memory ran out. Every file nmt reads whole goes through `nmt.atomic.open_for_reading`."""
    data = tmp_path / "data"
    shutil.copytree(prepared[0], data)
    path = {
        "checkpoint": tmp_path / "model.pt",
        "shortlist": tmp_path / "list.pt",
        "prepare.json": data / "prepare.json",
        "metrics": tmp_path / "run" / "metrics.jsonl",
    }[role]
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path) if planted == "fifo" else path.symlink_to("/dev/zero")
    args = {
        "checkpoint": ["translate", "-c", str(path)],
        "shortlist": ["translate", "-c", str(random_checkpoint), "--shortlist", str(path)],
        "prepare.json": ["train", str(TINY), *tiny_sets(data, tmp_path / "r")],
        "metrics": ["plot", "curves", str(path.parent), "-o", str(tmp_path / "c.png")],
    }[role]
    r = nmt(*args, stdin="A dog.\n", timeout=120)
    assert_one_line(r.returncode, r.stderr, str(path), "not a regular file")


# ------------------------------------------------------------------ 6. broken pipes and signals


def test_a_reader_that_goes_away_ends_translate_quietly(random_checkpoint, tmp_path):
    (tmp_path / "in.txt").write_bytes(
        b"\n" * 400_000
    )  # empty lines: many output lines, no model work
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            "bash",
            "-o",
            "pipefail",
            "-c",
            f'"{sys.executable}" -m nmt translate -c "{random_checkpoint}" < in.txt | head -1',
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # nothing on stderr but the log's INFO records (the engine chosen)
    assert r.returncode == 0 and r.stdout == "\n", r.stderr
    assert all(INFO_RECORD.match(line) for line in r.stderr.splitlines()), r.stderr


def _started_on_a_fifo(ckpt: Path, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Any]:
    """translate reading a named pipe, past its start-up: a first line written to the pipe has
    been translated (`--buffer-lines 1`: its line on stdout, or in -o's temporary), so the model is
    loaded and the command waits for more input. Opening the pipe is no such sign: translate opens
    its input before it loads the model. Under load start-up can be slow, so the wait is long, and a
    translate that never gets there is killed and reported, never waited for without end."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    # faulthandler: a command that does not stop is sent SIGABRT and shows where each thread was
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    # Ctrl-C as a user at a terminal gives it: to a command whose SIGINT is at its default. A
    # background job of a non-interactive shell (how a script or CI may start this suite)
    # ignores SIGINT, a child inherits that, and Python then installs no KeyboardInterrupt
    # handler. A handled signal is reset to its default in the child: handle it while starting.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nmt",
                "translate",
                "-c",
                str(ckpt),
                "-i",
                str(fifo),
                "--buffer-lines",
                "1",
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 300

    def fail(what: str) -> None:
        proc.kill()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"translate {what} (exit {proc.returncode}): {out!r} {err!r}")

    while True:  # opened without blocking: a translate that exits early must not hang the test
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader yet
            if proc.poll() is not None or time.monotonic() > deadline:
                fail("never opened its input")
            time.sleep(0.01)
    os.set_blocking(fd, True)
    writer = os.fdopen(fd, "w")
    writer.write("A dog runs.\n")
    writer.flush()
    output = Path(args[args.index("-o") + 1]) if "-o" in args else None
    while not (
        select.select([proc.stdout], [], [], 0.05)[0]
        if output is None
        else any(p.stat().st_size for p in output.parent.glob(f".{output.name}.tmp-*"))
    ):
        if proc.poll() is not None or time.monotonic() > deadline:
            writer.close()
            fail("never translated its first line")
        time.sleep(0.01)
    return proc, writer


def _stopped_by(proc: subprocess.Popen, writer: Any, sig: int, thread: int | None = None) -> str:
    """Send `sig` (to the process, or to one of its threads), then the command's stderr once
    it has ended (killed after 120 s)."""
    try:
        if thread is None:
            proc.send_signal(sig)
        # a thread-directed signal: what the kernel does when another thread takes a process's
        # signal
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.tgkill(proc.pid, thread, sig) == 0, os.strerror(ctypes.get_errno())
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(
                signal.SIGABRT
            )  # its threads' tracebacks on stderr, if stderr is still open
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate(timeout=60)
            pytest.fail(
                f"translate did not stop within 120 s of signal {sig} (exit {proc.returncode}): "
                f"{out!r} {err}"
            )
    finally:
        writer.close()
    return err


def test_ctrl_c_in_translate_says_so_and_exits_130(random_checkpoint, tmp_path):
    proc, writer = _started_on_a_fifo(random_checkpoint, tmp_path)
    err = _stopped_by(proc, writer, signal.SIGINT)
    assert_one_line(proc.returncode, err, "interrupted", status=130)


@pytest.mark.parametrize(
    "sig, says, status", [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "SIGTERM", 143)]
)
def test_a_signal_another_thread_takes_still_stops_translate(
    random_checkpoint, tmp_path, sig, says, status
):
    """A signal sent to a process goes to any one of its threads that does not block it, and
    Python runs the handler in the main thread only: taken by another thread (torch's, tqdm's),
    it did not interrupt the main thread's blocking read of a quiet pipe, and translate went on
    waiting (seen under load, 1 run in 12). Sent to each other thread, it must stop translate."""
    proc, writer = _started_on_a_fifo(random_checkpoint, tmp_path)
    others = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    assert others, "translate has no thread besides its main one: nothing to test"
    err = _stopped_by(proc, writer, sig, thread=others[-1])
    assert_one_line(proc.returncode, err, says, status=status)


def test_sigterm_in_translate_leaves_no_temporary_and_exits_143(random_checkpoint, tmp_path):
    proc, writer = _started_on_a_fifo(random_checkpoint, tmp_path, "-o", str(tmp_path / "out.txt"))
    err = _stopped_by(proc, writer, signal.SIGTERM)
    assert_one_line(proc.returncode, err, "SIGTERM", status=143)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fifo"]


# ------------------------------------------------------------------ 8. stale temporaries


def test_translate_removes_the_temporaries_of_dead_writers_of_its_output(
    random_checkpoint, tmp_path, capfd
):
    dead = tmp_path / f".out.txt.tmp-{dead_pid()}-0123abcd"
    alive = tmp_path / f".out.txt.tmp-{os.getpid()}-0123abcd"
    other = tmp_path / f".other.txt.tmp-{dead_pid()}-0123abcd"
    for path in (dead, alive, other):
        path.write_text("partial")
    code, _, err = run_here(
        capfd,
        "translate",
        "-c",
        str(random_checkpoint),
        "-i",
        os.devnull,
        "-o",
        str(tmp_path / "out.txt"),
    )
    assert code == 0, err
    assert not dead.exists() and alive.exists() and other.exists()


def test_prepare_removes_the_work_directories_of_dead_runs(prepared, raw_corpus, tmp_path, capfd):
    pid = dead_pid()
    leftovers = [tmp_path / f".data.tmp-{pid}-0123abcd", tmp_path / f".data.old-{pid}-0123abcd"]
    for path in leftovers:
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "train.en.bin").write_bytes(b"x")
    alive = tmp_path / f".data.tmp-{os.getpid()}-0123abcd"
    alive.mkdir()
    code, _, err = run_here(
        capfd,
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        raw_corpus.prefix("train"),
        "--spm-model",
        str(prepared[0] / "spm.model"),
        "--destdir",
        str(tmp_path / "data"),
    )
    assert code == 0, err
    assert not any(p.exists() for p in leftovers) and alive.is_dir()


def test_clean_temporaries_takes_directories_only_when_asked(tmp_path):
    leftover = tmp_path / f".x.tmp-{dead_pid()}-0123abcd"
    leftover.mkdir()
    assert clean_temporaries(tmp_path) == 0 and leftover.is_dir()
    assert clean_temporaries(tmp_path, name="x", directories=True) == 1 and not leftover.exists()


# ------------------------------------------------------------------ 9. file metadata


def test_replacing_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o600)
    atomic_write_bytes(b"new", path)
    assert path.read_bytes() == b"new" and (path.stat().st_mode & 0o777) == 0o600


def test_writing_onto_a_symlink_writes_through_it(tmp_path):
    target, link = tmp_path / "real.txt", tmp_path / "link.txt"
    target.write_text("old")
    link.symlink_to(target.name)
    atomic_write_bytes(b"new", link)
    assert link.is_symlink() and target.read_bytes() == b"new"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to("made.txt")
    atomic_write_bytes(b"made", dangling)
    assert dangling.is_symlink() and (tmp_path / "made.txt").read_bytes() == b"made"


# ------------------------------------------------------------------ 10. score


@pytest.mark.parametrize("metrics", ["", " , "], ids=["empty", "commas"])
def test_score_with_no_metric_is_one_line(tmp_path, capfd, metrics):
    ref = tmp_path / "ref.txt"
    ref.write_text("a b\n")
    code, _, err = run_here(
        capfd, "score", "--ref", str(ref), "--hyp", str(ref), "--metrics", metrics
    )
    assert_one_line(code, err, "--metrics")


def test_score_line_count_mismatch_names_both_files(tmp_path, capfd):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("a b\nc d\n")
    hyp.write_text("a b\n")
    code, _, err = run_here(capfd, "score", "--ref", str(ref), "--hyp", str(hyp))
    assert_one_line(code, err, str(ref), str(hyp), "1", "2")


def test_score_reads_invalid_utf8_the_same_from_stdin_and_hyp(tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("a house\nthe cat\n")
    hyp.write_bytes(b"a h\xffuse\nthe cat\n")
    from_file = nmt("score", "--ref", str(ref), "--hyp", str(hyp), "--json", stdin=b"", check=True)
    from_stdin = nmt("score", "--ref", str(ref), "--json", stdin=hyp.read_bytes(), check=True)
    assert json.loads(from_file.stdout) == json.loads(from_stdin.stdout)
    assert f"{hyp}:1: invalid UTF-8" in from_file.stderr.decode()
    assert "<stdin>:1: invalid UTF-8" in from_stdin.stderr.decode()


def test_score_never_appends_to_a_file_it_reads(tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("a b\n")
    hyp.write_text("a b\n")
    for args, stdin_file, needle in (
        (["--hyp", str(hyp)], None, f"the hypotheses (--hyp {hyp})"),
        ([], hyp, "the hypotheses (standard input)"),
    ):
        with open(hyp, "ab") as out, open(stdin_file or os.devnull, "rb") as stdin:
            r = run_process(
                "score", "--ref", str(ref), *args, stdin=stdin, stdout=out, stderr=subprocess.PIPE
            )
        assert_one_line(r.returncode, r.stderr.decode(), f"standard output is {needle}")
    assert hyp.read_text() == "a b\n"


# ------------------------------------------------------------------ 11. wording


def test_one_line_with_three_problems_is_one_cleaned_line():
    stats = TextStats("x.de")
    lines = list(iter_lines(io.BytesIO(b"a\xff\x00b\x0bc\nclean\n"), stats))
    assert len(lines) == 2
    assert stats.summary().startswith("x.de: cleaned 1 line (")


# ------------------------------------------------------------------ checkpoint_best.pt on its own


def test_best_checkpoint_is_its_own_file_and_survives_damage_to_the_last(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    state = {"format_version": 1, "model": {"w": torch.ones(3)}, "config": {}, "update": 4}
    run_dir.save_checkpoint(state, 4, best=True, keep_last=0)
    last, best, numbered = (
        run_dir.path / n for n in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_4.pt")
    )
    assert os.path.samefile(last, numbered) and not os.path.samefile(last, best)
    with open(last, "r+b") as f:  # damage in place, as a careless copy or a bad disk would
        f.truncate(100)
    assert torch.equal(load_checkpoint(best)["model"]["w"], torch.ones(3))


# -------------------------------------------------------------- 12. found by probing every surface


def test_an_output_onto_a_fifo_or_a_descriptor_is_written_into_never_replaced(
    random_checkpoint, tmp_path
):
    """A rename over /dev/null (as root) or a FIFO would unlink it; /dev/stdout >> log kept the
    log's head."""
    src = tmp_path / "in.txt"
    src.write_text("a b c\nd e\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = run_process(
        "translate",
        "-c",
        str(random_checkpoint),
        "-i",
        str(src),
        "-o",
        str(fifo),
        "--beam",
        "1",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got[0].count(b"\n") == 2
    log = tmp_path / "log.txt"
    log.write_bytes(b"kept\n")
    with open(log, "ab") as out:
        r = run_process(
            "translate",
            "-c",
            str(random_checkpoint),
            "-i",
            str(src),
            "-o",
            "/dev/stdout",
            "--beam",
            "1",
            stdout=out,
            stderr=subprocess.PIPE,
        )
    assert r.returncode == 0, r.stderr
    assert log.read_bytes() == b"kept\n" + got[0]
    assert not list(Path(tempfile.gettempdir()).glob(".stdout.tmp-*"))


def test_dash_is_standard_input_and_output(random_checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a b c\nd e\n")
    with open(src, "rb") as stdin:
        r = run_process(
            "translate",
            "-c",
            str(random_checkpoint),
            "-i",
            "-",
            "-o",
            "-",
            "--beam",
            "1",
            stdin=stdin,
            capture_output=True,
        )
    assert r.returncode == 0 and r.stdout.count(b"\n") == 2 and not (tmp_path / "-").exists()


def test_translate_reads_a_gzip_input_as_its_text(random_checkpoint, tmp_path, capfd):
    plain, packed = tmp_path / "in.txt", tmp_path / "in.txt.gz"
    plain.write_text("".join(f"a b {i}\n" for i in range(20)))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    outputs = []
    for path in (plain, packed):
        code, out, err = run_here(
            capfd, "translate", "-c", str(random_checkpoint), "-i", str(path), "--beam", "1"
        )
        assert code == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 20


def _damaged(cfg: dict[str, Any], model: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    heads = {**cfg, "model": {**cfg["model"], "heads": 3}}  # 3 does not divide d_model 32
    name = next(k for k, t in model.items() if t.is_floating_point())
    return {
        "heads not dividing d_model": {"config": heads},
        "a NaN weight": {"model": {**model, name: torch.full_like(model[name], float("nan"))}},
    }


@pytest.mark.parametrize("case", ["heads not dividing d_model", "a NaN weight"])
def test_a_checkpoint_with_an_impossible_config_or_a_nan_weight_is_refused_everywhere(
    random_checkpoint, tmp_path, capfd, case
):
    """Either used to translate with a traceback, or to empty lines and exit 0, and to export a
    model that CTranslate2 cannot load; averaging passed the NaN on."""
    good = load_checkpoint(random_checkpoint)
    bad = _save(
        tmp_path / "bad.pt",
        random_checkpoint,
        **_damaged(config_to_dict(load_config(TINY)), good["model"])[case],
    )
    needle = (
        "model.heads (3) must divide"
        if case.startswith("heads")
        else "holds NaN or infinite values"
    )
    for args in (
        ["translate", "-c", str(bad), "-i", os.devnull],
        ["export", str(bad), str(tmp_path / "ct2")],
        ["average-checkpoints", str(random_checkpoint), str(bad), "-o", str(tmp_path / "avg.pt")],
    ):
        code, _, err = run_here(capfd, *args)
        assert_one_line(code, err, str(bad), needle)
    assert not (tmp_path / "ct2").exists() and not (tmp_path / "avg.pt").exists()


def test_a_model_of_the_other_direction_is_refused_in_an_ensemble_an_average_and_as_a_teacher(
    random_checkpoint, raw_corpus, tmp_path, capfd
):
    cfg = config_to_dict(load_config(TINY))
    cfg["data"].update(source_lang="de", target_lang="en")
    ours = _save(
        tmp_path / "en-de.pt",
        random_checkpoint,
        config={**cfg, "data": {**cfg["data"], "source_lang": "en", "target_lang": "de"}},
    )
    other = _save(tmp_path / "de-en.pt", random_checkpoint, config=cfg)
    for args in (
        ["translate", "-c", str(ours), "-c", str(other), "-i", os.devnull],
        ["average-checkpoints", str(ours), str(other), "-o", str(tmp_path / "avg.pt")],
        [
            "distill",
            "--teacher",
            str(other),
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            raw_corpus.prefix("train"),
            "--out",
            str(tmp_path / "d"),
        ],
    ):
        code, _, err = run_here(capfd, *args)
        assert_one_line(code, err, str(other), "translates de->en, not en->de")


def test_a_terminology_file_that_is_not_utf8_is_one_line_naming_its_line(
    random_checkpoint, tmp_path, capfd
):
    terms = tmp_path / "terms.tsv"
    terms.write_bytes(b"cat\tKatze\ndog\tSch\xe4ferhund\n")  # Latin-1
    code, _, err = run_here(
        capfd,
        "translate",
        "-c",
        str(random_checkpoint),
        "-i",
        os.devnull,
        "--terminology",
        str(terms),
    )
    assert_one_line(code, err, f"{terms}:2: not UTF-8")


def test_every_replaced_file_removes_a_killed_writers_temporary(random_checkpoint, tmp_path, capfd):
    left = tmp_path / f".avg.pt.tmp-{dead_pid()}-0badf00d"
    left.write_bytes(b"half a checkpoint")
    code, _, err = run_here(
        capfd, "average-checkpoints", str(random_checkpoint), "-o", str(tmp_path / "avg.pt")
    )
    assert code == 0, err
    assert not left.exists() and (tmp_path / "avg.pt").is_file()


def test_export_force_refuses_to_remove_what_it_did_not_write(random_checkpoint, tmp_path, capfd):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert run_here(capfd, "export", str(random_checkpoint), str(out))[0] == 0
    (out / ".git").mkdir()
    (out / "README.md").write_text("# card\n")
    before = sorted(p.name for p in out.iterdir())
    code, _, err = run_here(capfd, "export", str(random_checkpoint), str(out), "--force")
    assert_one_line(code, err, f"OUT_DIR {out}: holds .git, README.md")
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_run_pruned_to_its_best_checkpoint_resumes_from_it_and_never_replaces_it(
    prepared, tmp_path, caplog
):
    data, run_dir = prepared[0], tmp_path / "run"
    cfg = tiny(data, run_dir, max_updates=2, save_interval_updates=1, validate_interval_updates=1)
    train(cfg)
    best = load_checkpoint(run_dir / "checkpoint_best.pt")
    for path in [run_dir / "checkpoint_last.pt", *run_dir.glob("checkpoint_[0-9]*.pt")]:
        path.unlink()
    with pytest.raises(NmtError, match="model.ffn_dim"):  # a new run here would have replaced it
        train(with_overrides(cfg, model={"ffn_dim": 96}))
    kept = load_checkpoint(run_dir / "checkpoint_best.pt")
    assert kept["update"] == best["update"] and all(
        torch.equal(kept["model"][k], t) for k, t in best["model"].items()
    )
    caplog.set_level(logging.INFO, logger="nmt")
    assert train(with_overrides(cfg, train={"max_updates": 3})).update == 3
    assert f"resumed from update {best['update']}" in caplog.text


def test_the_tokenizer_and_the_splits_of_the_data_are_checked_before_training(prepared, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared[0], data)
    meta = json.loads((data / "prepare.json").read_text())
    cfg = tiny(data, tmp_path / "run", max_updates=1)
    with pytest.raises(NmtError, match="no split 'vaild'"):
        train(with_overrides(cfg, data={"valid_split": "vaild"}))
    with pytest.raises(NmtError, match="decode.beam must be smaller than the vocabulary"):
        train(with_overrides(cfg, decode={"beam": 10**6}))
    meta["spm"]["sha256"] = "0" * 64  # as if spm.model had been swapped for another
    (data / "prepare.json").write_text(json.dumps(meta))
    with pytest.raises(NmtError, match="spm.model: not the tokenizer the data was prepared with"):
        train(cfg)


def test_a_finished_run_started_again_keeps_its_config(prepared, tmp_path):
    cfg = tiny(prepared[0], tmp_path / "run", max_updates=1)
    train(cfg)
    written = (tmp_path / "run" / "config.yaml").read_bytes()
    assert train(with_overrides(cfg, train={"lr": 0.5})).update == 1
    assert (tmp_path / "run" / "config.yaml").read_bytes() == written


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "model:\n  d_model: 64\ntrain:\n  lr: 0.1\nmodel:\n  heads: 4\n",
            "c.yaml:5:1: malformed YAML: key model given twice",
        ),
        ("train:\n  seed: -1\n", "train.seed must be in [0, 2^62), got -1"),
        ("train:\n  threads: 100000\n", "train.threads must be in [0, 4096], got 100000"),
        (
            "train:\n  pad_to_multiple: 300\nmodel:\n  max_positions: 256\n",
            "train.pad_to_multiple (300) must not exceed model.max_positions (256)",
        ),
    ],
    ids=["duplicate key", "seed", "threads", "pad_to_multiple"],
)
def test_config_mistakes_that_used_to_reach_training_are_one_line(tmp_path, text, needle):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "c.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_rejected_value_is_shown_short_even_from_a_yaml_alias_bomb(tmp_path):
    levels = ['&b0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"&b{i} [" + ",".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (tmp_path / "c.yaml").write_text("train:\n  lr: [" + ", ".join(levels) + "]\n")
    with pytest.raises(ConfigError, match="train.lr must be a number") as e:
        load_config(tmp_path / "c.yaml")
    assert len(str(e.value)) < 500


def test_the_api_refuses_fp16_on_the_cpu_at_load_and_a_where_that_is_not_a_function(
    random_checkpoint,
):
    with pytest.raises(NmtError, match="fp16 needs a CUDA device"):
        Translator.load(random_checkpoint, precision="fp16", device="cpu")
    translator = Translator.load(random_checkpoint, device="cpu", beam=1)
    with pytest.raises(NmtError, match="where= must be a function"):
        translator.translate_nbest(["a b"], where="x")


def test_a_best_metric_changed_on_resume_starts_a_new_best_and_patience(prepared, tmp_path, caplog):
    """The best loss (9.4, lower is better) was compared with a BLEU, or the reverse:
    checkpoint_best.pt was never replaced again and patience stopped a run that improved."""
    caplog.set_level(logging.INFO, logger="nmt")
    data, run_dir = prepared[0], tmp_path / "run"
    cfg = tiny(
        data,
        run_dir,
        max_updates=2,
        validate_interval_updates=1,
        valid_bleu=False,
        best_metric="loss",
    )
    train(cfg)
    assert (
        train(
            with_overrides(cfg, train={"max_updates": 3, "valid_bleu": True, "best_metric": "bleu"})
        ).update
        == 3
    )
    assert load_checkpoint(run_dir / "checkpoint_best.pt")["update"] == 3
    assert "the best validation so far is a loss" in caplog.text
