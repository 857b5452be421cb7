"""Attention you can see: `translate --alignment` (valid Pharaoh pairs on every line),
`--attention FILE.npz` (rows that sum to one, the right pieces), the same through the Python
API, for the Transformer and the RNN; `nmt plot attention` / `nmt plot curves`, and the
TensorBoard mirror of metrics.jsonl.

Random tiny models as in test_translate (a random model never emits EOS: max_len_b 6).
"""

from __future__ import annotations

import builtins
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, nmt, nmt_here, records, save_random_model, tiny

from nmt.api import Translator
from nmt.decoding.alignment import default_layer, hard_alignment, load_attention, pharaoh
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer, train_sentencepiece

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
def models(raw_corpus, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("attention")
    spm = Tokenizer(train_sentencepiece(raw_corpus.lines("train", "en") + raw_corpus.lines("train", "de"),
                                        root / "spm", 500))
    two_layers = {"encoder_layers": 2, "decoder_layers": 2}
    return {
        "transformer": save_random_model(root / "t.pt", spm, seed=1, model=two_layers),
        "rnn": save_random_model(root / "rnn.pt", spm, seed=2, model={"arch": "rnn", "rnn_hidden": 32}),
        "rnn-none": save_random_model(root / "none.pt", spm, seed=3,
                                      model={"arch": "rnn", "rnn_hidden": 32, "attention": "none"}),
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
    assert nmt_here("translate", "-i", str(write_input(tmp_path, lines)), "-o", str(out), *args) == 0
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
    got = run_translate(tmp_path, sentences, "-c", str(models[arch]), "--attention", str(npz), "--batch-size", "3")
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
    got = run_translate(tmp_path, sentences[:1], "-c", str(models["transformer"]), "--alignment", "--nbest", "2",
                        "--scores")
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
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "no attention" in r.stderr, r.stderr
    r = nmt("translate", "-c", str(models["transformer"]), "-i", str(src), "--alignment",
            "--alignment-layer", "5", env=ENV)
    assert r.returncode == 1 and "--alignment-layer 5" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with pytest.raises(NmtError, match="alignment_layer="):
        Translator.load(models["transformer"], device="cpu", alignment_layer=-3)


# ------------------------------------------------------------------ pictures


def test_plot_attention_and_curves_write_pngs(models, sentences, tmp_path):
    pytest.importorskip("matplotlib")
    npz = tmp_path / "att.npz"
    run_translate(tmp_path, sentences[:3], "-c", str(models["transformer"]), "--attention", str(npz))
    assert nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / "maps")) == 0
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["attention_0.png"]
    assert nmt_here("plot", "attention", str(npz), "-o", str(tmp_path / "avg"), "--average") == 0
    assert (tmp_path / "avg/attention_0.png").read_bytes()[:4] == b"\x89PNG"
    runs = []
    for name, offset in (("a", 0.0), ("b", 0.5)):
        run = tmp_path / name
        run.mkdir()
        lines = [{"type": "train", "update": u, "loss": 9 - u / 10 + offset, "ppl": 2 ** (8 - u / 10), "lr": 1e-3,
                  "elapsed": u * 1.5} for u in range(1, 40)]
        lines += [{"type": "valid", "update": u, "valid_loss": 8 - u / 20, "valid_ppl": 2 ** (7 - u / 20),
                   "valid_bleu": u / 2, "elapsed": u * 1.5} for u in (10, 20, 30)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"type": "tr')
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


def test_plot_curves_never_draw_over_the_metrics(tmp_path, capfd):
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"type": "train", "update": 1, "loss": 1.0}\n')
    link = tmp_path / "curves.png"
    link.symlink_to(metrics)  # a figure's name, written through to the metrics
    assert nmt_here("plot", "curves", str(run), "-o", str(link)) == 1
    assert f"-o {link} is the metrics (RUN_DIR {metrics}); choose another output" in capfd.readouterr().err
    assert metrics.read_text() == '{"type": "train", "update": 1, "loss": 1.0}\n'


def test_plot_attention_never_draws_over_the_file_it_reads(tmp_path, capfd):
    maps = tmp_path / "maps"
    maps.mkdir()
    npz = maps / "attention_0.png"  # an --attention file under the name of the picture it would give
    with open(npz, "wb") as f:
        np.savez(f, index=np.array([0]), attention_0=np.full((1, 1, 2, 2), 0.5, "f4"),
                 source_0=np.array(["a", "</s>"]), target_0=np.array(["x", "</s>"]))
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
    assert losses == pytest.approx([r["loss"] for r in records(tmp_path / "run", "train")], rel=1e-6)


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
