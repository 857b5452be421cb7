"""Scoring with sacreBLEU (BLEU, chrF, TER, each with its signature) and named test sets.

The only module that imports sacrebleu. Scores are sacreBLEU's own, on detokenized text,
so they are comparable with published numbers; the signature says how they were computed.
"""

from __future__ import annotations

import difflib
import functools
import json as jsonlib
import os
import re
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF, TER

from nmt import textio
from nmt.atomic import FileArg, check_outputs
from nmt.errors import NmtError, one_line
from nmt.options import SENTENCE_METRICS, ScoreOptions

METRICS = ("bleu", "chrf", "ter")
DOWNLOAD_TIMEOUT_S = 60  # per socket operation; sacreBLEU's urlopen has none of its own


@dataclass(frozen=True)
class MetricResult:
    name: str  # "bleu", "chrf" or "ter"
    score: float
    signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    text: str  # sacreBLEU's line, e.g. "BLEU = 27.31 59.6/33.1/20.1/13.2 (BP = 1.000 ...)"


def _metric(name: str, tokenize: str | None, lowercase: bool) -> BLEU | CHRF | TER:
    if name == "bleu":
        if tokenize is not None and tokenize not in BLEU.TOKENIZERS:
            choices = ", ".join(sorted(BLEU.TOKENIZERS))
            raise NmtError(f"unknown BLEU tokenizer {tokenize!r} (choices: {choices})")
        try:
            return BLEU(tokenize=tokenize, lowercase=lowercase)
        except RuntimeError as exc:  # "ja-mecab" / "ko-mecab" without sacrebleu[ja] / [ko]
            raise NmtError(f"BLEU tokenizer {tokenize}: {one_line(exc, 1000)}") from exc
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "ter":  # sacreBLEU's TER is case-insensitive by default; we keep its default
        return TER()
    raise NmtError(f"unknown metric {name!r} (choices: {', '.join(METRICS)})")


def score_corpus(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf"),
    *,
    tokenize: str | None = None,
    lowercase: bool = False,
    names: Sequence[str] | None = None,
    hyp_name: str = "hypotheses",
) -> list[MetricResult]:
    """Score detokenized hypotheses against one or more reference streams.

    `refs[i]` is the i-th reference stream (one line per hypothesis), as in sacreBLEU.
    `tokenize` is BLEU's tokenizer (None = sacreBLEU's default, 13a; e.g. "intl", "zh").
    `names` (one per reference stream) and `hyp_name` make errors name the files.
    """
    if isinstance(refs, str) or any(
        isinstance(stream, str) or (len(stream) and not isinstance(stream[0], str))
        for stream in refs
    ):
        raise TypeError("refs must be a list of reference streams, each a list of lines")
    metrics = [m.lower() for m in ([metrics] if isinstance(metrics, str) else metrics)]
    metric_objects = [_metric(name, tokenize, lowercase) for name in metrics]
    if not refs:
        raise NmtError("scoring needs at least one reference stream")
    names = [f"reference {i + 1}" for i in range(len(refs))] if names is None else names
    if not hyps:
        raise NmtError(f"{hyp_name}: nothing to score (0 lines)")
    for ref_name, stream in zip(names, refs, strict=True):
        if len(stream) != len(hyps):
            raise NmtError(f"{hyp_name} has {len(hyps)} lines but {ref_name} has {len(stream)}")
    hyp_lines = list(hyps)
    ref_lines = [list(stream) for stream in refs]
    scores = [metric.corpus_score(hyp_lines, ref_lines) for metric in metric_objects]
    return [
        MetricResult(name, float(score.score), metric.get_signature().format(), score.format())
        for name, metric, score in zip(metrics, metric_objects, scores, strict=True)
    ]


def corpus_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """BLEU with sacreBLEU's defaults, e.g. for validation; `refs` is a list of streams
    (`corpus_bleu(hyps, [refs])` for one reference), as in `sacrebleu.corpus_bleu`."""
    return score_corpus(hyps, refs, ("bleu",))[0].score


def sentence_scores(hyps: Sequence[str], ref: str, metric: str = "chrf") -> list[float]:
    """sacreBLEU's sentence-level score of each hypothesis against one reference: chrF
    (`sacrebleu.sentence_chrf`) or BLEU with effective order (`sacrebleu.sentence_bleu`, as
    sacreBLEU recommends for single sentences)."""
    if metric not in SENTENCE_METRICS:
        raise NmtError(
            f"unknown sentence metric {metric!r} (choices: {', '.join(SENTENCE_METRICS)})"
        )
    scorer = _sentence_metric(metric)
    return [float(scorer.sentence_score(h, [ref]).score) for h in hyps]


