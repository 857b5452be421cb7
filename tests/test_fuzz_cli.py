"""Every option of every command, fed boundary values: the command succeeds, or it fails with
exactly one stderr line starting with `nmt` and no traceback (the README's promise).

Values: negative, zero, huge, NaN and infinities, empty and blank strings, and paths that are a
directory, missing, under a regular file, unwritable (/proc), an empty file or a file of
another kind. Every config key goes through `nmt train --set KEY=VALUE --dump-config`, where the
config is checked, and the model's sizes (1e6-1e9) through training, where they reach the
allocator. `nmt import` gets malformed model folders: each JSON and YAML file of a Hugging Face
folder and a Marian release (special:model.yml inside the .npz included) as every wrong shape (a
list, null, a string, a number, nested 100,000 deep, empty), the keys the importers read set to
values of every wrong type and size, and each file as a FIFO, a symlink to /dev/zero or a
directory. The quick values run in `make test`; the whole product is `slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from helpers import TINY, nmt_here, save_random_model

from nmt.config import SECTIONS
from nmt.tokenizer import Tokenizer

INTS = ["-1", "0", "1", "3", str(2**63), str(10**30)]
FLOATS = ["-1", "0", "0.5", "1e308", "nan", "inf", "-inf"]
STRINGS = ["", " ", "x", "é" * 300]
PATHS = ["{dir}", "{missing}", "{under_file}", "/proc/nmt-fuzz", "{empty}", "{garbage}"]
QUICK = {"-1", "0", "", "nan", "{dir}", "{missing}", "{under_file}"}


pytestmark = pytest.mark.usefixtures(
    "isolated"
)  # conftest: temporary cwd, logging and threads undone


@pytest.fixture(scope="module")
def world(prepared: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files the cases refer to: {ckpt}, {data}, {input}, {empty}, {garbage}, {dir}, ..."""
    root = tmp_path_factory.mktemp("fuzz")
    save_random_model(root / "a.pt", Tokenizer.from_file(prepared[0] / "spm.model"), 1)
    (root / "in.txt").write_text("A man.\nTwo dogs run.\n")
    (root / "ref.txt").write_text("Ein Mann.\nZwei Hunde laufen.\n")
    (root / "empty").write_bytes(b"")
    (root / "garbage").write_bytes(os.urandom(256))
    (root / "file").write_text("x")
    (root / "dir").mkdir()
    return {
        "ckpt": str(root / "a.pt"),
        "data": str(prepared[0]),
        "input": str(root / "in.txt"),
        "ref": str(root / "ref.txt"),
        "empty": str(root / "empty"),
        "garbage": str(root / "garbage"),
        "dir": str(root / "dir"),
        "missing": str(root / "missing" / "x"),
        "under_file": str(root / "file" / "x"),
        "out": str(root / "dir" / "out.txt"),
        "raw": str(Path(prepared[1]["splits"]["train"]["prefix"])),
    }


