"""Attention you can see: `translate --alignment` (valid Pharaoh pairs on every line),
`--attention FILE.npz` (rows that sum to one, the right pieces), the same through the Python
API, for the Transformer and the RNN; `nmt plot attention` / `nmt plot curves`, and the
TensorBoard mirror of metrics.jsonl.

Random tiny models as in test_translate (a random model never emits EOS: max_len_b 6).
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, nmt, nmt_here, one_error_line, records, save_random_model, tiny

from nmt.api import Translator
from nmt.decoding.alignment import default_layer, hard_alignment, load_attention, pharaoh
from nmt.errors import NmtError

ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
PAIR = re.compile(r"^(\d+)-(\d+)$")


@pytest.fixture(autouse=True)
def keep_logging():
    """`nmt_here` points the root logger at this test's (captured) stderr, which is closed after
    it: give the next tests back the handlers they had."""
    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def models(test_tokenizer, tmp_path_factory) -> dict[str, Path]:
    root, spm = tmp_path_factory.mktemp("attention"), test_tokenizer
    two_layers = {"encoder_layers": 2, "decoder_layers": 2}
    return {
        "transformer": save_random_model(root / "t.pt", spm, seed=1, model=two_layers),
        "rnn": save_random_model(
            root / "rnn.pt", spm, seed=2, model={"arch": "rnn", "rnn_hidden": 32}
        ),
        "rnn-none": save_random_model(
            root / "none.pt",
            spm,
            seed=3,
            model={"arch": "rnn", "rnn_hidden": 32, "attention": "none"},
        ),
    }


@pytest.fixture(scope="module")
def sentences(raw_corpus) -> list[str]:
    lines = raw_corpus.lines("test", "en")[:12]
    return [lines[0], "", "   ", *lines[1:]]  # empty and blank lines stay empty


def write_input(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def run_translate(tmp_path: Path, lines: list[str], *args: str) -> list[str]:
    out = tmp_path / "out.txt"
    assert (
        nmt_here("translate", "-i", str(write_input(tmp_path, lines)), "-o", str(out), *args) == 0
    )
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) == len(lines) + 1  # one line per input line
    return got[:-1]


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_alignments_are_valid_index_pairs_on_every_line(models, sentences, tmp_path, arch):
    translator = Translator.load(models[arch], device="cpu")
    tok = translator.loaded.tokenizer
    got = run_translate(tmp_path, sentences, "-c", str(models[arch]), "--alignment")
    api = translator.translate_nbest(sentences, alignment=True, attention=True)
    for line, out, hyps in zip(sentences, got, api, strict=True):
        if not line.strip():
            assert out == "" and hyps == []
            continue
        text, alignment = out.split("\t")
        assert text == hyps[0].text
        n_src, n_tgt = len(tok.encode(line)), len(hyps[0].attention.target) - 1
        pairs = [tuple(map(int, PAIR.match(p).groups())) for p in alignment.split()]
        assert [j for _, j in pairs] == list(range(n_tgt))  # every target piece once, in order
        assert all(0 <= i < n_src for i, _ in pairs)
        assert alignment == pharaoh(hyps[0].alignment)


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_attention_file_rows_sum_to_one_with_the_pieces(models, sentences, tmp_path, arch):
    npz = tmp_path / "att.npz"
    got = run_translate(
        tmp_path, sentences, "-c", str(models[arch]), "--attention", str(npz), "--batch-size", "3"
    )
    tok = Translator.load(models[arch], device="cpu").loaded.tokenizer
    items = load_attention(npz)
    assert [i for i, *_ in items] == [i for i, line in enumerate(sentences) if line.strip()]
    layers, heads = (2, 2) if arch == "transformer" else (1, 1)
    for index, weights, src, tgt in items:
        assert src == [tok.piece(t) for t in tok.encode(sentences[index])] + ["</s>"]
        assert tgt[-1] == "</s>" and all(isinstance(p, str) and p for p in tgt)
        assert weights.shape == (layers, heads, len(tgt), len(src)) and weights.dtype == np.float32
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert (weights >= 0).all()
        assert got[index] != ""


def test_alignment_with_nbest_and_scores_follows_each_hypothesis(models, sentences, tmp_path):
    got = run_translate(
        tmp_path,
        sentences[:1],
        "-c",
        str(models["transformer"]),
        "--alignment",
        "--nbest",
        "2",
        "--scores",
    )
    fields = got[0].split("\t")
    assert len(fields) == 6
    assert float(fields[0]) <= 0 and float(fields[3]) <= 0
    assert all(PAIR.match(p) for p in (fields[2] + " " + fields[5]).split())


def test_alignment_layer_picks_the_layer(models, sentences):
    for layer, index in ((0, 0), (-1, 1), (None, 1)):
        tr = Translator.load(models["transformer"], device="cpu", alignment_layer=layer)
        for hs in tr.translate_nbest(sentences[:4], alignment=True, attention=True):
            if hs:
                assert hs[0].alignment == hard_alignment(hs[0].attention.weights, index)
    assert default_layer(2) == 1 and default_layer(1) == 0 and default_layer(6) == 5


def test_a_model_without_attention_or_a_missing_layer_is_one_line(models, tmp_path):
    src = write_input(tmp_path, ["A dog runs."])
    r = nmt("translate", "-c", str(models["rnn-none"]), "-i", str(src), "--alignment", env=ENV)
    assert r.returncode == 1, r.stderr
    one_error_line(r.stderr, "no attention")
    r = nmt(
        "translate",
        "-c",
        str(models["transformer"]),
        "-i",
        str(src),
        "--alignment",
        "--alignment-layer",
        "5",
        env=ENV,
    )
    assert (
        r.returncode == 1 and "--alignment-layer 5" in r.stderr and "Traceback" not in r.stderr
    ), r.stderr
    with pytest.raises(NmtError, match="alignment_layer="):
        Translator.load(models["transformer"], device="cpu", alignment_layer=-3)


# ------------------------------------------------------------------ pictures


def test_plot_attention_and_curves_write_pngs(models, sentences, tmp_path):
    pytest.importorskip("matplotlib")
    npz = tmp_path / "att.npz"
    run_translate(
        tmp_path, sentences[:3], "-c", str(models["transformer"]), "--attention", str(npz)
    )
    assert nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / "maps")) == 0
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["attention_0.png"]
    assert nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / "avg"), "--average") == 0
    assert (tmp_path / "avg/attention_0.png").read_bytes()[:4] == b"\x89PNG"
    runs = []
    for name, offset in (("a", 0.0), ("b", 0.5)):
        run = tmp_path / name
        run.mkdir()
        lines = [
            {
                "type": "train",
                "update": u,
                "loss": 9 - u / 10 + offset,
                "ppl": 2 ** (8 - u / 10),
                "lr": 1e-3,
                "elapsed": u * 1.5,
            }
            for u in range(1, 40)
        ]
        lines += [
            {
                "type": "valid",
                "update": u,
                "valid_loss": 8 - u / 20,
                "valid_ppl": 2 ** (7 - u / 20),
                "valid_bleu": u / 2,
                "elapsed": u * 1.5,
            }
            for u in (10, 20, 30)
        ]
        (run / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in lines) + '{"type": "tr'
        )
        runs.append(str(run))
    assert nmt_here("plot", "curves", *runs, "-o", str(tmp_path / "curves.png")) == 0
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch, capfd):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    (tmp_path / "run").mkdir()
    (tmp_path / "run/metrics.jsonl").write_text('{"type": "train", "update": 1, "loss": 1.0}\n')
    assert nmt_here("plot", "curves", str(tmp_path / "run"), "-o", str(tmp_path / "c.png")) == 1
    err = capfd.readouterr().err
    assert "pip install 'nmt[plot]'" in err and err.strip().count("\n") == 0, err


def test_plot_curves_of_a_directory_without_metrics_is_one_line(tmp_path, capfd):
    assert nmt_here("plot", "curves", str(tmp_path), "-o", str(tmp_path / "c.png")) == 1
    assert "no metrics.jsonl" in capfd.readouterr().err


# --------------------------------------------------------- hostile files (issue 25 (7), (8), (14))


def attention_file(path: Path, **changes) -> Path:
    """A small valid `--attention` file (sentence 0, two layers), with `changes` (None removes an
    array)."""
    arrays = {
        "index": np.array([0]),
        "attention_0": np.full((2, 1, 2, 2), 0.5, "f4"),
        "source_0": np.array(["a", "</s>"]),
        "target_0": np.array(["x", "</s>"]),
        **changes,
    }
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def npy(array: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """`array` in the .npy format, its header declaring `shape` if given (a forged file)."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array)
    data = buffer.getvalue()
    if shape is None:
        return data
    old, new = repr(array.shape).encode() + b", }", repr(shape).encode() + b", }"
    return data.replace(old + b" " * (len(new) - len(old)), new)  # the header keeps its length


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        (
            {"index": np.array([0, 1])},
            "attention_1",
        ),  # the issue's: an index without its arrays (KeyError)
        ({"index": None}, "index"),
        ({"index": np.array([[0]])}, "index"),
        ({"index": np.array(["0"])}, "index"),
        (
            {"attention_0": np.array([None, 1], dtype=object)},
            "attention_0",
        ),  # refused by numpy, outside the handler
        ({"attention_0": np.ones((2, 2), "f4")}, "attention_0"),
        (
            {
                "attention_0": np.ones((1, 1, 0, 0), "f4"),
                "source_0": np.array([], str),
                "target_0": np.array([], str),
            },
            "attention_0",
        ),
        ({"attention_0": np.ones((1, 1, 2, 2), "c8")}, "attention_0"),
        ({"attention_0": np.full((1, 1, 2, 2), np.nan, "f4")}, "attention_0"),
        (
            {"attention_0": np.full((1, 1, 2, 3), 0.3, "f4")},
            "source_0",
        ),  # 3 source columns, 2 pieces
        ({"target_0": np.array([1, 2])}, "target_0"),
        ({"source_0": None}, "source_0"),
    ],
)
def test_plot_attention_of_a_malformed_file_is_one_line_naming_the_file_and_key(
    tmp_path, capfd, changes, key
):
    npz = attention_file(tmp_path / "m.npz", **changes)
    assert nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / "maps")) == 1
    err = one_error_line(capfd.readouterr().err)
    assert f"{npz}: {key}:" in err, err
    assert not (tmp_path / "maps").exists()  # checked before anything is drawn


