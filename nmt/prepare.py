"""`nmt prepare-bpe`: learn (or reuse) a joint sentencepiece model, filter, binarize, report.

A reused model is a sentencepiece file (`--spm-model`) or the one inside an nmt checkpoint
(`--tokenizer-from`: data to fine-tune that checkpoint on, its vocabulary unchanged).

Input: fairseq-style prefixes (`--trainpref D/train` means `D/train.en` and `D/train.de`,
or their `.gz`). Output in `destdir`, with split names train, valid, test, test1, ...:
`spm.model`/`spm.vocab`, the binarized splits (format in `nmt.data`), `{split}.raw.{lang}`
for valid/test splits, and `prepare.json` (the report, also returned).

Only the train split is filtered; valid and test keep one sentence per input line. The
whole output is written to a temporary sibling directory that replaces `destdir` at the
end, so a failed run never leaves a mix of old and new files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, compress, islice
from pathlib import Path
from typing import BinaryIO

import numpy as np
from tqdm import tqdm

from nmt import __version__, atomic
from nmt.checkpoint import load_model_checkpoint
from nmt.data import META_FILE, bin_path, idx_path, raw_path, token_dtype
from nmt.errors import NmtError
from nmt.options import DEFAULT_VOCAB_SIZE, PrepareOptions
from nmt.textio import TextStats, count_lines, find_text, is_pipe, open_stream, read_lines
from nmt.tokenizer import NMT_SPECIALS, Tokenizer, VocabTokenizer, spm_pieces, train_sentencepiece

logger = logging.getLogger(__name__)

CHUNK_PAIRS = 20_000  # pairs encoded per sentencepiece call (spread over `workers` threads)
DROP_REASONS = ("empty", "too_short", "too_long", "ratio")  # checked in this order


@dataclass
class Split:
    """One split of the input: its prefix, its file per language, its line count (`find_splits`)."""

    name: str
    prefix: str
    files: dict[str, Path]  # lang -> input file (as messages and the report name it)
    lines: int
    filtered: bool
    copies: dict[str, Path]  # lang -> the copy of a named pipe, read in its place

    def text(self, lang: str) -> Path:
        """Where the text of `lang` is read: its file, or the copy of a named pipe."""
        return self.copies.get(lang, self.files[lang])


def prepare_bpe(opts: PrepareOptions, progress: bool = True) -> dict:
    """Run prepare-bpe; returns the report also written to `destdir/prepare.json`."""
    start = time.time()
    opts.check()
    dest = atomic.directory_target(opts.destdir, "--destdir")
    atomic.check_replaceable(
        dest,
        opts.force,
        (META_FILE,),
        f"an output of nmt prepare-bpe (no {META_FILE})",
        "--destdir",
    )
    reused = _reused_tokenizer(opts)
    with tempfile.TemporaryDirectory(prefix="nmt-prepare-") as pipes:
        splits = find_splits(opts, Path(pipes))  # reads every file once: after the cheap checks
        atomic.check_outputs(
            input_files(opts, splits), [atomic.FileArg("--destdir", opts.destdir, directory=True)]
        )
        with atomic.os_errors_as(f"--destdir {dest}", "cannot create it"):
            dest.parent.mkdir(parents=True, exist_ok=True)
        # the output is made in a temporary sibling that replaces `dest` at the end
        with atomic.replacing_directory(dest, "the prepared data", "--destdir") as work:
            tok = _tokenizer(opts, splits[0], reused, work)
            dtype = token_dtype(max(tok.vocab_size, tok.source_vocab_size or 0))
            reports = {}
            hashes = {}
            for split in splits:
                reports[split.name], file_hashes = _binarize(
                    split, tok, dtype, opts, work, progress
                )
                hashes.update(file_hashes)
            train = "".join(
                f"{name}:{hashes[name]}" for name in sorted(hashes) if name.startswith("train.")
            )
            fingerprint = hashlib.sha256((tok.sha256 + train).encode()).hexdigest()
            report: dict = {
                "format_version": 1,
                "nmt_version": __version__,
                "source_lang": opts.source_lang,
                "target_lang": opts.target_lang,
                "vocab_size": tok.vocab_size,
                # source_vocab_size: separate vocabularies; else None
                "source_vocab_size": tok.source_vocab_size,
                "dtype": dtype.name,
                "spm": {
                    "model": "spm.model",
                    "sha256": tok.sha256,
                    "source": str(opts.spm_model or opts.tokenizer_from) if reused else "trained",
                },
                "splits": reports,
                "sha256": hashes,
                "fingerprint": fingerprint,
                "options": dataclasses.asdict(opts),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(time.time() - start, 3),
            }
            (work / META_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    logger.info(
        "wrote %s in %.1f s (vocab %d, fingerprint %s)",
        dest,
        report["seconds"],
        report["vocab_size"],
        report["fingerprint"][:12],
    )
    return report


def find_splits(opts: PrepareOptions, pipes: Path | None = None) -> list[Split]:
    """Locate every input file and check line counts, before any real work. A named pipe
    (`mkfifo`, `<(zcat ...)`) carries its text once, and its text is read two or three times
    (counted, learned from, binarized): it is read once into a copy in the directory `pipes`;
    without `pipes` it is refused."""
    named = [("train", opts.trainpref, True)]
    if opts.validpref:
        named.append(("valid", opts.validpref, False))
    tests = [p.strip() for p in (opts.testpref or "").split(",") if p.strip()]
    named += [(f"test{i or ''}", prefix, False) for i, prefix in enumerate(tests)]
    splits: list[Split] = []
    copied: dict[Path, Path] = {}  # a named pipe given twice (as two splits) is read once
    for name, prefix, filtered in named:
        files = {lang: find_text(prefix, lang) for lang in (opts.source_lang, opts.target_lang)}
        copies: dict[str, Path] = {}
        for lang, path in files.items():
            if is_pipe(path):
                if path not in copied:
                    copied[path] = _copy_pipe(path, pipes, f"{name}.{lang}")
                copies[lang] = copied[path]
        src, tgt = files.values()
        n_src, n_tgt = (count_lines(copies.get(lang, path)) for lang, path in files.items())
        if n_src != n_tgt:
            raise NmtError(
                f"{src} has {n_src} lines but {tgt} has {n_tgt}; parallel files must align"
            )
        splits.append(Split(name, prefix, files, n_src, filtered, copies))
    return splits


def _copy_pipe(path: Path, pipes: Path | None, name: str) -> Path:
    """The named pipe `path` read to its end into the file `pipes/name`; an NmtError naming
    the pipe if it cannot be (no `pipes`: the command reads its text more than once)."""
    if pipes is None:
        raise NmtError(
            f"{path}: a named pipe can be read once, and this command reads its text several "
            "times; give a file"
        )
    copy = pipes / name
    logger.info("reading the named pipe %s into a temporary copy (%s)", path, copy)
    with (
        atomic.os_errors_as(path, f"cannot copy the named pipe to {copy}"),
        open_stream(path) as src,
        open(copy, "xb") as dst,
    ):
        shutil.copyfileobj(src, dst, 1 << 20)
    return copy


def input_files(opts: PrepareOptions, splits: list[Split]) -> list[atomic.FileArg]:
    """The files prepare-bpe reads (none of them may be in --destdir, which is replaced whole)."""
    options = {"train": "--trainpref", "valid": "--validpref"}
    inputs = [
        atomic.FileArg(options.get(split.name, "--testpref"), path, f"the {split.name} text")
        for split in splits
        for path in split.files.values()
    ]
    if opts.spm_model:
        inputs.append(atomic.FileArg("--spm-model", opts.spm_model, "the sentencepiece model"))
    if opts.tokenizer_from:
        inputs.append(atomic.FileArg("--tokenizer-from", opts.tokenizer_from, "the checkpoint"))
    return inputs


def _reused_tokenizer(opts: PrepareOptions) -> Tokenizer | None:
    """The sentencepiece model of --spm-model or of the checkpoint --tokenizer-from (loaded by the
    one checkpoint loader, with its checks); None where one is to be learned."""
    if opts.spm_model:
        try:
            tok = Tokenizer.from_file(opts.spm_model)
        except NmtError as e:
            raise NmtError(f"--spm-model {e}") from None
        if (
            opts.vocab_size is not None and opts.vocab_size != tok.vocab_size
        ):  # never ignored in silence
            raise NmtError(
                f"--vocab-size {opts.vocab_size}: --spm-model {opts.spm_model} has a vocabulary of "
                f"{tok.vocab_size}; leave --vocab-size out"
            )
        return tok
    if opts.tokenizer_from:
        try:
            return load_model_checkpoint(opts.tokenizer_from, mmap=True).tokenizer
        except NmtError as e:
            raise NmtError(f"--tokenizer-from {e}") from None
    return None


def _tokenizer(
    opts: PrepareOptions, train: Split, reused: Tokenizer | None, work: Path
) -> Tokenizer:
    """Reuse --spm-model or --tokenizer-from's model, or learn one joint model on both sides of
    train (--separate-vocab: one per side, spm.{lang}.model, bundled in spm.model); into
    work/spm.*"""
    if reused is not None:
        (work / "spm.model").write_bytes(reused.model_bytes)
        if opts.spm_model:
            vocab = Path(opts.spm_model).with_suffix(".vocab")
            if vocab.is_file():
                (work / "spm.vocab").write_bytes(
                    atomic.read_regular(vocab, "the sentencepiece vocabulary")
                )
        logger.info(
            "reusing the sentencepiece model of %s (vocab %d)",
            opts.spm_model or opts.tokenizer_from,
            reused.vocab_size,
        )
        return reused
    start = time.time()
    vocab_size = DEFAULT_VOCAB_SIZE if opts.vocab_size is None else opts.vocab_size
    source = opts.source_lang
    target = opts.target_lang
    # (file prefix, the languages it learns from, its vocabulary size, the option that sets it) of
    # each sentencepiece model to learn: one joint model, or one per side (--separate-vocab)
    if opts.separate_vocab:
        target_option = "--vocab-size" if opts.target_vocab_size is None else "--target-vocab-size"
        learn = [
            (f"spm.{source}", [source], vocab_size, "--vocab-size"),
            (f"spm.{target}", [target], opts.target_vocab_size or vocab_size, target_option),
        ]
    else:
        learn = [("spm", [source, target], vocab_size, "--vocab-size")]
    logger.info(
        "learning a %s sentencepiece model, vocab %d, on %s (sampling at most %d sentences)",
        opts.model_type,
        vocab_size,
        " + ".join(map(str, train.files.values())),
        opts.input_sentence_size,
    )
    models = [
        train_sentencepiece(
            [train.text(lang) for lang in langs],
            work / prefix,
            size,
            model_type=opts.model_type,
            character_coverage=opts.character_coverage,
            byte_fallback=opts.byte_fallback,
            input_sentence_size=opts.input_sentence_size,
            seed=opts.seed,
            num_threads=opts.workers,
            source=" + ".join(str(train.files[lang]) for lang in langs),
            size_option=option,
        )
        for prefix, langs, size, option in learn
    ]
    logger.info(
        "learned the sentencepiece model%s in %.1f s",
        "s" * opts.separate_vocab,
        time.time() - start,
    )
    if not opts.separate_vocab:
        return Tokenizer.from_file(models[0])
    # nmt's ids on each side: spm.model bundles the two
    src, tgt = (atomic.read_regular(path, "the sentencepiece model") for path in models)
    tok = VocabTokenizer(
        src,
        tgt,
        spm_pieces(tgt, str(models[1])),
        NMT_SPECIALS,
        source_pieces=spm_pieces(src, str(models[0])),
    )
    (work / "spm.model").write_bytes(tok.model_bytes)
    return tok


class _TokenWriter:
    """Appends sentences to `{split}.{lang}.bin` (hashing it) and writes the .idx at the end."""

    def __init__(self, work: Path, split: str, lang: str, dtype: np.dtype):
        self.bin = bin_path(work, split, lang)
        self.idx = idx_path(work, split, lang)
        self.dtype = dtype
        self.file: BinaryIO = open(self.bin, "wb")
        self.hash = hashlib.sha256()
        self.lengths: list[np.ndarray] = []
        self.tokens = 0

    def write(self, ids: list[list[int]], lengths: np.ndarray) -> None:
        total = int(lengths.sum())
        data = np.fromiter(chain.from_iterable(ids), dtype=self.dtype, count=total).tobytes()
        self.file.write(data)
        self.hash.update(data)
        self.lengths.append(lengths)
        self.tokens += total

    def close(self) -> dict[str, str]:
        """Finish both files; returns their sha256 by file name."""
        self.file.close()
        # offsets: 0, then where each sentence ends
        offsets = np.concatenate([np.zeros(1, "<i8"), *self.lengths]).cumsum(dtype="<i8")
        data = offsets.tobytes()
        self.idx.write_bytes(data)
        return {
            self.bin.name: self.hash.hexdigest(),
            self.idx.name: hashlib.sha256(data).hexdigest(),
        }


def _binarize(
    split: Split, tok: Tokenizer, dtype: np.dtype, opts: PrepareOptions, work: Path, progress: bool
) -> tuple[dict, dict[str, str]]:
    """Encode (and for train, filter) one split; returns its report and file hashes."""
    langs = (opts.source_lang, opts.target_lang)
    stats = {lang: TextStats(str(split.files[lang])) for lang in langs}
    readers = [read_lines(split.text(lang), stats[lang]) for lang in langs]
    writers = [_TokenWriter(work, split.name, lang, dtype) for lang in langs]
    raws = (
        []
        if split.filtered
        else [
            open(raw_path(work, split.name, lang), "w", encoding="utf-8", newline="\n")
            for lang in langs
        ]
    )
    dropped = dict.fromkeys(DROP_REASONS, 0)
    bar = tqdm(total=split.lines, unit="pairs", desc=split.name, disable=None if progress else True)

    def store(src: list[str], tgt: list[str], encoded: Future) -> None:
        src_ids, tgt_ids = encoded.result()
        src_len, tgt_len = (
            np.fromiter(map(len, side), np.int64, len(side)) for side in (src_ids, tgt_ids)
        )
        if split.filtered:
            keep = _keep_mask(src, tgt, src_len, tgt_len, opts, dropped)
            src_ids = list(compress(src_ids, keep))
            tgt_ids = list(compress(tgt_ids, keep))
            src_len = src_len[keep]
            tgt_len = tgt_len[keep]
        writers[0].write(src_ids, src_len)
        writers[1].write(tgt_ids, tgt_len)
        bar.update(len(src))

    # sentencepiece encodes a chunk in `workers` threads without the GIL while this thread
    # reads the next chunk and stores the previous one.
    pending = None
    try:
        with ThreadPoolExecutor(max_workers=1) as encoder:
            for src, tgt in _chunks(readers, split):
                for raw, lines in zip(raws, (src, tgt), strict=False):  # no raw text for train
                    raw.write("".join(line + "\n" for line in lines))
                encoded = encoder.submit(_encode_pair, tok, src, tgt, opts.workers)
                if pending:
                    store(*pending)
                pending = (src, tgt, encoded)
            if pending:
                store(*pending)
    finally:
        bar.close()
        for raw in raws:
            raw.close()
    hashes = {**writers[0].close(), **writers[1].close()}
    kept = split.lines - sum(dropped.values())
    report = {
        "prefix": split.prefix,
        "files": {lang: str(split.files[lang]) for lang in langs},
        "lines": split.lines,
        "filtered": split.filtered,
        "kept": kept,
        "dropped": dropped,
        "tokens": {lang: w.tokens for lang, w in zip(langs, writers, strict=True)},
        "cleaned": {
            lang: {
                "invalid_utf8": s.invalid_utf8,
                "nul": s.nul,
                "line_breaks": s.line_breaks,
                "lines": s.cleaned_lines,
                "first_lines": s.first_lines,
            }
            for lang, s in stats.items()
        },
    }
    dropped_text = "".join(f", {n} {why}" for why, n in dropped.items() if n)
    if split.filtered and kept == 0:  # a dataset nothing can be trained on is no success
        raise NmtError(
            f"{' and '.join(map(str, split.files.values()))}: kept 0 of {split.lines} training "
            f"pairs{dropped_text}; nothing to train on (see --min-len, --max-len, --max-ratio)"
        )
    logger.info("%s: kept %d of %d pairs%s", split.name, kept, split.lines, dropped_text)
    for lang in langs:
        if stats[lang].cleaned:
            logger.warning("%s", stats[lang].summary())
    return report, hashes


def _chunks(readers: list[Iterator[str]], split: Split) -> Iterator[tuple[list[str], list[str]]]:
    """(source lines, target lines) of up to CHUNK_PAIRS aligned pairs at a time."""
    pairs = zip(*readers, strict=True)
    try:
        while chunk := list(islice(pairs, CHUNK_PAIRS)):
            src, tgt = zip(*chunk)
            yield list(src), list(tgt)
    except ValueError:  # from zip(strict=True); the line counts were equal when checked
        files = " and ".join(map(str, split.files.values()))
        raise NmtError(f"{files} changed while being read (line counts differ now)") from None


def _encode_pair(
    tok: Tokenizer, src: list[str], tgt: list[str], workers: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The ids of a chunk's source lines and of its target lines (each side its own model)."""
    return tok.encode_batch(src, workers), tok.encode_target_batch(tgt, workers)


def _keep_mask(
    src: list[str],
    tgt: list[str],
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    opts: PrepareOptions,
    dropped: dict[str, int],
) -> np.ndarray:
    """Which train pairs to keep; each dropped pair is counted under its first reason."""
    n = len(src)
    empty = np.fromiter(
        (not (s.strip() and t.strip()) for s, t in zip(src, tgt, strict=True)), bool, n
    )
    short = np.minimum(src_len, tgt_len) < opts.min_len
    long_ = np.maximum(src_len, tgt_len) > opts.max_len
    ratio = np.zeros(n, bool)
    if opts.max_ratio:
        ratio = (src_len > opts.max_ratio * tgt_len) | (tgt_len > opts.max_ratio * src_len)
    drop = np.zeros(n, bool)
    for reason, mask in zip(DROP_REASONS, (empty, short, long_, ratio), strict=True):
        dropped[reason] += int((mask & ~drop).sum())
        drop |= mask
    return ~drop
