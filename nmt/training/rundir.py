"""The run directory that `nmt train` produces, and every write into it.

It holds `config.yaml` (resolved), `spm.model`, `train.log`, `metrics.jsonl` and the
checkpoints (`checkpoint_last.pt`, `checkpoint_best.pt`, `checkpoint_<update>.pt`). Only
rank 0 opens it, and holds its lock (`train.lock`) while it is open: a second `nmt train`
on the same directory stops with one line naming the directory and the holder's pid. The
lock and `.nmt-last-run` are written only as regular files, never through a symbolic link
(`open_regular_file`). Every write error on it is an NmtError naming the file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

from nmt import checkpoint as ckpt
from nmt.atomic import atomic_write_bytes, clean_temporaries, open_regular_file, write_all
from nmt.config import Config, dump_config
from nmt.errors import NmtError

log = logging.getLogger(__name__)
LOCK_FILE = "train.lock"
CONFIG_FILE = "config.yaml"
# a config.yaml next to one of these is the config of a run directory (`run_dir_of_config`)
RUN_DIR_FILES = (LOCK_FILE, "checkpoint_last.pt")


def run_dir_of_config(config: Path, cfg: Config, run_dir_given: bool) -> Config:
    """`cfg` (read from `config`) with the run directory to train.

    `train.run_dir` is relative to the working directory, as fairseq's --save-dir is, except in
    the config.yaml of a run directory: `nmt train RUN/config.yaml` trains RUN, wherever the run
    was copied or moved to (issue 25: a copy trained the original, whose path the saved
    train.run_dir held), unless `run_dir_given` (--run-dir or --set train.run_dir) names another."""
    own = config.parent
    if run_dir_given or config.name != CONFIG_FILE or not any((own / n).exists() for n in RUN_DIR_FILES):
        return cfg
    if Path(cfg.train.run_dir).resolve() != own.resolve():
        log.info("%s is the config of the run directory %s: training there, not in its train.run_dir %s "
                 "(--run-dir chooses another)", config, own, cfg.train.run_dir)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, run_dir=str(own)))


class RunDirLock:
    """An advisory lock (flock) on RUN/train.lock, which holds the holder's pid for the message
    of the next comer. The kernel drops a flock when the process ends, however it ends
    (`kill -9` included): no stale lock to clean up. The file itself stays."""

    def __init__(self, fd: int):
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


def lock_run_dir(path: Path) -> RunDirLock:
    """Lock the run directory `path` (which must exist) for this process, or raise an NmtError
    naming it and the pid of the process that holds it."""
    fd = open_regular_file(path / LOCK_FILE, os.O_RDWR, "the run directory's lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise NmtError(f"{path}: another nmt train (pid {holder}) is using this run directory; "
                       "wait for it to finish, stop it, or choose another train.run_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunDirLock(fd)


class RunDir:
    """`open()` it (rank 0), `emit()` metrics records, `save_checkpoint()`, then `close()`."""

    def __init__(self, path: Path, tensorboard: bool = False):
        self.path, self.tensorboard = path, tensorboard
        self.metrics_file: Any = None
        self._board: Any = None  # a torch.utils.tensorboard SummaryWriter with train.tensorboard
        self._log_handler: logging.Handler | None = None
        self._lock: RunDirLock | None = None

    def open(self, spm_model: bytes) -> None:
        """Create the run directory, clean up after a killed run, open train.log and metrics.jsonl,
        write spm.model (the tokenizer's bytes) if it is missing and record the run in .nmt-last-run."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NmtError(f"{self.path}: cannot write the run directory ({e.strerror or e})") from None
        self._lock = lock_run_dir(self.path)  # before anything in it is touched
        clean_temporaries(self.path)
        log_path, metrics_path = self.path / "train.log", self.path / "metrics.jsonl"
        try:
            handler = _RunLogHandler(log_path)
            handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
            logging.getLogger().addHandler(handler)
            self._log_handler = handler
        except OSError as e:
            raise NmtError(f"{log_path}: cannot write the training log ({e.strerror or e})") from None
        try:
            _drop_partial_last_line(metrics_path)
            self.metrics_file = open(metrics_path, "a", encoding="utf-8")
        except OSError as e:
            raise NmtError(f"{metrics_path}: cannot write metrics ({e.strerror or e})") from None
        if self.tensorboard:
            self._board = _summary_writer(self.path / "tensorboard")
        spm = self.path / "spm.model"
        if not spm.exists():
            atomic_write_bytes(spm_model, spm, "the sentencepiece model")
        _record_last_run(self.path)

    def close(self) -> None:
        """Close metrics.jsonl, detach train.log (train() may run again in this process) and
        release the lock. Write errors are ignored here: the one that stopped training has been
        reported."""
        if self.metrics_file is not None:
            with suppress(OSError):
                self.metrics_file.close()
            self.metrics_file = None
        if self._board is not None:
            with suppress(OSError):
                self._board.close()
            self._board = None
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            with suppress(OSError):
                self._log_handler.close()
            self._log_handler = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def emit(self, record: dict[str, Any]) -> None:
        """Append one JSON line to metrics.jsonl (nothing where it is not open: ranks > 0)."""
        if self.metrics_file is not None:
            try:
                self.metrics_file.write(json.dumps(record) + "\n")
                self.metrics_file.flush()
            except OSError as e:
                raise NmtError(f"{self.metrics_file.name}: cannot write metrics ({e.strerror or e})") from None
        if self._board is not None:  # the same numbers as scalars "train/loss", "valid/valid_bleu", ...
            kind, step = record.get("type", "train"), record.get("update", 0)
            for key, value in record.items():
                if key not in ("type", "update") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._board.add_scalar(f"{kind}/{key}", value, step)
            self._board.flush()

    def write_config(self, cfg: Config) -> None:
        atomic_write_bytes(dump_config(cfg).encode("utf-8"), self.path / CONFIG_FILE, "the config")

    def save_checkpoint(self, state: dict[str, Any], update: int, *, numbered: bool, best: bool,
                        keep_last: int) -> None:
        """Write checkpoint_<update>.pt (if numbered) and checkpoint_last.pt (one file: last is a
        hard link to the numbered one), checkpoint_best.pt (a file of its own), then prune
        numbered ones beyond `keep_last`.

        Why best is written apart: it is the one checkpoint nothing replaces later, so damage to
        the shared file (a truncation in place, a bad block) must not reach it. last and the
        newest numbered checkpoint stay one file: a second copy would double the write of
        every save, and resuming already falls back from a damaged last to the previous
        numbered checkpoint (docs/reliability.md)."""
        names = ([f"checkpoint_{update}.pt"] if numbered else []) + ["checkpoint_last.pt"]
        if best:
            ckpt.atomic_save(state, self.path / "checkpoint_best.pt")
        first = self.path / names[0]
        ckpt.atomic_save(state, first)
        for name in names[1:]:
            ckpt.link_or_copy(first, self.path / name)
        if numbered and keep_last:
            try:
                ckpt.prune_checkpoints(self.path, keep_last)
            except OSError as e:
                raise NmtError(f"{e.filename or self.path}: cannot delete an old checkpoint "
                               f"({e.strerror or e})") from None
        log.info("saved %s", ", ".join(names + (["checkpoint_best.pt"] if best else [])))


def _record_last_run(run_dir: Path) -> None:
    """Write the run directory's path to .nmt-last-run in the working directory: `nmt translate`
    with no --checkpoint uses the last run started here. A convenience only, so a read-only
    working directory, a symbolic link or a FIFO there is a warning, not a reason to stop."""
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
    """A TensorBoard writer to `path` (train.tensorboard), or a one-line error saying what to install."""
    if path.exists() and not path.is_dir():
        raise NmtError(f"{path}: not a directory, where train.tensorboard writes its logs; "
                       "move it away or set train.tensorboard: false")
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise NmtError("train.tensorboard: true needs the tensorboard package: pip install tensorboard "
                       "(or pip install 'nmt[tensorboard]')") from None
    try:
        return SummaryWriter(log_dir=str(path))
    except OSError as e:
        raise NmtError(f"{path}: cannot write TensorBoard logs ({e.strerror or e})") from None


class _RunLogHandler(logging.FileHandler):
    """train.log. A failed write (disk full) stops training with an NmtError naming the file,
    where logging would print a traceback and carry on."""

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            raise NmtError(f"{self.baseFilename}: cannot write the training log ({error.strerror or error})") from None
        super().handleError(record)


def _drop_partial_last_line(path: Path) -> None:
    """A run killed while writing metrics.jsonl may leave half a line; appending after it would
    glue the next record to it. Cut it off (a record is a few hundred bytes)."""
    if not path.is_file():  # new, or not a regular file (a pipe, /dev/full)
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - (1 << 16))
        f.seek(start)
        tail = f.read()
        if tail and not tail.endswith(b"\n"):
            cut = start + tail.rfind(b"\n") + 1
            f.truncate(cut)
            log.warning("%s: removed an incomplete last line (%d bytes) left by an interrupted run", path, size - cut)
