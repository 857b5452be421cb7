"""Hostile models, import and export (issue 57): what a damaged or forged model folder, or a
model that overflows, made `nmt import`, `nmt translate` and `nmt export` do, each a one-line
refusal now, and what a round trip through Hugging Face kept.

- a model whose weights are finite but overflow float32 computes NaN: refused at import (a
  probe sentence), and at translation (beam search, sampling, forced decoding) naming the model,
  where every translation came out empty with exit 0;
- a stored `embed_positions.weight` that is not the sinusoid table nmt computes, and tied
  copies of `model.shared.weight` that differ, are refused, not silently replaced;
- generation_config.json's min_new_tokens, no_repeat_ngram_size and max_length, and the
  languages of tokenizer_config.json, survive import -> export -> import; a run trained with a
  config that names no languages saves prepare.json's;
- decode settings nothing can decode with (a beam of 10^9, one position) are refused at import;
- a safetensors file past the address-space limit is one line, not a MemoryError traceback;
- `export --force` replaces an earlier export of the other vocabulary layout.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from helpers import ROOT, nmt_here, one_error_line, tiny
from hf_marian import VARIANTS, Variant, train_spm_pair, write_hf_marian
from marian_npz import write_release
from transformers import MarianMTModel
from transformers import logging as hf_logging

from nmt import Translator
from nmt.checkpoint import atomic_save, load_checkpoint
from nmt.errors import NmtError
from nmt.training.trainer import train

pytestmark = [
    pytest.mark.usefixtures("one_thread", "restore_logging"),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]

Q = "model.encoder.layers.0.self_attn.q_proj.weight"
K = "model.encoder.layers.0.self_attn.k_proj.weight"
NORM = "model.encoder.layers.0.final_layer_norm.weight"
SOURCES = ["A dog runs through the snow.", "Two children play in the park.", "A man reads."]


class Folders:
    """Tiny MarianMT folders (tests/hf_marian.py) and their imports, each made once a module."""

    def __init__(self, raw_corpus: Any, factory: pytest.TempPathFactory):
        self.factory = factory
        self.spm = train_spm_pair(
            raw_corpus.lines("train", "en"), raw_corpus.lines("train", "de"), factory.mktemp("spm")
        )
        self.folders: dict[Variant, Path] = {}
        self.checkpoints: dict[Variant, Path] = {}

    def folder(self, name: str = "swish") -> Path:
        variant = VARIANTS[name]
        if variant not in self.folders:
            self.folders[variant] = write_hf_marian(self.factory.mktemp("hf"), variant, *self.spm)
        return self.folders[variant]

    def checkpoint(self, name: str = "swish") -> Path:
        variant = VARIANTS[name]
        if variant not in self.checkpoints:
            out = self.factory.mktemp("imported") / "model.pt"
            assert nmt_here("import", str(self.folder(name)), "-o", str(out)) == 0
            self.checkpoints[variant] = out
        return self.checkpoints[variant]


@pytest.fixture(scope="module")
def folders(raw_corpus, tmp_path_factory) -> Any:
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    yield Folders(raw_corpus, tmp_path_factory)
    hf_logging.set_verbosity(verbosity)


def copy_of(folders: Folders, tmp_path: Path, name: str = "swish") -> Path:
    folder = tmp_path / "model"
    shutil.copytree(folders.folder(name), folder)
    return folder


def run(capfd: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """`nmt ARGS` in this process: (exit status, stdout, stderr)."""
    capfd.readouterr()
    code = nmt_here(*args)
    out, err = capfd.readouterr()
    return code, out, err


def refused(capfd: pytest.CaptureFixture, *args: str, needles: tuple[str, ...]) -> str:
    code, _, err = run(capfd, *args)
    assert code == 1, err
    return one_error_line(err, *needles)


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**data, **changes}))


def edit_safetensors(folder: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    state = safetensors.torch.load_file(folder / "model.safetensors")
    change(state)
    safetensors.torch.save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def as_bin(folder: Path, state: dict[str, torch.Tensor]) -> None:
    """The folder's weights as an older upload's pytorch_model.bin holding `state`."""
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")


def hf_state(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's model as transformers holds it: tied copies, position tables."""
    model = MarianMTModel.from_pretrained(folder).eval()
    return {k: v.clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------ a model that computes NaN


OVERFLOWS: dict[str, Callable[[dict[str, torch.Tensor]], None]] = {
    # q.k overflows: the attention's softmax is NaN
    "1e30 in an encoder layer": lambda w: (w[Q].fill_(1e30), w[K].fill_(1e30)),
    "a LayerNorm scale of 3e38": lambda w: w[NORM].fill_(3e38),  # a flipped exponent bit
}


@pytest.mark.parametrize("case", OVERFLOWS)
def test_an_import_that_computes_nan_is_refused(folders, tmp_path, capfd, case):
    folder = copy_of(folders, tmp_path)
    edit_safetensors(folder, OVERFLOWS[case])
    out = tmp_path / "out.pt"
    refused(capfd, "import", str(folder), "-o", str(out), needles=(str(folder), "NaN", "probe"))
    assert not out.exists()


@pytest.fixture(scope="module")
def overflowing(folders, tmp_path_factory) -> Path:
    """An imported checkpoint whose encoder's query projection is 1e30 everywhere (finite, so the
    checkpoint loads): every log-probability torch computes is NaN. CTranslate2's kernels
    compute finite ones from it (the translating guide), so these tests decode with torch."""
    state = load_checkpoint(folders.checkpoint())
    state["model"]["encoder.0.self_attn.qkv.weight"].fill_(1e30)
    path = tmp_path_factory.mktemp("nan") / "overflowing.pt"
    atomic_save(state, path)
    return path


@pytest.mark.parametrize("options", [[], ["--sampling"], ["--beam", "1"]])
def test_translating_with_a_model_that_computes_nan_is_an_error_naming_it(
    overflowing, tmp_path, capfd, options
):
    source = tmp_path / "in.en"
    source.write_text("\n".join(SOURCES) + "\n")
    refused(
        capfd,
        "translate",
        "-c",
        str(overflowing),
        "-i",
        str(source),
        "--engine",
        "torch",
        *options,
        needles=(str(overflowing), "NaN log-probabilities"),
    )


def test_scoring_with_a_model_that_computes_nan_is_an_error_naming_it(overflowing):
    translator = Translator.load(overflowing, device="cpu", engine="torch")
    with pytest.raises(NmtError, match=f"{overflowing}: .*NaN log-probabilities"):
        translator.score(SOURCES, SOURCES)


# ------------------------------------------------------------------ tables transformers reads


def test_a_stored_position_table_that_differs_is_refused(folders, tmp_path, capfd):
    """transformers runs a stored embed_positions.weight; nmt computes MarianMT's table: one
    that differs (forced log-probs differed by up to 3.09) is refused, naming it."""
    folder = copy_of(folders, tmp_path)
    state = hf_state(folder)
    table = state["model.decoder.embed_positions.weight"]
    table[5:] = table[5:].roll(1, dims=0)  # positions 5.. one off
    as_bin(folder, state)
    refused(
        capfd,
        "import",
        str(folder),
        "-o",
        str(tmp_path / "out.pt"),
        needles=("model.decoder.embed_positions.weight", "not MarianMT's sinusoid table"),
    )


TIED = {
    "lm_head": "lm_head.weight",
    "shared": "model.shared.weight",
    "encoder's table": "model.encoder.embed_tokens.weight",
}


@pytest.mark.parametrize("case", TIED)
def test_a_bin_whose_tied_copies_differ_is_refused(folders, tmp_path, capfd, case):
    folder = copy_of(folders, tmp_path)
    state = hf_state(folder)
    name = TIED[case]
    state[name] = state[name] + 0.01  # a copy of its own, no longer the tied one
    as_bin(folder, state)
    refused(capfd, "import", str(folder), "-o", str(tmp_path / "out.pt"), needles=(name, "tied"))


# ------------------------------------------------------------------ item 9: what a round trip keeps


def test_decode_settings_and_languages_survive_a_hugging_face_round_trip(folders, tmp_path):
    folder = copy_of(folders, tmp_path)
    settings = {"num_beams": 3, "min_new_tokens": 2, "no_repeat_ngram_size": 3, "max_length": 40}
    edit_json(folder / "generation_config.json", **settings)  # hf_marian's model has 128 positions
    first, back = tmp_path / "first.pt", tmp_path / "back.pt"
    assert nmt_here("import", str(folder), "-o", str(first)) == 0
    config = load_checkpoint(first)["config"]
    want = {"beam": 3, "min_len": 2, "no_repeat_ngram_size": 3, "max_len_a": 0.0, "max_len_b": 39}
    assert {k: config["decode"][k] for k in want} == want
    assert (config["data"]["source_lang"], config["data"]["target_lang"]) == ("en", "de")
    exported = tmp_path / "hf"
    assert nmt_here("export", str(first), str(exported), "--format", "hf") == 0
    generation = json.loads((exported / "generation_config.json").read_text())
    assert {k: generation[k] for k in settings} == settings
    assert json.loads((exported / "tokenizer_config.json").read_text())["source_lang"] == "en"
    assert nmt_here("import", str(exported), "-o", str(back)) == 0
    again = load_checkpoint(back)["config"]
    assert again["decode"] == config["decode"] and again["data"] == config["data"]


def test_a_run_whose_config_names_no_languages_saves_those_of_prepare_json(prepared, tmp_path):
    """configs/tiny.yaml names no languages: the checkpoints say en->de, as prepare.json does,
    so that nmt serve lists the pair. A run saved before (languages empty) still resumes."""
    data, run_dir = prepared[0], tmp_path / "run"
    cfg = tiny(data, run_dir, max_updates=1)
    assert (cfg.data.source_lang, cfg.data.target_lang) == ("", "")
    train(cfg)
    state = load_checkpoint(run_dir / "checkpoint_last.pt")
    saved = state["config"]["data"]
    assert (saved["source_lang"], saved["target_lang"]) == ("en", "de")
    assert "source_lang: en" in (run_dir / "config.yaml").read_text()
    saved.update(source_lang="", target_lang="")  # as a run of an older nmt saved it
    atomic_save(state, run_dir / "checkpoint_last.pt")
    assert train(tiny(data, run_dir, max_updates=2)).update == 2


# ------------------------------------------------------------------ decode settings nothing can use


def test_one_position_is_refused_at_import(folders, tmp_path, capfd):
    folder = copy_of(folders, tmp_path)
    edit_json(folder / "config.json", max_position_embeddings=1)
    refused(
        capfd,
        "import",
        str(folder),
        "-o",
        str(tmp_path / "out.pt"),
        needles=("config.json (max_position_embeddings)", "too few to translate"),
    )


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("num_beams", 10**9, "num_beams must be smaller than the vocabulary"),
        ("max_length", 1, "max_length 1 leaves no token"),
        ("min_new_tokens", -1, "min_new_tokens must not be negative"),
    ],
)
def test_generation_settings_nothing_can_decode_with_are_refused_at_import(
    folders, tmp_path, capfd, key, value, needle
):
    folder = copy_of(folders, tmp_path)
    edit_json(folder / "generation_config.json", **{key: value})
    out = tmp_path / "out.pt"
    refused(
        capfd, "import", str(folder), "-o", str(out), needles=("generation_config.json", needle)
    )
    assert not out.exists()


