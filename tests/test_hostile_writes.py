"""Every file a command writes, with a hard link, a symbolic link, a FIFO or /dev/full in its
place (issue 57): the one rule of `nmt.atomic`.

Inside a folder a command writes (a run directory, `nmt distill --out`), a file is a regular
file with one link, never written through a symbolic link: a link or a special file there is a
one-line error before anything is written; a hard link is broken by a rename (or a copy of its
own), never written through. A path the user names (`-o`, OUT_DIR, `--destdir`) keeps its
documented behaviour: a symlink is written through, a device or a FIFO written into (a FIFO
nobody reads is refused, never waited for), a hard link replaced. Either way the file a link
names keeps its content, nothing hangs, and nothing already written is lost.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    ROOT,
    TINY,
    distill_command,
    first_train_pairs,
    last_error_line,
    nmt_here,
    save_random_model,
    set_args,
)

from nmt import atomic
from nmt.api import Translation, Translator
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # cli.main sets logging; train sets torch's threads

VICTIM = b"a file of someone else's, which no nmt command may change\n"
KINDS = ["hardlink", "symlink", "fifo", "devfull"]


# ------------------------------------------------------------------ helpers


class _Hang(Exception):
    pass


@contextmanager
def no_hang(seconds: int = 300) -> Iterator[None]:
    """Fail, instead of waiting for ever, when the block outlasts `seconds` (a FIFO opened for
    writing blocks until a reader comes). Generous: the machine may be loaded."""

    def ring(signum: int, frame: Any) -> None:
        raise _Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plant(path: Path, kind: str, victim: Path) -> None:
    """Put `kind` at `path`, in place of what is there: a hard link to `victim`, a symbolic link
    to it, a FIFO, or a symbolic link to /dev/full."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "hardlink":
        os.link(victim, path)
    elif kind == "symlink":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/full")


def victim_for(path: Path, tmp: Path) -> Path:
    """A file elsewhere for a link at `path` to name: a copy of what is at `path` (a checkpoint
    that resumes, a manifest that reads), else VICTIM; a folder with one file for a folder."""
    victim = tmp / "elsewhere" / path.name
    victim.parent.mkdir(exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, victim)
    elif path.is_file():
        shutil.copyfile(path, victim)
    else:
        victim.write_bytes(VICTIM)
    return victim


def snapshot(path: Path) -> dict[str, bytes]:
    """The content of a file, or of each file under a folder, by name."""
    if path.is_dir():
        return {
            str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
        }
    return {"": path.read_bytes()}


def outcome(code: int, err: str, path: Path, kind: str, refused: bool) -> None:
    """Exit 1 with one error line naming `path` where `refused`, else exit 0, no traceback."""
    if refused:
        assert code == 1, err[-2000:]
        last_error_line(err, path.name)
    else:
        assert code == 0, err[-2000:]
        assert "Traceback" not in err


# ------------------------------------------------------------------ the rule, in nmt.atomic


