"""`nmt distill`: sequence-level knowledge distillation (Kim & Rush 2016). A teacher translates
the training data, and a student (smaller and faster: configs/student.yaml, a deep encoder and
a shallow decoder) is trained on the teacher's translations instead of the references.

A command, not a recipe of `translate`, `prepare-bpe` and `train`, for the steps no command
does: translating a corpus in shards that survive a kill, n-best selection against the
reference, the filter of degenerate translations; the rest is called (`Translator`,
`prepare_bpe`, `train`). The steps, in OUT (--out), each resumable:

1. translate: the source side of --trainpref in shards of --shard-lines lines, each written
   whole to OUT/shards/NNNNN.TGT when done (a line per source line: the --nbest hypotheses).
2. select and filter: per sentence the hypothesis with the best sentence --select score
   against the reference, then the degenerate-pair rule (`degenerate`): OUT/distilled/.
3. prepare: `prepare-bpe` of OUT/distilled/train, --validpref and --testpref: OUT/data-bin.
4. train: --config on OUT/data-bin in OUT/run, resumed as `nmt train` resumes (its checks).

OUT/manifest.json holds what steps 1 to 3 were made from (`_records`): every setting and the
sha256 of the source, each teacher, the reference and the valid/test text. A rerun compares
(issue 33: a teacher replaced at its path gave a student of the shards of both): finished
shards of another teacher, text or setting are refused in one line naming it, never mixed;
another --select, reference or valid/test text makes the later steps again from the same
shards, but a student trained on other pairs is refused. All is checked before anything is
written, each file and folder distill writes in OUT included (`nmt.atomic.own_file`: never a
symbolic link, a FIFO or a device); then OUT is locked (distill.lock): a second distill there
stops at once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from nmt import atomic
from nmt.api import Translator
from nmt.checkpoint import check_direction, has_checkpoints, load_model_checkpoint
from nmt.config import Config
from nmt.data import META_FILE
from nmt.device import resolve_device
from nmt.engine import sha256_of
from nmt.errors import NmtError
from nmt.evaluate import sentence_scores
from nmt.options import DistillOptions, PrepareOptions
from nmt.prepare import Split, find_splits, input_files, prepare_bpe
from nmt.textio import TextStats, open_bytes, read_lines
from nmt.training.trainer import TrainResult, train

log = logging.getLogger(__name__)

REPORT = "distill.json"
MANIFEST = "manifest.json"
LOCK = "distill.lock"
# of the manifest; 1 (in OUT/shards/) held the teachers' paths, not their content, 2 no engine
FORMAT_VERSION = 3
STEPS = ("translate", "select", "prepare")  # the manifest's records, each made from the one before
SMALL = 1 << 20  # the manifest and the reports distill reads are a few kB
# checked in this order; a pair is counted under the first that applies
FILTER_RULES = ("copy", "repeat")
REPEATS = 4  # a word n-gram this many times in a row makes a translation degenerate ...
MAX_NGRAM = 4  # ... for n-grams of 1 to this many words
# the options a record's keys come from, for messages; JSON's types, named
_OPTIONS = {
    "lines": "--trainpref",
    "shard_lines": "--shard-lines",
    "nbest": "--nbest",
    "beam": "--beam",
    "precision": "--precision",
    "engine": "--engine",
    "metric": "--select",
}
_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "true or false",
    int: "an integer",
    float: "a number",
    type(None): "null",
}
JsonObject = dict[str, Any]  # the manifest, a step's record in it, the report
_BUSY = (
    "another nmt distill (pid {pid}) is using this directory; wait for it to finish, stop it, or "
    "choose another --out"
)


class Job(NamedTuple):
    """A distillation checked before anything is written (`_checked`); its files in OUT first."""

    opts: DistillOptions
    out: Path
    shards: Path
    distilled: Path
    outputs: list[Path]  # the distilled text: train.SRC, train.TGT in `distilled`
    data: Path
    report: Path
    manifest: Path
    source: Path
    reference: Path
    lines: int
    paths: list[Path]  # the shards
    cfg: Config | None  # the student's
    records: dict[str, JsonObject]


# ------------------------------------------------------------------ the rule and the selection


def repeated_ngram(words: Sequence[str], times: int = REPEATS, max_n: int = MAX_NGRAM) -> bool:
    """Whether some n-gram of 1 to `max_n` words occurs `times` times in a row in `words`
    ("der der der der", "a b a b a b a b"). An n-gram repeated k times in a row is a stretch
    where word j equals word j + n for (k - 1) * n consecutive j."""
    for n in range(1, max_n + 1):
        need = (times - 1) * n
        run = 0
        for j in range(len(words) - n):
            run = run + 1 if words[j] == words[j + n] else 0
            if run >= need:
                return True
    return False


def degenerate(source: str, target: str) -> str | None:
    """Why the pair (source, the teacher's translation) is dropped, or None to keep it: "copy",
    the translation is the source itself (words compared, spaces aside); "repeat", a word or an
    n-gram of up to MAX_NGRAM words occurs REPEATS times in a row: the decoder looped. The other
    degenerate pairs are those of `prepare-bpe`'s filter (step 3): an empty side, a side too
    long or too short, a token-length ratio above 3."""
    words = target.split()
    if words and words == source.split():
        return "copy"
    return "repeat" if repeated_ngram(words) else None


def select_hypothesis(hyps: Sequence[str], reference: str, metric: str) -> int:
    """The index of the hypothesis with the best sentence `metric` score against `reference`
    (sacreBLEU's, `nmt.evaluate.sentence_scores`); on a tie the first, i.e. the one the
    teacher ranks higher. A single hypothesis (or none) is not scored."""
    if len(hyps) <= 1:
        return 0
    scores = sentence_scores(hyps, reference, metric)
    return max(range(len(hyps)), key=scores.__getitem__)


# ------------------------------------------------------------------ the command


def distill(opts: DistillOptions, progress: bool = False) -> TrainResult | None:
    """Run what is left of the steps (module docstring) in opts.out: the student's training result
    or None."""
    job = _checked(opts)
    todo = _plan(job)[1]
    # the teacher (--beam, --nbest, ...), where shards are left to translate: loaded now, so
    # that a setting it refuses (fp16 off CUDA) is refused before anything is written
    translator = Translator.from_options(opts.teacher_options()) if todo else None
    _make_directory(job.out)
    with atomic.lock_directory(job.out, LOCK, "the distillation's lock", _BUSY):
        atomic.clean_temporaries(job.out)
        manifest, todo = _plan(job)  # again under the lock: what another run did meanwhile counts
        if todo:
            if manifest.get("translate") != job.records["translate"]:
                # new shards: the later steps' records go with the old ones. Missing shards of the
                # same record keep them (issue 57: a run killed then left a manifest every rerun
                # refused)
                manifest = _save_manifest(job, manifest, "translate", job.records["translate"])
            translate_shards(
                translator or Translator.from_options(opts.teacher_options()),
                job,
                set(todo),
                progress,
            )
        else:
            log.info(
                "all %d shards of %s are translated (reusing them)", len(job.paths), job.shards
            )
        translator = None  # the teacher leaves memory before the student trains
        return _after_translation(job, manifest, progress)


def _checked(opts: DistillOptions) -> Job:
    """The checks that need no writing (the options, each text file there and each pair aligned,
    the student's config, each teacher a checkpoint, no output an input), then the hashes."""
    opts.check()
    out = Path(opts.out)
    shards, distilled, data = (out / name for name in ("shards", "distilled", "data-bin"))
    originals = opts.prepare_options(opts.trainpref, str(data))
    splits = find_splits(originals)
    source, reference = (splits[0].files[lang] for lang in (opts.source_lang, opts.target_lang))
    lines = splits[0].lines
    if lines == 0:
        raise NmtError(f"--trainpref {source}: no lines to translate")
    cfg = opts.student_config(out) if opts.config is not None else None
    for teacher in opts.teachers:
        try:
            model = load_model_checkpoint(teacher, mmap=True)
            check_direction(teacher, model.config, opts, "-s, -t")
            separate = model.tokenizer.source_vocab_size is not None
        except NmtError as e:
            raise NmtError(f"--teacher {e}") from None
        # the student has the teacher's vocabularies
        if separate and cfg is not None and cfg.model.share_embeddings:
            raise NmtError(
                f"--config {opts.config}: model.share_embeddings must be false: the source and "
                f"target vocabularies of {teacher} are separate"
            )
    if cfg is not None:
        _check_student_device(cfg)
    atomic.check_outputs(
        _inputs(opts, originals, splits),
        [
            atomic.FileArg("--out", path, what, directory=True)
            for path, what in (
                (shards, "the shards"),
                (distilled, "the distilled text"),
                (data, "the student's data"),
            )
        ],
    )
    paths = [shards / f"{k:05d}.{opts.target_lang}" for k in range(-(-lines // opts.shard_lines))]
    job = Job(
        opts,
        out,
        shards,
        distilled,
        [distilled / f"train.{lang}" for lang in (opts.source_lang, opts.target_lang)],
        data,
        out / REPORT,
        out / MANIFEST,
        source,
        reference,
        lines,
        paths,
        cfg,
        _records(opts, splits, lines),
    )
    _check_own_files(job)
    return job


def _check_student_device(cfg: Config) -> None:
    """The student's device (and fp16's need of CUDA), which `nmt train` checks only once it starts:
    after every shard is translated."""
    try:
        device = resolve_device(cfg.train.device)
    except NmtError as e:
        raise NmtError(f"the student's train.device: {e}") from None
    if cfg.train.precision == "fp16" and device.type != "cuda":
        raise NmtError("the student's train.precision fp16 needs a CUDA device; use bf16 on CPU")


def _check_own_files(job: Job) -> None:
    """Each file and folder distill writes in OUT, where it exists, is a regular file (a folder)
    and no symbolic link (`nmt.atomic.own_file`): a linked manifest, report or shard would be
    written through, onto the file it names; a FIFO shard would block for ever."""
    if not job.out.is_dir():
        return  # new, or not a folder (`_read_manifest` says so)
    folders = {
        job.shards: "the shards' folder",
        job.distilled: "the distilled text's folder",
        job.data: "the student's data",
    }
    if job.cfg is not None and Path(job.cfg.train.run_dir) == job.out / "run":
        folders[job.out / "run"] = "the student's run directory"
    for folder, what in folders.items():
        atomic.own_file(folder, what, directory=True)
    files = {
        job.out / LOCK: "the distillation's lock",
        job.manifest: "the distillation's manifest",
        job.report: "the distillation report",
    }
    files |= dict.fromkeys(job.paths, "a shard of translations")
    files |= dict.fromkeys(job.outputs, "the distilled text")
    for path, what in files.items():
        atomic.own_file(path, what)


def _inputs(
    opts: DistillOptions, prepare: PrepareOptions, splits: list[Split]
) -> list[atomic.FileArg]:
    """What distill reads: what prepare-bpe reads (the text files, the first teacher), the other
    teachers, the student's config."""
    inputs = [
        arg._replace(option="--teacher", what="the teacher")
        if arg.option == "--tokenizer-from"
        else arg
        for arg in input_files(prepare, splits)
    ]
    inputs += [atomic.FileArg("--teacher", path, "a teacher") for path in opts.teachers[1:]]
    if opts.config is not None:
        inputs.append(atomic.FileArg("--config", opts.config, "the student's config"))
    return inputs


def _after_translation(job: Job, manifest: JsonObject, progress: bool) -> TrainResult | None:
    """Steps 2 to 4, each made again where its record in the manifest is not this run's."""
    opts = job.opts
    records = job.records
    report = _json_of(job.report, "the distillation report")  # not an object: written again
    report = report if isinstance(report, dict) else {}
    new_pairs = manifest.get("select") != records["select"]
    if (
        new_pairs
        or not isinstance(report.get("filter"), dict)
        or not all(p.is_file() for p in job.outputs)
    ):
        if new_pairs:  # the student's data goes with the pairs
            manifest = _save_manifest(job, manifest, "select", None)
        report = {
            "format_version": 1,
            "teachers": [str(t) for t in opts.teachers],
            "source": str(job.source),
            "reference": str(job.reference),
            "lines": job.lines,
            "shards": {
                "count": len(job.paths),
                "shard_lines": opts.shard_lines,
                "dir": str(job.shards),
            },
            **select_and_filter(job),
        }
        _write_json(job.report, report, "the distillation report")
        manifest = _save_manifest(job, manifest, "select", records["select"])
    else:
        log.info("reusing %s (the selected and filtered pairs)", job.distilled)
    try:  # prepare-bpe's counts, or it prepares again
        split = _json_of(job.data / META_FILE, "the student's data report")["splits"]["train"]
        prepared: JsonObject | None = {"kept": split["kept"], "dropped": split["dropped"]}
    except (LookupError, TypeError):
        prepared = None
    if prepared is None or manifest.get("prepare") != records["prepare"]:
        prepared = prepare_bpe(
            opts.prepare_options(str(job.distilled / "train"), str(job.data), force=True),
            progress=progress,
        )["splits"]["train"]
        _save_manifest(job, manifest, "prepare", records["prepare"])
    else:
        log.info("reusing %s (the student's data)", job.data)
    report["prepare"] = {
        "data": str(job.data),
        "kept": prepared["kept"],
        "dropped": prepared["dropped"],
    }
    _write_json(job.report, report, "the distillation report")
    if job.cfg is None:
        log.info(
            "no --config: the student is not trained; train it on %s, e.g. nmt train "
            "configs/student.yaml --set data.dir=%s",
            job.data,
            job.data,
        )
        return None
    result = train(job.cfg)
    report["train"] = {
        "run_dir": job.cfg.train.run_dir,
        "update": result.update,
        "reason": result.reason,
    }
    _write_json(job.report, report, "the distillation report")
    return result


# ------------------------------------------------------------------ the manifest


def _records(opts: DistillOptions, splits: list[Split], lines: int) -> dict[str, JsonObject]:
    """What each step's output is made from: the files by their content (a text moved elsewhere
    resumes), each teacher hashed once per run; the reference only where there is a choice."""
    choice = opts.nbest > 1
    return {
        "translate": {
            "source_sha256": sha256_of(open_bytes(splits[0].files[opts.source_lang])),
            "lines": lines,
            "shard_lines": opts.shard_lines,
            "nbest": opts.nbest,
            "beam": opts.beam,
            "precision": opts.precision,
            "engine": opts.engine,
            "teachers_sha256": [
                sha256_of(atomic.open_for_reading(t, "the teacher", None)) for t in opts.teachers
            ],
        },
        "select": {
            "metric": opts.select if choice else None,
            "reference_sha256": sha256_of(open_bytes(splits[0].files[opts.target_lang]))
            if choice
            else None,
            "repeats": REPEATS,
            "max_ngram": MAX_NGRAM,
        },
        "prepare": {
            "splits": [
                [split.name, *(sha256_of(open_bytes(f)) for f in split.files.values())]
                for split in splits[1:]
            ]
        },
    }


def _plan(job: Job) -> tuple[JsonObject, list[int]]:
    """OUT's manifest ({} where new) and the shards left to translate. Finished shards of another
    teacher, text or setting are refused, never mixed; so is a student (the config's run
    directory) of other pairs: `nmt train` would refuse it, but after its pairs were replaced."""
    known = _read_manifest(job)
    records = job.records
    old = known.get("translate")
    done = [path.is_file() for path in job.paths]
    if old is not None and old != records["translate"] and any(done):
        raise NmtError(
            f"{job.shards}: translated with {_difference(job, 'translate', old)}; run again with "
            f"the same text, teachers and settings, or delete {job.shards} to translate again"
        )
    changed = next((step for step in STEPS[:2] if known.get(step) != records[step]), None)
    if changed is not None and job.cfg is not None and has_checkpoints(job.cfg.train.run_dir):
        raise NmtError(
            f"{job.cfg.train.run_dir}: holds a student of other distilled pairs than these "
            f"({_difference(job, changed, known.get(changed))}); move it away, or --set "
            "train.run_dir=ANOTHER, to train one on these"
        )
    return known, [
        k for k, finished in enumerate(done) if not finished or old != records["translate"]
    ]


def _difference(job: Job, step: str, old: JsonObject | None) -> str:
    """The first key where `step`'s record in the manifest (`old`) differs, as options name it."""
    new = job.records[step]
    if old is None:
        return f"no record of them in {job.manifest}"
    key = next(k for k in new if old[k] != new[k])
    before = old[key]
    now = new[key]
    if key == "teachers_sha256":
        changed = [teacher for teacher, a, b in zip(job.opts.teachers, before, now) if a != b]
        return (
            f"another teacher than --teacher {changed[0]} (its content differs)"
            if len(before) == len(now)
            else f"{len(before)} --teacher (now {len(now)})"
        )
    texts = {
        "source_sha256": job.source,
        "reference_sha256": job.reference,
        "splits": "--validpref/--testpref",
    }
    if key in texts:
        return f"another text than {texts[key]} (its content differs)"
    before, now = ("the teacher's" if value is None else value for value in (before, now))
    return f"{_OPTIONS.get(key, key)} {before} (now {now})"


def _read_manifest(job: Job) -> JsonObject:
    """OUT/manifest.json, checked; {} where OUT is new or holds only a killed run's lock and
    temporaries. Anything else is refused: distill writes only where it has written before."""
    if job.out.exists() and not job.out.is_dir():
        raise NmtError(f"--out {job.out}: exists and is not a directory")
    try:
        known = json.loads(atomic.read_regular(job.manifest, "the distillation's manifest", SMALL))
    except FileNotFoundError:
        if job.out.is_dir() and any(
            e.name != LOCK and not atomic.TEMPORARY.fullmatch(e.name) for e in job.out.iterdir()
        ):
            raise NmtError(
                f"--out {job.out}: not empty and not an nmt distill directory (no {MANIFEST}); "
                "choose a new or empty directory"
            ) from None
        return {}
    except (ValueError, RecursionError) as e:
        raise NmtError(
            f"{job.manifest}: not JSON ({e}); move {job.out} away to start again"
        ) from None
    if (problem := _manifest_problem(known, job.records)) is not None:
        raise NmtError(
            f"{job.manifest}: {problem}: not a manifest of this nmt distill; move {job.out} away "
            "to start again"
        )
    return known


def _manifest_problem(known: Any, records: dict[str, JsonObject]) -> str | None:
    """What in `known` (a parsed manifest) is not as distill writes it, naming the key, or None:
    each step's record holds this run's keys, each of its type (or null), and no others."""
    if not isinstance(known, dict):
        return f"{_KINDS[type(known)]} where an object belongs"
    if known.get("format_version") != FORMAT_VERSION:
        return f"format_version is not {FORMAT_VERSION}"
    for step in (step for step in STEPS if step in known):
        if not isinstance(known[step], dict):
            return f"{step} is {_KINDS[type(known[step])]} where an object belongs"
        if unknown := [key for key in known[step] if key not in records[step]]:
            return f"{step}.{unknown[0]} is not a key of it"
        for key, value in records[step].items():
            theirs = known[step].get(key)
            if (
                key not in known[step]
                or None not in (theirs, value)
                and type(theirs) is not type(value)
            ):
                found = _KINDS[type(theirs)] if key in known[step] else "missing"
                return f"{step}.{key} is {found} where {_KINDS[type(value)]} belongs"
    return None


def _save_manifest(job: Job, manifest: JsonObject, step: str, record: Any) -> JsonObject:
    """`manifest` with `step`'s record (None: none) and none of the later steps' (made from its
    output), written whole."""
    later = STEPS[STEPS.index(step) :]
    kept = {
        "format_version": FORMAT_VERSION,
        **{k: v for k, v in manifest.items() if k not in later},
        **({step: record} if record is not None else {}),
    }
    _write_json(job.manifest, kept, "the distillation's manifest")
    return kept


# ------------------------------------------------------------------ step 1: the shards


def _line_name(source: Path, first: int, i: int) -> str:
    return f"{source}:{first + i}"  # FILE:LINE of line i of a shard whose first line is `first`


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(lines, size)):
        yield chunk


def translate_shards(translator: Translator, job: Job, todo: set[int], progress: bool) -> None:
    """Translate shard k of the source (lines k * shard_lines ...) to job.paths[k] for each k in
    `todo`, each written whole when it is done; a killed run's partial shard is removed."""
    source = job.source
    lines = job.lines
    paths = job.paths
    size = job.opts.shard_lines
    _make_directory(job.shards)
    atomic.clean_temporaries(job.shards)
    done = sum(min(size, lines - k * size) for k in range(len(paths)) if k not in todo)
    say = log.debug if progress else log.info
    with tqdm(
        total=lines,
        initial=done,
        unit="line",
        desc="translate",
        dynamic_ncols=True,
        disable=None if progress else True,
    ) as bar:
        for k, chunk in enumerate(
            _chunks(read_lines(source, TextStats(str(source), log_each=True)), size)
        ):
            if k not in todo:
                continue
            start = time.time()
            first = k * size
            hyps = translator.translate_nbest(
                chunk,
                job.opts.nbest,
                where=partial(_line_name, source, first + 1),
                first_index=first,
            )
            text = "".join("\t".join(h.text for h in hs) + "\n" for hs in hyps)
            atomic.atomic_write_bytes(
                text.encode("utf-8"), paths[k], "a shard of translations", own=True
            )
            bar.update(len(chunk))
            say(
                "%s: lines %d-%d of %d translated in %.1f s",
                paths[k],
                first + 1,
                first + len(chunk),
                lines,
                time.time() - start,
            )


# ------------------------------------------------------------------ step 2: select and filter


def select_and_filter(job: Job) -> JsonObject:
    """The distilled pairs: per source line its selected hypothesis (of job.paths, the shards),
    unless `degenerate`; written to job.outputs (source, target), each whole. Returns the report's
    sections."""
    opts = job.opts
    _make_directory(job.distilled)
    dropped = dict.fromkeys(FILTER_RULES, 0)
    changed = kept = 0
    sources, references = (
        _chunks(read_lines(f), opts.shard_lines) for f in (job.source, job.reference)
    )
    with (
        atomic.replacing(job.outputs[0], "the distilled source", own=True) as tmp_src,
        atomic.replacing(job.outputs[1], "the distilled target", own=True) as tmp_tgt,
        open(tmp_src, "xb", buffering=0) as out_src,
        open(tmp_tgt, "xb", buffering=0) as out_tgt,
    ):
        for path, srcs, refs in zip(job.paths, sources, references, strict=True):
            shard = list(read_lines(path))
            if len(shard) != len(srcs):
                raise NmtError(
                    f"{path}: {len(shard)} lines where its {len(srcs)} source lines need one each; "
                    "delete it to translate it again"
                )
            pairs = []
            for src, ref, line in zip(srcs, refs, shard, strict=True):
                hyps = line.split("\t")  # an empty line: one empty hypothesis
                best = select_hypothesis(hyps, ref, opts.select)
                changed += best != 0
                reason = degenerate(src, hyps[best])
                if reason is None:
                    pairs.append((src, hyps[best]))
                else:
                    dropped[reason] += 1
            kept += len(pairs)
            for side, out in enumerate((out_src, out_tgt)):
                atomic.write_all(
                    out.fileno(), "".join(pair[side] + "\n" for pair in pairs).encode("utf-8")
                )
        for out in (out_src, out_tgt):
            os.fsync(out.fileno())
    total = kept + sum(dropped.values())
    log.info(
        "distilled %d pairs into %s: kept %d%s",
        total,
        job.distilled,
        kept,
        "".join(f", {n} dropped as {why}" for why, n in dropped.items() if n),
    )
    return {
        "select": {"nbest": opts.nbest, "metric": opts.select, "not_the_teachers_best": changed},
        "filter": {
            "pairs": total,
            "kept": kept,
            "dropped": dropped,
            "files": [str(p) for p in job.outputs],
        },
    }


# ------------------------------------------------------------------ files


def _json_of(path: Path, what: str) -> Any:
    """The JSON in `path` (a regular file), or None where there is none or it is not JSON."""
    try:
        return json.loads(atomic.read_regular(path, what, SMALL))
    except (FileNotFoundError, ValueError, RecursionError):
        return None


def _make_directory(path: Path) -> None:
    with atomic.os_errors_as(path, "cannot create it"):
        path.mkdir(parents=True, exist_ok=True)


def _write_json(path: Path, obj: JsonObject, what: str) -> None:
    """`obj` in `path`, written whole; left as it is where it holds `obj` already (a rerun)."""
    if _json_of(path, what) != obj:
        atomic.atomic_write_bytes(
            (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
            path,
            what,
            own=True,
        )