def test_plot_attention_of_what_is_not_an_npz_file_is_one_line(tmp_path, capfd):
    np.save(tmp_path / "plain.npy", np.ones(3))
    good = attention_file(tmp_path / "good.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(good[: len(good) // 2])  # was BadZipFile
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "dir.npz").mkdir()
    with zipfile.ZipFile(
        tmp_path / "forged.npz", "w"
    ) as archive:  # numpy would allocate 2^42 floats (MemoryError)
        archive.writestr("index.npy", npy(np.array([0])))
        archive.writestr(
            "attention_0.npy", npy(np.ones((1, 1, 2, 2), "f4"), shape=(1, 1, 2**21, 2**21))
        )
    for name in ("plain.npy", "truncated.npz", "empty.npz", "dir.npz", "forged.npz"):
        assert (
            nmt_here("plot", "attention", str(tmp_path / name), "-o", str(tmp_path / "maps")) == 1
        ), name
        assert f"{tmp_path / name}: " in one_error_line(capfd.readouterr().err)
    assert not (tmp_path / "maps").exists()


def test_plot_attention_refuses_a_bad_destination_or_count_in_one_line(tmp_path, capfd):
    npz = attention_file(tmp_path / "a.npz")
    (tmp_path / "file").write_text("keep")
    for out, needle in (
        ("file", "-o"),
        ("file/maps", "-o"),
    ):  # an existing file; a directory that cannot be made
        assert nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / out)) == 1
        assert needle in one_error_line(capfd.readouterr().err)
    assert (tmp_path / "file").read_text() == "keep"
    assert (
        nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / "maps"), "--sentences", "-1")
        == 1
    )
    # was accepted, and dropped the last sentence
    assert "--sentences must not be negative, got -1" in one_error_line(capfd.readouterr().err)
    assert not (tmp_path / "maps").exists()