def _cases() -> list[tuple[tuple[str, ...], bool]]:
    """(argv, quick) for every option and value."""
    translate = ("translate", "-c", "{ckpt}", "-i", "{input}")
    cases: list[tuple[tuple[str, ...], bool]] = []

    def add(argv: tuple[str, ...], value: str) -> None:
        cases.append((argv, value in QUICK))

    for option in (
        "--beam",
        "--max-len-b",
        "--min-len",
        "--no-repeat-ngram-size",
        "--batch-size",
        "--max-tokens",
        "--nbest",
        "--workers",
    ):
        for v in INTS:
            add((*translate, option, v), v)
    for v in ("-1", "0", "1", str(2**63)):
        add((*translate, "--threads", v), v)
    for option in ("--lenpen", "--max-len-a"):
        for v in FLOATS:
            add((*translate, option, v), v)
    for option in ("--lenpen-style", "--device", "--precision"):
        for v in [*STRINGS, "cuda:99", "gnmt"]:
            add((*translate, option, v), v)
    for v in PATHS:
        add(("translate", "-c", v, "-i", "{input}"), v)
        add(("translate", "-c", "{ckpt}", "-i", v), v)
        add((*translate, "-o", v), v)
        add((*translate, "--shortlist", v), v)
    for v in PATHS:
        add(("average-checkpoints", v, "-o", "{out}"), v)
        add(("average-checkpoints", "{ckpt}", "-o", v), v)
        add(("average-checkpoints", v, "--last", "1", "-o", "{out}"), v)
    for v in INTS:
        add(("average-checkpoints", "{dir}", "--last", v, "-o", "{out}"), v)
    for v in PATHS:
        add(("score", "--ref", v, "--hyp", "{input}"), v)
        add(("score", "--ref", "{ref}", "--hyp", v), v)
    for option in ("--metrics", "--tokenize", "--test-set", "--langpair"):
        for v in [*STRINGS, ",", "bleu,xx"]:
            add(("score", "--ref", "{ref}", "--hyp", "{input}", option, v), v)
    for v in PATHS:
        add(("shortlist", v, "-o", "{out}"), v)
        add(("shortlist", "{data}", "-o", v, "--iterations", "1"), v)
    for option in ("--top", "--frequent", "--max-sentences"):
        for v in INTS:
            add(("shortlist", "{data}", "-o", "{out}", "--iterations", "1", option, v), v)
    for v in ("-1", "0"):
        add(("shortlist", "{data}", "-o", "{out}", "--iterations", v), v)
    prepare = ("prepare-bpe", "-s", "en", "-t", "de", "--spm-model", "{data}/spm.model")
    for v in PATHS:
        add((*prepare, "--trainpref", v, "--destdir", "{dir}/p"), v)
        add((*prepare, "--trainpref", "{raw}", "--destdir", v), v)
        add(
            (
                "prepare-bpe",
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                "{raw}",
                "--destdir",
                "{dir}/p",
                "--spm-model",
                v,
            ),
            v,
        )
    for option in (
        "--vocab-size",
        "--input-sentence-size",
        "--max-len",
        "--min-len",
        "--workers",
        "--seed",
    ):
        for v in INTS[:3]:
            add(
                (
                    "prepare-bpe",
                    "-s",
                    "en",
                    "-t",
                    "de",
                    "--trainpref",
                    "{raw}",
                    "--destdir",
                    "{dir}/p",
                    option,
                    v,
                ),
                v,
            )
    for option in ("--character-coverage", "--max-ratio"):
        for v in FLOATS:
            add(
                (
                    "prepare-bpe",
                    "-s",
                    "en",
                    "-t",
                    "de",
                    "--trainpref",
                    "{raw}",
                    "--destdir",
                    "{dir}/p",
                    "--vocab-size",
                    "300",
                    option,
                    v,
                ),
                v,
            )
    for v in STRINGS:
        add(("prepare-bpe", "-s", v, "-t", "de", "--trainpref", "{raw}", "--destdir", "{dir}/p"), v)
    for v in PATHS:
        add(("train", v, "--dump-config"), v)
    for v in INTS:
        add(("train", str(TINY), "--dry-run", "--vocab-size", v), v)
    for v in [*STRINGS, "cuda:99", "2024"]:
        add(("train", str(TINY), "--device", v, "--dump-config"), v)
        add(("train", str(TINY), "--run-dir", v, "--dump-config"), v)
    for section, cls in SECTIONS.items():
        for name in cls.__dataclass_fields__:
            for v in ["-1", "0", "", "nan", "1e308", str(10**30), "[1]", "{a: 1}", "yes", "#"]:
                add(("train", str(TINY), "--set", f"{section}.{name}={v}", "--dump-config"), v)
    return cases


CASES = _cases()

# Model sizes past the config's checks (1e6-1e9): each reaches the model's construction, where
# `nmt train` sizes it against the device's memory. The memory is fixed at 1 GiB
# (`memory_bytes`) so that each value has the same outcome on any machine: refused in one line,
# or (model.max_positions=1000000) a model that fits and trains one update.
MODEL_SIZES = [str(10**k) for k in range(6, 10)]
MODEL_CASES = [
    pytest.param(
        (
            "train",
            str(TINY),
            "--set",
            "data.dir={data}",
            "--set",
            "train.run_dir=run",
            "--set",
            "train.device=cpu",
            "--set",
            "train.threads=1",
            "--set",
            "train.max_updates=1",
            *(("--set", "model.arch=rnn") if key.startswith("rnn") else ()),
            "--set",
            f"model.{key}={v}",
        ),
        marks=() if v == MODEL_SIZES[-1] else pytest.mark.slow,
        id=f"model.{key}={v}",
    )
    for key in (
        "d_model",
        "ffn_dim",
        "encoder_layers",
        "decoder_layers",
        "max_positions",
        "rnn_hidden",
        "rnn_layers",
    )
    for v in MODEL_SIZES
]


