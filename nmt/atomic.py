"""Files that are either old or whole: temporaries named after their writer, fsync, rename.

Every file `nmt` writes in place of another (checkpoints, a run's config.yaml, `translate -o`)
is first written to a hidden sibling `.{name}.tmp-{pid}-{hex}`, then renamed over it: a kill
leaves the old file or the new one, and a temporary naming its writer for a later run to remove
once that process is gone (`clean_temporaries`). A directory (prepare-bpe's `--destdir`, an
export) is replaced whole (`replacing_directory`). No command writes a file it reads
(`check_outputs`, before anything is written).

The one rule for a file a command writes inside a folder it writes (a run directory, `nmt
distill --out`; `own_file`): it is a regular file, never written through a symbolic link; one
it appends to or rewrites in place has one link (`open_regular_file`), since a hard link would
carry the writes to its other names; one replaced whole is renamed over, which breaks a hard
link. A path the user names (`-o`) is the user's: a symlink is written through, a device or a
FIFO written into.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from nmt.errors import NmtError

log = logging.getLogger(__name__)

# `.{name}.tmp-{pid}-{hex}`; prepare-bpe's directories also `.{name}.old-{pid}-{hex}` (the old
# output between its rename and its removal)
TEMPORARY = re.compile(r"\.(.+)\.(?:tmp|old)-(\d+)-[0-9a-f]+")


# a name longer than this is shortened to its hash in its temporaries' names, so that a name the
# file system accepts (up to 255 bytes) has a temporary it accepts too
LONG_NAME = 200


def temporary_name(path: Path, kind: str = "tmp") -> Path:
    """A hidden sibling of `path` for this process to fill: `.{name}.tmp-{pid}-{hex}` (kind
    "old": where a replaced directory waits for its removal); `name` a hash if it is long."""
    return path.with_name(
        f".{_temporary_stem(path.name)}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"
    )


def _temporary_stem(name: str) -> str:
    """How the temporaries of the file `name` name it: as it is, or the start of its sha256 if
    long."""
    if len(os.fsencode(name)) <= LONG_NAME:
        return name
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:16]


@contextlib.contextmanager
def os_errors_as(subject: object, action: str) -> Iterator[None]:
    """An OSError raised in the block becomes the one-line NmtError "{subject}: {action}
    (reason)"."""
    try:
        yield
    except OSError as e:
        raise NmtError(f"{subject}: {action} ({e.strerror or e})") from None


def fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory (Windows): nothing to sync
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _named(path: str | Path, option: str) -> str:
    """How a message names `path`: with the option it was given for ("-o out.txt"), if any."""
    return f"{option} {path}" if option else str(path)


def _through_link(path: str | Path, name: str) -> Path:
    """`path`, or where it points if it is a symlink: what writing it replaces (the link stays).
    A name the system refuses (longer than 255 bytes) is an NmtError naming it (as `name`)."""
    path = Path(path)
    with os_errors_as(name, "cannot write there"):
        return Path(os.path.realpath(path)) if path.is_symlink() else path


def _parent_problem(path: Path) -> str | None:
    """Why no file can be made at `path` in its folder, or None: the nearest folder above it that
    exists is a file ("not a directory"), or none up to that one exists ("no such directory")."""
    parent = path.parent
    if parent.is_dir():
        return None
    existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing}: not a directory"
    return f"{parent}: no such directory"


def written_into(path: str | Path) -> bool:
    """Whether `path` is a device, a FIFO, a socket or a descriptor's name (/dev/stdout): written
    into, never replaced."""
    with contextlib.suppress(OSError):
        if stat.S_IFMT(os.stat(path).st_mode) not in (stat.S_IFREG, stat.S_IFDIR):
            return True
    return os.path.abspath(path).startswith(("/dev/std", "/dev/fd/", "/proc/"))


def target(path: str | Path, option: str = "") -> Path:
    """The file that writing `path` replaces: a symlink's target (written through, the link
    stays), checked to be a possible file name: not a directory, in a directory that exists;
    `path` itself if it is `written_into`. `option` (e.g. "-o") is named in the NmtError."""
    if written_into(path):
        return Path(path)
    name = _named(path, option)
    path = _through_link(path, name)
    if path.is_dir() or path.name in ("", ".."):  # a Path's name is never "."
        raise NmtError(f"{name}: is a directory; give a file name")
    problem = _parent_problem(path)
    if problem is not None:
        raise NmtError(f"{name}: cannot write there ({problem})")
    return path