def test_plot_curves_checks_the_image_format_before_reading_the_runs(tmp_path, capfd, monkeypatch):
    pytest.importorskip("matplotlib")
    import nmt.plot

    def no_reading(run_dir):
        raise AssertionError("the runs were read before the format was checked")

    monkeypatch.setattr(nmt.plot, "read_metrics", no_reading)
    assert nmt_here("plot", "curves", str(tmp_path), "-o", str(tmp_path / "c.unknownext")) == 1
    assert (
        "-o" in (err := one_error_line(capfd.readouterr().err))
        and ".unknownext" in err
        and "png" in err
    )


def test_plot_curves_skips_bad_records_and_says_how_many(tmp_path, capfd):
    pytest.importorskip("matplotlib")
    from nmt.plot import read_metrics

    good = [
        {"type": "train", "update": u, "loss": 5.0 - u, "ppl": 30.0, "lr": 1e-3, "elapsed": u * 2.0}
        for u in (1, 2, 3)
    ] + [{"type": "valid", "update": 2, "valid_bleu": 1.5, "elapsed": 4.0}]
    bad = [
        b'{"type": "train", "update": 9, \xff\xfe "loss": 1}',  # invalid UTF-8
        b'{"type": "train", "update": 9, "loss": 1.0, "elapsed": "x"}',
        b'{"type": "train", "update": 9, "loss": 1e400}',  # inf
        b'{"type": "train", "update": 9, "loss": 1' + b"0" * 400 + b"}",  # 10^400, beyond any float
        b'{"type": "train", "update": 9, "loss": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        b"[1, 2]",
        b'{"type": "train", "update": true, "loss": 1.0}',
        b'{"type": 7, "update": 9}',
    ]
    lines = [
        json.dumps(good[0]).encode(),
        *bad[:4],
        *(json.dumps(r).encode() for r in good[1:]),
        *bad[4:],
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(
        b"\n".join(lines) + b'\n\n{"type": "tr'
    )  # a killed run's last line
    assert nmt_here("plot", "curves", str(run), "-o", str(tmp_path / "c.png")) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert (
        len(warnings) == 1
        and f"{run / 'metrics.jsonl'}: skipped 9 bad record(s), the first on line 2" in warnings[0]
    )
    assert read_metrics(run) == (good[:3], good[3:])


def test_attention_is_written_as_the_lines_are_translated(models, sentences, tmp_path, monkeypatch):
    """Issue 25 (14): the attention of every line was kept in memory until the end (~62 KB a
    sentence). Now each line's arrays are in the file's temporary before the next line is read."""
    npz, sizes = tmp_path / "att.npz", []
    real = Translator.translate_nbest

    def watching(self, texts, *args, **kwargs):
        sizes.append(sum(p.stat().st_size for p in tmp_path.glob(".att.npz.tmp-*")))
        return real(self, texts, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_nbest", watching)
    lines = [s for s in sentences if s.strip()][:4]
    run_translate(
        tmp_path,
        lines,
        "-c",
        str(models["transformer"]),
        "--attention",
        str(npz),
        "--buffer-lines",
        "1",
    )
    assert len(sizes) == 4 and 0 < sizes[1] < sizes[2] < sizes[3], sizes
    assert [i for i, *_ in load_attention(npz)] == [0, 1, 2, 3]
    assert not list(tmp_path.glob(".att.npz.tmp-*"))


def test_a_failed_translation_leaves_no_attention_file(
    models, sentences, tmp_path, monkeypatch, capfd
):
    npz = tmp_path / "att.npz"
    npz.write_bytes(b"old")
    real, calls = Translator.translate_nbest, []

    def failing(self, texts, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise NmtError("stop here")
        return real(self, texts, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_nbest", failing)
    src = write_input(tmp_path, [s for s in sentences if s.strip()][:4])
    assert (
        nmt_here(
            "translate",
            "-c",
            str(models["transformer"]),
            "-i",
            str(src),
            "-o",
            str(tmp_path / "out.txt"),
            "--attention",
            str(npz),
            "--buffer-lines",
            "1",
        )
        == 1
    )
    assert "stop here" in capfd.readouterr().err
    assert npz.read_bytes() == b"old" and not list(tmp_path.glob(".att.npz.tmp-*"))


def test_plot_curves_never_draw_over_the_metrics(tmp_path, capfd):
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"type": "train", "update": 1, "loss": 1.0}\n')
    link = tmp_path / "curves.png"
    link.symlink_to(metrics)  # a figure's name, written through to the metrics
    assert nmt_here("plot", "curves", str(run), "-o", str(link)) == 1
    assert (
        f"-o {link} is the metrics (RUN_DIR {metrics}); choose another output"
        in capfd.readouterr().err
    )
    assert metrics.read_text() == '{"type": "train", "update": 1, "loss": 1.0}\n'


def test_plot_attention_never_draws_over_the_file_it_reads(tmp_path, capfd):
    maps = tmp_path / "maps"
    maps.mkdir()
    npz = (
        maps / "attention_0.png"
    )  # an --attention file under the name of the picture it would give
    with open(npz, "wb") as f:
        np.savez(
            f,
            index=np.array([0]),
            attention_0=np.full((1, 1, 2, 2), 0.5, "f4"),
            source_0=np.array(["a", "</s>"]),
            target_0=np.array(["x", "</s>"]),
        )
    before = npz.read_bytes()
    assert nmt_here("plot", "attention", str(npz), "-o", str(maps)) == 1
    assert f"-o {npz} is the attention file (ATTENTION {npz})" in capfd.readouterr().err
    assert npz.read_bytes() == before


# ------------------------------------------------------------------ TensorBoard


def test_tensorboard_mirrors_the_metrics(prepared, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from nmt.training.trainer import train

    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        train(tiny(prepared[0], tmp_path / "run", max_updates=4, tensorboard=True))
    finally:
        torch.set_num_threads(threads)
    events = EventAccumulator(str(tmp_path / "run/tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert losses == pytest.approx(
        [r["loss"] for r in records(tmp_path / "run", "train")], rel=1e-6
    )


def test_tensorboard_without_the_package_is_one_line(prepared, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name.startswith("tensorboard"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    from nmt.training.trainer import train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(NmtError, match="pip install tensorboard"):
            train(tiny(prepared[0], tmp_path / "run", max_updates=2, tensorboard=True))
    finally:
        torch.set_num_threads(threads)
