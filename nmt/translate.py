"""`nmt translate`: raw text in, detokenized translations out, one line for every line.

This module reads and writes streams; everything under it (loading checkpoints, batching,
search, cleaning and detokenizing) is the Python API, `nmt.api.Translator`, which sits on
`nmt.decoding.predict` as validation does.

The I/O contract: input is read as every command reads raw text (`nmt.textio`): only
`\\n` ends a line, a trailing `\\r` (CRLF files) is dropped, invalid UTF-8 is replaced and
reported with its line number; empty and whitespace-only lines give empty lines without
touching the model; over-long lines are truncated with a warning; a translation never
contains a line break or a tab. Input is read in chunks of 4096 lines, each sorted by length
into batches and written back in input order, so memory stays flat on any input size.

Streaming: on a terminal, and with `--buffer-lines N` on any input, a chunk is also
translated as soon as the input pauses, i.e. when the lines read so far are all there is
for now. So `nmt translate --buffer-lines N` can sit behind a pipe as a co-process (write a
line or a few, read their translations), and a file, where more input is always waiting, is
still read in chunks of N. Without it, a pipe is read in fixed chunks: where a chunk ends
then never depends on timing, and neither do the printed scores (batch shapes change the
last bits of the floats).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from nmt.api import Translation, Translator
from nmt.atomic import (
    FileArg,
    TextWriter,
    check_outputs,
    os_errors_as,
    replacing,
    target,
    write_stdout,
)
from nmt.decoding.alignment import (
    AttentionWriter,
    layer_count,
    pharaoh,
    resolve_layer,
    writing_attention,
)
from nmt.decoding.predict import resolve_checkpoints
from nmt.errors import NmtError
from nmt.options import TranslateOptions
from nmt.terminology import Request, parse_json_line
from nmt.textio import TextStats, gunzipped, iter_line_blocks, open_stream

log = logging.getLogger(__name__)
CHUNK_LINES = 4096


def _input_waiting(stream: BinaryIO) -> bool:
    """Whether more of `stream` can be read without waiting. A regular file always can; a
    stream without a file descriptor (in memory) counts as a file."""
    try:
        ready, _, _ = select.select([stream], [], [], 0)
    except (
        AttributeError,
        OSError,
        ValueError,
    ):  # no fileno (in memory), or select can't (Windows pipes)
        return True
    return bool(ready)


def read_chunks(
    stream: BinaryIO, name: str, chunk_lines: int, until_pause: bool = False
) -> Iterator[list[str]]:
    """The stream's lines (`nmt.textio`'s policy, each cleaned line logged as NAME:LINE), in
    chunks of at most `chunk_lines`; with `until_pause`, also a shorter chunk whenever the
    input pauses (see above)."""
    chunk: list[str] = []
    for lines in iter_line_blocks(stream, TextStats(name, log_each=True)):
        for line in lines:
            chunk.append(line)
            if len(chunk) >= chunk_lines:
                yield chunk
                chunk = []
        if chunk and until_pause and not _input_waiting(stream):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def format_line(hyps: list[Translation], nbest: int, scores: bool, alignment: bool = False) -> str:
    """One output line: the best translation, or with --nbest / --scores the `nbest` best,
    tab-separated, each after its score; with --alignment each followed by a tab and its
    Pharaoh alignment (an empty input line stays empty)."""
    fields: list[str] = []
    for h in hyps[:nbest]:
        if scores:
            fields.append(f"{h.score:.4f}")
        fields.append(h.text)
        if alignment:
            fields.append(pharaoh(h.alignment or []))
    return "\t".join(fields)


def write_translations(
    translator: Translator,
    inp: BinaryIO,
    out: Any,
    opts: TranslateOptions,
    name: str,
    attention: AttentionWriter | None,
) -> int:
    """Translate `inp` (named `name`) to `out` chunk by chunk, as `opts` (nmt translate's options)
    say, flushing after each; returns the lines written. --buffer-lines: see
    `TranslateOptions.buffer_lines` (0: CHUNK_LINES, streaming on a terminal).
    With an `attention` file, the attention of each non-empty line's best translation is added
    to it as the line is translated (nmt.decoding.alignment.writing_attention)."""
    from tqdm import tqdm

    bar = tqdm(
        unit="line", dynamic_ncols=True, leave=False, disable=not sys.stderr.isatty()
    )  # on a terminal
    written = 0
    streaming = opts.buffer_lines > 0 or _isatty(inp)
    for texts in read_chunks(inp, name, opts.buffer_lines or CHUNK_LINES, until_pause=streaming):
        where = partial(_line_name, name, written + 1)
        items: list[str | Request] = list(texts)
        if opts.json_input:  # each line a JSON request: its text and its lexical constraints
            items = [
                parse_json_line(t, where(i)) if t.strip() else Request("")
                for i, t in enumerate(texts)
            ]
        hyps = translator.translate_nbest(
            items,
            opts.nbest,
            where=where,
            first_index=written,
            alignment=opts.alignment,
            attention=attention is not None,
            split=opts.split_sentences,
        )
        for i, h in enumerate(hyps):
            out.write(format_line(h, opts.nbest, opts.scores, opts.alignment) + "\n")
            if attention is not None and h and h[0].attention is not None:
                a = h[0].attention
                attention.add(written + i, a.weights, a.source, a.target)
        out.flush()
        written += len(texts)
        bar.update(len(texts))
    bar.close()
    return written


def _isatty(stream: BinaryIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _line_name(name: str, first: int, i: int) -> str:
    return f"{name}:{first + i}"


def translate_main(opts: TranslateOptions) -> None:
    if opts.buffer_lines < 0:
        raise NmtError(f"--buffer-lines must be 0 (automatic) or more, got {opts.buffer_lines}")
    if opts.split_sentences and (opts.json_input or opts.attention):
        raise NmtError("--split-sentences cannot be combined with --json-input or --attention")
    Translator.check_options(opts)  # before any file is touched
    given = bool(opts.checkpoints)  # or the last run's
    opts = dataclasses.replace(
        opts,
        checkpoints=resolve_checkpoints([str(p) for p in opts.checkpoints]),
        input=None if str(opts.input) == "-" else opts.input,  # -: stdin, stdout
        output=None if str(opts.output) == "-" else opts.output,
    )
    output = target(opts.output, "-o") if opts.output else None  # before the models load
    if opts.attention:
        target(opts.attention, "--attention")
    check_outputs(*_files(opts, given))
    inp, name = _input(opts.input)
    if output is None and (sys.stdout is None or _closed(1)):
        raise NmtError("standard output is closed; give -o FILE")
    try:
        translator = Translator.from_options(opts)
        # a model without attention says so before any input is read
        if opts.alignment or opts.attention:
            resolve_layer(opts.alignment_layer, layer_count(translator.loaded.model))
        # plain or gzip (by content), the stream peeked at once and never reopened; once the
        # model is loaded: a terminal or a pipe may wait for its first line
        with os_errors_as(name, "cannot read"):
            text = gunzipped(inp)
        with (
            writing_attention(opts.attention)
            if opts.attention
            else contextlib.nullcontext() as attention
        ):
            run = partial(
                write_translations, translator, text, opts=opts, name=name, attention=attention
            )
            if output is not None:
                # written to a temporary next to it and renamed at the end: an error or an interrupt
                # leaves no partial file (and an existing one unchanged); a killed run's is removed
                # first
                with (
                    replacing(output, "the translations") as tmp,
                    open(tmp, "xb", buffering=0) as f,
                ):
                    run(TextWriter(f.fileno()))
            else:
                write_stdout(run, "the translations")
        if translator.terminology is not None:
            t = translator.term_stats
            log.info(
                "terminology: %d lines had terms; %d of their %d terms are in the translations",
                t["lines"],
                t["met"],
                t["terms"],
            )
    finally:
        if opts.input:
            inp.close()


def _files(opts: TranslateOptions, given: bool) -> tuple[list[FileArg], list[FileArg]]:
    """What `nmt translate` reads and what it writes (`nmt.atomic.check_outputs`); `given`:
    the checkpoints were named with --checkpoint (not the last run's)."""
    option = "--checkpoint" if given else "the last run's"
    what = "the checkpoint" if len(opts.checkpoints) == 1 else "one of the checkpoints"
    inputs = [FileArg(option, path, what) for path in opts.checkpoints]
    inputs.append(
        FileArg("--input", opts.input, "the input")
        if opts.input
        else FileArg("standard input", 0, "the input")
    )
    if opts.shortlist:
        inputs.append(FileArg("--shortlist", opts.shortlist, "the shortlist"))
    if opts.terminology:
        inputs.append(FileArg("--terminology", opts.terminology, "the terminology file"))
    outputs = [
        FileArg("-o", opts.output, "the translations")
        if opts.output
        else FileArg("standard output", 1, "the translations")
    ]
    if opts.attention:
        outputs.append(FileArg("--attention", opts.attention, "the attention file"))
    return inputs, outputs


def _closed(fd: int) -> bool:
    with contextlib.suppress(OSError):
        os.fstat(fd)
        return False
    return True


def _input(path: Path | None) -> tuple[BinaryIO, str]:
    """The input stream and its name for messages: a file (or a named pipe, `<(...)`), or
    stdin, as opened: `nmt.textio.gunzipped` tells plain from gzip."""
    if path is None:
        if sys.stdin is None or _closed(0):
            raise NmtError("standard input is closed; give --input FILE")
        return sys.stdin.buffer, "<stdin>"
    try:
        return open_stream(path), str(path)
    except NmtError as e:
        raise NmtError(f"--input {e}") from None