def directory_target(path: str | Path, option: str = "") -> Path:
    """The directory that writing `path` as a whole replaces: a symlink's target (written
    through, the link stays); never `.` or `..`, which cannot be renamed away, nor a path under
    a regular file ("not a directory")."""
    name = _named(path, option)
    path = _through_link(path, name)
    if path.name in ("", ".."):
        raise NmtError(f"{name}: name a directory to create or replace, not {str(path)!r}")
    problem = _parent_problem(path)
    if (
        problem is not None and "not a directory" in problem
    ):  # a missing parent is made (prepare-bpe)
        raise NmtError(f"{name}: cannot write there ({problem})")
    return path


def own_file(path: Path, what: str, *, directory: bool = False) -> Path:
    """`path`, a file (or, with `directory`, a folder) inside a folder the command writes, about
    to be written: refused in one line where a symbolic link stands there (writing would reach
    whatever it names) or something that is not a regular file (a FIFO would block, a device
    be written into) or not a folder. Missing, it passes: it is made."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as e:  # a name too long, a folder above it that is a file
        raise NmtError(f"{path}: cannot write {what} ({e.strerror or e})") from None
    kind = "directory" if directory else "regular file"
    if stat.S_ISLNK(mode):
        raise NmtError(
            f"{path}: {what} is a symbolic link, not a {kind}; nmt does not write through it: "
            "remove it"
        )
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        raise NmtError(f"{path}: {what} is not a {kind}; remove it")
    return path


def check_replaceable(
    dest: Path, force: bool, markers: tuple[str, ...], kind: str, option: str = ""
) -> None:
    """Refuse to replace an existing `dest` unless it is an empty directory or, with `force`, a
    directory holding all of `markers` (an earlier output of the command: `kind`)."""
    name = _named(dest, option)
    if not dest.exists():
        return
    if not dest.is_dir():
        raise NmtError(f"{name} exists and is not a directory")
    with os_errors_as(name, "cannot read it"):
        if not any(dest.iterdir()):
            return
    if not force:
        raise NmtError(f"{name} exists and is not empty; use --force to replace it")
    if not all((dest / marker).is_file() for marker in markers):
        raise NmtError(
            f"{name} is not empty and is not {kind}; refusing to replace it even with --force "
            "(choose a new or empty directory)"
        )


@contextlib.contextmanager
def replacing(path: Path, what: str = "checkpoint", *, own: bool = False) -> Iterator[Path]:
    """Yield a temporary for the caller to fill (a killed writer's of `path` removed first), then
    rename it over `path` and fsync the directory; on failure it goes away, `path` unchanged, and
    an OSError (disk full) is an NmtError naming `path`. A symlink is written through (the link
    stays), the permission bits kept; owner, extended attributes and other hard links are not
    (docs/reliability.md). A device, a FIFO or a descriptor (`written_into`) is not replaced: it
    is opened first (a FIFO nobody reads is refused, never waited for), and the temporary, in the
    system's temporary directory, is appended to it at the end. With `own`, `path` is a file of a
    folder the command writes (`own_file`): a link or a special file there is refused."""
    path = own_file(path, what) if own else target(path)
    into = None if own or not written_into(path) else _open_into(path, what)
    clean_temporaries(path.parent, name=path.name)
    tmp = temporary_name(Path(tempfile.gettempdir(), path.name) if into is not None else path)
    try:
        yield tmp
        if into is not None:
            with open(tmp, "rb") as src:
                while block := src.read(1 << 20):
                    write_all(into, block)
            return tmp.unlink()
        with contextlib.suppress(
            FileNotFoundError
        ):  # the replaced file's permission bits (none: a new file)
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        _raise_write_error(exc, path, what)
        raise
    finally:
        if into is not None:
            os.close(into)


def _open_into(path: Path, what: str) -> int:
    """A descriptor appending to `path`, a device, a FIFO or a descriptor's name (`written_into`),
    opened before anything is written: a FIFO that no process reads is refused in one line (it
    would block for ever), and so is a name that cannot be opened (/proc/x.yaml)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == errno.ENXIO and stat.S_ISFIFO(os.stat(path).st_mode):
            reason = "a FIFO that no process reads; start its reader first"
        raise NmtError(f"{path}: cannot write {what} ({reason})") from None
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def replacing_together(outputs: list[tuple[Path, str]]) -> Iterator[list[Path]]:
    """`replacing` of each (path, what) of `outputs` at once: their temporaries, in that order, for
    the caller to fill. Every output is opened or checked before any is written; those written
    into (a device, a FIFO) are written first and the files renamed last, so that a failure (a
    full /dev/full) leaves every file as it was: none is written unless all can be."""
    with contextlib.ExitStack() as stack:
        tmps: dict[int, Path] = {}
        # the files entered first, so that they are left (renamed) last
        for i in sorted(range(len(outputs)), key=lambda i: written_into(outputs[i][0])):
            tmps[i] = stack.enter_context(replacing(*outputs[i]))
        yield [tmps[i] for i in sorted(tmps)]


@contextlib.contextmanager
def replacing_directory(
    dest: Path, what: str, option: str = "", *, own: bool = False
) -> Iterator[Path]:
    """Yield a new hidden sibling directory of `dest` (from `directory_target`; killed writers'
    leftovers removed first) for the caller to fill, then put it in place of `dest` as a whole.
    On failure it goes away, `dest` unchanged; an OSError (no permission, a full disk) is an
    NmtError naming `dest`. With `own`, a `dest` holding names the new one lacks (a clone's .git,
    a README) is refused, naming them, instead of being removed with it."""
    name = _named(dest, option)
    with os_errors_as(name, f"cannot write {what}"):
        clean_temporaries(dest.parent, name=dest.name, directories=True)
        work = temporary_name(dest)
        work.mkdir()
    try:
        yield work
        if own and dest.is_dir():
            others = sorted({p.name for p in dest.iterdir()} - {p.name for p in work.iterdir()})
            if others:
                raise NmtError(
                    f"{name}: holds {', '.join(others[:5])}, which {what} does not write; move "
                    "them away"
                )
        _swap_directory(work, dest)
    except BaseException as exc:
        shutil.rmtree(work, ignore_errors=True)
        _raise_write_error(exc, name, what)
        raise


def _raise_write_error(exc: BaseException, name: object, what: str) -> None:
    """Raise the OSError behind the error `exc` of a write (a full disk) as the NmtError "{name}:
    cannot write {what} (reason)"; an NmtError (it names its cause) or an interrupt is left to the
    caller. The OSError may be a cause or context: torch.save reports a failed write (ENOSPC) as
    a RuntimeError whose context is the OSError raised by the file object."""
    if not isinstance(exc, Exception) or isinstance(exc, NmtError):
        return
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            raise NmtError(f"{name}: cannot write {what} ({seen.strerror or seen})") from exc
        seen = seen.__cause__ or seen.__context__


def _swap_directory(work: Path, dest: Path) -> None:
    """Rename `work` to `dest`; an existing `dest` is renamed aside first (and back if that fails),
    then removed, its permission bits kept. A kill leaves the old or the new directory at `dest`."""
    if not dest.exists():
        work.rename(dest)
        return
    os.chmod(work, stat.S_IMODE(dest.stat().st_mode))
    old = temporary_name(dest, "old")
    dest.rename(old)
    try:
        work.rename(dest)
    except BaseException:
        old.rename(dest)
        raise
    shutil.rmtree(
        old, ignore_errors=True
    )  # what stays (unreadable) goes with the next run's cleaning


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, or raise the OSError. A short write (`ulimit -f`) is
    retried so that its error surfaces: Python's buffered files have reported success after one."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


class TextWriter:
    """Text to a file descriptor through `write_all`: `write` collects, `flush` writes. For
    outputs whose every byte counts (translations, `nmt score`, the resolved config)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        data = "".join(self.parts).encode("utf-8")
        self.parts = []
        write_all(self.fd, data)


def write_stdout(write: Callable[[TextWriter], object], what: str = "") -> None:
    """`write(out)`, then `out.flush()`, `out` a TextWriter on standard output: a closed stdout or a
    failed write (a full disk) is one line, "standard output: cannot write {what} (reason)"; a
    broken pipe (the reader went away) is raised, and the CLI ends quietly."""
    if sys.stdout is None:
        raise NmtError("standard output is closed")
    try:
        sys.stdout.flush()  # what print() may have left in Python's buffer goes first
        out = TextWriter(sys.stdout.fileno())
        write(out)
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        action = f"cannot write {what}" if what else "cannot write"
        raise NmtError(f"standard output: {action} ({e.strerror or e})") from None


def atomic_write_bytes(
    data: bytes, path: str | Path, what: str = "file", *, own: bool = False
) -> None:
    """Write `data` to `path` so that a kill leaves the old file or the new one (fsync, rename,
    fsync the directory), and a temporary that `clean_temporaries` recognises (`own`:
    `replacing`'s)."""
    with replacing(Path(path), what, own=own) as tmp, open(tmp, "xb", buffering=0) as f:
        write_all(f.fileno(), data)
        os.fsync(f.fileno())


def clean_temporaries(
    directory: str | Path, name: str | None = None, directories: bool = False
) -> int:
    """Remove temporaries left by killed writers in `directory` (only those of the file
    `name`, if given; also whole directories, prepare-bpe's, with `directories`); return how
    many. A temporary whose writer process is still alive on this machine is left alone.
    """
    removed = 0
    try:
        entries = list(Path(directory).iterdir())
    except OSError:  # missing, not a directory, unreadable: nothing we may clean
        entries = []
    for entry in entries:
        match = TEMPORARY.fullmatch(entry.name)
        if match is None or (name is not None and match.group(1) != _temporary_stem(name)):
            continue
        is_dir = entry.is_dir() and not entry.is_symlink()
        if (not directories if is_dir else not entry.is_file()) or process_alive(
            int(match.group(2))
        ):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry) if is_dir else entry.unlink(missing_ok=True)
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


# --------------------------------------------------------------- no command writes a file it reads


class FileArg(NamedTuple):
    """A file a command reads or writes, named as the user gave it (for messages)."""

    option: str  # "-o", "--checkpoint", "CHECKPOINT", "standard input"
    file: str | os.PathLike | int  # a path, or an open file descriptor (0 or 1)
    what: str = ""  # what it holds: "the checkpoint"
    directory: bool = (
        False  # an output directory replaced as a whole: nothing it reads may be in it
    )


def check_outputs(inputs: Iterable[FileArg], outputs: Iterable[FileArg]) -> None:
    """Refuse, before anything is written, an output that is one of the command's inputs or
    another of its outputs, or an output directory that holds an input. Files are compared by
    device and inode, so every name of a file counts (symlinks followed, hard links, `./x`); a
    file not there yet by its resolved path. A descriptor counts only as a regular file
    (`-o x.txt < x.txt`), never as a pipe or a terminal."""
    seen = [(arg, key) for arg in inputs if (key := _file_key(arg.file)) is not None]
    for out in outputs:
        key = _file_key(out.file)
        if key is None:
            continue
        for arg, other in seen:
            if other == key or (out.directory and _inside(arg.file, key)):
                verb = "is" if other == key else "contains"
                raise NmtError(
                    f"{_label(out)} {verb} {arg.what} ({_label(arg)}); choose another output"
                )
        seen.append((out, key))


def _label(arg: FileArg) -> str:
    return arg.option if isinstance(arg.file, int) else f"{arg.option} {arg.file}"


def _file_key(file: str | os.PathLike | int) -> tuple[object, object] | None:
    """(device, inode) of `file` (symlinks followed); ("path", its resolved path) if it is not
    there; None for a descriptor that is not a regular file."""
    try:
        st = os.stat(file)  # a descriptor's too
    except OSError:
        return None if isinstance(file, int) else ("path", os.path.realpath(file))
    return (
        None if isinstance(file, int) and not stat.S_ISREG(st.st_mode) else (st.st_dev, st.st_ino)
    )


def _inside(file: str | os.PathLike | int, directory: tuple[object, object]) -> bool:
    """Whether the path `file` resolves to a place under the directory whose key is `directory`."""
    if isinstance(file, int) or directory[0] == "path":
        return False
    return any(_file_key(parent) == directory for parent in Path(os.path.realpath(file)).parents)


def open_regular_file(path: Path, flags: int, what: str, *, create: bool = True) -> int:
    """A descriptor of `path` opened with `flags` (and O_CREAT if `create`), refused in one line
    unless it is a regular file. A symbolic link is not followed: one planted in a shared
    directory (runs/) would have training truncate whatever file it names (issue 25); a FIFO
    opens without blocking and is refused like a device or a directory. Opened for writing, it
    must have one link: O_NOFOLLOW cannot see a hard link, through which the writes would change
    its other names (`ln victim RUN/metrics.jsonl`, a run copied with `cp -al`; `unshare` first
    where a copy of its own is the answer). A missing file (without `create`) raises
    FileNotFoundError for the caller to word."""
    flags |= (
        os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    )
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ENOENT and not create:
            raise
        if e.errno == errno.ELOOP:
            raise NmtError(
                f"{path}: {what} is a symbolic link, which nmt does not follow; remove it"
            ) from None
        if e.errno in (
            errno.EISDIR,
            errno.ENXIO,
        ):  # ENXIO: a FIFO with no reader, opened for writing only
            raise NmtError(f"{path}: {what} is not a regular file; remove it") from None
        raise NmtError(f"{path}: cannot open {what} ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NmtError(f"{path}: {what} is not a regular file; remove it")
    if flags & (os.O_WRONLY | os.O_RDWR) and st.st_nlink > 1:
        os.close(fd)
        raise NmtError(
            f"{path}: {what} has {st.st_nlink} links (a hard link: writing it would change its "
            "other names); remove it"
        )
    return fd


def unshare(path: Path, what: str) -> None:
    """Give `path`, a regular file with other hard links (a run directory copied with `cp -al`, or
    `ln victim RUN/train.log`), a copy of its own in their place, by rename, before it is appended
    to: its other names keep their content. A missing file, or one with one link, stays as it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise NmtError(f"{path}: cannot write {what} ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink == 1:
        return  # one link, or refused by open_regular_file
    with replacing(path, what, own=True) as tmp:
        shutil.copyfile(path, tmp)
        fsync_path(tmp)
    log.warning(
        "%s: %s had %d links (a hard link); it is now a copy of its own, the other names keep "
        "their content",
        path,
        what,
        st.st_nlink,
    )


# ------------------------------------------------------------------ reading: regular files only

# what nmt reads whole into memory (a config, a vocabulary, a tokenizer, a manifest) is refused
# past this size: a symlink to /dev/zero or a runaway file must not read until memory runs out
READ_LIMIT = 1 << 30


def open_for_reading(path: str | Path, what: str, limit: int | None = READ_LIMIT) -> BinaryIO:
    """`path` open for reading, refused in one line naming it unless it is a regular file of at
    most `limit` bytes (None: any size). Symbolic links are followed (a Hugging Face cache links
    each file to a blob); a FIFO or a device, which would block or never end, is opened without
    blocking and refused. A missing file raises FileNotFoundError for the caller to word."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:  # a directory opens (read-only), and is refused below
        raise NmtError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise NmtError(f"{path}: {what} is a directory, not a file")
        raise NmtError(f"{path}: {what} is not a regular file (a FIFO, a device or a socket)")
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise NmtError(f"{path}: {what} is {st.st_size:,} bytes, more than nmt reads ({limit:,})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, what: str, limit: int | None = READ_LIMIT) -> bytes:
    """The bytes of `path` under `open_for_reading`'s rule; a missing file raises
    FileNotFoundError, a read error NmtError naming the file."""
    with open_for_reading(path, what, limit) as f, os_errors_as(path, f"cannot read {what}"):
        return f.read()


# ------------------------------------------------------------------ a directory's lock


class DirectoryLock(contextlib.AbstractContextManager["DirectoryLock"]):
    """An advisory lock (flock) on a file in a directory holding the holder's pid, for the next
    comer's message. The kernel drops it when the process ends, even by `kill -9`. `with` releases
    it."""

    def __init__(self, fd: int):
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_directory(path: Path, name: str, what: str, busy: str) -> DirectoryLock:
    """Lock the directory `path` for this process through its file `name` (`open_regular_file`,
    named as `what`), or raise the NmtError `{path}: {busy}`, `busy` with `{pid}` for the holder's:
    `nmt train`'s run directory (`train.lock`), `nmt distill`'s --out (`distill.lock`)."""
    fd = open_regular_file(path / name, os.O_RDWR, what)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise NmtError(f"{path}: {busy.format(pid=holder)}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DirectoryLock(fd)
