"""The run directory that `nmt train` produces, and every write into it.

It holds `config.yaml` (resolved), `spm.model`, `train.log`, `metrics.jsonl` and the
checkpoints (`checkpoint_last.pt`, `checkpoint_best.pt`, `checkpoint_<update>.pt`). Only
rank 0 opens it. Every write error on it is an NmtError naming the file.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

from nmt import checkpoint as ckpt
from nmt.atomic import atomic_write_bytes, clean_temporaries
from nmt.config import Config, dump_config
from nmt.errors import NmtError

log = logging.getLogger(__name__)


class RunDir:
    """`open()` it (rank 0), `emit()` metrics records, `save_checkpoint()`, then `close()`."""

    def __init__(self, path: Path):
        self.path = path
        self.metrics_file: Any = None
        self._log_handler: logging.Handler | None = None

    def open(self, spm_model: bytes) -> None:
        """Create the run directory, clean up after a killed run, open train.log and metrics.jsonl,
        write spm.model (the tokenizer's bytes) if it is missing and record the run in .nmt-last-run."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            clean_temporaries(self.path)
        except OSError as e:
            raise NmtError(f"{self.path}: cannot write the run directory ({e.strerror or e})") from None
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
        spm = self.path / "spm.model"
        if not spm.exists():
            atomic_write_bytes(spm_model, spm, "the sentencepiece model")
        try:  # `nmt translate` with no --checkpoint uses the last run started from this directory
            Path(ckpt.LAST_RUN_FILE).write_text(str(self.path.resolve()) + "\n", encoding="utf-8")
        except OSError as e:  # a convenience only: a read-only working directory is no reason to stop
            log.warning("cannot record the run in %s (%s)", Path(ckpt.LAST_RUN_FILE).resolve(), e.strerror or e)

    def close(self) -> None:
        """Close metrics.jsonl and detach train.log (train() may run again in this process).

        Write errors are ignored here: the one that stopped training has been reported."""
        if self.metrics_file is not None:
            with suppress(OSError):
                self.metrics_file.close()
            self.metrics_file = None
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            with suppress(OSError):
                self._log_handler.close()
            self._log_handler = None

    def emit(self, record: dict[str, Any]) -> None:
        """Append one JSON line to metrics.jsonl (nothing where it is not open: ranks > 0)."""
        if self.metrics_file is not None:
            try:
                self.metrics_file.write(json.dumps(record) + "\n")
                self.metrics_file.flush()
            except OSError as e:
                raise NmtError(f"{self.metrics_file.name}: cannot write metrics ({e.strerror or e})") from None

    def write_config(self, cfg: Config) -> None:
        atomic_write_bytes(dump_config(cfg).encode("utf-8"), self.path / "config.yaml", "the config")

    def save_checkpoint(self, state: dict[str, Any], update: int, *, numbered: bool, best: bool,
                        keep_last: int) -> None:
        """Write checkpoint_<update>.pt (if numbered), checkpoint_best.pt and checkpoint_last.pt
        (one file, the others links to it), then prune numbered ones beyond `keep_last`."""
        names = ([f"checkpoint_{update}.pt"] if numbered else []) + (
            ["checkpoint_best.pt"] if best else []) + ["checkpoint_last.pt"]
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
        log.info("saved %s", ", ".join(names))


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
