"""Terminology and shortlists under hostile use (issue 57): the whole-word rule after
normalization and case folding, terms a line cannot use, empty terms from a file or a request,
special files as a terminology, hand-made shortlists and shortlist data."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import unicodedata
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import ROOT, assert_one_line, nmt, nmt_here

from nmt.data import bin_path, idx_path
from nmt.decoding.shortlist import learn_shortlist, load_shortlist, save_shortlist
from nmt.errors import NmtError
from nmt.terminology import load_terminology, terminology_from_pairs


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


# ------------------------------------------------------------------ item 11: the whole-word rule

# (source term, text, whether the term is a word of the text): the six and their siblings
WHOLE_WORDS = [
    (
        "stanbul",
        "A dog in İstanbul.",
        False,
    ),  # İ folds to i + a combining dot: a mark, not a word's start
    ("phone", "A new İPHONE.", False),
    ("te", nfd("Un été chaud."), False),  # NFD: the accents are marks after the letters
    ("ller", nfd("Frau Müller kommt."), False),
    ("café", nfd("Ein café hier."), True),  # NFC term, NFD text
    ("ｄｏｇ", "A dog runs.", True),  # fullwidth term (NFKC)
    ("dog", "A ｄｏｇ runs.", True),  # fullwidth text
    (nfd("café"), "Ein CAFÉ hier.", True),  # NFD term, NFC text, other case
    ("Müller", nfd("FRAU MÜLLER"), True),
    ("e", nfd("é"), False),  # ends before a mark
    ("dog", "dog\u0301s", False),
    ("i", "İ", False),
    ("İstanbul", "IN İSTANBUL", True),
    ("s", "groß", False),  # inside the folding of ß (ss)
    ("STRASSE", "Die Straße.", True),
    ("file", "A ﬁle.", True),  # ligature (NFKC and the fold)
    ("1", "½ cup", False),  # inside the compatibility form of ½ (1⁄2)
    ("क", "कि", False),  # a Devanagari consonant before its vowel sign (a spacing mark)
    ("가 다", nfd("가 다"), True),  # Hangul written as jamo
    ("가", nfd("각"), False),  # a syllable's start is not a word
    ("Việt Nam", nfd("VIỆT NAM"), True),  # two marks, in canonical order
]


@pytest.mark.parametrize(
    "term, text, found", WHOLE_WORDS, ids=[f"{i}-{c[0]}" for i, c in enumerate(WHOLE_WORDS)]
)
def test_a_term_is_a_whole_word_after_normalization_and_case_folding(term, text, found):
    """Issue 57 (11): a term matches where the text equals it once both are NFC, NFKC and
    case-folded, between whole characters (a letter with its combining marks), never with a
    letter, digit, _ or combining mark either side."""
    assert len(WHOLE_WORDS) == 21
    t = terminology_from_pairs([(term, "TARGET"), ("unrelated", "X")])
    assert t.match(text) == (["TARGET"] if found else []), (term, text)


# ---------------------------------------------------------------- item 12: terms a line cannot use


def test_a_term_empty_once_normalized_is_refused_at_load_naming_its_line(tmp_path):
    """Issue 57 (12): a zero-width target was accepted at load and failed at the first line
    that matched, naming that input line; now the file's own line, at load."""
    path = tmp_path / "terms.tsv"
    path.write_text("dog\tHund\ncat\tKatze\nbird\t\u200b\n", encoding="utf-8")
    with pytest.raises(NmtError, match=rf"^{path}:3: the target term is empty once normalized"):
        load_terminology(path)
    path.write_text("\u200b\u200c\tHund\n", encoding="utf-8")
    with pytest.raises(NmtError, match=rf"^{path}:1: the source term is empty once normalized"):
        load_terminology(path)


