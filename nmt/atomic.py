"""Files that are either old or whole: temporaries named after their writer, fsync, rename.

Every file `nmt` writes in place of another (checkpoints, a run directory's config.yaml and
spm.model, `translate -o`, a prepared data directory) is first written to a hidden sibling
named `.{name}.tmp-{pid}-{random hex}`, then renamed over the target. A kill leaves the old
file or the new one, never half of one; the temporary it may leave names its writer, so the
next run can remove it once that process is gone (`clean_temporaries`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

from nmt.errors import NmtError

log = logging.getLogger(__name__)

TEMPORARY = re.compile(r"\..+\.tmp-(\d+)-[0-9a-f]+")


def temporary_name(path: str | Path) -> Path:
    """A hidden sibling of `path` for this process to fill: `.{name}.tmp-{pid}-{hex}`."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def os_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc`: torch.save reports a failed write (ENOSPC) as a RuntimeError
    whose context is the OSError raised by the file object."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory (Windows): nothing to sync
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: Path, what: str = "checkpoint") -> Iterator[Path]:
    """Yield a temporary for the caller to fill, then rename it over `path` and fsync the
    directory. On failure the temporary goes away and `path` keeps its previous content;
    an OSError (disk full, directory gone) becomes an NmtError naming `path`."""
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        error = os_error(exc)
        if isinstance(exc, Exception) and error is not None:
            reason = error.strerror or str(error)
            raise NmtError(f"{path}: cannot write {what} ({reason})") from exc
        raise


def atomic_write_bytes(data: bytes, path: str | Path, what: str = "file") -> None:
    """Write `data` to `path` so that a kill leaves the old file or the new one (fsync, rename,
    fsync the directory), and a temporary that `clean_temporaries` recognises."""
    with replacing(Path(path), what) as tmp, open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def clean_temporaries(directory: str | Path) -> int:
    """Remove temporaries left by killed writers in `directory`; return how many.

    A temporary whose writer process is still alive on this machine is left alone.
    """
    removed = 0
    for entry in Path(directory).iterdir() if Path(directory).is_dir() else []:
        match = TEMPORARY.fullmatch(entry.name)
        if match is None or not entry.is_file() or process_alive(int(match.group(1))):
            continue
        entry.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info("removed %d leftover temporary file(s) from %s", removed, directory)
    return removed


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:  # alive, owned by someone else
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True
