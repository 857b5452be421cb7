"""Lexical shortlists: IBM Model 1 finds the word translations of a made-up language, each
sentence's list holds exactly what it should, and files are checked before use.

Decoding with a shortlist is tested in test_translate.py (equal to a masked full-vocabulary
search, batching invariance, the CLI).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nmt.data import bin_path, idx_path
from nmt.decoding.shortlist import (
    Shortlist,
    learn_shortlist,
    load_shortlist,
    save_shortlist,
    shortlist_command,
)
from nmt.errors import NmtError
from nmt.tokenizer import NMT_SPECIALS


def _vocabulary(size: int, sha256: str) -> SimpleNamespace:
    """What load_shortlist reads of a tokenizer: a joint vocabulary of `size` and its hash."""
    pieces = [str(i) for i in range(size)]
    return SimpleNamespace(
        vocab_size=size,
        sha256=sha256,
        source_vocab_size=None,
        vocabularies=lambda: (pieces, pieces),
    )


V = 80
WORDS = range(10, 50)  # source words; word w translates to TRANSLATION[w]
ARTICLE = 70  # a target token in every sentence, aligned to no source word in particular


def _translation() -> dict[int, int]:
    targets = list(range(10, 50))
    random.Random(0).shuffle(targets)
    return dict(zip(WORDS, targets, strict=True))


TRANSLATION = _translation()


def _write_data_dir(path: Path, pairs: list[tuple[list[int], list[int]]], sha: str = "abc") -> Path:
    """A directory in the layout of `nmt prepare-bpe` holding only a train split of token ids."""
    path.mkdir(parents=True)
    for side, lang in enumerate(("en", "de")):
        seqs = [p[side] for p in pairs]
        np.concatenate(seqs).astype("<u2").tofile(bin_path(path, "train", lang))
        np.concatenate(([0], np.cumsum([len(s) for s in seqs]))).astype("<i8").tofile(
            idx_path(path, "train", lang)
        )
    meta = {
        "format_version": 1,
        "source_lang": "en",
        "target_lang": "de",
        "vocab_size": V,
        "dtype": "uint16",
        "spm": {"model": "spm.model", "sha256": sha},
        "splits": {"train": {"lines": len(pairs)}},
    }
    (path / "prepare.json").write_text(json.dumps(meta), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Sentences of 3-8 source words; the target has their translations in a shuffled order
    and the article first."""
    rng = random.Random(1)
    pairs = []
    for _ in range(400):
        src = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        tgt = [TRANSLATION[w] for w in src]
        rng.shuffle(tgt)
        pairs.append((src, [ARTICLE, *tgt]))
    return _write_data_dir(tmp_path_factory.mktemp("shortlist") / "data", pairs)


def test_ibm_model_1_finds_each_words_translation(data_dir):
    sl = learn_shortlist(data_dir, top=3, frequent=1)
    for w in WORDS:
        assert int(sl.candidates[w, 0]) == TRANSLATION[w], w
    # the article co-occurs with every word but is explained by none: frequent, not a translation
    assert sl.frequent.tolist() == [ARTICLE]
    assert not (sl.candidates[list(WORDS), 0] == ARTICLE).any()
    # tokens never seen in the source have no candidates
    assert (sl.candidates[60:] == -1).all() and (sl.candidates[NMT_SPECIALS.ids()] == -1).all()
    assert sl.vocab_size == V and sl.spm_sha256 == "abc"


def test_learning_in_chunks_gives_the_same_table(data_dir, monkeypatch):
    one = learn_shortlist(data_dir, top=5, frequent=3)
    monkeypatch.setattr("nmt.decoding.shortlist._OCCURRENCES_PER_CHUNK", 500)  # ~40 chunks
    many = learn_shortlist(data_dir, top=5, frequent=3)
    assert torch.equal(one.candidates, many.candidates) and torch.equal(one.frequent, many.frequent)


def test_each_sentence_gets_its_own_list():
    cand = torch.full((V, 2), -1, dtype=torch.long)
    cand[10] = torch.tensor([40, 41])
    cand[11] = torch.tensor([42, -1])
    cand[12] = torch.tensor([43, 44])
    sl = Shortlist(cand, torch.tensor([70, 71]), V, "abc")
    src = torch.tensor(
        [
            [10, 11, 3, 0],  # pad (0) is not a source token
            [12, 12, 12, 3],
        ]
    )
    lists = [[0, 1, 2, 3, 10, 11, 40, 41, 42, 70, 71], [0, 1, 2, 3, 12, 43, 44, 70, 71]]
    allowed = sl.allowed(src, NMT_SPECIALS)
    assert [row.nonzero().view(-1).tolist() for row in allowed] == lists
    vocab, mask = sl.batch_vocab(src, NMT_SPECIALS)  # the union, and each sentence's part of it
    assert vocab.tolist() == sorted(set(lists[0]) | set(lists[1]))
    assert [vocab[row].tolist() for row in mask] == lists


def test_save_and_load_check_the_vocabulary(data_dir, tmp_path):
    sl = learn_shortlist(data_dir, top=4, frequent=2)
    path = tmp_path / "sl.pt"
    save_shortlist(sl, path)
    back = load_shortlist(path, _vocabulary(V, "abc"))
    assert torch.equal(back.candidates, sl.candidates) and torch.equal(back.frequent, sl.frequent)
    with pytest.raises(NmtError, match="another vocabulary"):
        load_shortlist(path, _vocabulary(V, "other"))
    with pytest.raises(NmtError, match="another vocabulary"):
        load_shortlist(path, _vocabulary(V + 1, "abc"))
    with pytest.raises(NmtError, match="not found"):
        load_shortlist(tmp_path / "missing.pt", _vocabulary(V, "abc"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(NmtError, match="junk.pt: not a shortlist"):
        load_shortlist(junk, _vocabulary(V, "abc"))


def test_bad_options_are_errors(data_dir):
    with pytest.raises(NmtError, match="^--top must not be negative, got -1$"):
        learn_shortlist(data_dir, top=-1)
    with pytest.raises(NmtError, match="^--iterations must be at least 1, got 0$"):
        learn_shortlist(data_dir, iterations=0)


@pytest.mark.parametrize("name", ["train.de.bin", "train.en.idx", "prepare.json"])
def test_the_shortlist_never_replaces_a_data_file_it_reads(data_dir, tmp_path, name):
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    with pytest.raises(
        NmtError, match=rf"-o {data / name} is the .* \(DATA_DIR {data / name}\); choose another"
    ):
        shortlist_command(data, data / name, top=3, frequent=1, iterations=1, max_sentences=100)
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before
    shortlist_command(
        data, data / "shortlist.pt", top=3, frequent=1, iterations=1, max_sentences=100
    )  # beside them: fine
    assert load_shortlist(data / "shortlist.pt", _vocabulary(V, "abc")).frequent.numel() == 1
