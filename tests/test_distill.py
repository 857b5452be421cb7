"""`nmt distill` (issue 28): a teacher's translations of the training data, resumable in shards,
n-best selection by sentence chrF, the degenerate-pair rule, the student's data with the
teacher's vocabulary and the student's training, all through the real command line.

The teacher is the `trained_checkpoint` fixture (it ends its outputs on its own, so it
translates real sentences to real lengths); the training text is the first LINES pairs of
`raw_corpus`, in shards of SHARD lines. Where a test is about what distill does with the
teacher's outputs rather than about the teacher, `Translator.translate_nbest` is replaced by
hand-written outputs (no decoding).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sacrebleu
from helpers import (
    ROOT,
    TINY,
    assert_one_line,
    dead_pid,
    distill_command,
    first_train_pairs,
    last_error_line,
    nmt_here,
    one_error_line,
    save_random_model,
    write_parallel,
)

from nmt.api import Translation, Translator
from nmt.checkpoint import load_model_checkpoint
from nmt.config import config_to_dict, load_config
from nmt.distill import FILTER_RULES, MAX_NGRAM, degenerate, repeated_ngram, select_hypothesis

pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # cli.main sets logging, train and translate torch's threads

LINES, SHARD = 90, 30
STUDENT = [
    "--config",
    str(TINY),
    "--set",
    "train.max_updates=3",
    "--set",
    "train.device=cpu",
    "--set",
    "train.threads=1",
]


@pytest.fixture(scope="module")
def corpus(raw_corpus: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train.en / train.de: the first LINES pairs of raw_corpus's train split."""
    return first_train_pairs(raw_corpus, tmp_path_factory.mktemp("distill_corpus"), LINES)


def distill_args(teacher: Path, corpus: Path, raw_corpus: Any, out: Path, *extra: str) -> list[str]:
    return distill_command(teacher, corpus, raw_corpus, out, *extra, shard=SHARD)


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def shard_files(out: Path) -> list[Path]:
    return [out / "shards" / f"{k:05d}.de" for k in range(-(-LINES // SHARD))]


def stamps(paths: list[Path]) -> list[tuple[int, int]]:
    """Inode and modification time of each file: a file written again (atomically: a new
    inode) or touched shows."""
    return [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths]


def spy(
    monkeypatch: pytest.MonkeyPatch,
    *,
    fail_at: int | None = None,
    outputs: Callable[[int, str], str | list[str]] | None = None,
    during: Callable[[], None] | None = None,
) -> list[int]:
    """Record the first line (first_index) of each translate_nbest call; with `fail_at`, the
    call of that number raises KeyboardInterrupt (Ctrl-C) before translating; with
    `outputs`, the translation of line i (0-based) of text t is outputs(i, t) (or its n-best
    list), undecoded; `during` runs in the first call, while a shard is being translated."""
    calls: list[int] = []
    real = Translator.translate_nbest

    def translate_nbest(
        self: Translator, texts: list[str], nbest: int = 1, **kw: Any
    ) -> list[list[Translation]]:
        calls.append(kw.get("first_index", 0))
        if during is not None and len(calls) == 1:
            during()
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt
        if outputs is not None:
            first = kw.get("first_index", 0)
            given = [outputs(first + i, t) for i, t in enumerate(texts)]
            return [
                [Translation(h, 0.0, 0.0) for h in ([g] if isinstance(g, str) else g)]
                if t.strip()
                else []
                for g, t in zip(given, texts, strict=True)
            ]
        return real(self, texts, nbest, **kw)

    monkeypatch.setattr(Translator, "translate_nbest", translate_nbest)
    return calls


def expected_pairs(sources: list[str], targets: list[str]) -> tuple[list[str], list[str]]:
    kept = [(s, t) for s, t in zip(sources, targets, strict=True) if degenerate(s, t) is None]
    return [s for s, _ in kept], [t for _, t in kept]


# ------------------------------------------------------------------ end to end


def test_distillation_end_to_end_through_the_cli(
    trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch
):
    """The teacher's beam translations become the student's targets (degenerate pairs aside),
    prepared with the teacher's own sentencepiece model, and a student trains on them: an
    ordinary checkpoint that translates. Running the command again translates nothing,
    rewrites none of the steps' files, and the finished student stays finished."""
    out = tmp_path / "d"
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out, *STUDENT)) == 0

    sources = lines_of(corpus / "train.en")
    teacher = Translator.load(trained_checkpoint, threads=1).translate(sources)
    shards = shard_files(out)
    assert [line for p in shards for line in lines_of(p)] == teacher
    assert all(len(lines_of(p)) == SHARD for p in shards)
    kept_src, kept_tgt = expected_pairs(sources, teacher)
    assert lines_of(out / "distilled/train.en") == kept_src
    assert lines_of(out / "distilled/train.de") == kept_tgt

    data = out / "data-bin"
    assert (data / "spm.model").read_bytes() == load_model_checkpoint(
        trained_checkpoint
    ).tokenizer.model_bytes
    prepared = json.loads((data / "prepare.json").read_text())
    assert prepared["splits"]["train"]["lines"] == len(kept_src)
    assert prepared["splits"]["valid"]["lines"] == len(
        raw_corpus.lines("val", "en")
    )  # the original, untranslated

    report = json.loads((out / "distill.json").read_text())
    assert report["lines"] == LINES and report["shards"]["count"] == len(shards)
    assert report["filter"]["kept"] == len(kept_src)
    assert report["filter"]["kept"] + sum(report["filter"]["dropped"].values()) == LINES
    assert set(report["filter"]["dropped"]) == set(FILTER_RULES)
    assert report["prepare"]["kept"] == prepared["splits"]["train"]["kept"]
    assert report["train"]["update"] == 3

    student = out / "run/checkpoint_last.pt"
    loaded = load_model_checkpoint(student)
    assert loaded.config.model == load_config(TINY).model
    assert loaded.tokenizer.sha256 == load_model_checkpoint(trained_checkpoint).tokenizer.sha256
    assert isinstance(Translator.load(student, threads=1).translate([sources[0]])[0], str)

    files = [
        *shards,
        out / "distilled/train.en",
        out / "distilled/train.de",
        data / "prepare.json",
        student,
    ]
    before = stamps(files)
    calls = spy(monkeypatch)
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out, *STUDENT)) == 0
    assert calls == [] and stamps(files) == before
    assert json.loads((out / "distill.json").read_text())["train"]["update"] == 3