@functools.cache
def _sentence_metric(metric: str) -> BLEU | CHRF:
    return CHRF() if metric == "chrf" else BLEU(effective_order=True)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a text file (plain or .gz), read as every `nmt` command reads raw text
    (`nmt.textio`): split on "\\n" only, invalid UTF-8 replaced, each cleaned line logged."""
    return list(textio.read_lines(path, textio.TextStats(str(path), log_each=True)))


def format_results(results: Sequence[MetricResult], json: bool = False) -> str:
    """`nmt score` output: sacreBLEU's line and the signature per metric, or a JSON list."""
    if json:
        return jsonlib.dumps([asdict(r) for r in results], indent=2, ensure_ascii=False)
    return "\n".join(f"{r.text}\n  signature: {r.signature}" for r in results)


# ------------------------------------------------------------------ named test sets


def load_test_set(name: str, langpair: str) -> tuple[list[str], list[list[str]]]:
    """Sources and reference streams of a sacreBLEU test set, e.g. ("wmt14", "en-de").

    sacreBLEU downloads the set into $SACREBLEU (default ~/.sacrebleu) on first use; when
    that fails (offline), the error says which files to put where.
    """
    dataset = sacrebleu.DATASETS.get(name)
    if dataset is None:
        close = difflib.get_close_matches(name, sacrebleu.DATASETS, n=6, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see `sacrebleu --list`"
        raise NmtError(f"unknown test set {name!r} ({hint})")
    if langpair not in dataset.langpairs:
        raise NmtError(
            f"test set {name} has no language pair {langpair!r} (choices: "
            f"{', '.join(sorted(dataset.langpairs))})"
        )
    previous_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        source_file = dataset.get_source_file(langpair)
        ref_files = dataset.get_reference_files(langpair)
    except (Exception, SystemExit) as exc:  # sacreBLEU calls sys.exit on a bad download
        raise NmtError(_placement_hint(dataset, langpair, exc)) from exc
    finally:
        socket.setdefaulttimeout(previous_timeout)
    return read_lines(source_file), [read_lines(path) for path in ref_files]


def _placement_hint(dataset, langpair: str, exc: BaseException) -> str:
    """Where sacreBLEU looks for the raw files of `dataset`, from its own metadata."""
    raw_dir = Path(dataset._rawdir)  # $SACREBLEU/<name>/raw, fixed when sacrebleu is imported
    archives = [f"{url} to {raw_dir / dataset._get_tarball_filename(url)}" for url in dataset.data]
    entries = dataset.langpairs[langpair]
    entries = [entries["path"]] if isinstance(entries, dict) else entries
    # TSV sets prefix a column number ("2:MTNT/test.tsv")
    files = dict.fromkeys(re.sub(r"^\d+:", "", entry) for entry in entries)
    reason = (
        "download failed; sacreBLEU logged why"
        if isinstance(exc, SystemExit)
        else one_line(exc, 1000)
    )
    paths = ", ".join(str(raw_dir / f) for f in files)
    return (
        f"{dataset.name}/{langpair}: sacreBLEU could not get the test set ({reason}); to install "
        f"it by hand, download {' and '.join(archives)}, then unpack "
        f"{'them' if len(archives) > 1 else 'it'} in {raw_dir} so that {paths} "
        f"{'exists' if len(files) == 1 else 'exist'}; the SACREBLEU environment variable moves the "
        f"test-set directory (now {os.path.dirname(dataset._outdir)})"
    )


def score_command(opts: ScoreOptions) -> str:
    """`nmt score`: the hypotheses of --hyp or standard input against reference files or a
    sacreBLEU test set, formatted (text or JSON)."""
    if opts.hyp is None and sys.stdin is None:
        raise NmtError("standard input is closed; give --hyp FILE")
    if (not opts.ref) == (opts.test_set is None):
        raise NmtError("give either --ref FILE or --test-set NAME --langpair XX-YY")
    metrics = tuple(dict.fromkeys(m.strip().lower() for m in opts.metrics.split(",") if m.strip()))
    if not metrics:
        raise NmtError(f"--metrics {opts.metrics!r}: give at least one of {', '.join(METRICS)}")
    reads = [FileArg("--ref", path, "a reference") for path in opts.ref]
    reads.append(
        FileArg("--hyp", opts.hyp, "the hypotheses")
        if opts.hyp is not None
        else FileArg("standard input", 0, "the hypotheses")
    )
    check_outputs(reads, [FileArg("standard output", 1, "the scores")])
    if opts.test_set is not None:
        if not opts.langpair:
            raise NmtError("--test-set needs --langpair, e.g. --langpair en-de")
        _, ref_streams = load_test_set(opts.test_set, opts.langpair)
        names = [f"{opts.test_set}:{opts.langpair}"] * len(ref_streams)
    else:
        ref_streams = [read_lines(p) for p in opts.ref]
        names = [str(p) for p in opts.ref]
    hyps = (
        read_lines(opts.hyp)
        if opts.hyp is not None
        else list(textio.iter_lines(sys.stdin.buffer, textio.TextStats("<stdin>", log_each=True)))
    )
    results = score_corpus(
        hyps,
        ref_streams,
        metrics=metrics,
        tokenize=opts.tokenize,
        lowercase=opts.lowercase,
        names=names,
        hyp_name=str(opts.hyp) if opts.hyp is not None else "<stdin>",
    )
    return format_results(results, json=opts.json)