def test_a_term_too_long_for_a_line_goes_unmet_with_a_warning(random_checkpoint, tmp_path, capsys):
    """Issue 57 (12): one term whose target is longer than a line's translation may be (53
    tokens) stopped the whole run with exit 1; the docs promise it goes unmet with a warning:
    every line is translated, the warning names the line and the term."""
    terms = tmp_path / "terms.tsv"
    long_target = " ".join(f"Wort{i}" for i in range(20))
    terms.write_text(f"dog\t{long_target}\ncat\tKatze\n", encoding="utf-8")
    src = tmp_path / "in.en"
    src.write_text("A cat.\nA bird.\nA dog and a cat.\n", encoding="utf-8")
    out = tmp_path / "out.de"
    code = nmt_here(
        "translate",
        "-c",
        str(random_checkpoint),
        "-i",
        str(src),
        "-o",
        str(out),
        "--terminology",
        str(terms),
        "--beam",
        "2",
        "--max-len-a",
        "0",
        "--max-len-b",
        "12",
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert len(out.read_text(encoding="utf-8").split("\n")) == 4  # three lines and the last newline
    warned = [line for line in err.splitlines() if "left unmet" in line]
    assert len(warned) == 1 and f"{src}:3: the term 'Wort0 Wort1" in warned[0], err
    assert "tokens, longer than the 12 tokens this line's translation may have" in warned[0]


# ------------------------------------------------------------------ item 29: empty terms


@pytest.mark.parametrize(
    "pair, message",
    [
        (("", "Katze"), "terminology['']: the source term is empty"),
        (("  ", "Katze"), "terminology['  ']: the source term is empty"),
        (("dog", " "), "terminology['dog']: the target term is empty"),
        (("\u200b", "Katze"), "terminology['\\u200b']: the source term is empty once normalized"),
        (("dog", "\u200b\u2060"), "terminology['dog']: the target term is empty once normalized"),
        (("x" * 1001, "y"), "the source term is 1,001 characters; a term has at most 1,000"),
    ],
)
def test_an_empty_term_given_as_pairs_is_refused_naming_it(pair, message):
    """Issue 57 (29): `{"terminology": {"": "Katze"}}` forced "Katze" into every translation
    (an empty term matches everywhere); a file's empty term was refused, pairs' were not."""
    with pytest.raises(NmtError) as e:
        terminology_from_pairs([("dog", "Hund"), pair])
    assert message in str(e.value)
    assert terminology_from_pairs([(" dog ", " Hund ")]).match("a dog") == [
        "Hund"
    ]  # spaces around: stripped


# ------------------------------------------------------------------ item 5: special files, bounds


def _load_in_a_child(path: Path) -> subprocess.CompletedProcess[str]:
    """load_terminology(path) in a child process, which a hang cannot take the suite with."""
    code = "import sys; from nmt.terminology import load_terminology; load_terminology(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_a_request_s_terminology_is_not_kept_once_it_is_dropped():
    """`re` kept every compiled pattern in its module-wide cache: each request's terminology
    stayed in memory after its answer (+157 MB after 30 requests of a server)."""
    terminology = terminology_from_pairs([(f"term{i}", f"Begriff{i}") for i in range(50)])
    assert terminology.match("a term7 here") == ["Begriff7"]
    pattern = weakref.ref(terminology.pattern)
    del terminology
    gc.collect()
    assert pattern() is None


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_terminology_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    """Issue 57 (5): `--terminology /dev/zero` spun for ever (no newline: an ever longer line,
    joined again at each read); a FIFO with no writer blocked. Both are refused at once, in one
    line naming the file."""
    path = tmp_path / "terms.tsv"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    try:
        done = _load_in_a_child(path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_terminology of a {kind} never ended")
    assert done.returncode == 1 and "NmtError" in done.stderr, done.stderr
    assert "is not a regular file" in done.stderr.splitlines()[-1]


def test_a_terminology_file_is_bounded(tmp_path, monkeypatch):
    """Issue 57 (5): the file is read whole under a bound, and each term too."""
    path = tmp_path / "terms.tsv"
    path.write_text("dog\tHund\n" * 20, encoding="utf-8")
    monkeypatch.setattr("nmt.terminology.TERMINOLOGY_LIMIT", 100)
    with pytest.raises(
        NmtError, match=rf"^{path}: the terminology file is 180 bytes, more than nmt reads \(100\)"
    ):
        load_terminology(path)
    monkeypatch.undo()
    path.write_text("dog\tHund\n" + "a" * 5000 + "\tb\n", encoding="utf-8")
    with pytest.raises(NmtError, match=rf"^{path}:2: the source term is 5,000 characters"):
        load_terminology(path)


def test_the_terminology_cli_refuses_dev_zero_in_one_line(random_checkpoint):
    """The command says so in one line (in a child process: a hang must not take the suite)."""
    try:
        done = nmt(
            "translate",
            "-c",
            str(random_checkpoint),
            "-i",
            os.devnull,
            "--terminology",
            "/dev/zero",
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("translate --terminology /dev/zero never ended")
    assert_one_line(done.returncode, done.stderr, "/dev/zero", "not a regular file")


# ------------------------------------------------------------------ item 17: hand-made shortlists

V = 40


def _tokenizer(size: int = V, sha256: str = "abc") -> SimpleNamespace:
    """What load_shortlist reads of a tokenizer: a joint vocabulary of `size` and its hash."""
    pieces = [str(i) for i in range(size)]
    return SimpleNamespace(
        vocab_size=size,
        sha256=sha256,
        source_vocab_size=None,
        vocabularies=lambda: (pieces, pieces),
    )


def _shortlist_file(path: Path, **changes: object) -> Path:
    """A shortlist file as `nmt shortlist` writes it, with `changes` to its keys (None: removed)."""
    obj: dict[str, object] = {
        "format": "nmt-shortlist",
        "format_version": 1,
        "vocab_size": V,
        "spm_sha256": "abc",
        "source_lang": "en",
        "target_lang": "de",
        "candidates": torch.full((V, 3), -1, dtype=torch.int32),
        "frequent": torch.arange(5, 10, dtype=torch.int32),
    }
    for key, value in changes.items():
        if value is None:
            del obj[key]
        else:
            obj[key] = value
    torch.save(obj, path)
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": None}, "not a shortlist (no vocab_size)"),
        ({"spm_sha256": None}, "not a shortlist (no spm_sha256)"),
        ({"vocab_size": "40"}, "made for another vocabulary"),
        ({"candidates": "abc"}, "not a shortlist (candidates is not an integer table of 40 rows)"),
        ({"candidates": torch.zeros(V, 3)}, "not a shortlist (candidates is not an integer table"),
        (
            {"candidates": torch.zeros(V - 1, 3, dtype=torch.int32)},
            "not a shortlist (candidates is not an integer table",
        ),
        (
            {"candidates": torch.full((V, 3), V, dtype=torch.int32)},
            "candidates holds token ids outside the vocabulary",
        ),
        (
            {"candidates": torch.full((V, 3), -7, dtype=torch.int32)},
            "candidates holds token ids outside the vocabulary",
        ),
        (
            {"frequent": torch.tensor([1, 10**6])},
            "frequent holds token ids outside the vocabulary (0 to 39)",
        ),
        ({"frequent": None}, "not a shortlist (no frequent)"),
        (
            {"frequent": torch.ones(2, 2, dtype=torch.int64)},
            "not a shortlist (frequent is not an integer table of one row)",
        ),
    ],
)
def test_a_hand_made_shortlist_is_refused_naming_the_file(tmp_path, changes, message):
    """Issue 57 (17): a missing `vocab_size` was a KeyError, `candidates` a string an
    AttributeError, ids past the vocabulary a RuntimeError or IndexError in the search; a table
    of too few rows silently gave wrong lists."""
    path = _shortlist_file(tmp_path / "sl.pt", **changes)
    with pytest.raises(NmtError) as e:
        load_shortlist(path, _tokenizer())
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value), str(e.value)
    good = load_shortlist(_shortlist_file(tmp_path / "good.pt"), _tokenizer())
    assert good.candidates.shape == (V, 3) and good.frequent.tolist() == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("kind", ["text", "pickle", "checkpoint"])