def test_a_killed_distillation_resumes_without_translating_finished_shards(
    trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch
):
    """Ctrl-C while the third shard is being translated: the first two are on disk, whole, and
    nothing else; a killed writer's temporary is there too (kill -9). The rerun translates
    the third shard only, leaves the first two as they were (same inode, same mtime), removes
    the temporary, and ends with the data of a run that was never interrupted."""
    out, whole = tmp_path / "killed", tmp_path / "whole"
    calls = spy(monkeypatch, fail_at=3)
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 130
    shards = shard_files(out)
    assert calls == [0, SHARD, 2 * SHARD]
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(
        [shards[0].name, shards[1].name]
    )
    assert sorted(p.name for p in out.iterdir()) == ["distill.lock", "manifest.json", "shards"]
    assert not (out / "distilled").exists() and not (out / "data-bin").exists()
    leftover = out / "shards" / f".{shards[2].name}.tmp-{dead_pid()}-0123abcd"
    leftover.write_text("half a shard\n")
    finished = stamps(shards[:2])

    calls = spy(monkeypatch)
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 0
    assert calls == [2 * SHARD]
    assert stamps(shards[:2]) == finished
    assert not leftover.exists()

    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, whole)) == 0
    for name in [
        *(f"shards/{p.name}" for p in shards),
        "distilled/train.en",
        "distilled/train.de",
        "data-bin/train.en.bin",
        "data-bin/train.de.bin",
        "data-bin/train.de.idx",
    ]:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    report, reference = (json.loads((d / "distill.json").read_text()) for d in (out, whole))
    assert report["filter"] == {**reference["filter"], "files": report["filter"]["files"]}
    assert report["prepare"]["kept"] == reference["prepare"]["kept"]


def test_several_teachers_translate_as_an_ensemble(
    trained_checkpoint, corpus, raw_corpus, tmp_path
):
    """--teacher twice: the shards are the ensemble's translations (Translator with both
    checkpoints), the student's vocabulary the first one's; the manifest holds each teacher's
    content hash, in order."""
    other = tmp_path / "other.pt"
    other.write_bytes(trained_checkpoint.read_bytes())
    out = tmp_path / "ensemble"
    assert (
        nmt_here(
            *distill_args(trained_checkpoint, corpus, raw_corpus, out, "--teacher", str(other))
        )
        == 0
    )
    sources = lines_of(corpus / "train.en")
    ensemble = Translator.load([trained_checkpoint, other], threads=1).translate(sources)
    assert [line for p in shard_files(out) for line in lines_of(p)] == ensemble
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["translate"]["teachers_sha256"] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in (trained_checkpoint, other)
    ]