def _check(world: dict[str, str], capfd: pytest.CaptureFixture, argv: tuple[str, ...]) -> None:
    args = list(argv)
    for key, value in world.items():  # not str.format: a value may hold braces ("{a: 1}")
        args = [a.replace(f"{{{key}}}", value) for a in args]
    capfd.readouterr()
    code = nmt_here(*args)
    err = capfd.readouterr().err
    assert "Traceback" not in err, (args, err)
    if code != 0:
        lines = [
            line for line in err.splitlines() if line.strip() and " | " not in line
        ]  # log lines aside
        assert len(lines) == 1 and lines[0].startswith("nmt"), (args, code, err)


@pytest.mark.parametrize(
    "argv", [a for a, quick in CASES if quick], ids=lambda a: " ".join(a[:1] + a[-2:])
)
def test_boundary_values_succeed_or_fail_in_one_line(world, capfd, argv):
    _check(world, capfd, argv)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [a for a, quick in CASES if not quick], ids=lambda a: " ".join(a[:1] + a[-2:])
)
def test_every_boundary_value_succeeds_or_fails_in_one_line(world, capfd, argv):
    _check(world, capfd, argv)


@pytest.mark.parametrize("argv", MODEL_CASES)
def test_model_sizes_that_reach_the_allocator_succeed_or_fail_in_one_line(
    world, capfd, monkeypatch, argv
):
    monkeypatch.setattr("nmt.device.memory_bytes", lambda device: 1 << 30, raising=False)
    _check(world, capfd, argv)


# ------------------------------------------------------------ malformed model folders (nmt import)
# Each case copies a tiny valid source (a Hugging Face MarianMT folder written by transformers, a
# Marian release), breaks one file or one key and imports it: success, or one line naming the file.

NESTED = "[" * 100_000 + "]" * 100_000  # past every parser's depth: JSON and YAML alike
# whole files: texts that are valid JSON and YAML of the wrong shape (and no text at all)
SHAPES = {
    "a list": "[1, 2]",
    "null": "null",
    "a string": '"x"',
    "a number": "5",
    "nested 100,000 deep": NESTED,
    "empty": "",
    "a mapping of lists": '{"a": [1]}',
}
# values of one key (as JSON; the YAML files take them too)
VALUES = {
    "a list": [1],
    "null": None,
    "a string": "x",
    "-1": -1,
    "0": 0,
    "10^9": 10**9,
    "10^30": 10**30,
    "1e308": 1e308,
    "0.5": 0.5,
    "true": True,
    "a mapping": {"a": 1},
    "nested": json.loads("[" * 500 + "]" * 500),
}
QUICK_VALUES = {"a list", "-1", "0", "10^9"}
JSON_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "vocab.json")
# keys the importers read (the quick ones); every other key of the file is slow
HF_KEYS = (
    "d_model",
    "encoder_layers",
    "encoder_attention_heads",
    "vocab_size",
    "pad_token_id",
    "max_position_embeddings",
    "activation_function",
    "dropout",
    "tie_word_embeddings",
    "scale_embedding",
)
MARIAN_KEYS = (
    "type",
    "dim-emb",
    "enc-depth",
    "transformer-heads",
    "transformer-dim-ffn",
    "tied-embeddings-all",
    "transformer-preprocess",
    "version",
)
DECODER_KEYS = ("models", "vocabs", "beam-size", "normalize")
NOT_REGULAR = ("a FIFO", "a symlink to /dev/zero", "a directory")