def test_a_file_of_another_kind_says_what_a_shortlist_is(tmp_path, kind):
    """Issue 57 (20): `--shortlist` of the wrong kind showed `(UnpicklingError)`; the message
    says what file is expected."""
    path = tmp_path / "wrong.pt"
    if kind == "text":
        path.write_text("dog\tHund\n", encoding="utf-8")
    elif kind == "pickle":
        torch.save({"x": SimpleNamespace(a=1)}, path)
    else:
        torch.save({"format_version": 1, "model": {"w": torch.zeros(2)}, "config": {}}, path)
    with pytest.raises(NmtError) as e:
        load_shortlist(path, _tokenizer())
    assert str(e.value).startswith(
        f"{path}: not a shortlist (a shortlist is the file `nmt shortlist DATA_DIR -o FILE` writes"
    ), str(e.value)
    assert "Error" not in str(e.value)
    assert ("this is a checkpoint" in str(e.value)) == (kind == "checkpoint")


def _data_dir(path: Path, src: list[list[int]], tgt: list[list[int]], vocab_size: int = V) -> Path:
    """A prepare-bpe directory holding only a train split of these token ids."""
    path.mkdir()
    for lang, seqs in (("en", src), ("de", tgt)):
        np.concatenate(seqs).astype("<u2").tofile(bin_path(path, "train", lang))
        np.concatenate(([0], np.cumsum([len(s) for s in seqs]))).astype("<i8").tofile(
            idx_path(path, "train", lang)
        )
    meta = {
        "format_version": 1,
        "source_lang": "en",
        "target_lang": "de",
        "vocab_size": vocab_size,
        "dtype": "uint16",
        "spm": {"model": "spm.model", "sha256": "abc"},
        "splits": {"train": {"lines": len(src)}},
    }
    (path / "prepare.json").write_text(json.dumps(meta), encoding="utf-8")
    return path