# ------------------------------------------------------------------ n-best selection


def test_select_hypothesis_is_sacrebleus_best_sentence_score():
    ref = "Ein Mann fährt mit einem roten Fahrrad die Straße entlang."
    hyps = [
        "Ein Mann fährt Fahrrad.",
        "Ein Mann fährt auf einem roten Fahrrad eine Straße entlang.",
        "Mann",
        "Ein Mann mit einem Fahrrad.",
    ]
    chrf = [sacrebleu.sentence_chrf(h, [ref]).score for h in hyps]
    assert select_hypothesis(hyps, ref, "chrf") == chrf.index(max(chrf)) != 0
    bleu = [sacrebleu.sentence_bleu(h, [ref]).score for h in hyps]
    assert select_hypothesis(hyps, ref, "bleu") == bleu.index(max(bleu))
    assert (
        select_hypothesis(["Ein Hund.", "Ein Hund."], "Eine Katze.", "chrf") == 0
    )  # a tie: the teacher's order
    assert select_hypothesis(["anything"], ref, "chrf") == 0


def test_nbest_keeps_the_hypothesis_with_the_best_sentence_chrf(
    trained_checkpoint, corpus, raw_corpus, tmp_path
):
    """With --nbest 3, the shards hold the teacher's 3 best (tab-separated, best first) and the
    student's target is, per sentence, the one with the highest sacreBLEU sentence chrF against
    the reference (the first on a tie); here that is not always the teacher's best."""
    out = tmp_path / "nbest"
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out, "--nbest", "3")) == 0
    sources, refs = lines_of(corpus / "train.en"), lines_of(corpus / "train.de")
    nbest = Translator.load(trained_checkpoint, threads=1).translate_nbest(sources, 3)
    assert [line.split("\t") for p in shard_files(out) for line in lines_of(p)] == [
        [h.text for h in hs] for hs in nbest
    ]
    chosen = []
    for hs, ref in zip(nbest, refs, strict=True):
        scores = [sacrebleu.sentence_chrf(h.text, [ref]).score for h in hs]
        chosen.append(scores.index(max(scores)))
    assert any(chosen)
    kept_src, kept_tgt = expected_pairs(
        sources, [hs[k].text for hs, k in zip(nbest, chosen, strict=True)]
    )
    assert lines_of(out / "distilled/train.en") == kept_src
    assert lines_of(out / "distilled/train.de") == kept_tgt
    report = json.loads((out / "distill.json").read_text())
    assert report["select"] == {
        "nbest": 3,
        "metric": "chrf",
        "not_the_teachers_best": sum(k != 0 for k in chosen),
    }


# ------------------------------------------------------------------ the degenerate-pair rule


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        ("A dog runs.", "A dog runs.", "copy"),
        ("A dog  runs. ", " A dog runs.", "copy"),  # spaces aside
        ("Hello", "Hello", "copy"),
        ("A dog runs.", "a dog runs.", None),  # not the same words
        ("A dog.", "Ein Hund Hund Hund Hund läuft.", "repeat"),
        ("A dog.", "Ein Hund Hund Hund läuft.", None),  # 3 times
        ("A dog.", "x a b a b a b a b y", "repeat"),
        ("A dog.", "x a b a b a b a y", None),
        ("A dog.", " ".join(["a b c d"] * 4), "repeat"),
        ("A dog.", " ".join(["a b c d e"] * 4), None),  # a 5-gram: longer than MAX_NGRAM
        ("A dog.", "", None),  # empty: prepare-bpe's rule
    ],
)
def test_the_degenerate_rule(source, target, reason):
    assert degenerate(source, target) == reason


def test_repeated_ngram_counts_runs_not_occurrences():
    assert repeated_ngram("a b a c a d a e".split()) is False  # 4 a's, never in a row
    assert repeated_ngram(["x"] * 4) is True and repeated_ngram(["x"] * 3) is False
    assert repeated_ngram(("p q " * 4).split(), times=4, max_n=1) is False  # bigrams not looked for
    assert MAX_NGRAM == 4


