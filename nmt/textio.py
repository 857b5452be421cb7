"""Reading raw text corpora: plain or gzip, one sentence per line, robust to dirty input.

Lines are split on `\\n` only (never on CR, U+2028 or the other characters `str.splitlines`
splits on), so line N of a source file always pairs with line N of its target file. Each
line is cleaned so that any line reader downstream sees the same line count:

- a trailing CR (CRLF files) and a UTF-8 BOM at the start of the file are removed;
- invalid UTF-8 is decoded with U+FFFD replacement characters;
- NUL bytes become spaces (they break C tools and sentencepiece);
- the other line-breaking characters of `str.splitlines` (CR, VT, FF, FS, GS, RS, NEL,
  U+2028, U+2029) inside a line become spaces.

Every cleaned line is counted in a `TextStats` (with the first few line numbers) so that
callers can report it, naming the file; with `log_each` each line that was not valid UTF-8
is logged as it is read (`FILE:LINE: ...`), for streams whose end may be far away.

This is the one reader of raw text: `prepare-bpe` and sentencepiece training read corpora
with `read_lines`, `translate` reads its input and `score` its hypotheses and references
with `iter_lines`/`read_lines`, so every command sees the same lines.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import select
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nmt.errors import NmtError, one_line

log = logging.getLogger(__name__)
BLOCK_SIZE = 1 << 20
# a line longer than this (in bytes) is no sentence: a link to /dev/zero, a binary file; refused
# instead of being gathered until memory runs out
MAX_LINE_BYTES = 1 << 26
MAX_REPORTED_LINES = 10
_BOM = b"\xef\xbb\xbf"
# Characters str.splitlines() breaks on, besides "\n" (which we split on).
_BREAK_CHARS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAKS = re.compile(f"[{_BREAK_CHARS}]")
SURROGATES = re.compile("[\ud800-\udfff]")  # lone surrogates: in no text, not encodable as UTF-8


@dataclass
class TextStats:
    """What reading one file had to clean up; line numbers are 1-based."""

    path: str
    lines: int = 0
    invalid_utf8: int = 0
    nul: int = 0
    line_breaks: int = 0
    first_lines: list[int] = field(default_factory=list)
    log_each: bool = False  # log each line whose bytes were not UTF-8 as it is read (FILE:LINE)
    cleaned_lines: int = 0  # lines with at least one of the problems above

    @property
    def cleaned(self) -> int:
        """Problems cleaned (a line may have several: see `cleaned_lines`)."""
        return self.invalid_utf8 + self.nul + self.line_breaks

    def summary(self) -> str:
        """One line for the log, e.g. 'x.de: cleaned 2 lines (2 invalid UTF-8 -> U+FFFD); first: 3,
        9' (a line with several problems counts once as a line and once under each problem)."""
        kinds = [
            f"{n} {what}"
            for n, what in (
                (self.invalid_utf8, "invalid UTF-8 -> U+FFFD"),
                (self.nul, "NUL -> space"),
                (self.line_breaks, "CR/U+2028/... inside a line -> space"),
            )
            if n
        ]
        first = ", ".join(map(str, self.first_lines))
        n = self.cleaned_lines
        return (
            f"{self.path}: cleaned {n} line{'' if n == 1 else 's'} ({'; '.join(kinds)}); first: "
            f"{first}"
        )


def find_text(prefix: str | Path, lang: str) -> Path:
    """`PREFIX.LANG` or else `PREFIX.LANG.gz`, a file or a named pipe (a corpus is a stream);
    NmtError naming both when neither exists, or naming the one that is neither (a directory, a
    device such as a link to /dev/zero, which would never end)."""
    plain = Path(f"{prefix}.{lang}")
    gz = Path(f"{prefix}.{lang}.gz")
    for path in (plain, gz):
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
            return path
        raise NmtError(
            f"{path}: not a text file or a named pipe (a directory, a device or a socket)"
        )
    raise NmtError(f"{plain} not found (nor {gz.name})")


