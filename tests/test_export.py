"""`nmt export --format ctranslate2`: the exported model computes what ours computes.

Against the real `ctranslate2` package where it is installed (`pip install -e ".[dev]"` brings
it); those tests skip without it, the refusals run anyway. Per-token log-probabilities of forced
decoding are compared on random models of every architecture variant (post-/pre-norm,
sinusoidal/learned positions, tied/untied embeddings), which checks each fact of the mapping
(positions counted from 0, embedding scale, final norms, fused q/k/v, BOS start, source EOS); greedy
and beam outputs of a trained model are compared with `nmt translate`'s on real sentences.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import dead_pid, nmt_here, save_random_model

from nmt import Translator
from nmt.convert.ctranslate2 import export
from nmt.decoding.predict import score_token_lists
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer

try:
    import ctranslate2 as ct2
except ImportError:
    ct2 = None
needs_ctranslate2 = pytest.mark.skipif(
    ct2 is None, reason="ctranslate2 is not installed (pip install 'nmt[ctranslate2]')"
)

VARIANTS = {
    "post-norm, sinusoids, tied": {},
    "pre-norm": {"norm_first": True},
    "learned positions": {"learned_positions": True},
    "untied source embeddings": {"share_embeddings": False},
    "odd head size, 3 layers": {
        "d_model": 36,
        "heads": 3,
        "encoder_layers": 3,
        "decoder_layers": 2,
    },
    "deep encoder, one decoder layer (a distilled student)": {
        "encoder_layers": 4,
        "decoder_layers": 1,
    },
    # issue 26: the options of Marian / Hugging Face MarianMT models
    "marian: swish, untied output with bias, zero start, eps 1e-6": {
        "activation": "swish",
        "tie_output": False,
        "output_bias": True,
        "decoder_start": "zeros",
        "norm_eps": 1e-6,
        "positions": "marian",
    },
    "hf marian: gelu, separate embeddings, its table": {
        "activation": "gelu",
        "share_embeddings": False,
        "output_bias": True,
        "positions": "hf_marian",
        "decoder_start": "zeros",
    },
    "pre-norm, gelu_sigmoid, untied output": {
        "norm_first": True,
        "activation": "gelu_sigmoid",
        "tie_output": False,
    },
    "gelu_tanh": {"activation": "gelu_tanh"},
    # issue 37: prepare-bpe --separate-vocab's two vocabularies (source_vocabulary.json,
    # target_vocabulary.json)
    "separate vocabularies": {"share_embeddings": False},
}


pytestmark = pytest.mark.usefixtures(
    "one_thread", "restore_logging"
)  # conftest: torch on one thread


def pieces(tokenizer, text: str, side: int = 0) -> list[str]:
    """The pieces of a source text (`side` 1: of a target text)."""
    return [
        tokenizer.vocabularies()[side][i]
        for i in (tokenizer.encode_target if side else tokenizer.encode)(text)
    ]


def ct2_translate(
    model_dir: Path, tokenizer, texts: list[str], beam: int, lenpen: float
) -> list[str]:
    """CTranslate2 with the settings that equal nmt's length-style search: |Y| counts the EOS
    (return_end_token, then dropped), <unk> is never produced, lengths do not bind."""
    translator = ct2.Translator(str(model_dir), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        [pieces(tokenizer, t) for t in texts],
        beam_size=beam,
        length_penalty=lenpen,
        return_end_token=True,
        disable_unk=True,
        max_decoding_length=250,
        max_input_length=0,
    )
    out = []
    for r in results:
        hyp = r.hypotheses[0]
        out.append(
            tokenizer.decode([tokenizer._sp.piece_to_id(p) for p in hyp if p != "</s>"]).strip()
        )
    return out


@needs_ctranslate2
@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_model_gives_the_same_token_log_probs(
    variant, test_tokenizer, raw_corpus, request, tmp_path
):
    if variant == "separate vocabularies":
        test_tokenizer = Tokenizer.from_file(
            request.getfixturevalue("prepared_separate")[0] / "spm.model"
        )
    ckpt = save_random_model(tmp_path / "m.pt", test_tokenizer, seed=3, model=VARIANTS[variant])
    if VARIANTS[variant].get("output_bias"):  # initialised to zeros: make it count
        state = torch.load(ckpt, weights_only=True)
        state["model"]["output_bias"] = torch.randn(
            test_tokenizer.vocab_size, generator=torch.Generator().manual_seed(4)
        )
        torch.save(state, ckpt)
    export(ckpt, tmp_path / "ct2")
    assert (tmp_path / "ct2/source_vocabulary.json").exists() == (
        variant == "separate vocabularies"
    )
    ours = Translator.load(ckpt, device="cpu")
    tok = ours.loaded.tokenizer
    sources, targets = raw_corpus.lines("test", "en")[:16], raw_corpus.lines("test", "de")[:16]
    expected = score_token_lists(
        ours.loaded.model,
        [tok.encode(s) for s in sources],
        [tok.encode_target(t) for t in targets],
        ours.decode,
        specials=tok.specials,
    )
    got = ct2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1).score_batch(
        [pieces(tok, s) for s in sources], [pieces(tok, t, 1) for t in targets]
    )
    for g, e, t in zip(got, expected, targets, strict=True):
        assert g.tokens == [*pieces(tok, t, 1), "</s>"]
        assert g.log_probs == pytest.approx(e, abs=2e-4)


@needs_ctranslate2
def test_exported_greedy_and_beam_equal_nmt_translate(trained_checkpoint, raw_corpus, tmp_path):
    """Real sentences (Multi30k val and test lines) through `nmt export` and `nmt translate`.
    Only a near-tie may differ: then both outputs must score within 1e-3 under our model (the
    two engines round differently in the last bits). nmt's side is its own search (torch)."""
    out_dir = tmp_path / "ct2"
    assert nmt_here("export", str(trained_checkpoint), str(out_dir)) == 0
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "config.json",
        "model.bin",
        "shared_vocabulary.json",
        "spm.model",
    ]
    texts = raw_corpus.lines("test", "en") + raw_corpus.lines("val", "en")
    (tmp_path / "in.en").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    ours = Translator.load(trained_checkpoint, device="cpu")
    tok = ours.loaded.tokenizer
    for beam in (1, 5):
        out = tmp_path / f"beam{beam}.de"
        assert (
            nmt_here(
                "translate",
                "-c",
                str(trained_checkpoint),
                "-i",
                str(tmp_path / "in.en"),
                "-o",
                str(out),
                "--device",
                "cpu",
                "--engine",
                "torch",
                "--beam",
                str(beam),
                "--lenpen",
                "1.0",
                "--lenpen-style",
                "length",
                "--max-len-a",
                "3",
                "--max-len-b",
                "50",
            )
            == 0
        )
        expected = out.read_text(encoding="utf-8").split("\n")[:-1]
        got = ct2_translate(out_dir, tok, texts, beam, lenpen=1.0)
        differ = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
        assert len(differ) <= 2, differ  # 0 of 100 differed when written, at beam 1 and 5
        for i in differ:
            a, b = ours.score([texts[i]] * 2, [expected[i], got[i]], normalize=True)
            assert abs(a - b) < 1e-3, (beam, texts[i], expected[i], got[i], a, b)