def test_the_filter_drops_what_it_says(
    trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch
):
    """Hand-made teacher outputs, one kind per line in turn: a copy of the source, a looping
    translation, an empty one, one far too long, the reference. distill drops the copies and
    the loops and counts them; prepare-bpe's own filter drops the empty and the long ones (its
    counts in distill.json too); the references pass both."""
    sources, refs = lines_of(corpus / "train.en"), lines_of(corpus / "train.de")
    long_ = [" ".join(f"w{j}x" for j in range(12 * len(s.split()))) for s in sources]
    kinds = [
        lambda i, s: s,
        lambda i, s: "der der der der Hund",
        lambda i, s: "",
        lambda i, s: long_[i],
        lambda i, s: refs[i],
    ]
    spy(monkeypatch, outputs=lambda i, s: kinds[i % 5](i, s))
    out = tmp_path / "filter"
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 0
    count = {k: len(range(k, LINES, 5)) for k in range(5)}
    report = json.loads((out / "distill.json").read_text())
    assert report["filter"]["dropped"] == {"copy": count[0], "repeat": count[1]}
    assert lines_of(out / "distilled/train.en") == [s for i, s in enumerate(sources) if i % 5 > 1]
    assert lines_of(out / "distilled/train.de") == [
        kinds[i % 5](i, s) for i, s in enumerate(sources) if i % 5 > 1
    ]
    dropped = report["prepare"]["dropped"]
    assert dropped["empty"] == count[2]
    assert dropped["ratio"] + dropped["too_long"] == count[3]
    prepared = json.loads((out / "data-bin/prepare.json").read_text())["splits"]["train"]
    assert prepared["kept"] == report["prepare"]["kept"] == count[4]


# --------------------------------------------------------------- bad input: one line, nothing lost


def _case(name: str, tmp: Path, corpus: Path) -> tuple[dict[str, str | None], list[str], list[str]]:
    """(options changed, options added, what the message names) of a bad-input case."""
    bad = tmp / "bad"
    bad.mkdir()
    cases: dict[str, tuple[dict[str, str | None], list[str], list[str]]] = {
        "no teacher": ({"--teacher": None}, [], ["--teacher"]),
        "missing train": (
            {"--trainpref": str(bad / "train")},
            [],
            [str(bad / "train.en"), "not found"],
        ),
        "misaligned": (
            {"--trainpref": str(bad / "train")},
            [],
            [str(bad / "train.en"), str(bad / "train.de"), f"{LINES} lines", f"{LINES - 1}"],
        ),
        "text teacher": (
            {"--teacher": str(corpus / "train.en")},
            [],
            ["--teacher", str(corpus / "train.en")],
        ),
        "missing teacher": (
            {"--teacher": str(bad / "no.pt")},
            [],
            ["--teacher", str(bad / "no.pt"), "not found"],
        ),
        "bad select": ({}, ["--select", "bleurt"], ["--select", "chrf", "bleurt"]),
        "nbest above beam": ({}, ["--nbest", "9"], ["--nbest"]),
        "no shard": ({"--shard-lines": "0"}, [], ["--shard-lines"]),
        "same languages": ({"-t": "en"}, [], ["must differ"]),
        "missing valid": (
            {"--validpref": str(bad / "val")},
            [],
            [str(bad / "val.en"), "not found"],
        ),
        "bad config key": (
            {},
            ["--config", str(bad / "c.yaml")],
            [str(bad / "c.yaml"), "model.d_modle"],
        ),
        "data.dir set": ({}, ["--config", str(TINY), "--set", "data.dir=x"], ["--set data.dir"]),
        "out a file": ({"--out": str(corpus / "train.de")}, [], ["--out", "not a directory"]),
        "out not distill's": (
            {"--out": str(bad)},
            [],
            ["--out", str(bad), "not an nmt distill directory"],
        ),
        # issue 33: the manifest was written, then the first shard refused fp16, and the manifest
        # the next
        "fp16 on the cpu": ({}, ["--device", "cpu", "--precision", "fp16"], ["fp16", "CUDA"]),
    }
    if name == "misaligned":
        (bad / "train.en").write_text((corpus / "train.en").read_text())
        (bad / "train.de").write_text(
            "".join(line + "\n" for line in lines_of(corpus / "train.de")[:-1])
        )
    if name == "bad config key":
        (bad / "c.yaml").write_text("model:\n  d_modle: 3\n")
    if name == "out not distill's":
        (bad / "notes.txt").write_text("mine\n")
    return cases[name]


BAD = [
    "no teacher",
    "missing train",
    "misaligned",
    "text teacher",
    "missing teacher",
    "bad select",
    "nbest above beam",
    "no shard",
    "same languages",
    "missing valid",
    "bad config key",
    "data.dir set",
    "out a file",
    "out not distill's",
    "fp16 on the cpu",
]


