"""`nmt translate`: raw text in, detokenized translations out, one line for every line.

This module reads and writes streams; the prediction under it (loading checkpoints,
batching, search) is `nmt.predict`, which validation and the Python API use too.

The I/O contract: input is read as every command reads raw text (`nmt.textio`): only
`\\n` ends a line, a trailing `\\r` (CRLF files) is dropped, invalid UTF-8 is replaced and
reported with its line number; empty and whitespace-only lines give empty lines without
touching the model; over-long lines are truncated with a warning; a translation never
contains a line break or a tab. Input is read in bounded chunks, each sorted by length into
batches and written back in input order, so memory stays flat on any input size.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt.atomic import TextWriter, clean_temporaries, replacing, target
from nmt.config import DecodeConfig
from nmt.device import resolve_device
from nmt.errors import NmtError
from nmt.options import TranslateOptions
from nmt.predict import (
    DECODE_PRECISIONS,
    Loaded,
    decode_config,
    load_models,
    load_shortlist_for,
    resolve_checkpoints,
    translate_token_lists,
)
from nmt.search import Hypothesis
from nmt.shortlist import Shortlist
from nmt.textio import TextStats, iter_lines
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)
CHUNK_LINES = 4096
_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def read_chunks(stream: BinaryIO, name: str, chunk_lines: int) -> Iterator[list[str]]:
    """The stream's lines (`nmt.textio`'s policy, each cleaned line logged as NAME:LINE), in
    chunks of at most `chunk_lines`."""
    lines = iter_lines(stream, TextStats(name, log_each=True))
    while chunk := list(islice(lines, chunk_lines)):
        yield chunk


def clean_output(text: str) -> str:
    """A translation on one line: line breaks, tabs and other separators become spaces."""
    return _BREAKS.sub(" ", text).strip()


def format_line(hyps: list[Hypothesis], tokenizer: Tokenizer, nbest: int, scores: bool) -> str:
    fields: list[str] = []
    for h in hyps[:nbest]:
        if scores:
            fields.append(f"{h.score:.4f}")
        fields.append(clean_output(tokenizer.decode(h.tokens)))
    if not hyps and (scores or nbest > 1):
        return ""
    return "\t".join(fields)


def translate_stream(loaded: Loaded, cfg: DecodeConfig, inp: BinaryIO, out: Any, *, name: str, nbest: int,
                     scores: bool, device: torch.device, precision: str, workers: int = 1,
                     shortlist: Shortlist | None = None, chunk_lines: int = CHUNK_LINES) -> int:
    """Translate `inp` to `out` chunk by chunk; returns the number of lines written."""
    limit = loaded.max_positions - 1
    bar = _bar()
    written = 0
    for texts in read_chunks(inp, name, chunk_lines):
        seqs = [loaded.tokenizer.encode(t) if t.strip() else [] for t in texts]
        for n, s in enumerate(seqs, start=written + 1):
            if len(s) > limit:
                log.warning("%s:%d: %d tokens, truncated to the model's maximum of %d", name, n, len(s), limit)
        hyps = translate_token_lists(loaded.model, seqs, cfg, nbest=nbest, device=device, precision=precision,
                                     max_positions=loaded.max_positions, workers=workers, shortlist=shortlist)
        for h in hyps:
            out.write(format_line(h, loaded.tokenizer, nbest, scores) + "\n")
        out.flush()
        written += len(texts)
        if bar is not None:
            bar.update(len(texts))
    if bar is not None:
        bar.close()
    return written


def _bar() -> Any:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(unit="line", dynamic_ncols=True, leave=False)


def translate_main(opts: TranslateOptions) -> None:
    if opts.precision not in DECODE_PRECISIONS:
        raise NmtError(f"--precision must be one of {', '.join(DECODE_PRECISIONS)}, got {opts.precision!r}")
    if opts.threads < 0:
        raise NmtError(f"--threads must be 0 (torch's default) or more, got {opts.threads}")
    if opts.workers < 0:
        raise NmtError(f"--workers must be 0 (one per CPU thread) or more, got {opts.workers}")
    if opts.threads > 0:
        torch.set_num_threads(min(opts.threads, MAX_THREADS))
    # int8 decoding exists on the CPU only: there, auto means the CPU even where CUDA is present
    device = resolve_device("cpu" if opts.precision == "int8" and opts.device == "auto" else opts.device)
    inp, name = _input(opts.input)
    output = target(opts.output, "-o") if opts.output else None  # before the models load
    if output is None and (sys.stdout is None or _closed(1)):
        raise NmtError("standard output is closed; give -o FILE")
    try:
        loaded = load_models(resolve_checkpoints([str(p) for p in opts.checkpoints]), device, opts.precision)
        source = str(opts.checkpoints[0]) if opts.checkpoints else "the checkpoint"
        cfg = decode_config(loaded.config.decode, opts.decode, opts.nbest, source=source,
                            vocab_size=loaded.tokenizer.vocab_size)
        shortlist = load_shortlist_for(str(opts.shortlist), loaded, cfg.beam) if opts.shortlist else None
        run = partial(translate_stream, loaded, cfg, inp, name=name, nbest=opts.nbest, scores=opts.scores,
                      device=device, precision=opts.precision, workers=opts.workers, shortlist=shortlist)
        if output is not None:
            # written to a temporary next to it and renamed at the end: an error or an interrupt
            # leaves no partial file (and an existing one unchanged); a killed run's is removed here
            clean_temporaries(output.parent, name=output.name)
            with replacing(output, "the translations") as tmp, open(tmp, "xb", buffering=0) as f:
                run(TextWriter(f.fileno()))
        else:
            _to_stdout(run)
    finally:
        if opts.input:
            inp.close()


MAX_THREADS = 4096  # torch refuses absurd thread counts with an error of its own


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _input(path: Path | None) -> tuple[BinaryIO, str]:
    """The input stream and its name for messages: a file (or a named pipe, `<(...)`) or stdin."""
    if path is None:
        if sys.stdin is None or _closed(0):
            raise NmtError("standard input is closed; give --input FILE")
        return sys.stdin.buffer, "<stdin>"
    if Path(path).is_dir():
        raise NmtError(f"--input {path}: is a directory")
    try:
        return open(path, "rb"), str(path)
    except FileNotFoundError:
        raise NmtError(f"{path}: input file not found") from None
    except OSError as e:
        raise NmtError(f"--input {path}: cannot open ({e.strerror or e})") from None


def _to_stdout(run: Any) -> None:
    """`run(out)` writing to standard output; a failed write (a full disk, a file-size limit)
    is one line. A closed pipe (the reader went away) goes to the CLI, which ends quietly."""
    sys.stdout.flush()
    try:
        run(TextWriter(sys.stdout.fileno()))
    except BrokenPipeError:
        raise
    except OSError as e:
        raise NmtError(f"standard output: cannot write the translations ({e.strerror or e})") from None
