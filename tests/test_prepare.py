"""prepare-bpe, the tokenizer and text reading: properties on a few hundred real lines."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import nmt.prepare
from nmt.data import ParallelData, read_meta, read_raw
from nmt.errors import NmtError
from nmt.prepare import DROP_REASONS, PrepareOptions, prepare_bpe
from nmt.textio import TextStats, count_lines, find_text, read_lines
from nmt.tokenizer import NMT_SPECIALS, SpecialIds, Tokenizer


def options(dest: Path, train: str, **kw) -> PrepareOptions:
    kw.setdefault("workers", 1)
    return PrepareOptions(
        source_lang="en", target_lang="de", trainpref=train, destdir=str(dest), **kw
    )


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def decoded(tok: Tokenizer, data: ParallelData) -> list[tuple[str, str]]:
    return [(tok.decode(data.src(i)), tok.decode(data.tgt(i))) for i in range(len(data))]


@pytest.fixture(scope="module")
def tok(prepared) -> Tokenizer:
    return Tokenizer.from_file(prepared[0] / "spm.model")


# ---------------------------------------------------------------- text reading


@pytest.mark.parametrize("content", [b"", b"\n", b"a", b"a\n", b"a\nb", b"a\n\nb\n\n", b"a\rb\r\n"])
def test_count_lines_agrees_with_read_lines(tmp_path, content):
    path = tmp_path / "x.txt"
    path.write_bytes(content)
    assert count_lines(path) == len(list(read_lines(path)))


def test_read_lines_splits_only_on_newline_and_cleans(tmp_path):
    raw = ("\ufeffbom\r\ncr\rinside\nls\u2028ps\u2029nel\x85\nnul\x00byte\n").encode()
    raw += b"bad \xff\xfe utf8\n" + "müde Straße\n".encode() + b"last-no-newline"
    path = tmp_path / "dirty.txt"
    path.write_bytes(raw)
    stats = TextStats(str(path))
    lines = list(read_lines(path, stats))
    assert lines == [
        "bom",
        "cr inside",
        "ls ps nel ",
        "nul byte",
        "bad \ufffd\ufffd utf8",
        "müde Straße",
        "last-no-newline",
    ]
    assert (stats.lines, stats.invalid_utf8, stats.nul, stats.line_breaks) == (7, 1, 1, 2)
    assert stats.first_lines == [2, 3, 4, 5]
    # block boundaries (inside multi-byte characters, between CR and LF) change nothing
    assert list(read_lines(path, block_size=3)) == lines
    gz = tmp_path / "dirty.txt.gz"
    gz.write_bytes(gzip.compress(raw))
    assert list(read_lines(gz)) == lines and count_lines(gz) == 7


def test_find_text_prefers_plain_then_gz(tmp_path):
    (tmp_path / "a.en.gz").write_bytes(gzip.compress(b"x\n"))
    assert find_text(tmp_path / "a", "en") == tmp_path / "a.en.gz"
    (tmp_path / "a.en").write_text("x\n")
    assert find_text(tmp_path / "a", "en") == tmp_path / "a.en"
    with pytest.raises(NmtError, match=r"b\.de not found \(nor b\.de\.gz\)"):
        find_text(tmp_path / "b", "de")


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_special_ids_bytes_and_pickle(prepared, tok):
    dest, report = prepared
    ids = tok.specials
    assert ids == NMT_SPECIALS == SpecialIds(pad=0, unk=1, bos=2, eos=3)
    assert tok.piece(ids.pad) == "<pad>" and tok.piece(ids.eos) == "</s>"
    assert tok.vocab_size == report["vocab_size"] == 500
    again = Tokenizer.from_bytes((dest / "spm.model").read_bytes())
    assert again.sha256 == tok.sha256 == report["spm"]["sha256"]
    assert Tokenizer.from_file(dest / "spm.model").model_bytes == again.model_bytes
    clone = pickle.loads(pickle.dumps(tok))
    texts = ["Ein Mann fährt Fahrrad.", "", "A dog runs.  "]
    assert tok.encode_batch(texts, num_threads=2) == [tok.encode(t) for t in texts]
    assert clone.encode_batch(texts) == [again.encode(t) for t in texts]
    assert tok.decode([ids.bos, *tok.encode("A dog."), ids.eos, ids.pad]) == "A dog."


def test_tokenizer_rejects_other_special_ids_and_garbage(tmp_path, raw_corpus):
    import sentencepiece as spm  # only to build a model with sentencepiece's default ids

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(raw_corpus.lines("train", "en")),
        model_prefix=str(tmp_path / "d"),
        vocab_size=100,
        minloglevel=2,
    )
    with pytest.raises(NmtError, match=r"d\.model: .*pad=-1 unk=0 bos=1 eos=2"):
        Tokenizer.from_file(tmp_path / "d.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(NmtError, match=r"junk\.model: not a sentencepiece model"):
        Tokenizer.from_file(tmp_path / "junk.model")
    with pytest.raises(NmtError, match="d.model"):
        prepare_bpe(
            options(
                tmp_path / "out", raw_corpus.prefix("train"), spm_model=str(tmp_path / "d.model")
            ),
            progress=False,
        )
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- prepare-bpe


def test_roundtrip_and_binarized_valid_match_raw_text(prepared, tok, raw_corpus):
    dest, report = prepared
    for split, prefix in (("valid", "val"), ("test", "test")):
        raw = raw_corpus.lines(prefix, "en")
        assert read_raw(dest, split, "en") == raw
        data = ParallelData.load(dest, split)
        assert len(data) == len(raw) == report["splits"][split]["lines"]
        for i, line in enumerate(raw):
            assert tok.decode(tok.encode(line)) == tok.normalize(line)
            assert data.src(i).tolist() == tok.encode(line)
            if line.isascii():  # NFKC changes nothing but whitespace in plain ASCII
                assert tok.normalize(line) == " ".join(line.split())


def test_report_schema_and_fingerprint(prepared):
    dest, report = prepared
    assert read_meta(dest) == report
    assert list(report["splits"]) == ["train", "valid", "test"]
    assert report["dtype"] == "uint16" and report["spm"]["source"] == "trained"
    for split in report["splits"].values():
        assert split["kept"] + sum(split["dropped"].values()) == split["lines"]
        assert set(split["dropped"]) == set(DROP_REASONS)
    assert set(report["sha256"]) >= {"train.en.bin", "train.de.idx", "valid.en.bin"}
    assert len(report["fingerprint"]) == 64 and report["options"]["vocab_size"] == 500
    files = {p.name for p in dest.iterdir()}
    assert {"spm.model", "spm.vocab", "prepare.json", "valid.raw.de", "test.raw.en"} <= files
    assert not any(name.startswith("train.raw") for name in files)


def _expected_reason(tok, src, tgt, min_len, max_len, max_ratio):
    if not src.strip() or not tgt.strip():
        return "empty"
    ls, lt = len(tok.encode(src)), len(tok.encode(tgt))
    if min(ls, lt) < min_len:
        return "too_short"
    if max(ls, lt) > max_len:
        return "too_long"
    if ls > max_ratio * lt or lt > max_ratio * ls:
        return "ratio"
    return None


def test_train_filter_counts_and_alignment_valid_test_untouched(
    tmp_path, prepared, tok, raw_corpus
):
    src, tgt = raw_corpus.lines("train", "en")[:120], raw_corpus.lines("train", "de")[:120]
    long_en, long_de = " ".join(src[:12]), " ".join(tgt[:12])
    planted = {  # position -> (source, target, reason)
        3: ("", tgt[3], "empty"),
        10: (src[10], "   ", "empty"),
        20: ("\u200b", tgt[20], "too_short"),  # not whitespace, but normalized away
        30: (long_en, long_de, "too_long"),
        40: ("Ja.", tgt[40], "ratio"),
    }
    for i, (s, t, _) in planted.items():
        src[i], tgt[i] = s, t
    for split in ("train", "valid"):
        write_lines(tmp_path / f"{split}.en", src)
        write_lines(tmp_path / f"{split}.de", tgt)
    limits = dict(min_len=1, max_len=60, max_ratio=3.0)
    report = prepare_bpe(
        options(
            tmp_path / "out",
            str(tmp_path / "train"),
            validpref=str(tmp_path / "valid"),
            testpref=str(tmp_path / "valid"),
            spm_model=str(prepared[0] / "spm.model"),
            **limits,
        ),
        progress=False,
    )

    reasons = [_expected_reason(tok, s, t, **limits) for s, t in zip(src, tgt, strict=True)]
    assert {i: reasons[i] for i in planted} == {i: p[2] for i, p in planted.items()}
    train = report["splits"]["train"]
    assert train["dropped"] == {r: reasons.count(r) for r in DROP_REASONS}
    assert train["kept"] == reasons.count(None) and train["lines"] == len(src)
    kept = [
        (tok.normalize(s), tok.normalize(t))
        for s, t, r in zip(src, tgt, reasons, strict=True)
        if r is None
    ]
    assert decoded(tok, ParallelData.load(tmp_path / "out", "train")) == kept

    for split in ("valid", "test"):  # never filtered: one entry per line, empty ones too
        info = report["splits"][split]
        assert info["kept"] == info["lines"] == len(src) and not any(info["dropped"].values())
        data = ParallelData.load(tmp_path / "out", split)
        assert data.src_sizes[3] == 0 and data.src_sizes[30] > 60
        assert decoded(tok, data) == [
            (tok.normalize(s), tok.normalize(t)) for s, t in zip(src, tgt, strict=True)
        ]
        assert read_raw(tmp_path / "out", split, "de") == tgt


def test_dirty_input_is_cleaned_counted_and_stays_aligned(
    tmp_path, prepared, tok, raw_corpus, caplog
):
    src, tgt = raw_corpus.lines("train", "en")[:40], raw_corpus.lines("train", "de")[:40]
    dirty = [line.encode() for line in src]
    dirty[0] = b"\xef\xbb\xbf" + dirty[0]  # BOM
    dirty[4] = dirty[4] + b" \xff\xfe"  # invalid UTF-8 (line 5)
    dirty[7] = dirty[7].replace(b" ", b"\x00", 1)  # NUL (line 8)
    dirty[10] = dirty[10].replace(b" ", "\u2028".encode(), 1)  # line separator (line 11)
    dirty[12] = dirty[12].replace(b" ", b"\r", 1)  # lone CR (line 13)
    (tmp_path / "train.en").write_bytes(b"".join(line + b"\r\n" for line in dirty))  # CRLF
    (tmp_path / "train.de.gz").write_bytes(gzip.compress("\n".join(tgt).encode()))  # no final \n
    report = prepare_bpe(
        options(
            tmp_path / "out",
            str(tmp_path / "train"),
            validpref=str(tmp_path / "train"),
            max_ratio=0,
            spm_model=str(prepared[0] / "spm.model"),
        ),
        progress=False,
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("train.en: cleaned 4 lines" in w and "first: 5, 8, 11, 13" in w for w in warnings)

    clean = list(src)
    clean[4] += " \ufffd\ufffd"  # NUL, U+2028 and CR became the spaces they replaced
    info = report["splits"]["valid"]["cleaned"]["en"]
    assert (info["invalid_utf8"], info["nul"], info["line_breaks"]) == (1, 1, 2)
    assert info["first_lines"] == [5, 8, 11, 13]
    assert report["splits"]["valid"]["cleaned"]["de"]["first_lines"] == []
    assert read_raw(tmp_path / "out", "valid", "en")[4] == clean[4]
    expected = [(tok.normalize(s), tok.normalize(t)) for s, t in zip(clean, tgt, strict=True)]
    for split in ("train", "valid"):  # nothing dropped here: line i still pairs with line i
        assert decoded(tok, ParallelData.load(tmp_path / "out", split)) == expected


def test_reuse_spm_model_and_workers_give_identical_output(tmp_path, prepared, raw_corpus):
    dest, report = prepared
    runs = {}
    for workers in (1, 2):
        opts = options(
            tmp_path / f"w{workers}",
            raw_corpus.prefix("train"),
            validpref=raw_corpus.prefix("val"),
            testpref=raw_corpus.prefix("test"),
            spm_model=str(dest / "spm.model"),
            workers=workers,
        )
        runs[workers] = prepare_bpe(opts, progress=False)
        assert (tmp_path / f"w{workers}" / "spm.model").read_bytes() == (
            dest / "spm.model"
        ).read_bytes()
    assert runs[1]["spm"]["source"] == str(dest / "spm.model")
    assert runs[1]["fingerprint"] == runs[2]["fingerprint"] == report["fingerprint"]
    assert runs[1]["sha256"] == runs[2]["sha256"] == report["sha256"]
    assert runs[1]["splits"] == report["splits"]


def test_mismatched_line_counts_name_both_files(tmp_path):
    write_lines(tmp_path / "train.en", ["a", "b", "c"])
    write_lines(tmp_path / "train.de", ["a", "b"])
    with pytest.raises(NmtError, match=r"train\.en has 3 lines but .*train\.de has 2"):
        prepare_bpe(options(tmp_path / "out", str(tmp_path / "train")), progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_files_are_named(tmp_path, raw_corpus):
    with pytest.raises(NmtError, match=r"nope\.en not found \(nor nope\.en\.gz\)"):
        prepare_bpe(options(tmp_path / "out", str(tmp_path / "nope")), progress=False)
    write_lines(tmp_path / "val.en", ["x"])
    with pytest.raises(NmtError, match=r"val\.de not found"):
        prepare_bpe(
            options(tmp_path / "out", raw_corpus.prefix("train"), validpref=str(tmp_path / "val")),
            progress=False,
        )
    assert list(tmp_path.iterdir()) == [tmp_path / "val.en"]


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_ratio=0.5),
        dict(min_len=300),
        dict(workers=0),
        dict(model_type="char"),
        dict(vocab_size=2),
    ],
    ids=lambda bad: ",".join(f"{k}={v}" for k, v in bad.items()),
)
def test_bad_options_are_errors_naming_the_option(tmp_path, raw_corpus, bad):
    with pytest.raises(NmtError, match="--"):
        prepare_bpe(options(tmp_path / "out", raw_corpus.prefix("train"), **bad), progress=False)


def test_vocab_size_is_checked_only_where_it_is_used(tmp_path):
    """A model given by --spm-model brings its vocabulary: --vocab-size is unused, so unchecked."""
    with pytest.raises(NmtError, match="^--vocab-size must be at least 8, got 2$"):
        options(tmp_path / "out", "train", vocab_size=2).check()
    options(tmp_path / "out", "train", vocab_size=2, spm_model=str(tmp_path / "spm.model")).check()


def test_destdir_needs_force_and_failures_keep_old_output(
    tmp_path, prepared, raw_corpus, monkeypatch
):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    opts = options(dest, raw_corpus.prefix("train"), spm_model=str(prepared[0] / "spm.model"))
    with pytest.raises(NmtError, match="--force"):
        prepare_bpe(opts, progress=False)
    opts.force = True
    with pytest.raises(NmtError, match="no prepare.json"):  # not ours: never deleted
        prepare_bpe(opts, progress=False)
    (dest / "notes.txt").unlink()
    first = prepare_bpe(opts, progress=False)
    (dest / "stale.bin").write_bytes(b"x")
    before = {p.name: p.read_bytes() for p in dest.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(nmt.prepare, "_binarize", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_bpe(opts, progress=False)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary directory left
    monkeypatch.undo()
    second = prepare_bpe(opts, progress=False)
    assert not (dest / "stale.bin").exists()  # replaced as a whole, never mixed
    assert second["fingerprint"] == first["fingerprint"]
    assert json.loads((dest / "prepare.json").read_text())["fingerprint"] == first["fingerprint"]


@pytest.mark.parametrize("inside", ["--trainpref", "--spm-model"])
def test_destdir_that_holds_an_input_is_refused(tmp_path, prepared, raw_corpus, inside):
    """--destdir is replaced as a whole: an input in it would be deleted (or rewritten) after it was
    read."""
    dest = tmp_path / "data"
    shutil.copytree(prepared[0], dest)
    for lang in ("en", "de"):
        shutil.copy(f"{raw_corpus.prefix('train')}.{lang}", dest / f"corpus.{lang}")
    train = str(dest / "corpus") if inside == "--trainpref" else raw_corpus.prefix("train")
    spm = str(dest / "spm.model") if inside == "--spm-model" else None
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with pytest.raises(
        NmtError, match=rf"--destdir {dest} contains the .* \({inside} {dest}/.*\); choose another"
    ):
        prepare_bpe(options(dest, train, spm_model=spm, force=True, vocab_size=500), progress=False)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_index_files_are_consistent(prepared):
    dest, report = prepared
    for split, info in report["splits"].items():
        for lang in ("en", "de"):
            offsets = np.fromfile(dest / f"{split}.{lang}.idx", dtype="<i8")
            tokens = np.fromfile(dest / f"{split}.{lang}.bin", dtype="<u2")
            assert len(offsets) == info["kept"] + 1 and offsets[0] == 0
            assert offsets[-1] == len(tokens) == info["tokens"][lang]
            assert np.all(np.diff(offsets) >= 0) and tokens.max() < report["vocab_size"]
            assert not np.isin(tokens, [NMT_SPECIALS.pad, NMT_SPECIALS.bos, NMT_SPECIALS.eos]).any()