@pytest.mark.parametrize("kind", ["symlink", "fifo", "devfull", "directory"])
def test_own_file_refuses_a_link_or_a_special_file(kind, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    path = tmp_path / "run" / "metrics.jsonl"
    if kind == "directory":
        path.mkdir(parents=True)
    else:
        plant(path, kind, victim)
    with pytest.raises(NmtError, match="metrics.jsonl: metrics is"):
        atomic.own_file(path, "metrics")
    with no_hang(), pytest.raises(NmtError, match="metrics.jsonl"):
        atomic.atomic_write_bytes(b"new\n", path, "metrics", own=True)
    assert victim.read_bytes() == VICTIM


def test_a_file_appended_to_must_have_one_link(tmp_path):
    """O_NOFOLLOW cannot see a hard link: `ln victim RUN/metrics.jsonl` had training append to
    the victim. Opened for writing it is refused; `unshare` gives it a copy of its own."""
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    path = tmp_path / "metrics.jsonl"
    os.link(victim, path)
    with pytest.raises(NmtError, match="has 2 links"):
        atomic.open_regular_file(path, os.O_WRONLY | os.O_APPEND, "metrics")
    os.close(atomic.open_regular_file(path, os.O_RDONLY, "metrics"))  # reading it is harmless
    atomic.unshare(path, "metrics")
    fd = atomic.open_regular_file(path, os.O_WRONLY | os.O_APPEND, "metrics")
    atomic.write_all(fd, b"appended\n")
    os.close(fd)
    assert victim.read_bytes() == VICTIM and os.stat(victim).st_nlink == 1
    assert path.read_bytes() == VICTIM + b"appended\n"


def test_outputs_written_together_leave_every_file_as_it_was_when_a_device_fails(tmp_path):
    """A device is written into before any file is renamed; a FIFO nobody reads is refused at
    once."""
    kept = tmp_path / "kept.txt"
    kept.write_bytes(b"old\n")
    with pytest.raises(NmtError, match="/dev/full: cannot write the config"):
        with atomic.replacing_together(
            [(kept, "the checkpoint"), (Path("/dev/full"), "the config")]
        ) as tmps:
            for tmp in tmps:
                tmp.write_bytes(b"new\n")
    assert kept.read_bytes() == b"old\n" and sorted(os.listdir(tmp_path)) == ["kept.txt"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with no_hang(), pytest.raises(NmtError, match="no process reads"):
        with atomic.replacing_together([(kept, "the checkpoint"), (fifo, "the config")]) as tmps:
            raise AssertionError("refused before anything is written")
    assert kept.read_bytes() == b"old\n"


# ------------------------------------------------------------ names the file system almost refuses


def test_a_long_output_name_is_written_and_one_too_long_is_one_line(
    random_checkpoint, tmp_path, capfd
):
    """A 250-byte name (the file system takes 255) was refused because its temporary's name was
    15 bytes and a pid longer; 256 bytes and more was an OSError traceback."""
    src = tmp_path / "in.txt"
    src.write_text("a b c\n")
    fits = tmp_path / ("x" * 250)
    assert (
        nmt_here(
            "translate",
            "-c",
            str(random_checkpoint),
            "-i",
            str(src),
            "-o",
            str(fits),
            "--beam",
            "1",
        )
        == 0
    )
    assert fits.read_text().count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == sorted(["in.txt", fits.name])
    capfd.readouterr()
    too_long = tmp_path / ("y" * 300)
    code = nmt_here(
        "translate",
        "-c",
        str(random_checkpoint),
        "-i",
        str(src),
        "-o",
        str(too_long),
        "--beam",
        "1",
    )
    assert code == 1
    last_error_line(capfd.readouterr().err, "-o", "File name too long")


def test_a_temporary_of_a_long_name_is_found_by_the_cleaning(tmp_path):
    name = "z" * 250
    tmp = atomic.temporary_name(tmp_path / name)
    assert len(os.fsencode(tmp.name)) < 64
    tmp.write_bytes(b"partial")
    os.rename(
        tmp, tmp.with_name(tmp.name.replace(f"-{os.getpid()}-", "-999999999-"))
    )  # a writer gone
    assert atomic.clean_temporaries(tmp_path, name=name) == 1 and not list(tmp_path.iterdir())


# ------------------------------------------------------------------ a path under a regular file


@pytest.mark.parametrize("command", ["export", "prepare-bpe"])
def test_an_output_folder_under_a_regular_file_is_not_a_directory(
    command, random_checkpoint, raw_corpus, tmp_path, capfd
):
    """They said "no such directory" and "File exists"."""
    (tmp_path / "file").write_bytes(VICTIM)
    out = tmp_path / "file" / "sub" / "out"
    if command == "export":
        args = ["export", "--format", "hf", str(random_checkpoint), str(out)]
    else:
        args = [
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            raw_corpus.prefix("train"),
            "--destdir",
            str(out),
            "--vocab-size",
            "100",
        ]
    assert nmt_here(*args) == 1
    last_error_line(capfd.readouterr().err, f"{tmp_path / 'file'}: not a directory")
    assert (tmp_path / "file").read_bytes() == VICTIM


# ------------------------------------------------------------- nmt import: every output before any


# the model settings a MarianMT folder can hold (nmt.convert.hf.HF_ONLY)
MARIAN_LIKE = {
    "norm_first": False,
    "learned_positions": False,
    "positions": "hf_marian",
    "decoder_start": "bos",
    "norm_eps": 1e-5,
}


@pytest.fixture(scope="module")
def marian_like(prepared, tmp_path_factory) -> Path:
    """A random tiny model that `nmt export --format hf` writes."""
    path = tmp_path_factory.mktemp("marian_like") / "m.pt"
    return save_random_model(
        path, Tokenizer.from_file(prepared[0] / "spm.model"), seed=1, model=MARIAN_LIKE
    )


@pytest.fixture(scope="module")
def hf_folder(marian_like, tmp_path_factory) -> Path:
    """`marian_like` exported as a MarianMT folder, to import."""
    out = tmp_path_factory.mktemp("hf") / "model"
    assert nmt_here("export", "--format", "hf", str(marian_like), str(out)) == 0
    return out


@pytest.mark.parametrize("config", ["/dev/full", "fifo", "/proc/nmt-no-such.yaml"])
def test_import_writes_no_checkpoint_when_its_config_cannot_be_written(
    config, hf_folder, tmp_path, capfd
):
    """`--config /dev/full` (or /proc/x.yaml) wrote the checkpoint, then failed; a FIFO nobody
    reads wrote the checkpoint, then blocked for ever."""
    if config == "fifo":
        config = str(tmp_path / "fifo")
        os.mkfifo(config)
    out = tmp_path / "imported.pt"
    with no_hang():
        code = nmt_here("import", str(hf_folder), "-o", str(out), "--config", config)
    assert code == 1
    last_error_line(capfd.readouterr().err, config)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == (
        ["fifo"] if config.endswith("fifo") else []
    )


def test_import_with_the_checkpoint_onto_dev_full_leaves_the_config_as_it_was(
    hf_folder, tmp_path, capfd
):
    config = tmp_path / "finetune.yaml"
    config.write_bytes(b"old: config\n")
    assert nmt_here("import", str(hf_folder), "-o", "/dev/full", "--config", str(config)) == 1
    last_error_line(capfd.readouterr().err, "/dev/full")
    assert config.read_bytes() == b"old: config\n" and sorted(os.listdir(tmp_path)) == [
        "finetune.yaml"
    ]


# ------------------------------------------------------------------ nmt train: the run directory


def _train_args(prepared: tuple[Path, dict], run: Path, updates: int, **extra: object) -> list[str]:
    return [
        "train",
        str(TINY),
        *set_args(
            {
                "data.dir": prepared[0],
                "train.run_dir": run,
                "train.device": "cpu",
                "train.threads": 1,
                "train.max_updates": updates,
                "train.save_interval_updates": 1,
                "train.valid_bleu": False,
                "train.log_interval": 1,
                **extra,
            }
        ),
    ]


@pytest.fixture(scope="module")
def trained_run(prepared, tmp_path_factory) -> Path:
    """A run directory trained for 2 updates, for tests to copy and resume."""
    run = tmp_path_factory.mktemp("run") / "run"
    here = os.getcwd()
    os.chdir(run.parent)
    threads = torch.get_num_threads()
    try:
        assert nmt_here(*_train_args(prepared, run, 2)) == 0
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
    return run


def test_training_never_writes_through_a_hard_link(prepared, trained_run, tmp_path, capfd):
    """`ln v.txt R/metrics.jsonl; ln vl.txt R/train.log` had training cut v.txt's last line and
    append the metrics; a hard-linked .nmt-last-run had its target overwritten. Each name gets
    a copy of its own (the marker: a warning); the other names keep their content."""
    run = tmp_path / "R"
    shutil.copytree(trained_run, run)
    victims = {}
    for name in ("metrics.jsonl", "train.log"):
        victims[name] = tmp_path / f"v-{name}"
        victims[name].write_bytes(VICTIM + b"an unfinished last line")
        (run / name).unlink()
        os.link(victims[name], run / name)
    marker = tmp_path / "v-marker"
    marker.write_bytes(VICTIM)
    os.link(marker, ".nmt-last-run")
    assert nmt_here(*_train_args(prepared, run, 3)) == 0
    err = capfd.readouterr().err
    assert "not recording the run" in err and "has 2 links" in err
    for name, victim in victims.items():
        assert victim.read_bytes() == VICTIM + b"an unfinished last line", name
        assert os.stat(run / name).st_nlink == 1 and (run / name).read_bytes().startswith(VICTIM)
    assert b'"update": 3' in (run / "metrics.jsonl").read_bytes()
    assert marker.read_bytes() == VICTIM


def test_a_run_copied_with_hard_links_trains_without_changing_the_original(
    prepared, trained_run, tmp_path, capfd
):
    """`cp -al t1 snap; nmt train snap/config.yaml` changed t1's metrics.jsonl (records of updates
    it never trained) and train.log."""
    original = tmp_path / "t1"
    shutil.copytree(trained_run, original)
    before = snapshot(original)
    snap = tmp_path / "snap"
    subprocess.run(["cp", "-al", str(original), str(snap)], check=True)
    (snap / "train.lock").unlink()  # the lock is refused while it has another name (next test)
    assert nmt_here("train", str(snap / "config.yaml"), "--set", "train.max_updates=3") == 0
    assert snapshot(original) == before
    assert b'"update": 3' in (snap / "metrics.jsonl").read_bytes()


NAMES = [
    "metrics.jsonl",
    "train.log",
    "train.lock",
    "config.yaml",
    "spm.model",
    "checkpoint_last.pt",
    "checkpoint_best.pt",
    "tensorboard",
    ".nmt-last-run",
]


def _train_case(name: str, kind: str) -> Any:
    """Whether `nmt train` refuses (True), or goes on (False; .nmt-last-run: with a warning)."""
    if name == ".nmt-last-run":
        return False
    if kind == "hardlink":
        return name == "train.lock"  # its pid would be written into the other name
    return True


def _train_params() -> list[Any]:
    quick = {
        ("metrics.jsonl", "symlink"),
        ("train.lock", "hardlink"),
        ("config.yaml", "fifo"),
        ("tensorboard", "symlink"),
        ("checkpoint_best.pt", "devfull"),
    }
    return [
        pytest.param(name, kind, marks=() if (name, kind) in quick else pytest.mark.slow)
        for name in NAMES
        for kind in KINDS
        if not (name == "tensorboard" and kind == "hardlink")
    ]


@pytest.mark.parametrize(("name", "kind"), _train_params())
def test_train_with_a_link_or_a_special_file_at_each_path_it_writes(
    name, kind, prepared, trained_run, tmp_path, capfd
):
    """A symlink, a FIFO or a link to /dev/full in the run directory is one line before anything
    is written; a hard link is never written through; the file a link names keeps its content.
    (`RUN/tensorboard` linked elsewhere received the event files.)"""
    pytest.importorskip("tensorboard")
    run = tmp_path / "R"
    shutil.copytree(trained_run, run)
    path = Path(name) if name == ".nmt-last-run" else run / name
    victim = victim_for(path, tmp_path)
    before = snapshot(victim)
    plant(path, kind, victim)
    run_files = {
        p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.is_symlink()
    }
    with no_hang():
        code = nmt_here(*_train_args(prepared, run, 3, **{"train.tensorboard": True}))
    refused = _train_case(name, kind)
    outcome(code, capfd.readouterr().err, path, kind, refused)
    assert snapshot(victim) == before
    if refused:  # nothing trained, nothing replaced (the lock holds the last holder's pid)
        run_files.pop("train.lock", None)
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.name in run_files} == run_files
    if kind != "hardlink":
        assert path.is_symlink() or stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_symlinked_tensorboard_folder_is_refused(prepared, trained_run, tmp_path, capfd):
    pytest.importorskip("tensorboard")
    run = tmp_path / "R"
    shutil.copytree(trained_run, run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    assert nmt_here(*_train_args(prepared, run, 3, **{"train.tensorboard": True})) == 1
    last_error_line(capfd.readouterr().err, str(run / "tensorboard"), "symbolic link")
    assert not list(elsewhere.iterdir())


# ------------------------------------------------------------------ nmt distill: --out


LINES, SHARD = 60, 30


@pytest.fixture(scope="module")
def distill_corpus(raw_corpus, tmp_path_factory) -> Path:
    return first_train_pairs(raw_corpus, tmp_path_factory.mktemp("distill_corpus"), LINES)


def distill_args(teacher: Path, corpus: Path, raw_corpus: Any, out: Path, *extra: str) -> list[str]:
    return distill_command(teacher, corpus, raw_corpus, out, *extra, shard=SHARD)


def _references(
    monkeypatch: pytest.MonkeyPatch, corpus: Path, *, stop_at: int | None = None
) -> list[int]:
    """The teacher's translations are the references (no decoding); with `stop_at`, that call
    raises KeyboardInterrupt (a kill while a shard is translated). Returns the calls' first
    lines."""
    refs = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    calls: list[int] = []

    def translate_nbest(
        self: Translator, texts: list[str], nbest: int = 1, **kw: Any
    ) -> list[list[Translation]]:
        first = kw.get("first_index", 0)
        calls.append(first)
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        return [[Translation(refs[first + i], 0.0, 0.0)] for i in range(len(texts))]

    monkeypatch.setattr(Translator, "translate_nbest", translate_nbest)
    return calls


STUDENT = [
    "--config",
    str(TINY),
    "--set",
    "train.max_updates=1",
    "--set",
    "train.device=cpu",
    "--set",
    "train.threads=1",
]


@pytest.fixture(scope="module")
def distilled(random_checkpoint, distill_corpus, raw_corpus, tmp_path_factory) -> Path:
    """A finished distillation (the references as the teacher's output), its student trained."""
    out = tmp_path_factory.mktemp("distilled") / "d"
    here = os.getcwd()
    os.chdir(out.parent)
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        _references(mp, distill_corpus)
        try:
            assert (
                nmt_here(
                    *distill_args(random_checkpoint, distill_corpus, raw_corpus, out, *STUDENT)
                )
                == 0
            )
        finally:
            os.chdir(here)
            torch.set_num_threads(threads)
    return out


def test_a_distillation_killed_while_translating_a_shard_again_resumes(
    random_checkpoint, distill_corpus, raw_corpus, distilled, tmp_path, monkeypatch, capfd
):
    """A shard deleted to translate it again, and the run killed meanwhile, left a manifest that
    every later run refused ("holds a student of other distilled pairs"), though nothing changed."""
    out = tmp_path / "d"
    shutil.copytree(distilled, out)
    args = distill_args(random_checkpoint, distill_corpus, raw_corpus, out, *STUDENT)
    (out / "shards" / "00001.de").unlink()
    _references(monkeypatch, distill_corpus, stop_at=1)
    assert nmt_here(*args) == 130
    calls = _references(monkeypatch, distill_corpus)
    assert nmt_here(*args) == 0, capfd.readouterr().err[-2000:]
    assert calls == [SHARD] and (out / "shards" / "00001.de").is_file()


def test_a_student_on_a_device_it_cannot_use_is_refused_before_any_shard(
    random_checkpoint, distill_corpus, raw_corpus, tmp_path, monkeypatch, capfd
):
    """`--set train.device=cuda` on a machine without one was refused once every shard was
    written."""
    calls = _references(monkeypatch, distill_corpus)
    out = tmp_path / "d"
    device = "cuda:9999" if torch.cuda.is_available() else "cuda"
    args = distill_args(
        random_checkpoint,
        distill_corpus,
        raw_corpus,
        out,
        "--config",
        str(TINY),
        "--set",
        f"train.device={device}",
    )
    assert nmt_here(*args) == 1
    last_error_line(capfd.readouterr().err, "train.device", device)
    assert calls == [] and not out.exists()


DISTILL_FILES = [
    "distill.lock",
    "manifest.json",
    "distill.json",
    "shards/00001.de",
    "distilled/train.de",
    "shards",
    "data-bin",
    "run",
]


def _distill_params() -> list[Any]:
    quick = {
        ("manifest.json", "symlink"),
        ("distill.json", "symlink"),
        ("shards/00001.de", "symlink"),
        ("shards/00001.de", "fifo"),
        ("distill.lock", "hardlink"),
        ("distilled/train.de", "symlink"),
    }
    return [
        pytest.param(name, kind, marks=() if (name, kind) in quick else pytest.mark.slow)
        for name in DISTILL_FILES
        for kind in KINDS
        if not (kind == "hardlink" and name in ("shards", "data-bin", "run"))
    ]


@pytest.mark.parametrize(("name", "kind"), _distill_params())
def test_distill_with_a_link_or_a_special_file_at_each_path_it_writes(
    name,
    kind,
    random_checkpoint,
    distill_corpus,
    raw_corpus,
    distilled,
    tmp_path,
    monkeypatch,
    capfd,
):
    """A symlinked distill.json, manifest.json or shard was replaced by the report or the
    distilled lines; a FIFO shard blocked for ever. Each is one line before anything is written
    (the link's target unchanged); a hard link is refused (the lock) or replaced by rename."""
    out = tmp_path / "d"
    shutil.copytree(distilled, out)
    path = out / name
    victim = victim_for(path, tmp_path)
    before = snapshot(victim)
    plant(path, kind, victim)
    if name == "shards/00001.de" and kind == "symlink":  # a dangling link where a shard was deleted
        victim.unlink()
        before = {}
    _references(monkeypatch, distill_corpus)
    args = distill_args(random_checkpoint, distill_corpus, raw_corpus, out, *STUDENT)
    with no_hang():
        code = nmt_here(*args)
    refused = (
        kind != "hardlink" or name == "distill.lock"
    )  # the lock: its pid would reach the other name
    outcome(code, capfd.readouterr().err, path, kind, refused)
    assert (snapshot(victim) if victim.exists() else {}) == before


# ------------------------------------------------------------------ outputs the user names


def _user_outputs(
    random_checkpoint: Path,
    marian_like: Path,
    prepared: tuple[Path, dict],
    raw_corpus: Any,
    hf_folder: Path,
    tmp: Path,
) -> dict[str, tuple[list[str], Path, bool]]:
    """Per command: its arguments with OUT where the output goes, the output, whether it is a
    folder."""
    src = tmp / "in.txt"
    src.write_text("a b c\nd e\n")
    return {
        "translate": (
            ["translate", "-c", str(random_checkpoint), "-i", str(src), "--beam", "1", "-o", "OUT"],
            tmp / "out.txt",
            False,
        ),
        "average-checkpoints": (
            ["average-checkpoints", str(random_checkpoint), "-o", "OUT"],
            tmp / "avg.pt",
            False,
        ),
        "import": (["import", str(hf_folder), "-o", "OUT"], tmp / "imported.pt", False),
        "import --config": (
            ["import", str(hf_folder), "-o", str(tmp / "ck.pt"), "--config", "OUT"],
            tmp / "finetune.yaml",
            False,
        ),
        "shortlist": (
            [
                "shortlist",
                str(prepared[0]),
                "--iterations",
                "1",
                "--max-sentences",
                "50",
                "-o",
                "OUT",
            ],
            tmp / "shortlist.pt",
            False,
        ),
        "export": (["export", "--format", "hf", str(marian_like), "OUT"], tmp / "exported", True),
        "prepare-bpe": (
            [
                "prepare-bpe",
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                raw_corpus.prefix("train"),
                "--destdir",
                "OUT",
                "--vocab-size",
                "500",
            ],
            tmp / "data",
            True,
        ),
    }


FILE_OUTPUTS = ["translate", "average-checkpoints", "import", "import --config", "shortlist"]
FOLDER_OUTPUTS = ["export", "prepare-bpe"]  # a folder has no hard link, and /dev/full is no folder


def _user_params() -> list[Any]:
    """Each command with each kind; a hard link or a symlink only for translate unless slow."""
    cases = [(command, kind) for command in FILE_OUTPUTS for kind in KINDS]
    cases += [(command, kind) for command in FOLDER_OUTPUTS for kind in ("symlink", "fifo")]
    return [
        pytest.param(
            command,
            kind,
            marks=pytest.mark.slow
            if kind in ("hardlink", "symlink") and command != "translate"
            else (),
        )
        for command, kind in cases
    ]


@pytest.mark.parametrize(("command", "kind"), _user_params())
def test_an_output_the_user_names_keeps_its_documented_rule(
    command, kind, random_checkpoint, marian_like, prepared, raw_corpus, hf_folder, tmp_path, capfd
):
    """A hard link is replaced (its other name keeps its content); a symlink is written through
    (the link stays); a FIFO nobody reads and /dev/full are one line, without waiting, and the
    command's other output is not written."""
    outputs = _user_outputs(
        random_checkpoint, marian_like, prepared, raw_corpus, hf_folder, tmp_path
    )
    args, out, folder = outputs[command]
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    if folder:
        victim.mkdir()
    else:
        victim.write_bytes(VICTIM)
    if kind == "devfull":
        out = Path("/dev/full")
    else:
        plant(out, kind, victim)
    with no_hang():
        code = nmt_here(*[str(out) if a == "OUT" else a for a in args])
    err = capfd.readouterr().err
    if kind in ("fifo", "devfull"):
        assert code == 1, err[-2000:]
        last_error_line(err, str(out))
        assert not (tmp_path / "ck.pt").exists()  # import's checkpoint: not without its config
        return
    assert code == 0, err[-2000:]
    if kind == "hardlink":
        assert (
            victim.read_bytes() == VICTIM
            and os.stat(out).st_nlink == 1
            and out.read_bytes() != VICTIM
        )
    else:  # written through, the link kept (docs/reliability.md)
        assert out.is_symlink() and (
            any(victim.iterdir()) if folder else victim.read_bytes() != VICTIM
        )


def test_a_command_in_a_subprocess_never_waits_on_a_fifo(random_checkpoint, tmp_path):
    """The same through the real process: a FIFO output nobody reads ends in one line."""
    fifo = tmp_path / "out.txt"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt",
            "translate",
            "-c",
            str(random_checkpoint),
            "-i",
            os.devnull,
            "-o",
            str(fifo),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1
    last_error_line(r.stderr, str(fifo), "no process reads")
