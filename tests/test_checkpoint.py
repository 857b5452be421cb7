"""Checkpoints: atomic writes survive failures and kills, loading errors name the file,
listing is numeric, averaging follows fairseq's rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nmt import checkpoint
from nmt.atomic import clean_temporaries
from nmt.checkpoint import (
    atomic_save,
    average_checkpoints,
    link_or_copy,
    list_update_checkpoints,
    load_checkpoint,
    load_latest,
    prune_checkpoints,
    select_for_average,
)
from nmt.errors import NmtError


def make_ckpt(model: dict[str, torch.Tensor], update: int = 1, **extra) -> dict:
    ckpt = {
        "format_version": 1,
        "model": model,
        "config": {"model": {"d_model": 8}},
        "vocab_size": 8,
        "tokenizer": {"model": b"\x00spm bytes\xff", "sha256": "ab" * 32},
        "update": update,
        "epoch": 1,
        "train_state": {
            "optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}},
            "rng": {"torch": torch.get_rng_state()},
        },
    }
    ckpt.update(extra)
    return ckpt


def write(path: Path, model: dict[str, torch.Tensor], update: int = 1, **extra) -> Path:
    atomic_save(make_ckpt(model, update, **extra), path)
    return path


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


# ------------------------------------------------------------------ atomic writes


def test_atomic_save_roundtrip_keeps_bytes_and_rng_state(tmp_path):
    path = write(tmp_path / "c.pt", {"w": torch.arange(4.0)})
    ckpt = load_checkpoint(path)
    assert ckpt["tokenizer"]["model"] == b"\x00spm bytes\xff"  # bytes pass weights_only
    assert torch.equal(ckpt["model"]["w"], torch.arange(4.0))
    assert ckpt["train_state"]["rng"]["torch"].dtype == torch.uint8
    assert leftovers(tmp_path) == []


def test_failed_write_leaves_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = write(tmp_path / "c.pt", {"w": torch.zeros(3)})
    real_save = torch.save

    def save_then_fail(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial bytes")
        raise RuntimeError("simulated crash mid-write")

    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(RuntimeError, match="simulated"):
        atomic_save(make_ckpt({"w": torch.ones(3)}), path)
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.zeros(3))
    assert leftovers(tmp_path) == []


def test_disk_full_becomes_nmt_error_naming_the_path(tmp_path, monkeypatch):
    path = write(tmp_path / "c.pt", {"w": torch.zeros(3)})

    def save_disk_full(obj, f, *args, **kwargs):
        try:
            raise OSError(28, "No space left on device")
        except OSError:  # torch reports a failed write as a RuntimeError with this context
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None

    monkeypatch.setattr(torch, "save", save_disk_full)
    with pytest.raises(NmtError, match=r"c\.pt: cannot write checkpoint \(No space left"):
        atomic_save(make_ckpt({"w": torch.ones(3)}), path)
    assert leftovers(tmp_path) == []
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.zeros(3))


def test_unwritable_directory_is_nmt_error(tmp_path):
    with pytest.raises(NmtError, match="missing-dir"):
        atomic_save({"x": 1}, tmp_path / "missing-dir" / "c.pt")


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, torch
    from nmt.checkpoint import atomic_save
    path = sys.argv[1]
    for i in range(1, 10_000):
        model = {"w": torch.full((1 << 21,), float(i))}
        atomic_save({"format_version": 1, "config": {}, "model": model}, path)
        print(i, flush=True)
    """
)


