"""The run directory that `nmt train` produces, and every write into it.

It holds `config.yaml` (resolved), `spm.model`, `train.log`, `metrics.jsonl` and the
checkpoints (`checkpoint_last.pt`, `checkpoint_best.pt`, `checkpoint_<update>.pt`). Only
rank 0 opens it, and holds its lock (`train.lock`) while it is open: a second `nmt train`
on the same directory stops with one line naming the directory and the holder's pid. The
lock, `train.log`, `metrics.jsonl` and `.nmt-last-run` are opened only as regular files with
one link, never through a symbolic link (`open_regular_file`; `train.log` and `metrics.jsonl`
with other hard links, as after `cp -al`, get a copy of their own first), and a file replaced
whole (a checkpoint, `config.yaml`, `spm.model`) or the `tensorboard` folder is refused when a
link or a special file stands in its place (`own_file`), all before anything is written: a link
planted in a shared runs/ folder would otherwise have training cut or overwrite whatever file it
names. Every write error on it is an NmtError naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from nmt import checkpoint as ckpt
from nmt.atomic import (
    DirectoryLock,
    atomic_write_bytes,
    clean_temporaries,
    lock_directory,
    open_regular_file,
    os_errors_as,
    own_file,
    unshare,
    write_all,
)
from nmt.config import Config, dump_config
from nmt.errors import NmtError

log = logging.getLogger(__name__)
LOCK_FILE = "train.lock"
CONFIG_FILE = "config.yaml"
# a config.yaml next to one of these is the config of a run directory (`run_dir_of_config`)
RUN_DIR_FILES = (LOCK_FILE, "checkpoint_last.pt")
# the files of a run directory replaced whole, by their names, and those appended to
REPLACED = {
    CONFIG_FILE: "the config",
    "spm.model": "the sentencepiece model",
    "checkpoint_last.pt": "a checkpoint",
    "checkpoint_best.pt": "a checkpoint",
}
APPENDED = {"train.log": "the training log", "metrics.jsonl": "metrics"}


def run_dir_of_config(config: Path, cfg: Config, run_dir_given: bool) -> Config:
    """`cfg` (read from `config`) with the run directory to train.

    `train.run_dir` is relative to the working directory, as fairseq's --save-dir is, except in
    the config.yaml of a run directory: `nmt train RUN/config.yaml` trains RUN, wherever the run
    was copied or moved to (issue 25: a copy trained the original, whose path the saved
    train.run_dir held), unless `run_dir_given` (--run-dir or --set train.run_dir) names another."""
    own = config.parent
    if (
        run_dir_given
        or config.name != CONFIG_FILE
        or not any((own / n).exists() for n in RUN_DIR_FILES)
    ):
        return cfg
    if Path(cfg.train.run_dir).resolve() != own.resolve():
        log.info(
            "%s is the config of the run directory %s: training there, not in its train.run_dir %s "
            "(--run-dir chooses another)",
            config,
            own,
            cfg.train.run_dir,
        )
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, run_dir=str(own)))


def lock_run_dir(path: Path) -> DirectoryLock:
    """Lock the run directory `path` (which must exist) for this process, or raise an NmtError
    naming it and the pid of the process that holds it."""
    return lock_directory(
        path,
        LOCK_FILE,
        "the run directory's lock",
        "another nmt train (pid {pid}) is using this run directory; wait for it to finish, "
        "stop it, or choose another train.run_dir",
    )


class RunDir:
    """`open()` it (rank 0), `emit()` metrics records, `save_checkpoint()`, then `close()`."""

    def __init__(self, path: Path, tensorboard: bool = False):
        self.path = path
        self.tensorboard = tensorboard
        self.metrics_fd: int | None = None
        self._board: Any = None  # a torch.utils.tensorboard SummaryWriter with train.tensorboard
        self._opened = ExitStack()  # what close() undoes (the last opened first, the lock last)

    def open(self, spm_model: bytes) -> None:
        """Create the run directory, clean up after a killed run, open train.log and metrics.jsonl,
        write spm.model (the tokenizer's bytes) if it is missing and record the run in
        .nmt-last-run."""
        with os_errors_as(self.path, "cannot write the run directory"):
            self.path.mkdir(parents=True, exist_ok=True)
        self._opened.callback(lock_run_dir(self.path).release)  # before anything in it is touched
        for name, what in {**REPLACED, **APPENDED}.items():
            own_file(self.path / name, what)
        if self.tensorboard:  # a symlink would send the event files elsewhere
            own_file(self.path / "tensorboard", "the folder of train.tensorboard", directory=True)
        clean_temporaries(self.path)
        for name, what in APPENDED.items():
            unshare(self.path / name, what)
        metrics_path = self.path / "metrics.jsonl"
        handler = _RunLogHandler(self.path / "train.log")
        handler.setFormatter(
            logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s")
        )
        logging.getLogger().addHandler(handler)
        self._opened.callback(_quietly, handler.close)
        self._opened.callback(logging.getLogger().removeHandler, handler)  # detached, then closed
        self.metrics_fd = open_regular_file(metrics_path, os.O_RDWR | os.O_APPEND, "metrics")
        self._opened.callback(_quietly, os.close, self.metrics_fd)
        with os_errors_as(metrics_path, "cannot write metrics"):
            _drop_partial_last_line(self.metrics_fd, metrics_path)
        if self.tensorboard:
            self._board = _summary_writer(self.path / "tensorboard")
            self._opened.callback(_quietly, self._board.close)
        spm = self.path / "spm.model"
        if not spm.exists():
            atomic_write_bytes(spm_model, spm, "the sentencepiece model", own=True)
        _record_last_run(self.path)

    def close(self) -> None:
        """Close metrics.jsonl, detach train.log (train() may run again in this process) and
        release the lock. Write errors are ignored here: the one that stopped training has been
        reported."""
        self.metrics_fd = self._board = None  # emit() writes nothing from now on
        self._opened.close()

    def emit(self, record: dict[str, Any]) -> None:
        """Append one JSON line to metrics.jsonl (nothing where it is not open: ranks > 0)."""
        if self.metrics_fd is not None:
            with os_errors_as(self.path / "metrics.jsonl", "cannot write metrics"):
                write_all(self.metrics_fd, (json.dumps(record) + "\n").encode("utf-8"))
        # the same numbers as scalars "train/loss", "valid/valid_bleu", ... (every record has a
        # type and an update)
        if self._board is not None:
            for key, value in record.items():
                if (
                    key not in ("type", "update")
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                ):
                    self._board.add_scalar(f"{record['type']}/{key}", value, record["update"])
            self._board.flush()

    def write_config(self, cfg: Config) -> None:
        atomic_write_bytes(
            dump_config(cfg).encode("utf-8"), self.path / CONFIG_FILE, "the config", own=True
        )

    def save_checkpoint(
        self, state: dict[str, Any], update: int, *, best: bool, keep_last: int
    ) -> None:
        """Write checkpoint_<update>.pt and checkpoint_last.pt (one file: last is a hard link to
        the numbered one), checkpoint_best.pt (a file of its own), then prune numbered ones
        beyond `keep_last`.

        Why best is written apart: it is the one checkpoint nothing replaces later, so damage to
        the shared file (a truncation in place, a bad block) must not reach it. last and the
        newest numbered checkpoint stay one file: a second copy would double the write of
        every save, and resuming already falls back from a damaged last to the previous
        numbered checkpoint (docs/reliability.md)."""
        names = [f"checkpoint_{update}.pt", "checkpoint_last.pt"]
        written = names + (["checkpoint_best.pt"] if best else [])
        for name in written:
            own_file(self.path / name, "a checkpoint")
        if best:
            ckpt.atomic_save(state, self.path / "checkpoint_best.pt", own=True)
        first = self.path / names[0]
        ckpt.atomic_save(state, first, own=True)
        ckpt.link_or_copy(first, self.path / names[1])
        try:
            ckpt.prune_checkpoints(self.path, keep_last)
        except OSError as e:
            raise NmtError(
                f"{e.filename or self.path}: cannot delete an old checkpoint ({e.strerror or e})"
            ) from None
        log.info("saved %s", ", ".join(written))


def _record_last_run(run_dir: Path) -> None:
    """Write the run directory's path to .nmt-last-run in the working directory: `nmt translate`
    with no --checkpoint uses the last run started here. A convenience only, so a read-only
    working directory, a symbolic link, a hard link or a FIFO there is a warning, not a reason to
    stop."""
    marker = Path(ckpt.LAST_RUN_FILE)
    try:
        fd = open_regular_file(marker, os.O_WRONLY, "the last-run marker")
    except NmtError as e:
        log.warning("not recording the run: %s", e)
        return
    try:
        os.ftruncate(fd, 0)
        write_all(fd, (str(run_dir.resolve()) + "\n").encode("utf-8"))
    except OSError as e:
        log.warning("cannot record the run in %s (%s)", marker.resolve(), e.strerror or e)
    finally:
        os.close(fd)


def _summary_writer(path: Path) -> Any:
    """A TensorBoard writer to `path` (train.tensorboard), or a one-line error saying what to
    install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise NmtError(
            "train.tensorboard: true needs the tensorboard package: pip install tensorboard (or "
            "pip install 'nmt[tensorboard]')"
        ) from None
    with os_errors_as(path, "cannot write TensorBoard logs"):
        return SummaryWriter(log_dir=str(path))


def _quietly(close: Any, *args: Any) -> None:
    """`close(*args)`, a write error ignored (`RunDir.close`)."""
    with suppress(OSError):
        close(*args)


class _RunLogHandler(logging.Handler):
    """train.log, appended to as a regular file (no link followed), a line a write. A failed
    write (disk full) stops training with an NmtError naming the file, where logging would
    print a traceback and carry on."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.fd: int | None = open_regular_file(path, os.O_WRONLY | os.O_APPEND, "the training log")

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd is None:
            return
        line = (self.format(record) + "\n").encode("utf-8", "replace")
        with os_errors_as(self.path, "cannot write the training log"):
            write_all(self.fd, line)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        super().close()


def _drop_partial_last_line(fd: int, path: Path) -> None:
    """A run killed while writing metrics.jsonl may leave half a line; appending after it would
    glue the next record to it. Cut it off (a record is a few hundred bytes)."""
    size = os.fstat(fd).st_size
    start = max(0, size - (1 << 16))
    tail = os.pread(fd, size - start, start)
    if tail and not tail.endswith(b"\n"):
        cut = start + tail.rfind(b"\n") + 1
        os.ftruncate(fd, cut)
        log.warning(
            "%s: removed an incomplete last line (%d bytes) left by an interrupted run",
            path,
            size - cut,
        )
