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
import re
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt.atomic import replacing
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
    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    if opts.workers < 0:
        raise NmtError(f"--workers must be 0 (one per CPU thread) or more, got {opts.workers}")
    # int8 decoding exists on the CPU only: there, auto means the CPU even where CUDA is present
    device = resolve_device("cpu" if opts.precision == "int8" and opts.device == "auto" else opts.device)
    if opts.input is not None and not Path(opts.input).is_file():
        raise NmtError(f"{opts.input}: input file not found")
    loaded = load_models(resolve_checkpoints([str(p) for p in opts.checkpoints]), device, opts.precision)
    cfg = decode_config(loaded.config.decode, opts.decode, opts.nbest)
    shortlist = load_shortlist_for(str(opts.shortlist), loaded, cfg.beam) if opts.shortlist else None
    inp = open(opts.input, "rb") if opts.input else sys.stdin.buffer
    name = str(opts.input or "<stdin>")
    try:
        if opts.output:
            # written to a temporary next to it and renamed at the end: an error or an interrupt
            # leaves no partial file (and an existing one unchanged)
            with replacing(Path(opts.output), "the translations") as tmp, \
                    open(tmp, "w", encoding="utf-8", newline="\n") as out:
                translate_stream(loaded, cfg, inp, out, name=name, nbest=opts.nbest, scores=opts.scores,
                                 device=device, precision=opts.precision, workers=opts.workers,
                                 shortlist=shortlist)
        else:
            out = open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)
            translate_stream(loaded, cfg, inp, out, name=name, nbest=opts.nbest, scores=opts.scores,
                             device=device, precision=opts.precision, workers=opts.workers, shortlist=shortlist)
    finally:
        if opts.input:
            inp.close()