@needs_ctranslate2
def test_quantized_exports_load_and_translate(trained_checkpoint, raw_corpus, tmp_path):
    texts = raw_corpus.lines("test", "en")[:8]
    tok = Translator.load(trained_checkpoint, device="cpu").loaded.tokenizer
    fp32 = tmp_path / "fp32"
    export(trained_checkpoint, fp32)
    for quantization in ("int8", "int8_float32", "float16", "bfloat16"):
        out = tmp_path / quantization
        export(trained_checkpoint, out, quantization=quantization)
        assert (out / "model.bin").stat().st_size < (fp32 / "model.bin").stat().st_size
        if quantization.startswith(
            "int8"
        ):  # float16 / bfloat16 need a GPU or a CPU with them to run
            got = ct2_translate(out, tok, texts, beam=2, lenpen=1.0)
            assert len(got) == len(texts) and all(got)


# ------------------------------------------------------------------ refusals


def _one_line_error(capfd, needle: str) -> None:
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err


def test_without_ctranslate2_the_command_says_how_to_install_it(
    trained_checkpoint, tmp_path, monkeypatch, capfd
):
    real_import = builtins.__import__

    def no_ctranslate2(name, *args, **kwargs):
        if name.startswith("ctranslate2"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ctranslate2)
    assert nmt_here("export", str(trained_checkpoint), str(tmp_path / "out")) == 1
    _one_line_error(capfd, "pip install 'nmt[ctranslate2]'")
    assert not (tmp_path / "out").exists()