def _with(args: list[str], changed: dict[str, str | None], added: list[str]) -> list[str]:
    out = []
    i = 0
    while i < len(args):
        if args[i] in changed:
            if changed[args[i]] is not None:
                out += [args[i], str(changed[args[i]])]
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out + added


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_writes_nothing(
    case, trained_checkpoint, corpus, raw_corpus, tmp_path, capsys
):
    changed, added, needles = _case(case, tmp_path, corpus)
    out = tmp_path / "out"
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    args = _with(distill_args(trained_checkpoint, corpus, raw_corpus, out), changed, added)
    assert nmt_here(*args) == 1
    one_error_line(capsys.readouterr().err, *needles)
    assert not out.exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@contextmanager
def _quiet_cli(path: Path) -> Iterator[pytest.MonkeyPatch]:
    """`isolated` for a module fixture: a working directory, logging and threads restored."""
    import logging

    import torch

    root = logging.getLogger()
    handlers, level, threads = list(root.handlers), root.level, torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path)
        try:
            yield mp
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
            torch.set_num_threads(threads)


def test_the_teacher_translates_with_the_engine_asked_for(
    trained_checkpoint, corpus, raw_corpus, tmp_path, capsys
):
    """`--engine ctranslate2`: the shards are CTranslate2's translations, the manifest says so,
    and the student trains on them as on torch's."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    out = tmp_path / "d"
    engine = ["--engine", "ctranslate2", "--cache-dir", str(tmp_path / "cache")]
    args = distill_args(trained_checkpoint, corpus, raw_corpus, out, *engine, *STUDENT)
    assert nmt_here(*args) == 0
    assert "engine ctranslate2" in capsys.readouterr().err
    teacher = Translator.load(
        trained_checkpoint, threads=1, engine="ctranslate2", cache_dir=tmp_path / "cache"
    )
    sources = lines_of(corpus / "train.en")
    assert [line for p in shard_files(out) for line in lines_of(p)] == teacher.translate(sources)
    assert json.loads((out / "manifest.json").read_text())["translate"]["engine"] == "ctranslate2"
    assert (out / "run/checkpoint_last.pt").is_file()


@pytest.fixture(scope="module")
def translated(trained_checkpoint, corpus, raw_corpus, tmp_path_factory) -> Path:
    """A distillation directory whose shards are done (hand-made outputs: the references)."""
    out = tmp_path_factory.mktemp("translated") / "d"
    refs = lines_of(corpus / "train.de")
    with _quiet_cli(out.parent) as mp:
        spy(mp, outputs=lambda i, s: refs[i])
        assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 0
    return out


@pytest.mark.parametrize(
    ("changed", "added", "needles"),
    [
        ({"--shard-lines": "45"}, [], ["--shard-lines 30 (now 45)"]),
        ({}, ["--nbest", "2"], ["--nbest 1 (now 2)"]),
        ({}, ["--beam", "3"], ["--beam the teacher's (now 3)"]),
        ({}, ["--engine", "ctranslate2"], ["--engine auto (now ctranslate2)"]),
        ({"--trainpref": "{edited}"}, [], ["{edited}.en", "its content differs"]),
    ],
)
def test_a_rerun_with_other_settings_is_refused_and_keeps_the_shards(
    changed, added, needles, translated, trained_checkpoint, corpus, raw_corpus, tmp_path, capsys
):
    """Shards are never mixed: a rerun whose settings or source text (one word added to a
    line) differ from those in the shards' manifest is one line naming the option, and every
    file of the directory stays as it was."""
    edited = lines_of(corpus / "train.en")
    edited[5] = edited[5] + " again"
    write_parallel(
        list(zip(edited, lines_of(corpus / "train.de"), strict=True)),
        tmp_path / "edited",
        "en",
        "de",
    )
    changed = {k: v.format(edited=tmp_path / "edited") for k, v in changed.items()}
    files = sorted(p for p in translated.rglob("*") if p.is_file())
    before = stamps(files)
    assert (
        nmt_here(
            *_with(distill_args(trained_checkpoint, corpus, raw_corpus, translated), changed, added)
        )
        == 1
    )
    one_error_line(
        capsys.readouterr().err,
        str(translated / "shards"),
        *(n.format(edited=tmp_path / "edited") for n in needles),
    )
    assert (
        sorted(p for p in translated.rglob("*") if p.is_file()) == files and stamps(files) == before
    )


def test_the_same_text_elsewhere_resumes(
    translated, trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch
):
    """The shards are the translations of a text, not of a path: the same text moved resumes
    (nothing to translate)."""
    for lang in ("en", "de"):
        (tmp_path / f"moved.{lang}").write_bytes((corpus / f"train.{lang}").read_bytes())
    calls = spy(monkeypatch)
    args = _with(
        distill_args(trained_checkpoint, corpus, raw_corpus, translated),
        {"--trainpref": str(tmp_path / "moved")},
        [],
    )
    assert nmt_here(*args) == 0 and calls == []


# ------------------------------------------- issue 33: what the shards and the pairs are made from


def test_a_teacher_replaced_at_its_path_is_refused_and_its_shards_kept(
    trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch, capsys
):
    """Issue 33: another checkpoint written at the teacher's path between two runs was taken
    for the one that translated the shards, and the student got the shards of both. The
    manifest holds each teacher's content: the rerun is one line naming --teacher, and nothing
    in OUT changes; with the shards deleted (what the line says to do), the new teacher
    translates them all and the later steps are made again from its translations."""
    teacher, out = tmp_path / "teacher.pt", tmp_path / "d"
    teacher.write_bytes(trained_checkpoint.read_bytes())
    refs = lines_of(corpus / "train.de")
    spy(monkeypatch, outputs=lambda i, s: refs[i])
    assert nmt_here(*distill_args(teacher, corpus, raw_corpus, out)) == 0
    save_random_model(teacher, load_model_checkpoint(trained_checkpoint).tokenizer, seed=3)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = stamps(files)
    calls = spy(monkeypatch, outputs=lambda i, s: refs[i])
    capsys.readouterr()
    assert nmt_here(*distill_args(teacher, corpus, raw_corpus, out)) == 1
    one_error_line(
        capsys.readouterr().err, str(out / "shards"), f"--teacher {teacher}", "content differs"
    )
    assert calls == [] and stamps(files) == before

    shutil.rmtree(out / "shards")
    calls = spy(monkeypatch, outputs=lambda i, s: f"neu {refs[i]}")
    assert nmt_here(*distill_args(teacher, corpus, raw_corpus, out)) == 0
    assert calls == [0, SHARD, 2 * SHARD]
    assert (
        lines_of(out / "distilled/train.de")
        == expected_pairs(lines_of(corpus / "train.en"), [f"neu {r}" for r in refs])[1]
    )


def two_hypotheses(ref: str) -> list[str]:
    """Close to `ref` in characters but in few whole words (chrF's choice), and half of its
    words verbatim with the rest replaced (BLEU's, more often)."""
    words = ref.split()
    half = len(words) // 2
    return [
        " ".join(w[:-1] + "x" if len(w) > 2 else w for w in words),
        " ".join(words[:half] + [f"zq{j}" for j in range(len(words) - half)]),
    ]


@pytest.mark.parametrize("change", ["--select", "reference"])
def test_another_selection_is_made_again_from_the_same_shards(
    change, trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch
):
    """Issue 33: a rerun with another --select, or another reference text, kept the pairs
    selected before. The shards stay (nothing translated, not rewritten); the selection, the
    filter and the student's data are made again, as the new setting selects."""
    sources, refs = lines_of(corpus / "train.en"), lines_of(corpus / "train.de")
    out = tmp_path / "d"
    spy(monkeypatch, outputs=lambda i, s: two_hypotheses(refs[i]))
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out, "--nbest", "2")) == 0
    nbest = [two_hypotheses(r) for r in refs]
    first = [hs[select_hypothesis(hs, r, "chrf")] for hs, r in zip(nbest, refs, strict=True)]
    assert lines_of(out / "distilled/train.de") == expected_pairs(sources, first)[1]
    shards, fingerprint = (
        stamps(shard_files(out)),
        json.loads((out / "data-bin/prepare.json").read_text())["fingerprint"],
    )

    text, extra, metric, new_refs = corpus, ["--select", "bleu"], "bleu", refs
    if change == "reference":
        text, extra, metric, new_refs = tmp_path / "other", [], "chrf", [hs[1] for hs in nbest]
        write_parallel(list(zip(sources, new_refs, strict=True)), text / "train", "en", "de")
    again = [hs[select_hypothesis(hs, r, metric)] for hs, r in zip(nbest, new_refs, strict=True)]
    assert again != first
    calls = spy(monkeypatch)
    assert (
        nmt_here(*distill_args(trained_checkpoint, text, raw_corpus, out, "--nbest", "2", *extra))
        == 0
    )
    assert calls == [] and stamps(shard_files(out)) == shards
    assert lines_of(out / "distilled/train.de") == expected_pairs(sources, again)[1]
    assert json.loads((out / "distill.json").read_text())["select"]["metric"] == metric
    assert json.loads((out / "data-bin/prepare.json").read_text())["fingerprint"] != fingerprint


