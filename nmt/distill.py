"""`nmt distill`: sequence-level knowledge distillation (Kim & Rush 2016). A teacher translates
the training data, and a student (smaller and faster: configs/student.yaml, a deep encoder and
a shallow decoder) is trained on the teacher's translations instead of the references.

A command rather than a documented recipe of `nmt translate`, `prepare-bpe` and `train`,
because three of its steps are no existing command: translating a corpus in shards that
survive a kill (`nmt translate -o` writes its output whole or not at all, so a killed
translation of a big corpus would start again from its first line), keeping the best of an
n-best list by its sentence chrF against the reference, and filtering degenerate
translations. Everything else is called, not written again: `nmt.api.Translator` translates
(beam, ensembles, n-best), `nmt.prepare.prepare_bpe` prepares the student's data with the
teacher's vocabulary (`--tokenizer-from`) and its usual filter, and
`nmt.training.trainer.train` trains the student and resumes it.

The steps, in OUT (--out), each resumable; running the same command again does what is left:

1. translate: the source side of --trainpref in shards of --shard-lines lines, each written
   whole to OUT/shards/NNNNN.TGT when it is done (one line per source line: the teacher's
   --nbest hypotheses, best first, tab-separated). Finished shards are never translated
   again; the settings they were made with are in OUT/shards/manifest.json, and a run with
   other settings is refused rather than mixing them.
2. select and filter: per sentence the hypothesis with the best sentence --select score
   against the reference (the teacher's best where --nbest is 1), then the degenerate-pair
   rule (`degenerate`): OUT/distilled/train.SRC and train.TGT, and what each rule dropped in
   OUT/distill.json.
3. prepare: `prepare-bpe` of OUT/distilled/train (with its own filter: an empty side, a side
   too long or too short, a token-length ratio above 3), --validpref and --testpref as they
   are, with the first teacher's tokenizer: OUT/data-bin.
4. train: the student's config (--config) with data.dir OUT/data-bin and train.run_dir
   OUT/run; a run there resumes, as `nmt train` does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from tqdm import tqdm

from nmt.api import Translator
from nmt.atomic import (
    TEMPORARY,
    FileArg,
    atomic_write_bytes,
    check_outputs,
    clean_temporaries,
    replacing,
    write_all,
)
from nmt.checkpoint import load_model_checkpoint
from nmt.config import Config, load_config
from nmt.data import META_FILE
from nmt.errors import NmtError, require
from nmt.evaluate import sentence_scores
from nmt.options import SENTENCE_METRICS, DistillOptions, PrepareOptions, TranslateOptions
from nmt.prepare import Split, find_splits, input_files, prepare_bpe
from nmt.textio import TextStats, open_bytes, read_lines
from nmt.training.trainer import TrainResult, train

log = logging.getLogger(__name__)

REPORT = "distill.json"
MANIFEST = "manifest.json"
FILTER_RULES = ("copy", "repeat")  # checked in this order; a pair is counted under the first that applies
REPEATS = 4  # a word n-gram this many times in a row makes a translation degenerate ...
MAX_NGRAM = 4  # ... for n-grams of 1 to this many words
# the options that the manifest's keys come from, for messages; the keys a rerun need not match
# (shards are the translations of a text, wherever it is now)
_MANIFEST_OPTIONS = {"source_sha256": "--trainpref", "lines": "--trainpref",
                     "shard_lines": "--shard-lines", "nbest": "--nbest", "beam": "--beam", "teachers": "--teacher",
                     "precision": "--precision"}
_INFORMATIONAL = {"source"}


@dataclass(frozen=True)
class Layout:
    """Where each step writes, in OUT."""

    out: Path

    @property
    def shards(self) -> Path:
        return self.out / "shards"

    @property
    def distilled(self) -> Path:
        return self.out / "distilled"

    @property
    def data(self) -> Path:
        return self.out / "data-bin"

    @property
    def run(self) -> Path:
        return self.out / "run"

    @property
    def report(self) -> Path:
        return self.out / REPORT


# ------------------------------------------------------------------ the rule and the selection


def repeated_ngram(words: Sequence[str], times: int = REPEATS, max_n: int = MAX_NGRAM) -> bool:
    """Whether some n-gram of 1 to `max_n` words occurs `times` times in a row in `words`
    ("der der der der", "a b a b a b a b"). An n-gram repeated k times in a row is a stretch
    where word j equals word j + n for (k - 1) * n consecutive j."""
    for n in range(1, max_n + 1):
        need, run = (times - 1) * n, 0
        for j in range(len(words) - n):
            run = run + 1 if words[j] == words[j + n] else 0
            if run >= need:
                return True
    return False


def degenerate(source: str, target: str) -> str | None:
    """Why the pair (source, the teacher's translation) is dropped, or None to keep it:

    - "copy": the translation is the source itself (words compared, spaces aside): the
      teacher copied instead of translating;
    - "repeat": a word or an n-gram of up to MAX_NGRAM words occurs REPEATS (4) or more times
      in a row: the teacher's decoder looped.

    The other degenerate pairs are `prepare-bpe`'s filter's (step 3), which applies to
    every training set: an empty side, a side longer than 250 or shorter than 1 token, a
    token-length ratio above 3."""
    words = target.split()
    if words and words == source.split():
        return "copy"
    if repeated_ngram(words):
        return "repeat"
    return None


def select_hypothesis(hyps: Sequence[str], reference: str, metric: str = "chrf") -> int:
    """The index of the hypothesis with the best sentence `metric` score against `reference`
    (sacreBLEU's, `nmt.evaluate.sentence_scores`); on a tie the first, i.e. the one the
    teacher ranks higher. A single hypothesis (or none) is not scored."""
    if len(hyps) <= 1:
        return 0
    scores = sentence_scores(hyps, reference, metric)
    return max(range(len(hyps)), key=scores.__getitem__)


# ------------------------------------------------------------------ the command


def distill(opts: DistillOptions, progress: bool = False) -> TrainResult | None:
    """Run what is left of the four steps (module docstring) in opts.out; returns the
    student's training result, or None without --config."""
    _check_options(opts)
    where = Layout(Path(opts.out))
    # the cheap checks first, all before anything is written: every text file there and each
    # parallel pair aligned, the student's config, each teacher a checkpoint
    originals = _prepare_options(opts, opts.trainpref, where.data)
    splits = find_splits(originals)
    source, reference = (splits[0].files[lang] for lang in (opts.source_lang, opts.target_lang))
    lines = splits[0].lines
    if lines == 0:
        raise NmtError(f"--trainpref {source}: no lines to translate")
    cfg = student_config(opts, where) if opts.config is not None else None
    for teacher in opts.teachers:
        try:
            load_model_checkpoint(teacher, mmap=True)
        except NmtError as e:
            raise NmtError(f"--teacher {e}") from None
    check_outputs(_inputs(opts, originals, splits), [FileArg("--out", path, what, directory=True) for path, what in (
        (where.shards, "the shards"), (where.distilled, "the distilled text"), (where.data, "the student's data"))])

    manifest = _manifest(opts, source, lines)
    known = _known_manifest(where, manifest)
    paths = [where.shards / f"{k:05d}.{opts.target_lang}" for k in range(math.ceil(lines / opts.shard_lines))]
    todo = [k for k, path in enumerate(paths) if known is None or not path.is_file()]
    translator = _translator(opts) if todo else None  # checks --beam, --nbest, ... before anything is written
    if known is None:
        _make_directory(where.shards)
        atomic_write_bytes(_json(manifest), where.shards / MANIFEST, "the shards' manifest")
    if translator is not None:
        translate_shards(translator, source, lines, paths, set(todo), opts, progress)
        del translator
    else:
        log.info("all %d shards of %s are translated (reusing them)", len(paths), where.shards)

    report = _read_report(where)
    outputs = [where.distilled / f"train.{lang}" for lang in (opts.source_lang, opts.target_lang)]
    fresh = bool(todo) or "filter" not in report or not all(p.is_file() for p in outputs)
    if fresh:
        report = {"format_version": 1, "teachers": [str(t) for t in opts.teachers], "source": str(source),
                  "reference": str(reference), "lines": lines,
                  "shards": {"count": len(paths), "shard_lines": opts.shard_lines, "dir": str(where.shards)},
                  **select_and_filter(source, reference, paths, outputs, opts)}
        _write_report(where, report)
    else:
        log.info("reusing %s (the selected and filtered pairs)", where.distilled)

    prepared = prepare_student_data(opts, where, fresh, progress)
    train_split = prepared["splits"]["train"]
    report["prepare"] = {"data": str(where.data), "kept": train_split["kept"], "dropped": train_split["dropped"]}
    _write_report(where, report)
    if cfg is None:
        log.info("no --config: the student is not trained; train it on %s, e.g. nmt train configs/student.yaml "
                 "--set data.dir=%s", where.data, where.data)
        return None
    result = train(cfg)
    report["train"] = {"run_dir": cfg.train.run_dir, "update": result.update, "reason": result.reason}
    _write_report(where, report)
    return result


def _check_options(opts: DistillOptions) -> None:
    require(bool(opts.teachers), "give the teacher: --teacher CHECKPOINT (repeat it for an ensemble)")
    require(bool(opts.source_lang) and bool(opts.target_lang), "--source-lang and --target-lang are required")
    require(opts.source_lang != opts.target_lang, "--source-lang and --target-lang must differ")
    require(opts.nbest >= 1, f"--nbest must be at least 1, got {opts.nbest}")
    require(opts.select in SENTENCE_METRICS,
            f"--select must be one of {', '.join(SENTENCE_METRICS)}, got {opts.select!r}")
    require(opts.shard_lines >= 1, f"--shard-lines must be at least 1, got {opts.shard_lines}")


def _prepare_options(opts: DistillOptions, trainpref: str, destdir: Path, force: bool = False) -> PrepareOptions:
    """prepare-bpe's options for the student's data: `trainpref`, the original valid and test
    text, the first teacher's tokenizer."""
    return PrepareOptions(source_lang=opts.source_lang, target_lang=opts.target_lang, trainpref=trainpref,
                          destdir=str(destdir), validpref=opts.validpref, testpref=opts.testpref,
                          tokenizer_from=str(opts.teachers[0]), force=force)


def _inputs(opts: DistillOptions, prepare: PrepareOptions, splits: list[Split]) -> list[FileArg]:
    """What distill reads: what prepare-bpe reads (the text files, the first teacher), the other
    teachers, the student's config."""
    inputs = [arg._replace(option="--teacher", what="the teacher") if arg.option == "--tokenizer-from" else arg
              for arg in input_files(prepare, splits)]
    inputs += [FileArg("--teacher", path, "a teacher") for path in opts.teachers[1:]]
    if opts.config is not None:
        inputs.append(FileArg("--config", opts.config, "the student's config"))
    return inputs


def student_config(opts: DistillOptions, where: Layout) -> Config:
    """--config with --set, trained on OUT/data-bin in OUT/run (unless --set train.run_dir
    names another run directory); checked before anything is translated."""
    keys = {item.partition("=")[0].strip() for item in opts.sets}
    for key in ("data.dir", "data.source_lang", "data.target_lang"):
        if key in keys:
            raise NmtError(f"--set {key}: the student trains on {where.data} ({opts.source_lang}-"
                           f"{opts.target_lang}), which distill prepares; leave it out")
    options: dict[str, tuple[str, Any]] = {"data.dir": ("--out", str(where.data)),
                                           "data.source_lang": ("--source-lang", opts.source_lang),
                                           "data.target_lang": ("--target-lang", opts.target_lang)}
    if "train.run_dir" not in keys:
        options["train.run_dir"] = ("--out", str(where.run))
    return load_config(opts.config, list(opts.sets), options)


def _translator(opts: DistillOptions) -> Translator:
    """The teacher (an ensemble for several) with distill's decode options, named as its flags."""
    decode = {"beam": opts.beam} if opts.beam is not None else {}
    return Translator.from_options(TranslateOptions(checkpoints=list(opts.teachers), decode=decode, nbest=opts.nbest,
                                                    device=opts.device, precision=opts.precision,
                                                    threads=opts.threads))


# ------------------------------------------------------------------ step 1: the shards


def _manifest(opts: DistillOptions, source: Path, lines: int) -> dict[str, Any]:
    """What the shards are translations of, and how: a rerun must match it."""
    digest = hashlib.sha256()
    with open_bytes(source) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return {"format_version": 1, "source_sha256": digest.hexdigest(), "source": str(source.resolve()),
            "lines": lines, "shard_lines": opts.shard_lines, "nbest": opts.nbest, "beam": opts.beam,
            "precision": opts.precision, "teachers": [str(Path(t).resolve()) for t in opts.teachers]}


def _known_manifest(where: Layout, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of OUT's shards, checked to be `manifest`; None where OUT is new or empty.
    Anything else in OUT is refused: distill writes only where it has written before."""
    path = where.shards / MANIFEST
    if where.out.exists() and not where.out.is_dir():
        raise NmtError(f"--out {where.out}: exists and is not a directory")
    if not path.is_file():
        if where.out.is_dir() and _holds_anything(where):
            raise NmtError(f"--out {where.out}: not empty and not an nmt distill directory (no shards/{MANIFEST}); "
                           "choose a new or empty directory")
        return None
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: cannot read the shards' manifest ({e}); move {where.out} away to start again") from None
    for key, value in manifest.items():
        if key not in _INFORMATIONAL and known.get(key) != value:
            option = _MANIFEST_OPTIONS.get(key, key)
            what = (f"from another text than {manifest['source']} (its content differs)" if key == "source_sha256"
                    else f"with {option} {_shown(known.get(key))} (now {_shown(value)})")
            raise NmtError(f"{where.shards}: translated {what}; run again with the same text and settings, or "
                           "choose another --out")
    return known


def _holds_anything(where: Layout) -> bool:
    """Whether OUT holds anything but an empty shards/ (or the temporaries of a killed writer
    of its manifest): what a run killed before it wrote the manifest leaves."""
    try:
        for entry in where.out.iterdir():
            if entry != where.shards or not entry.is_dir():
                return True
            if any(TEMPORARY.fullmatch(e.name) is None for e in entry.iterdir()):
                return True
    except OSError as e:
        raise NmtError(f"--out {where.out}: cannot read it ({e.strerror or e})") from None
    return False


def _shown(value: Any) -> str:
    if value is None:
        return "the teacher's"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _line_name(source: Path, first: int, i: int) -> str:
    """FILE:LINE of line i of a shard whose first line is line `first` of `source`."""
    return f"{source}:{first + i}"


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(lines, size)):
        yield chunk


def translate_shards(translator: Translator, source: Path, lines: int, paths: list[Path], todo: set[int],
                     opts: DistillOptions, progress: bool) -> None:
    """Translate shard k of `source` (lines k * shard_lines ...) to paths[k] for each k in
    `todo`, each written whole when it is done; a killed run's partial shard is removed."""
    clean_temporaries(paths[0].parent)
    size = opts.shard_lines
    done = sum(min(size, lines - k * size) for k in range(len(paths)) if k not in todo)
    bar = tqdm(total=lines, initial=done, unit="line", desc="translate", dynamic_ncols=True,
               disable=None if progress else True)
    say = log.debug if progress else log.info
    try:
        for k, chunk in enumerate(_chunks(read_lines(source, TextStats(str(source), log_each=True)), size)):
            if k not in todo:
                continue
            start, first = time.time(), k * size
            hyps = translator.translate_nbest(chunk, opts.nbest, where=partial(_line_name, source, first + 1),
                                              first_index=first)
            text = "".join("\t".join(h.text for h in hs) + "\n" for hs in hyps)
            atomic_write_bytes(text.encode("utf-8"), paths[k], "a shard of translations")
            bar.update(len(chunk))
            say("%s: lines %d-%d of %d translated in %.1f s", paths[k], first + 1, first + len(chunk), lines,
                time.time() - start)
    finally:
        bar.close()


# ------------------------------------------------------------------ step 2: select and filter


def select_and_filter(source: Path, reference: Path, paths: list[Path], outputs: list[Path],
                      opts: DistillOptions) -> dict[str, Any]:
    """The distilled pairs: per source line its selected hypothesis, unless `degenerate`;
    written to `outputs` (source, target), each whole. Returns the report's sections."""
    _make_directory(outputs[0].parent)
    dropped = dict.fromkeys(FILTER_RULES, 0)
    changed = kept = 0
    sources = _chunks(read_lines(source, TextStats(str(source))), opts.shard_lines)
    references = _chunks(read_lines(reference, TextStats(str(reference))), opts.shard_lines)
    with replacing(outputs[0], "the distilled source") as tmp_src, \
            replacing(outputs[1], "the distilled target") as tmp_tgt, \
            open(tmp_src, "xb", buffering=0) as out_src, open(tmp_tgt, "xb", buffering=0) as out_tgt:
        for path, srcs, refs in zip(paths, sources, references, strict=True):
            shard = list(read_lines(path, TextStats(str(path))))
            if len(shard) != len(srcs):
                raise NmtError(f"{path}: {len(shard)} lines where its {len(srcs)} source lines need one each; "
                               "delete it to translate it again")
            keep_src, keep_tgt = [], []
            for src, ref, line in zip(srcs, refs, shard, strict=True):
                hyps = line.split("\t") if line else [""]
                best = select_hypothesis(hyps, ref, opts.select)
                changed += best != 0
                reason = degenerate(src, hyps[best])
                if reason is not None:
                    dropped[reason] += 1
                    continue
                keep_src.append(src + "\n")
                keep_tgt.append(hyps[best] + "\n")
            kept += len(keep_src)
            write_all(out_src.fileno(), "".join(keep_src).encode("utf-8"))
            write_all(out_tgt.fileno(), "".join(keep_tgt).encode("utf-8"))
        os.fsync(out_src.fileno())
        os.fsync(out_tgt.fileno())
    pairs = kept + sum(dropped.values())
    log.info("distilled %d pairs into %s: kept %d%s", pairs, outputs[0].parent, kept,
             "".join(f", {n} dropped as {why}" for why, n in dropped.items() if n))
    return {"select": {"nbest": opts.nbest, "metric": opts.select, "not_the_teachers_best": changed},
            "filter": {"pairs": pairs, "kept": kept, "dropped": dropped,
                       "files": [str(p) for p in outputs]}}


# ------------------------------------------------------------------ step 3: the student's data


def prepare_student_data(opts: DistillOptions, where: Layout, fresh: bool, progress: bool) -> dict[str, Any]:
    """prepare-bpe's report of OUT/data-bin: prepared now if the distilled pairs are new
    (`fresh`) or it is not there, else the one there."""
    meta = where.data / META_FILE
    if not fresh and meta.is_file():
        log.info("reusing %s (delete it to prepare it again)", where.data)
        try:
            return dict(json.loads(meta.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            raise NmtError(f"{meta}: cannot read it ({e}); delete {where.data} to prepare it again") from None
    return prepare_bpe(_prepare_options(opts, str(where.distilled / "train"), where.data, force=True),
                       progress=progress)


# ------------------------------------------------------------------ files


def _make_directory(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"{path}: cannot create it ({e.strerror or e})") from None


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _read_report(where: Layout) -> dict[str, Any]:
    """OUT/distill.json, or {} where there is none yet (or it cannot be read: it is rewritten)."""
    try:
        report = json.loads(where.report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def _write_report(where: Layout, report: dict[str, Any]) -> None:
    """OUT/distill.json, written whole; left as it is where nothing in it changed (a rerun)."""
    data = _json(report)
    try:
        if where.report.read_bytes() == data:
            return
    except OSError:
        pass
    atomic_write_bytes(data, where.report, "the distillation report")