def test_weights_the_export_does_not_know_are_refused(test_tokenizer, tmp_path, capfd):
    ckpt = save_random_model(tmp_path / "m.pt", test_tokenizer, seed=1)
    state = torch.load(ckpt, weights_only=True)
    state["model"]["decoder.0.gate.weight"] = torch.zeros(4)  # a layer of some future architecture
    torch.save(state, ckpt)
    assert nmt_here("export", str(ckpt), str(tmp_path / "out")) == 1
    _one_line_error(capfd, "decoder.0.gate.weight")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # nothing left behind


@needs_ctranslate2
def test_a_weight_the_table_does_not_place_is_refused(test_tokenizer, tmp_path, monkeypatch, capfd):
    """The export writes every weight of the model or none: the weight table's CTRANSLATE2 layout
    without its output-bias row refuses a model with an output bias, naming the weight."""
    import nmt.convert.ctranslate2
    from nmt.convert.table import CTRANSLATE2

    layout = dataclasses.replace(
        CTRANSLATE2, top=tuple(row for row in CTRANSLATE2.top if row.nmt != "output_bias")
    )
    monkeypatch.setattr(nmt.convert.ctranslate2, "CTRANSLATE2", layout)
    ckpt = save_random_model(tmp_path / "m.pt", test_tokenizer, seed=1, model={"output_bias": True})
    assert nmt_here("export", str(ckpt), str(tmp_path / "out")) == 1
    _one_line_error(capfd, "the CTranslate2 layout has no place for nmt's weights output_bias")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_model_settings_the_export_does_not_map_are_refused(
    test_tokenizer, tmp_path, monkeypatch, capfd
):
    import nmt.convert.ctranslate2

    ckpt = save_random_model(
        tmp_path / "m.pt", test_tokenizer, seed=1, model={"learned_positions": True}
    )
    monkeypatch.setattr(
        nmt.convert.ctranslate2,
        "EXPORTED_FIELDS",
        nmt.convert.ctranslate2.EXPORTED_FIELDS - {"learned_positions"},
    )
    assert nmt_here("export", str(ckpt), str(tmp_path / "out")) == 1
    _one_line_error(capfd, "model.learned_positions=True cannot be represented")


@needs_ctranslate2
def test_an_existing_directory_needs_force_and_must_be_an_export(
    trained_checkpoint, tmp_path, capfd
):
    out = tmp_path / "out"
    export(trained_checkpoint, out)
    assert nmt_here("export", str(trained_checkpoint), str(out)) == 1
    _one_line_error(capfd, "use --force")
    assert (
        nmt_here("export", str(trained_checkpoint), str(out), "--force", "--quantization", "int8")
        == 0
    )
    assert json.loads((out / "config.json").read_text())["add_source_eos"] is True
    assert "wrote" in capfd.readouterr().err
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    assert nmt_here("export", str(trained_checkpoint), str(other), "--force") == 1
    _one_line_error(capfd, "is not a CTranslate2 model")
    assert (other / "todo.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--format", "onnx"], "--format must be one of ctranslate2"),
        (["--quantization", "int4"], "--quantization must be one of"),
    ],
)
def test_bad_options_are_one_line(trained_checkpoint, tmp_path, capfd, args, needle):
    assert nmt_here("export", str(trained_checkpoint), str(tmp_path / "out"), *args) == 1
    _one_line_error(capfd, needle)