def test_a_student_of_other_pairs_is_refused_before_anything_is_written(
    trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch, capsys
):
    """A student trained on the pairs of --select chrf, then the same command with --select
    bleu: `nmt train` would refuse to resume it on the new pairs, but only after they had
    replaced those it was trained on. Refused first, in one line naming the run directory and
    what changed, with every file as it was."""
    refs = lines_of(corpus / "train.de")
    out = tmp_path / "d"
    spy(monkeypatch, outputs=lambda i, s: two_hypotheses(refs[i]))
    assert (
        nmt_here(
            *distill_args(trained_checkpoint, corpus, raw_corpus, out, "--nbest", "2", *STUDENT)
        )
        == 0
    )
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = stamps(files)
    capsys.readouterr()
    assert (
        nmt_here(
            *distill_args(
                trained_checkpoint,
                corpus,
                raw_corpus,
                out,
                "--nbest",
                "2",
                "--select",
                "bleu",
                *STUDENT,
            )
        )
        == 1
    )
    one_error_line(capsys.readouterr().err, str(out / "run"), "--select chrf (now bleu)")
    assert stamps(files) == before


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[]", ["a list where an object belongs"]),
        ("3", ["an integer where an object belongs"]),
        ("null", ["null where an object belongs"]),
        ('"manifest"', ["a string where an object belongs"]),
        ('{"format_version": "2"}', ["format_version"]),
        ("{translate}", ["not JSON"]),
        ("[" * 100_000, ["not JSON"]),
        (("translate", None, []), ["translate is a list where an object belongs"]),
        (
            ("translate", "shard_lines", "30"),
            ["translate.shard_lines is a string where an integer belongs"],
        ),
        (
            ("translate", "nbest", True),
            ["translate.nbest is true or false where an integer belongs"],
        ),
        (
            ("translate", "teachers_sha256", {}),
            ["translate.teachers_sha256 is an object where a list belongs"],
        ),
        (("select", "repeats", None), ["select.repeats is missing"]),
    ],
    ids=[
        "list",
        "number",
        "null",
        "string",
        "version",
        "not json",
        "deep",
        "step",
        "string field",
        "bool field",
        "object field",
        "missing field",
    ],
)
def test_a_manifest_of_the_wrong_shape_is_one_line_naming_the_file_and_key(
    text, needles, translated, trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch, capsys
):
    """Issue 33: a manifest that is valid JSON but not an object (or an object with a field of
    the wrong type) was a traceback. Each is one line naming the file and the key, and nothing
    in OUT changes."""
    out = tmp_path / "d"
    shutil.copytree(translated, out)
    manifest = out / "manifest.json"
    if isinstance(
        text, tuple
    ):  # (step, key, value): one field of the real manifest changed (None: removed)
        data = json.loads(manifest.read_text())
        step, key, value = text
        if key is None:
            data[step] = value
        elif value is None:
            del data[step][key]
        else:
            data[step][key] = value
        text = json.dumps(data)
    manifest.write_text(text)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = stamps(files)
    calls = spy(monkeypatch)
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 1
    one_error_line(capsys.readouterr().err, str(manifest), *needles)
    assert calls == [] and stamps(files) == before