def test_sigkill_during_writes_never_leaves_a_partial_file(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        done = [int(proc.stdout.readline()) for _ in range(3)]  # a few complete writes
        assert done == [1, 2, 3]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    value = load_checkpoint(path)["model"]["w"]
    assert value.shape == (1 << 21,) and torch.all(value == value[0]) and value[0] >= 3
    clean_temporaries(tmp_path)
    assert leftovers(tmp_path) == []
    assert load_checkpoint(path)["model"]["w"][0] == value[0]


def test_clean_temporaries_removes_dead_writers_only(tmp_path):
    (tmp_path / ".checkpoint_7.pt.tmp-999999999-0a1b2c3d").write_bytes(b"partial")
    (tmp_path / f".checkpoint_8.pt.tmp-{os.getpid()}-00ff").write_bytes(b"in flight")
    (tmp_path / "checkpoint_7.pt").write_bytes(b"not a temporary")
    (tmp_path / "notes.tmp-1-2").write_bytes(b"not ours")
    assert clean_temporaries(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".checkpoint_8.pt.tmp-{os.getpid()}-00ff",
        "checkpoint_7.pt",
        "notes.tmp-1-2",
    ]


def test_link_or_copy_shares_content_and_later_saves_do_not_touch_the_other_name(tmp_path):
    numbered = write(tmp_path / "checkpoint_10.pt", {"w": torch.zeros(2)}, update=10)
    link_or_copy(numbered, tmp_path / "checkpoint_last.pt")
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 10
    write(tmp_path / "checkpoint_last.pt", {"w": torch.ones(2)}, update=11)
    assert load_checkpoint(numbered)["update"] == 10
    numbered.unlink()  # pruning the numbered file keeps the other name whole
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 11
    assert leftovers(tmp_path) == []


def test_link_or_copy_falls_back_to_a_copy(tmp_path, monkeypatch):
    numbered = write(tmp_path / "checkpoint_10.pt", {"w": torch.zeros(2)}, update=10)

    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    link_or_copy(numbered, tmp_path / "checkpoint_best.pt")
    assert (tmp_path / "checkpoint_best.pt").read_bytes() == numbered.read_bytes()
    with pytest.raises(NmtError, match=r"checkpoint_last\.pt: cannot write checkpoint"):
        link_or_copy(tmp_path / "missing.pt", tmp_path / "checkpoint_last.pt")
    assert leftovers(tmp_path) == []


def test_load_latest_prefers_checkpoint_last(tmp_path):
    assert load_latest(tmp_path / "new-run") is None
    assert load_latest(tmp_path) is None
    write(tmp_path / "checkpoint_9.pt", {}, update=9)
    write(tmp_path / "checkpoint_10.pt", {}, update=10)
    assert load_latest(tmp_path)["update"] == 10  # checkpoint_last.pt deleted by hand
    write(tmp_path / "checkpoint_last.pt", {}, update=12)
    assert load_latest(tmp_path)["update"] == 12
    atomic_save(
        {k: v for k, v in make_ckpt({}).items() if k != "train_state"},
        tmp_path / "checkpoint_last.pt",
    )
    with pytest.raises(NmtError, match=r"checkpoint_last\.pt: not a training checkpoint"):
        load_latest(tmp_path)


# ------------------------------------------------------------------ loading errors


def test_load_missing_checkpoint(tmp_path):
    with pytest.raises(NmtError, match=r"nope\.pt: checkpoint not found"):
        load_checkpoint(tmp_path / "nope.pt")


def test_load_truncated_checkpoint(tmp_path):
    path = write(tmp_path / "c.pt", {"w": torch.randn(256)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(NmtError, match=r"c\.pt: corrupt or truncated checkpoint \("):
        load_checkpoint(path)


@pytest.mark.parametrize("content", [b"", b"garbage" * 20])
def test_load_garbage_checkpoint(tmp_path, content):
    path = tmp_path / "g.pt"
    path.write_bytes(content)
    with pytest.raises(NmtError, match=r"g\.pt: corrupt or truncated checkpoint"):
        load_checkpoint(path)


def test_load_rejects_missing_keys_and_unknown_version(tmp_path):
    atomic_save({"model": {}}, tmp_path / "a.pt")
    with pytest.raises(NmtError, match=r"a\.pt: corrupt .*missing format_version, config"):
        load_checkpoint(tmp_path / "a.pt")
    atomic_save([1, 2], tmp_path / "b.pt")
    with pytest.raises(NmtError, match=r"b\.pt: corrupt .*not a dict"):
        load_checkpoint(tmp_path / "b.pt")
    write(tmp_path / "c.pt", {}, format_version=99)
    with pytest.raises(NmtError, match=r"c\.pt: unsupported checkpoint format_version 99"):
        load_checkpoint(tmp_path / "c.pt")


def test_load_refuses_pickled_objects(tmp_path):
    torch.save(make_ckpt({}, extra=Path("x")), tmp_path / "p.pt")  # not allowed by weights_only
    with pytest.raises(NmtError, match=r"p\.pt: .*safe loading"):
        load_checkpoint(tmp_path / "p.pt")


# ------------------------------------------------------------------ listing, pruning


def test_update_checkpoints_sort_numerically_and_pruning_keeps_special_files(tmp_path):
    for name in [
        "checkpoint_100.pt",
        "checkpoint_9.pt",
        "checkpoint_10.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
        "checkpoint_avg5.pt",
        "checkpoint_10.pt.bak",
        ".checkpoint_11.pt.tmp-1-ab",
    ]:
        (tmp_path / name).write_bytes(b"x")
    assert list_update_checkpoints(tmp_path) == [
        (9, tmp_path / "checkpoint_9.pt"),
        (10, tmp_path / "checkpoint_10.pt"),
        (100, tmp_path / "checkpoint_100.pt"),
    ]
    assert prune_checkpoints(tmp_path, 0) == []
    assert prune_checkpoints(tmp_path, 2) == [tmp_path / "checkpoint_9.pt"]
    assert prune_checkpoints(tmp_path, 1) == [tmp_path / "checkpoint_10.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".checkpoint_11.pt.tmp-1-ab",
        "checkpoint_10.pt.bak",
        "checkpoint_100.pt",
        "checkpoint_avg5.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
    ]


def test_select_for_average_picks_latest_by_number(tmp_path):
    for update in (9, 100, 10, 20):
        (tmp_path / f"checkpoint_{update}.pt").write_bytes(b"x")
    assert [p.name for p in select_for_average(tmp_path, 2)] == [
        "checkpoint_20.pt",
        "checkpoint_100.pt",
    ]
    with pytest.raises(NmtError, match="last 5 checkpoints but only 4"):
        select_for_average(tmp_path, 5)
    with pytest.raises(NmtError, match="run directory not found"):
        select_for_average(tmp_path / "missing", 1)


# ------------------------------------------------------------------ averaging


def test_average_arithmetic_keeps_config_and_drops_train_state(tmp_path):
    a = write(
        tmp_path / "checkpoint_10.pt",
        {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor([7])},
        update=10,
    )
    b = write(
        tmp_path / "checkpoint_20.pt",
        {"w": torch.tensor([3.0, 4.0]), "steps": torch.tensor([7])},
        update=20,
    )
    out = tmp_path / "avg.pt"
    result = average_checkpoints([a, b], out)
    saved = load_checkpoint(out)
    for ckpt in (result, saved):
        assert torch.equal(ckpt["model"]["w"], torch.tensor([2.0, 3.0]))
        assert torch.equal(ckpt["model"]["steps"], torch.tensor([7]))  # integer buffer copied
        assert ckpt["update"] == 20
        assert ckpt["config"] == {"model": {"d_model": 8}}
        assert ckpt["vocab_size"] == 8 and ckpt["tokenizer"]["model"] == b"\x00spm bytes\xff"
        assert ckpt["averaged_from"] == ["checkpoint_10.pt", "checkpoint_20.pt"]
        assert "train_state" not in ckpt


@pytest.mark.parametrize(
    "dtype, values",
    [
        # fp16 sums overflow on 60000 + 50000 (max 65504) and round 2048 + 1 back to 2048
        (torch.float16, [[60000.0, 2048.0], [50000.0, 1.0], [55000.0, 1.0]]),
        # bf16 (8 significant bits) rounds 256 + 1 back to 256
        (torch.bfloat16, [[2.0, 256.0], [4.0, 1.0], [6.0, 1.0]]),
    ],
)
def test_low_precision_weights_are_averaged_in_fp32_and_keep_their_dtype(tmp_path, dtype, values):
    paths = [
        write(tmp_path / f"c{i}.pt", {"w": torch.tensor(v, dtype=dtype)})
        for i, v in enumerate(values)
    ]
    averaged = average_checkpoints(paths, tmp_path / "avg.pt")["model"]["w"]
    expected = torch.tensor(values, dtype=dtype).double().mean(0).to(dtype)
    assert averaged.dtype == dtype
    assert torch.equal(averaged, expected)
    naive = torch.zeros(2, dtype=dtype)
    for v in values:
        naive += torch.tensor(v, dtype=dtype)
    assert not torch.equal(naive / len(values), expected)  # what fp32 accumulation avoids


def test_averaging_copies_of_one_checkpoint_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    model = {
        "fp32": torch.randn(1000),
        "fp16": torch.randn(100).half(),
        "bf16": torch.randn(100).bfloat16(),
        "fp64": torch.randn(100, dtype=torch.float64),
        "mask": torch.rand(10) > 0.5,
        "ids": torch.arange(5),
    }
    path = write(tmp_path / "c.pt", model)
    averaged = average_checkpoints([path] * 7, tmp_path / "avg.pt")["model"]
    for key, tensor in model.items():
        assert averaged[key].dtype == tensor.dtype
        assert torch.equal(averaged[key], tensor), key


# id: (a.pt's model, b.pt's model, b.pt's other entries, the error averaging [a, b])
DISAGREEING = {
    "integer_buffer": (
        {"w": torch.ones(2), "steps": torch.tensor(1)},
        {"w": torch.ones(2), "steps": torch.tensor(2)},
        {},
        r"b\.pt: integer buffer steps differs from .*a\.pt",
    ),
    "key_only_in_the_first": (
        {"w": torch.ones(2), "extra": torch.ones(1)},
        {"w": torch.ones(2)},
        {},
        r"key extra is in .*a\.pt but not in .*b\.pt",
    ),
    "key_only_in_a_later_one": (
        {"w": torch.ones(2)},
        {"w": torch.ones(2), "extra": torch.ones(1)},
        {},
        r"key extra is in .*b\.pt but not in .*a\.pt",
    ),
    "shape": (
        {"w": torch.ones(2, 3)},
        {"w": torch.ones(3, 2)},
        {},
        r"key w has shape \(2, 3\) in .*a\.pt but \(3, 2\) in .*b\.pt",
    ),
    "vocabulary_size": (
        {"w": torch.ones(2)},
        {"w": torch.ones(2)},
        {"vocab_size": 9},
        r"vocab_size is 8 in .*a\.pt but 9 in .*b\.pt",
    ),
}


@pytest.mark.parametrize("case", list(DISAGREEING))
def test_average_refuses_checkpoints_that_disagree_naming_both_files(tmp_path, case):
    model_a, model_b, extra_b, message = DISAGREEING[case]
    a, b = write(tmp_path / "a.pt", model_a), write(tmp_path / "b.pt", model_b, **extra_b)
    with pytest.raises(NmtError, match=message):
        average_checkpoints([a, b], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


def test_average_needs_existing_inputs_and_the_same_tokenizer(tmp_path):
    a = write(tmp_path / "a.pt", {"w": torch.ones(2)})
    with pytest.raises(NmtError, match="at least one"):
        average_checkpoints([], tmp_path / "avg.pt")
    with pytest.raises(NmtError, match=r"missing\.pt: checkpoint not found"):
        average_checkpoints([a, tmp_path / "missing.pt"], tmp_path / "avg.pt")
    b = write(
        tmp_path / "b.pt", {"w": torch.ones(2)}, tokenizer={"model": b"other", "sha256": "cd" * 32}
    )
    with pytest.raises(NmtError, match="different tokenizers"):
        average_checkpoints([a, b], tmp_path / "avg.pt")


@pytest.mark.parametrize(
    ("key", "first", "second"),
    [("heads", 8, 4), ("max_positions", 256, 512), ("norm_first", False, True)],
)
def test_average_refuses_models_of_different_configs_whose_shapes_agree(
    tmp_path, key, first, second
):
    a = write(tmp_path / "a.pt", {"w": torch.ones(2)}, config={"model": {"d_model": 8, key: first}})
    b = write(
        tmp_path / "b.pt", {"w": torch.ones(2)}, config={"model": {"d_model": 8, key: second}}
    )
    with pytest.raises(
        NmtError, match=rf"model\.{key} is {first!r} in .*a\.pt but {second!r} in .*b\.pt"
    ):
        average_checkpoints([a, b], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()
    same = write(
        tmp_path / "c.pt",
        {"w": torch.ones(2)},
        config={"model": {"d_model": 8, key: first}, "train": {"lr": 1.0}},
    )
    average_checkpoints([a, same], tmp_path / "avg.pt")  # other sections (train, decode) may differ


def test_format_version_constant_matches_architecture():
    assert checkpoint.FORMAT_VERSION == 1


def test_load_latest_falls_back_past_a_corrupt_last_checkpoint(tmp_path, caplog):
    from nmt.checkpoint import load_latest

    for update in (2, 4):
        atomic_save(
            {
                "format_version": 1,
                "model": {"w": torch.full((2,), float(update))},
                "config": {},
                "update": update,
                "train_state": {},
            },
            tmp_path / f"checkpoint_{update}.pt",
        )
    (tmp_path / "checkpoint_last.pt").write_bytes((tmp_path / "checkpoint_4.pt").read_bytes()[:100])
    with caplog.at_level("WARNING"):
        state = load_latest(tmp_path)
    assert state["update"] == 4
    assert "checkpoint_last.pt" in caplog.text
    (tmp_path / "checkpoint_4.pt").write_bytes(b"garbage")
    assert load_latest(tmp_path)["update"] == 2
    (tmp_path / "checkpoint_2.pt").write_bytes(b"")
    with pytest.raises(NmtError, match="no checkpoint loads.*checkpoint_last.pt"):
        load_latest(tmp_path)
