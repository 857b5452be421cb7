"""Scoring equals sacreBLEU's own; named test sets explain where to put files offline."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
import sacrebleu

from nmt.errors import NmtError
from nmt.evaluate import (
    MetricResult,
    corpus_bleu,
    format_results,
    load_test_set,
    read_lines,
    score_corpus,
)

HYPS = [
    "The cat is sitting on the mat.",
    "A man rides his bike through the old town of Zürich.",
    "Two dogs play in the snow , one of them is brown.",
    "The weather was nice yesterday, but today it rains.",
]
REF1 = [
    "The cat sits on the mat.",
    "A man is riding his bicycle through Zürich's old town.",
    "Two dogs are playing in the snow; one is brown.",
    "Yesterday the weather was nice, but today it is raining.",
]
REF2 = [
    "There is a cat on the mat.",
    "A man cycles through the old town of Zurich.",
    "Two dogs play in the snow, one of which is brown.",
    "The weather was fine yesterday but it's raining today.",
]


def test_bleu_chrf_ter_equal_sacrebleu_with_one_reference():
    results = score_corpus(HYPS, [REF1], ("bleu", "chrf", "ter"))
    assert [r.name for r in results] == ["bleu", "chrf", "ter"]
    bleu = sacrebleu.metrics.BLEU()
    expected_bleu = bleu.corpus_score(HYPS, [REF1])
    assert results[0].score == pytest.approx(expected_bleu.score, abs=0)
    assert results[0].signature == bleu.get_signature().format()
    assert results[0].text == expected_bleu.format()
    assert results[0].text.startswith("BLEU = ")
    assert results[1].score == sacrebleu.corpus_chrf(HYPS, [REF1]).score
    assert results[1].signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    assert results[2].score == sacrebleu.corpus_ter(HYPS, [REF1]).score
    assert corpus_bleu(HYPS, [REF1]) == sacrebleu.corpus_bleu(HYPS, [REF1]).score


def test_multiple_references_tokenize_and_lowercase():
    results = score_corpus(HYPS, [REF1, REF2], ("bleu",), tokenize="intl", lowercase=True)
    expected = sacrebleu.corpus_bleu(HYPS, [REF1, REF2], tokenize="intl", lowercase=True)
    assert results[0].score == expected.score
    assert "nrefs:2|case:lc|" in results[0].signature and "tok:intl" in results[0].signature
    assert results[0].score > score_corpus(HYPS, [REF1], ("bleu",))[0].score


def score_files(
    hyp_path: str | Path,
    ref_paths: Sequence[str | Path],
    metrics: Sequence[str] = ("bleu", "chrf"),
    *,
    tokenize: str | None = None,
    lowercase: bool = False,
) -> list[MetricResult]:
    """`score_corpus` on files (as `nmt score --ref` reads them); errors name the files."""
    if not ref_paths:
        raise NmtError("scoring needs at least one reference file")
    hyps = read_lines(hyp_path)
    refs = [read_lines(path) for path in ref_paths]
    return score_corpus(
        hyps,
        refs,
        metrics,
        tokenize=tokenize,
        lowercase=lowercase,
        names=[str(p) for p in ref_paths],
        hyp_name=str(hyp_path),
    )


def test_mismatched_line_counts_name_both_counts_and_files(tmp_path):
    with pytest.raises(NmtError, match="hypotheses has 4 lines but reference 2 has 3"):
        score_corpus(HYPS, [REF1, REF2[:3]])
    (tmp_path / "hyp.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(REF1[:2]) + "\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"hyp\.txt has 4 lines but .*ref\.txt has 2"):
        score_files(tmp_path / "hyp.txt", [tmp_path / "ref.txt"])


def test_unknown_metric_and_tokenizer_list_the_choices():
    with pytest.raises(NmtError, match="unknown metric 'meteor' .*bleu, chrf, ter"):
        score_corpus(HYPS, [REF1], ("bleu", "meteor"))
    with pytest.raises(NmtError, match="unknown BLEU tokenizer 'moses' .*13a"):
        score_corpus(HYPS, [REF1], tokenize="moses")
    with pytest.raises(NmtError, match="nothing to score"):
        score_corpus([], [[]])
    with pytest.raises(TypeError):
        score_corpus(HYPS, REF1)  # a single stream must be wrapped in a list
    with pytest.raises(TypeError):
        score_corpus(HYPS, [[REF1, REF2]])  # streams wrapped once too often


def test_score_files_reads_plain_and_gz_references(tmp_path):
    (tmp_path / "hyp.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "ref.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(REF1) + "\n")
    (tmp_path / "ref2.txt").write_bytes(("\r\n".join(REF2) + "\r\n").encode())
    results = score_files(tmp_path / "hyp.txt", [tmp_path / "ref.gz", tmp_path / "ref2.txt"])
    assert results == score_corpus(HYPS, [REF1, REF2])


def test_read_lines_reads_as_every_command_does(tmp_path, caplog):
    """One policy for all raw text (nmt.textio): split on "\\n" only, so line counts stay
    right; separators inside a line become spaces; invalid UTF-8 is replaced and logged."""
    path = tmp_path / "x.txt"
    path.write_bytes("  a \u2028b\rc  \n\nlast".encode())
    assert read_lines(path) == ["  a  b c  ", "", "last"]
    path.write_bytes(b"ok\n\xff\xfe\n")
    assert read_lines(path) == ["ok", "\ufffd\ufffd"]
    assert "x.txt:2: invalid UTF-8" in caplog.text
    with pytest.raises(NmtError, match=r"nope\.txt: file not found"):
        read_lines(tmp_path / "nope.txt")


def test_format_results_human_and_json():
    results = score_corpus(HYPS, [REF1])
    human = format_results(results)
    assert human.splitlines()[0] == results[0].text
    assert results[0].signature in human.splitlines()[1]
    parsed = json.loads(format_results(results, json=True))
    assert [MetricResult(**item) for item in parsed] == results
    assert set(parsed[0]) == {"name", "score", "signature", "text"}


# ------------------------------------------------------------------ named test sets


def test_unknown_test_set_or_langpair_lists_close_choices():
    with pytest.raises(NmtError, match="unknown test set 'wmt14/ful'.*did you mean wmt14/full"):
        load_test_set("wmt14/ful", "en-de")
    with pytest.raises(NmtError, match="wmt14 has no language pair 'en-xx'.*en-de"):
        load_test_set("wmt14", "en-xx")


# SACREBLEU is read when sacrebleu is imported, so each case runs in a fresh interpreter,
# with urlopen replaced so that no test touches the network (offline or not).
_OFFLINE = textwrap.dedent(
    """
    import json, urllib.error, urllib.request
    def offline(*args, **kwargs):
        raise urllib.error.URLError("offline (test)")
    urllib.request.urlopen = offline
    from nmt.errors import NmtError
    from nmt.evaluate import load_test_set
    try:
        print(json.dumps(load_test_set("wmt14", "en-de")))
    except NmtError as exc:
        print("NmtError:", exc)
    """
)


def run_offline(sacrebleu_dir: Path) -> str:
    env = {**os.environ, "SACREBLEU": str(sacrebleu_dir)}
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _sgm(lines: list[str], origlang: str = "en") -> str:
    segs = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, 1))
    return (
        f'<srcset>\n<doc docid="d1" genre="news" origlang="{origlang}">\n{segs}</doc>\n</srcset>\n'
    )


def test_test_set_offline_says_where_to_put_files_and_following_it_works(tmp_path):
    root = tmp_path / "sacrebleu"
    message = run_offline(root)
    raw = root / "wmt14" / "raw"
    assert message.startswith("NmtError: wmt14/en-de:"), message
    assert "\n" not in message
    assert "offline (test)" in message
    assert (
        f"https://statmt.org/wmt14/test-filtered.tgz to {raw / 'wmt14.test-filtered.tgz'}"
        in message
    )
    src, ref = raw / "test/newstest2014-deen-src.en.sgm", raw / "test/newstest2014-deen-ref.de.sgm"
    assert f"so that {src}, {ref} exist" in message
    assert f"SACREBLEU environment variable moves the test-set directory (now {root})" in message

    # Do what the message says: put the archive there and unpack it.
    sources, references = ["Hello world .", "A  second   line"], ["Hallo Welt .", "Eine Zeile"]
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / src.name).write_text(_sgm(sources), encoding="utf-8")
    (tmp_path / "test" / ref.name).write_text(_sgm(references), encoding="utf-8")
    with tarfile.open(raw / "wmt14.test-filtered.tgz", "w:gz") as tar:
        tar.add(tmp_path / "test", arcname="test")
    with tarfile.open(raw / "wmt14.test-filtered.tgz") as tar:
        tar.extractall(raw, filter="data")
    assert json.loads(run_offline(root)) == [
        ["Hello world .", "A second line"],  # sacreBLEU collapses whitespace
        [["Hallo Welt .", "Eine Zeile"]],
    ]


def test_sacrebleu_sys_exit_becomes_nmt_error(monkeypatch):
    def bad_download(langpair):
        raise SystemExit(1)  # what sacreBLEU does on an MD5 mismatch or an SSL error

    monkeypatch.setattr(sacrebleu.DATASETS["wmt14"], "get_source_file", bad_download)
    before = socket.getdefaulttimeout()
    with pytest.raises(NmtError, match="wmt14/en-de: .*download failed.*unpack it in"):
        load_test_set("wmt14", "en-de")
    assert socket.getdefaulttimeout() == before