@pytest.fixture(scope="module")
def sources(raw_corpus, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pristine sources: "hf" (a folder transformers wrote) and "marian" (a release)."""
    from hf_marian import VARIANTS, train_spm_pair, write_hf_marian
    from marian_npz import Variant, write_release

    root = tmp_path_factory.mktemp("sources")
    spm = train_spm_pair(
        raw_corpus.lines("train", "en"), raw_corpus.lines("train", "de"), root / "spm"
    )
    return {
        "hf": write_hf_marian(root / "hf", VARIANTS["swish"], *spm),
        "marian": write_release(root / "marian", Variant()).folder,
    }


def _rewrite_model_yml(folder: Path, edit: Callable[[dict], Any]) -> None:
    """model.npz with its special:model.yml replaced by `edit(options)`: a dict (dumped) or a
    text."""
    from marian_npz import npz_text

    with np.load(folder / "model.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    options = yaml.safe_load(arrays["special:model.yml"].tobytes().rstrip(b"\0").decode())
    text = edit(options)
    arrays["special:model.yml"] = npz_text(
        text if isinstance(text, str) else json.dumps(text)
    )  # JSON is YAML
    np.savez(folder / "model.npz", **arrays)


def _set_key(name: str, key: str, value: Any) -> Callable[[Path], None]:
    """A mutation: `key` of file `name` (config.json, decoder.yml, or special:model.yml in
    model.npz) set to `value`."""

    def mutate(folder: Path) -> None:
        path = folder / name
        if name == "special:model.yml":
            _rewrite_model_yml(folder, lambda options: {**options, key: value})
        else:  # JSON is YAML too
            path.write_text(json.dumps({**yaml.safe_load(path.read_text()), key: value}))

    return mutate


def _not_regular(path: Path, kind: str) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    {
        "a FIFO": lambda: os.mkfifo(path),
        "a symlink to /dev/zero": lambda: path.symlink_to("/dev/zero"),
        "a directory": path.mkdir,
    }[kind]()


def _folder_cases() -> list[Any]:
    """pytest.param((source, mutate)) for every malformed-folder case; `mutate(folder)` breaks the
    copy."""
    cases = []

    def add(source: str, what: str, mutate: Callable[[Path], Any], quick: bool) -> None:
        cases.append(
            pytest.param(
                source, mutate, id=f"{source}: {what}", marks=() if quick else pytest.mark.slow
            )
        )

    for name in JSON_FILES:
        for shape, text in SHAPES.items():
            add("hf", f"{name} {shape}", lambda f, n=name, t=text: (f / n).write_text(t), True)
    for name in ("decoder.yml", "vocab.yml"):
        for shape, text in SHAPES.items():
            add("marian", f"{name} {shape}", lambda f, n=name, t=text: (f / n).write_text(t), True)
    for shape, text in SHAPES.items():
        add(
            "marian",
            f"special:model.yml {shape}",
            lambda f, t=text: _rewrite_model_yml(f, lambda o: t),
            True,
        )
    for label, value in VALUES.items():
        for name, keys in (
            ("config.json", HF_KEYS),
            ("special:model.yml", MARIAN_KEYS),
            ("decoder.yml", DECODER_KEYS),
        ):
            for key in keys:
                add(
                    "hf" if name == "config.json" else "marian",
                    f"{name} {key}={label}",
                    _set_key(name, key, value),
                    label in QUICK_VALUES,
                )
    for kind in NOT_REGULAR:
        for name in (
            "config.json",
            "vocab.json",
            "source.spm",
            "target.spm",
            "tokenizer_config.json",
            "generation_config.json",
            "model.safetensors",
        ):
            add("hf", f"{name} is {kind}", lambda f, n=name, k=kind: _not_regular(f / n, k), True)
        for name in ("decoder.yml", "model.npz", "vocab.yml", "source.spm", "target.spm"):
            add(
                "marian",
                f"{name} is {kind}",
                lambda f, n=name, k=kind: _not_regular(f / n, k),
                True,
            )
    return cases


class Hung(BaseException):
    """An import that blocked (on a FIFO): a failure, not a hang of the test run."""


def _import_check(
    sources: dict[str, Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture,
    source: str,
    mutate: Callable[[Path], Any],
) -> None:
    folder = tmp_path / source
    shutil.copytree(sources[source], folder)
    mutate(folder)

    def hung(signum: int, frame: Any) -> None:
        raise Hung

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        _check({}, capfd, ("import", str(folder), "-o", str(tmp_path / "out.pt")))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("source", "mutate"), _folder_cases())
def test_a_malformed_model_folder_imports_or_fails_in_one_line(
    sources, tmp_path, capfd, source, mutate
):
    _import_check(sources, tmp_path, capfd, source, mutate)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["hf", "marian"])
def test_every_key_of_every_source_file_imports_or_fails_in_one_line(
    sources, tmp_path, capfd, source
):
    """Every key the pristine files hold (not only those the importer reads), every value."""
    files = {"hf": ["config.json"], "marian": ["decoder.yml", "special:model.yml"]}[source]
    for name in files:
        if name == "special:model.yml":
            with np.load(sources[source] / "model.npz") as npz:
                keys = list(
                    yaml.safe_load(npz["special:model.yml"].tobytes().rstrip(b"\0").decode())
                )
        else:
            text = (sources[source] / name).read_text()
            keys = list(json.loads(text) if name.endswith(".json") else yaml.safe_load(text))
        for key in keys:
            for value in VALUES.values():
                case = tmp_path / f"{len(list(tmp_path.iterdir()))}"
                case.mkdir()
                _import_check(sources, case, capfd, source, _set_key(name, key, value))