def test_a_marian_beam_size_of_10_to_the_12_is_refused_at_import(tmp_path, capfd):
    release = write_release(tmp_path / "release")
    text = release.decoder_yml.read_text().replace("beam-size: 4", f"beam-size: {10**12}")
    release.decoder_yml.write_text(text)
    refused(
        capfd,
        "import",
        str(release.folder),
        "-o",
        str(tmp_path / "out.pt"),
        needles=("decoder.yml: beam-size must be smaller than the vocabulary",),
    )


# ------------------------------------------------------------------ past the address-space limit

LIMITED_IMPORT = """
import contextlib, io, resource, sys
from nmt import cli
with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):
    cli.main(["import", sys.argv[2] + "-missing", "-o", sys.argv[4]])  # imports its modules
status = [line for line in open("/proc/self/status") if line.startswith("VmSize")][0]
used = int(status.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (used + (512 << 20), resource.RLIM_INFINITY))
cli.main(sys.argv[1:])
"""


def sparse_safetensors(path: Path, gib: int) -> None:
    """A valid safetensors file of one `gib` GiB float32 tensor of zeros, sparse (no disk space)."""
    rows = (gib << 30) // (40 * 4)
    header = json.dumps(
        {
            "model.shared.weight": {
                "dtype": "F32",
                "shape": [rows, 40],
                "data_offsets": [0, rows * 40 * 4],
            }
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + rows * 40 * 4)


def test_a_safetensors_file_past_the_address_space_limit_is_one_line(folders, tmp_path):
    folder = copy_of(folders, tmp_path)
    sparse_safetensors(folder / "model.safetensors", 2)
    args = ["import", str(folder), "-o", str(tmp_path / "out.pt")]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", LIMITED_IMPORT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    one_error_line(proc.stderr, "model.safetensors", "too large for this process's memory")


# ------------------------------------------------------------------ export --force


@pytest.mark.parametrize("format", ["hf", "ctranslate2"])
def test_export_force_replaces_an_earlier_export_of_the_other_vocabulary_layout(
    folders, tmp_path, format
):
    """An export of separate vocabularies (target_vocab.json, source_ and target_vocabulary.json)
    replaced by one of a joint vocabulary: what the earlier export wrote goes with it."""
    out = tmp_path / "export"
    separate = folders.checkpoint("separate vocabularies, untied output")
    assert nmt_here("export", str(separate), str(out), "--format", format) == 0
    earlier = {p.name for p in out.iterdir()}
    joint = folders.checkpoint()
    assert nmt_here("export", str(joint), str(out), "--format", format, "--force") == 0
    gone = {
        "hf": {"target_vocab.json"},
        "ctranslate2": {"source_vocabulary.json", "target_vocabulary.json"},
    }
    assert gone[format] <= earlier - {p.name for p in out.iterdir()}
    (out / "README.md").write_text("mine")  # a name no export writes is still never removed
    assert nmt_here("export", str(separate), str(out), "--format", format, "--force") == 1
    assert (out / "README.md").exists()