def test_a_missing_checkpoint_is_one_line(tmp_path, capfd):
    with pytest.raises(NmtError, match="nope.pt"):
        export(tmp_path / "nope.pt", tmp_path / "out")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("tokenizer", None, "the checkpoint holds no sentencepiece model"),
        ("tokenizer", {"sha256": "0"}, "the checkpoint holds no sentencepiece model"),
        ("vocab_size", None, "the checkpoint's vocab_size is missing"),
        ("vocab_size", "500", "the checkpoint's vocab_size is missing"),
        ("model", None, "corrupt or truncated checkpoint (missing model)"),
        ("config", None, "corrupt or truncated checkpoint (missing config)"),
    ],
    ids=[
        "no tokenizer",
        "tokenizer without its model",
        "no vocab_size",
        "vocab_size a str",
        "no model",
        "no config",
    ],
)
def test_a_checkpoint_without_what_export_needs_is_one_line(
    test_tokenizer, tmp_path, capfd, key, value, needle
):
    """Export loads with the checks of translation (nmt.checkpoint.load_model_checkpoint): a
    checkpoint missing its tokenizer, vocab_size, model or config is a one-line error naming it
    and the key, never a KeyError's traceback, and nothing is written."""
    ckpt = save_random_model(tmp_path / "m.pt", test_tokenizer, seed=1)
    state = torch.load(ckpt, weights_only=True)
    if value is None:
        del state[key]
    else:
        state[key] = value
    torch.save(state, ckpt)
    assert nmt_here("export", str(ckpt), str(tmp_path / "out")) == 1
    _one_line_error(capfd, f"{ckpt}: {needle}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


# ------------------------------------------------------------------ destinations


@pytest.fixture
def model(test_tokenizer, tmp_path) -> Path:
    return save_random_model(tmp_path / "m.pt", test_tokenizer, seed=1)


@needs_ctranslate2
def test_a_symlinked_destination_is_written_through(model, tmp_path):
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to("real")
    assert nmt_here("export", str(model), str(link)) == 0
    assert link.is_symlink() and (tmp_path / "real" / "model.bin").is_file()
    assert (
        nmt_here("export", str(model), str(link), "--force") == 0
    )  # the export behind the link replaced
    assert link.is_symlink() and (tmp_path / "real" / "model.bin").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "m.pt", "real"]


def test_the_current_directory_is_refused_in_one_line(model, tmp_path, monkeypatch, capfd):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for name in (".", ".."):
        assert nmt_here("export", str(model), name) == 1
        _one_line_error(capfd, f"OUT_DIR {name}: name a directory to create or replace")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "m.pt"]


@needs_ctranslate2
def test_force_never_deletes_the_checkpoint_being_exported(model, tmp_path, capfd):
    out = tmp_path / "out"
    export(model, out)
    inside = out / "model.pt"
    shutil.copy(model, inside)
    (tmp_path / "via.pt").symlink_to(inside)
    for ckpt in (inside, tmp_path / "via.pt"):
        assert nmt_here("export", str(ckpt), str(out), "--force") == 1
        _one_line_error(
            capfd,
            f"OUT_DIR {out} contains the checkpoint (CHECKPOINT {ckpt}); choose another output",
        )
    assert inside.read_bytes() == model.read_bytes()


@needs_ctranslate2
@pytest.mark.parametrize(
    ("where", "code"), [("mkdir", errno.EACCES), ("mkdir", errno.EROFS), ("write", errno.ENOSPC)]
)
def test_a_destination_that_cannot_be_written_is_one_line_and_keeps_the_old_export(
    model, tmp_path, monkeypatch, capfd, where, code
):
    """An unwritable parent, a read-only filesystem and a full disk. The tests run as root, where
    chmod cannot make a directory unwritable: the OSError is raised where the system raises it."""
    out = tmp_path / "out"
    export(model, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    if where == "mkdir":
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if Path(path).parent == tmp_path:
                raise OSError(code, os.strerror(code), str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    else:

        def full(self, data):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(Path, "write_bytes", full)
    assert nmt_here("export", str(model), str(out), "--force") == 1
    _one_line_error(capfd, f"OUT_DIR {out}: cannot write the export ({os.strerror(code)})")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "out"]  # no temporary left


@needs_ctranslate2
def test_the_leftovers_of_a_killed_export_are_removed(model, tmp_path):
    pid = dead_pid()
    leftovers = [tmp_path / f".out.tmp-{pid}-0123abcd", tmp_path / f".out.old-{pid}-0123abcd"]
    for path in leftovers:
        path.mkdir()
        (path / "model.bin").write_bytes(b"partial")
    alive = tmp_path / f".out.tmp-{os.getpid()}-0123abcd"  # a writer still running: left alone
    alive.mkdir()
    assert nmt_here("export", str(model), str(tmp_path / "out")) == 0
    assert not any(p.exists() for p in leftovers) and alive.is_dir()
