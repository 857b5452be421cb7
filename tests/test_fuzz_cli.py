"""Every option of every command, fed boundary values: the command succeeds, or it fails with
exactly one stderr line starting with `nmt` and no traceback (the README's promise).

Values: negative, zero, huge, NaN and infinities, empty and blank strings, and paths that are a
directory, missing, under a regular file, unwritable (/proc), an empty file or a file of
another kind. Every config key goes through `nmt train --set KEY=VALUE --dump-config`, where the
config is checked, and the model's sizes (1e6-1e9) through training, where they reach the
allocator. The quick values run in `make test`; the whole product is `slow`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import TINY, nmt_here, save_random_model

from nmt.config import SECTIONS
from nmt.tokenizer import Tokenizer

INTS = ["-1", "0", "1", "3", str(2**63), str(10**30)]
FLOATS = ["-1", "0", "0.5", "1e308", "nan", "inf", "-inf"]
STRINGS = ["", " ", "x", "é" * 300]
PATHS = ["{dir}", "{missing}", "{under_file}", "/proc/nmt-fuzz", "{empty}", "{garbage}"]
QUICK = {"-1", "0", "", "nan", "{dir}", "{missing}", "{under_file}"}


pytestmark = pytest.mark.usefixtures("isolated")  # conftest: temporary cwd, logging and threads undone


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
    return {"ckpt": str(root / "a.pt"), "data": str(prepared[0]), "input": str(root / "in.txt"),
            "ref": str(root / "ref.txt"), "empty": str(root / "empty"), "garbage": str(root / "garbage"),
            "dir": str(root / "dir"), "missing": str(root / "missing" / "x"),
            "under_file": str(root / "file" / "x"), "out": str(root / "dir" / "out.txt"),
            "raw": str(Path(prepared[1]["splits"]["train"]["prefix"]))}


def _cases() -> list[tuple[tuple[str, ...], bool]]:
    """(argv, quick) for every option and value."""
    translate = ("translate", "-c", "{ckpt}", "-i", "{input}")
    cases: list[tuple[tuple[str, ...], bool]] = []

    def add(argv: tuple[str, ...], value: str) -> None:
        cases.append((argv, value in QUICK))

    for option in ("--beam", "--max-len-b", "--min-len", "--no-repeat-ngram-size", "--batch-size",
                   "--max-tokens", "--nbest", "--workers"):
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
        add(("prepare-bpe", "-s", "en", "-t", "de", "--trainpref", "{raw}", "--destdir", "{dir}/p",
             "--spm-model", v), v)
    for option in ("--vocab-size", "--input-sentence-size", "--max-len", "--min-len", "--workers", "--seed"):
        for v in INTS[:3]:
            add(("prepare-bpe", "-s", "en", "-t", "de", "--trainpref", "{raw}", "--destdir", "{dir}/p",
                 option, v), v)
    for option in ("--character-coverage", "--max-ratio"):
        for v in FLOATS:
            add(("prepare-bpe", "-s", "en", "-t", "de", "--trainpref", "{raw}", "--destdir", "{dir}/p",
                 "--vocab-size", "300", option, v), v)
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
    pytest.param(("train", str(TINY), "--set", "data.dir={data}", "--set", "train.run_dir=run", "--set", "train.device=cpu",
                  "--set", "train.threads=1", "--set", "train.max_updates=1",
                  *(("--set", "model.arch=rnn") if key.startswith("rnn") else ()), "--set", f"model.{key}={v}"),
                 marks=() if v == MODEL_SIZES[-1] else pytest.mark.slow, id=f"model.{key}={v}")
    for key in ("d_model", "ffn_dim", "encoder_layers", "decoder_layers", "max_positions", "rnn_hidden", "rnn_layers")
    for v in MODEL_SIZES]


def _check(world: dict[str, str], capfd: pytest.CaptureFixture, argv: tuple[str, ...]) -> None:
    args = list(argv)
    for key, value in world.items():  # not str.format: a value may hold braces ("{a: 1}")
        args = [a.replace(f"{{{key}}}", value) for a in args]
    capfd.readouterr()
    code = nmt_here(*args)
    err = capfd.readouterr().err
    assert "Traceback" not in err, (args, err)
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip() and " | " not in line]  # log lines aside
        assert len(lines) == 1 and lines[0].startswith("nmt"), (args, code, err)


@pytest.mark.parametrize("argv", [a for a, quick in CASES if quick], ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_boundary_values_succeed_or_fail_in_one_line(world, capfd, argv):
    _check(world, capfd, argv)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [a for a, quick in CASES if not quick], ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_every_boundary_value_succeeds_or_fails_in_one_line(world, capfd, argv):
    _check(world, capfd, argv)


@pytest.mark.parametrize("argv", MODEL_CASES)
def test_model_sizes_that_reach_the_allocator_succeed_or_fail_in_one_line(world, capfd, monkeypatch, argv):
    monkeypatch.setattr("nmt.device.memory_bytes", lambda device: 1 << 30, raising=False)
    _check(world, capfd, argv)