def is_pipe(path: str | Path) -> bool:
    """Whether `path` is a named pipe (`mkfifo`, `<(...)`): what it carries can be read once
    only."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


class _GzipStream(gzip.GzipFile):
    """A gzip stream over a file object that it closes with itself (gzip.GzipFile leaves a
    given file object open)."""

    def __init__(self, source: BinaryIO):
        super().__init__(fileobj=source, mode="rb")
        self.source = source

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.source.close()


def gunzipped(stream: BinaryIO, own: bool = False) -> BinaryIO:
    """`stream` itself, or a stream of its decompressed bytes if it starts as gzip does (by
    content, not name). The stream is peeked at once and never reopened: a pipe or a FIFO
    (`-i <(gzip -c f)`, `gzip -c f | nmt translate`) has no second reading, since its writer is
    gone. With `own`, closing the gzip stream closes `stream` too."""
    peek = getattr(stream, "peek", None)
    if peek is None:
        return stream
    _wait_for_input(
        _pipe(stream)
    )  # a pipe's first bytes are waited on as `_blocks` waits (signals)
    if peek(2)[:2] != b"\x1f\x8b":
        return stream
    if own:
        return _GzipStream(stream)  # type: ignore[return-value]
    return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]


def open_stream(path: str | Path) -> BinaryIO:
    """`path` open for reading its bytes as they come: a file, a named pipe or a device
    (`/dev/stdin`). A named pipe is opened without blocking, then waited on until its writer
    sends something or goes away, waking every 0.25 s as `_blocks` does, so that Ctrl-C stops
    a command whose pipe has no writer yet. A missing file or a directory is an NmtError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except OSError as e:
        raise NmtError(f"{path}: cannot open ({e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise NmtError(f"{path}: is a directory, not a text file")
    if stat.S_ISFIFO(mode):
        _wait_for_input(fd)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def open_bytes(path: str | Path) -> BinaryIO:
    """Open a plain or gzip (by content, not name) file or named pipe for reading bytes."""
    f = open_stream(path)
    try:
        return gunzipped(f, own=True)
    except OSError as e:
        f.close()
        raise NmtError(f"{path}: cannot read ({e.strerror or e})") from None


def _pipe(stream: BinaryIO) -> int | None:
    """The descriptor of a pipe, FIFO, socket or terminal that Python's own buffered reader
    reads (so that nothing can wait unseen in another buffer, as in gzip's); else None."""
    try:
        fd = stream.fileno() if isinstance(stream, io.BufferedReader | io.FileIO) else None
        return None if fd is None or stat.S_ISREG(os.fstat(fd).st_mode) else fd
    except (OSError, ValueError):
        return None


def _wait_for_input(fd: int | None) -> None:
    """Return once the descriptor `fd` (of `_pipe`; None: return at once) has input or its end,
    waking every 0.25 s so that the main thread runs a signal's handler (see `_blocks`)."""
    while fd is not None and not select.select([fd], [], [], 0.25)[0]:
        pass


def _blocks(stream: BinaryIO, stats: TextStats, block_size: int) -> Iterator[bytes]:
    """Chunks of whole lines (each ending in b"\\n", except maybe the stream's last); a read
    error or a line past MAX_LINE_BYTES is an NmtError naming `stats.path` (and the line).

    `read1` returns what is there (at most one read of the file or pipe), so a line typed
    into an interactive pipe comes out as soon as it is complete, while a file is still read
    in large blocks. A pipe or terminal is first waited on in `select`, waking every 0.25 s: a
    signal (Ctrl-C, SIGTERM) that another thread of the process happens to take does not
    interrupt the main thread's blocking read, and waking lets Python run its handler there.
    A read shorter than `block_size` left nothing in the reader's buffer, so only after one
    can waiting on the descriptor miss nothing."""
    read = getattr(stream, "read1", stream.read)
    fd = _pipe(stream)
    rest = b""
    full = True
    while True:
        try:
            if not full:
                _wait_for_input(fd)
            chunk = read(block_size)
        except BrokenPipeError:
            raise
        except (OSError, EOFError, zlib.error) as e:
            raise NmtError(f"{stats.path}: cannot read ({one_line(e)})") from None
        if not chunk:
            break
        full = len(chunk) == block_size
        chunk = rest + chunk
        cut = chunk.rfind(b"\n") + 1
        rest = chunk[cut:]
        if len(rest) > MAX_LINE_BYTES:  # the lines yielded before are counted by now
            raise NmtError(
                f"{stats.path}: line {stats.lines + 1} runs past {MAX_LINE_BYTES:,} bytes without "
                "a line break; not text (a device, a binary file?)"
            )
        if cut:
            yield chunk[:cut]
    if rest:
        yield rest + b"\n"


def _clean(raw: bytes, stats: TextStats) -> str:
    """The line `raw`, line `stats.lines` of its file, cleaned, counted into `stats`."""
    lineno = stats.lines
    before = stats.cleaned
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        line = raw.decode("utf-8", errors="replace")
        stats.invalid_utf8 += 1
        if stats.log_each:
            log.warning("%s:%d: invalid UTF-8 replaced by U+FFFD", stats.path, lineno)
    line = line.removesuffix("\r")
    if "\x00" in line:
        line = line.replace("\x00", " ")
        stats.nul += 1
    if _BREAKS.search(line):
        line = _BREAKS.sub(" ", line)
        stats.line_breaks += 1
    if stats.cleaned > before:  # a line with several problems counts once
        stats.cleaned_lines += 1
        if len(stats.first_lines) < MAX_REPORTED_LINES:
            stats.first_lines.append(lineno)
    return line


def iter_line_blocks(
    stream: BinaryIO, stats: TextStats, block_size: int = BLOCK_SIZE
) -> Iterator[list[str]]:
    """The cleaned lines of a binary stream (without their newline), counting into `stats`, as
    one list per read of the stream: when a list is yielded, no more of the stream has been
    read, so a caller can ask whether more input is waiting (`nmt.translate` answers a line
    typed into a pipe before the next arrives).

    Fast path: a whole block is decoded at once; only blocks with something to clean are
    handled line by line.
    """
    first = True
    for block in _blocks(stream, stats, block_size):
        if first:
            block = block.removeprefix(_BOM)
        first = False
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:
            pass  # cleaned line by line below
        else:
            text = text.replace("\r\n", "\n")
            if "\x00" not in text and not any(c in text for c in _BREAK_CHARS):  # memchr-fast
                lines = text.split("\n")[:-1]
                stats.lines += len(lines)
                yield lines
                continue
        cleaned = []
        for raw in block.split(b"\n")[:-1]:
            stats.lines += 1
            cleaned.append(_clean(raw, stats))
        yield cleaned


def iter_lines(stream: BinaryIO, stats: TextStats, block_size: int = BLOCK_SIZE) -> Iterator[str]:
    """Yield the cleaned lines of a binary stream (without their newline), counting into `stats`."""
    for lines in iter_line_blocks(stream, stats, block_size):
        yield from lines


def clean_text(text: str) -> str:
    """One sentence given as a Python string, cleaned as a line read from a file would be:
    line breaks (including `\\n`), NUL and the other separators become spaces, and lone
    surrogates (undecodable bytes smuggled in by `surrogateescape`) become U+FFFD."""
    text = _BREAKS.sub(" ", text.removesuffix("\r").replace("\n", " ").replace("\x00", " "))
    return SURROGATES.sub("\ufffd", text)


def on_one_line(text: str) -> str:
    """`text` (a translation) with its line breaks, tabs and other separators as spaces."""
    return _BREAKS.sub(" ", text.replace("\n", " ").replace("\t", " "))


def read_lines(
    path: str | os.PathLike, stats: TextStats | None = None, block_size: int = BLOCK_SIZE
) -> Iterator[str]:
    """Yield the cleaned lines of a text file, plain or gzip (see `iter_lines`)."""
    path = Path(path)
    stats = stats if stats is not None else TextStats(str(path))
    with open_bytes(path) as f:
        yield from iter_lines(f, stats, block_size)  # read errors: an NmtError naming stats.path


def count_lines(path: str | Path) -> int:
    """Number of lines `read_lines` yields (a last line without a newline counts)."""
    n = 0
    last = b"\n"
    with open_bytes(path) as f:
        try:
            while chunk := f.read(BLOCK_SIZE):
                n += chunk.count(b"\n")
                last = chunk[-1:]
        except (OSError, EOFError, zlib.error) as e:
            raise NmtError(f"{path}: cannot read ({e})") from None
    return n + (last != b"\n")
