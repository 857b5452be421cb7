"""The test helpers that make data: synthetic copy / reverse / sort tasks and parallel files
for prepare-bpe (they were in nmt.data; only the tests use them)."""

from __future__ import annotations

import pytest
from helpers import synthetic_pairs, write_parallel

from nmt.data import ParallelData
from nmt.errors import NmtError
from nmt.prepare import PrepareOptions, prepare_bpe
from nmt.tokenizer import Tokenizer

# ---------------------------------------------------------------- synthetic tasks


@pytest.mark.parametrize(
    "task, expect",
    [("copy", lambda xs: xs), ("reverse", lambda xs: xs[::-1]), ("sort", sorted)],
    ids=["copy", "reverse", "sort"],
)
def test_synthetic_tasks(task, expect):
    pairs = synthetic_pairs(task, 50, seed=4, min_len=2, max_len=6)
    assert pairs == synthetic_pairs(task, 50, seed=4, min_len=2, max_len=6)
    for src, tgt in pairs:
        symbols = src.split()
        assert 2 <= len(symbols) <= 6 and set(symbols) <= set("0123456789")
        assert tgt.split() == expect(symbols)


def test_synthetic_pairs_depend_on_the_seed_and_know_their_tasks():
    assert synthetic_pairs("copy", 20, seed=1) != synthetic_pairs("copy", 20, seed=2)
    with pytest.raises(NmtError, match="unknown synthetic task"):
        synthetic_pairs("shuffle", 1, seed=0)


def test_synthetic_task_through_prepare(tmp_path):
    pairs = synthetic_pairs("reverse", 200, seed=0)
    write_parallel(pairs, tmp_path / "raw" / "train", "src", "tgt")
    write_parallel(pairs[:20], tmp_path / "raw" / "valid", "src", "tgt")
    opts = PrepareOptions(
        source_lang="src",
        target_lang="tgt",
        trainpref=str(tmp_path / "raw/train"),
        validpref=str(tmp_path / "raw/valid"),
        destdir=str(tmp_path / "bin"),
        vocab_size=20,
        byte_fallback=False,
        workers=1,
    )
    report = prepare_bpe(opts, progress=False)
    assert report["splits"]["train"]["kept"] == 200 and report["vocab_size"] == 20
    tok = Tokenizer.from_file(tmp_path / "bin" / "spm.model")
    data = ParallelData.load(tmp_path / "bin", "valid")
    assert [(tok.decode(data.src(i)), tok.decode(data.tgt(i))) for i in range(20)] == pairs[:20]