@pytest.mark.parametrize("name", ["manifest.json", "distill.json", "data-bin/prepare.json"])
@pytest.mark.parametrize("planted", ["fifo", "dev-zero"])
def test_what_distill_reads_whole_is_a_regular_file(
    name, planted, translated, trained_checkpoint, corpus, raw_corpus, tmp_path, capsys
):
    """A FIFO in place of a file distill reads whole blocked it forever; a symlink to /dev/zero
    read until memory ran out. Each is refused in one line naming it (`read_regular`), after
    the log lines of the steps before the one that reads it."""
    out = tmp_path / "d"
    shutil.copytree(translated, out)
    (out / name).unlink()
    if planted == "fifo":
        os.mkfifo(out / name)
    else:
        (out / name).symlink_to("/dev/zero")
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 1
    last_error_line(capsys.readouterr().err, str(out / name), "not a regular file")


def test_a_second_distill_on_the_same_out_stops_at_once(
    trained_checkpoint, corpus, raw_corpus, tmp_path, monkeypatch, capsys
):
    """Issue 33: two distills on one --out both translated every shard. While the first
    translates its first shard, a second on the same --out is one line naming the directory
    and the first one's pid, and translates nothing; the first finishes as if alone."""
    out, refs = tmp_path / "d", lines_of(corpus / "train.de")
    second: list[tuple[int, str]] = []

    def run_second() -> None:
        capsys.readouterr()
        second.append(
            (
                nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)),
                capsys.readouterr().err,
            )
        )

    calls = spy(monkeypatch, outputs=lambda i, s: refs[i], during=run_second)
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out)) == 0
    [(code, err)] = second
    assert assert_one_line(code, err, str(out), f"pid {os.getpid()}").startswith("nmt: error: ")
    assert calls == [0, SHARD, 2 * SHARD]  # the second translated nothing
    assert [line for p in shard_files(out) for line in lines_of(p)] == refs