SRC = [[10, 11, 12], [11, 13], [12, 14, 10]]
TGT = [[20, 21], [21, 23, 24], [22, 20]]


def test_nmt_shortlist_refuses_a_vocabulary_its_tokens_cannot_hold(tmp_path, capsys):
    """Issue 57 (17): prepare.json's `vocab_size: 10**12` was trusted (an 8 TB table)."""
    data = _data_dir(tmp_path / "data", SRC, TGT, vocab_size=10**12)
    out = tmp_path / "sl.pt"
    code = nmt_here(
        "shortlist", str(data), "-o", str(out), "--top", "2", "--frequent", "2", "--iterations", "1"
    )
    assert_one_line(
        code,
        capsys.readouterr().err,
        f"{data / 'prepare.json'}: vocab_size 1,000,000,000,000 or "
        "source_vocab_size 1,000,000,000,000 is not a vocabulary of uint16 tokens (1 to 65,535)",
    )
    assert not out.exists()


def test_nmt_shortlist_refuses_ids_past_the_vocabulary(tmp_path):
    """Issue 57 (17): a `.bin` id past the vocabulary was an IndexError."""
    data = _data_dir(tmp_path / "data", SRC, [[20, 21], [21, 23, V + 5], [22, 20]])
    with pytest.raises(
        NmtError,
        match=rf"^{bin_path(data, 'train', 'de')}: token ids outside the vocabulary \(0 to 39",
    ):
        learn_shortlist(data, top=2, frequent=2, iterations=1)


def test_nmt_shortlist_refuses_offsets_that_go_backwards(tmp_path):
    """Issue 57 (17): non-increasing `.idx` offsets (first and last right) gave a shortlist and exit
    0."""
    data = _data_dir(tmp_path / "data", SRC, TGT)
    np.array([0, 6, 2, 8], dtype="<i8").tofile(idx_path(data, "train", "en"))
    with pytest.raises(NmtError, match=rf"^{idx_path(data, 'train', 'en')}: offsets go backwards"):
        learn_shortlist(data, top=2, frequent=2, iterations=1)


def test_a_shortlist_of_sound_data_still_loads(tmp_path):
    data = _data_dir(tmp_path / "data", SRC, TGT)
    path = tmp_path / "sl.pt"
    save_shortlist(learn_shortlist(data, top=2, frequent=2, iterations=1), path)
    loaded = load_shortlist(path, _tokenizer())
    assert loaded.candidates.shape == (V, 2) and loaded.frequent.numel() == 2
