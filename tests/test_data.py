"""Memory-mapped splits, token-based batching, sharding (nmt.training.data), collation."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from nmt.data import (
    Batch,
    Batches,
    ParallelData,
    collate,
    make_batches,
    read_meta,
    read_raw,
)
from nmt.errors import NmtError
from nmt.tokenizer import NMT_SPECIALS, SpecialIds, Tokenizer
from nmt.training.data import EMPTY_SHARD, shard_batches


def padded_cost(batch, src, tgt) -> int:
    return len(batch) * (int(src[batch].max()) + 1 + int(tgt[batch].max()) + 1)


@pytest.fixture(scope="module")
def sizes():
    """Skewed lengths like real data, with a few very long pairs."""
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, size=3000)
    tgt = np.maximum(1, src + rng.integers(-5, 6, size=3000))
    src[[7, 70, 700]], tgt[[7, 70, 700]] = [300, 500, 40], [310, 30, 900]
    return src, tgt


# ---------------------------------------------------------------- loading


def test_read_meta_and_load_errors_name_the_file(tmp_path, prepared):
    with pytest.raises(NmtError, match=r"nowhere: data directory not found \(data.dir"):
        read_meta(tmp_path / "nowhere")
    with pytest.raises(NmtError, match=r"prepare\.json not found"):
        read_meta(tmp_path)
    dest, _ = prepared
    with pytest.raises(NmtError, match=r"no split 'valid2' \(has train, valid, test\)"):
        ParallelData.load(dest, "valid2")
    with pytest.raises(NmtError, match=r"no language 'fr'"):
        ParallelData.load(dest, "train", "fr", "de")
    broken = tmp_path / "broken"
    shutil.copytree(dest, broken)
    data = (broken / "valid.de.idx").read_bytes()
    (broken / "valid.de.idx").write_bytes(data[:-8])
    with pytest.raises(NmtError, match=r"valid\.de\.idx does not match valid\.de\.bin"):
        ParallelData.load(broken, "valid")
    (broken / "valid.de.bin").unlink()
    with pytest.raises(NmtError, match=r"valid\.de\.bin not found"):
        ParallelData.load(broken, "valid")
    with pytest.raises(NmtError, match=r"test\.raw\.fr: cannot read"):
        read_raw(broken, "test", "fr")


def test_parallel_data_matches_report_and_both_directions(prepared):
    dest, report = prepared
    tok = Tokenizer.from_file(dest / "spm.model")
    train = ParallelData.load(dest, "train")
    info = report["splits"]["train"]
    assert len(train) == info["kept"]
    assert int(train.src_sizes.sum()) == info["tokens"]["en"]
    assert int(train.tgt_sizes.sum()) == info["tokens"]["de"]
    assert isinstance(train.src_data.tokens, np.memmap)
    backwards = ParallelData.load(dest, "train", "de", "en")
    assert np.array_equal(backwards.src_sizes, train.tgt_sizes)
    assert np.array_equal(backwards.tgt(5), train.src(5))
    valid = ParallelData.load(dest, "valid")
    for i, line in enumerate(read_raw(dest, "valid", "de")):
        assert valid.tgt(i).tolist() == tok.encode(line)


# ---------------------------------------------------------------- batches


def test_batches_respect_max_tokens_and_cover_each_pair_once(sizes):
    src, tgt = sizes
    for shuffle in (True, False):
        batches = make_batches(src, tgt, 500, seed=3, epoch=1, shuffle=shuffle, max_positions=512)
        assert isinstance(batches, Batches) and batches.excluded == 1  # index 700: 900 > 511
        assert batches.oversized == 2  # 7 and 70 fit max_positions but not 500 tokens
        ids = np.concatenate(batches)
        assert sorted(ids.tolist()) == [i for i in range(len(src)) if i != 700]
        for b in batches:
            assert padded_cost(b, src, tgt) <= 500 or (len(b) == 1 and b[0] in (7, 70))
    no_limit = make_batches(src, tgt, 500, seed=3, epoch=1)
    assert no_limit.excluded == 0 and no_limit.oversized == 3


def test_batches_depend_on_seed_and_epoch_only(sizes):
    src, tgt = sizes

    def as_lists(batches):
        return [b.tolist() for b in batches]

    one = as_lists(make_batches(src, tgt, 2000, seed=1, epoch=4))
    assert one == as_lists(make_batches(src.copy(), tgt.copy(), 2000, seed=1, epoch=4))
    assert one != as_lists(make_batches(src, tgt, 2000, seed=1, epoch=5))
    assert one != as_lists(make_batches(src, tgt, 2000, seed=2, epoch=4))
    ordered = as_lists(make_batches(src, tgt, 2000, seed=1, epoch=4, shuffle=False))
    assert ordered == as_lists(make_batches(src, tgt, 2000, seed=9, epoch=0, shuffle=False))
    flat = np.concatenate(ordered)
    assert np.all(np.diff(src[flat]) >= 0)  # validation order: sorted by source length


def test_pooled_sorting_keeps_padding_low(prepared):
    dest, _ = prepared
    data = ParallelData.load(dest, "train")
    src, tgt = data.src_sizes, data.tgt_sizes
    batches = make_batches(src, tgt, 600, seed=1, epoch=0)
    real = int((src + tgt + 2).sum())
    padded = sum(padded_cost(b, src, tgt) for b in batches)
    assert real / padded > 0.7  # random batches of Multi30k lengths give about 0.6


def test_shard_batches_equal_lengths_and_union(sizes):
    batches = make_batches(*sizes, 1500, seed=1, epoch=0)
    assert shard_batches(batches, 0, 1) is batches
    for world in (2, 3, 4, 7):
        shards = [shard_batches(batches, rank, world) for rank in range(world)]
        assert len({len(s) for s in shards}) == 1
        real = [b for s in shards for b in s if b is not EMPTY_SHARD]
        assert sorted(b.tolist() for b in real) == sorted(b.tolist() for b in batches)
        for shard in shards:  # padding only at the end
            n_real = sum(b is not EMPTY_SHARD for b in shard)
            assert all(b is not EMPTY_SHARD for b in shard[:n_real])
            assert all(b is EMPTY_SHARD for b in shard[n_real:])
    with pytest.raises(ValueError):
        shard_batches(batches, 2, 2)


@pytest.mark.parametrize(
    "specials",
    [NMT_SPECIALS, SpecialIds(pad=1000, unk=1, bos=1001, eos=1002)],
    ids=["nmt", "other"],
)
def test_collate_layout(prepared, specials):
    """The special ids are the ones given (the vocabulary's), never constants of collate's own."""
    dest, _ = prepared
    data = ParallelData.load(dest, "valid")
    ids = [5, 0, 17, 3]
    batch = collate(data, ids, specials)
    pad, bos, eos = specials.pad, specials.bos, specials.eos
    src_len, tgt_len = data.src_sizes[ids], data.tgt_sizes[ids]
    assert batch.src.shape == (4, src_len.max() + 1) and batch.src.dtype == torch.long
    assert batch.prev_output.shape == batch.target.shape == (4, tgt_len.max() + 1)
    assert batch.ids.tolist() == ids and len(batch) == 4
    assert batch.num_target_tokens == int((batch.target != pad).sum()) == int(tgt_len.sum()) + 4
    for row, i in enumerate(ids):
        n, m = src_len[row], tgt_len[row]
        assert batch.src[row, :n].tolist() == data.src(i).tolist() and batch.src[row, n] == eos
        assert (batch.src[row, n + 1 :] == pad).all()
        assert batch.prev_output[row, 0] == bos
        assert batch.prev_output[row, 1 : m + 1].tolist() == data.tgt(i).tolist()
        assert (
            batch.target[row, :m].tolist() == data.tgt(i).tolist() and batch.target[row, m] == eos
        )
        assert (batch.prev_output[row, m + 1 :] == pad).all() and (
            batch.target[row, m + 1 :] == pad
        ).all()
    moved = batch.to("cpu")
    assert (
        torch.equal(moved.target, batch.target)
        and moved.num_target_tokens == batch.num_target_tokens
    )


def padded_positions(batch: Batch) -> int:
    """Source and target positions of the padded tensors (what a batch costs to run)."""
    return batch.src.numel() + batch.target.numel()


def test_batches_padded_to_a_multiple_keep_the_budget_and_repeat_shapes(prepared):
    d = ParallelData.load(prepared[0], "train")
    plain = make_batches(d.src_sizes, d.tgt_sizes, 600, seed=1, epoch=1)
    padded = make_batches(d.src_sizes, d.tgt_sizes, 600, seed=1, epoch=1, pad_to=8)
    assert sorted(i for b in padded for i in b) == sorted(
        i for b in plain for i in b
    )  # every pair once
    shapes = {1: set(), 8: set()}
    for pad_to, batches in ((1, plain), (8, padded)):
        for ids in batches:
            batch = collate(d, ids, NMT_SPECIALS, pad_to=pad_to)
            assert padded_positions(batch) <= 600 or len(ids) == 1
            shapes[pad_to].add((batch.src.size(1), batch.target.size(1)))
            assert batch.src.size(1) % pad_to == 0 and batch.target.size(1) % pad_to == 0
    assert len(shapes[8]) < len(shapes[1])


def test_prefetcher_yields_what_collate_makes_and_passes_errors_on(prepared):
    from nmt.training.data import Prefetcher

    d = ParallelData.load(prepared[0], "train")
    groups = [
        [b, EMPTY_SHARD] for b in make_batches(d.src_sizes, d.tgt_sizes, 600, seed=1, epoch=1)
    ]
    with Prefetcher(d, groups, NMT_SPECIALS, pad_to=8, pin_memory=False) as fetched:
        got = list(fetched)
    assert len(got) == len(groups)
    for (ids, _), (batch, empty) in zip(groups, got, strict=True):
        want = collate(d, ids, NMT_SPECIALS, pad_to=8)
        assert (
            empty is EMPTY_SHARD
            and torch.equal(batch.src, want.src)
            and torch.equal(batch.target_index, want.target_index)
        )
    with Prefetcher(
        d, groups, NMT_SPECIALS, pad_to=1, pin_memory=False
    ) as fetched:  # stopped early: no hang
        next(iter(fetched))
    with (
        pytest.raises(IndexError),
        Prefetcher(d, [[np.array([10**9])]], NMT_SPECIALS, pad_to=1, pin_memory=False) as bad,
    ):
        list(bad)