def test_the_student_is_an_ordinary_checkpoint(
    translated, trained_checkpoint, corpus, raw_corpus, tmp_path
):
    """What a user does with a distilled student (deep encoder, one decoder layer) works
    through the CLI: averaging its last checkpoints, `translate --precision int8`, and `export`
    to CTranslate2, float32 and int8, which loads and translates every line."""
    import shutil

    import ctranslate2

    out = tmp_path / "d"
    shutil.copytree(translated, out)
    student = [
        *STUDENT,
        "--set",
        "train.save_interval_updates=1",
        "--set",
        "model.encoder_layers=3",
        "--set",
        "model.decoder_layers=1",
    ]
    assert nmt_here(*distill_args(trained_checkpoint, corpus, raw_corpus, out, *student)) == 0
    run, avg = out / "run", tmp_path / "avg.pt"
    assert nmt_here("average-checkpoints", str(run), "--last", "3", "-o", str(avg)) == 0
    loaded = load_model_checkpoint(avg)
    assert (loaded.config.model.encoder_layers, loaded.config.model.decoder_layers) == (3, 1)
    texts = raw_corpus.lines("test", "en")[:8]
    (tmp_path / "in.en").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    for precision in ("fp32", "int8"):
        hyp = tmp_path / f"{precision}.de"
        assert (
            nmt_here(
                "translate",
                "-c",
                str(avg),
                "-i",
                str(tmp_path / "in.en"),
                "-o",
                str(hyp),
                "--device",
                "cpu",
                "--precision",
                precision,
                "--max-len-a",
                "0",
                "--max-len-b",
                "8",
            )
            == 0
        )
        assert len(lines_of(hyp)) == len(texts)
    tok = loaded.tokenizer
    for quantization in ("float32", "int8"):
        model_dir = tmp_path / f"ct2_{quantization}"
        assert nmt_here("export", str(avg), str(model_dir), "--quantization", quantization) == 0
        results = ctranslate2.Translator(str(model_dir), device="cpu").translate_batch(
            [[tok.piece(i) for i in tok.encode(t)] for t in texts],
            beam_size=5,
            max_decoding_length=8,
        )
        assert len(results) == len(texts) and all(r.hypotheses[0] for r in results)


# ------------------------------------------------------------------ the student's config


def test_the_student_config_is_the_demo_model_narrower_with_a_deep_encoder_and_a_shallow_decoder():
    """configs/student.yaml trains as configs/multi30k.yaml does (budget, batches, schedule,
    heads, decoding): only the shape and the run directory differ: more encoder and fewer
    decoder layers than the teacher, and no wider (the feed-forward 4 times the width, as
    the teacher's)."""
    student, teacher = (
        config_to_dict(load_config(ROOT / f"configs/{name}.yaml"))
        for name in ("student", "multi30k")
    )
    for cfg in (student, teacher):
        cfg["train"].pop("run_dir")
    shape = {
        key: (student["model"].pop(key), teacher["model"].pop(key))
        for key in ("encoder_layers", "decoder_layers", "d_model", "ffn_dim")
    }
    assert student == teacher
    assert shape["encoder_layers"][0] > shape["encoder_layers"][1]
    assert shape["decoder_layers"][0] < shape["decoder_layers"][1]
    assert shape["d_model"][0] <= shape["d_model"][1]
    assert [ffn / width for ffn, width in zip(shape["ffn_dim"], shape["d_model"], strict=True)] == [
        4,
        4,
    ]
    assert shape["d_model"][0] % student["model"]["heads"] == 0
