"""What `nmt` reads, given as a hostile user gives it: special files (a link to /dev/zero, a
FIFO with no writer, a directory) wherever a command reads a file, gzip through a pipe, YAML
nested thousands deep, a vocabulary spelling a lone surrogate, corpora that leave nothing to
train on, a named pipe as a corpus, an empty metrics file, a constraint of a megabyte.

Commands run in a subprocess with a timeout: a read that never ends fails the test instead of
hanging it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import ROOT, TINY, assert_one_line, last_error_line, nmt

from nmt.config import load_config
from nmt.errors import ConfigError, NmtError
from nmt.options import PrepareOptions
from nmt.prepare import prepare_bpe
from nmt.tokenizer import NMT_SPECIALS, VocabTokenizer

TIMEOUT = 240  # generous: a loaded machine; a hang is what it catches, never a slow start
SENTENCES = ["A dog runs.", "Two men sit on a bench.", "", "A woman reads a book in the park."] * 5


# ------------------------------------------------------------------ helpers


def plant(path: Path, kind: str) -> Path:
    """Make `path` a link to /dev/zero, a FIFO nobody writes to, or a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


def feed_fifo(path: Path, data: bytes) -> threading.Thread:
    """A thread that writes `data` into the FIFO `path` once a reader opens it, then closes it:
    the only writer the pipe ever has."""

    def write() -> None:
        with open(path, "wb") as f:  # blocks until the reader opens it
            f.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def options(dest: Path, trainpref: str, **extra: object) -> PrepareOptions:
    return PrepareOptions(
        source_lang="en",
        target_lang="de",
        trainpref=trainpref,
        destdir=str(dest),
        workers=1,
        **extra,
    )  # type: ignore[arg-type]


# ---------------------------------------------------- every input of every command, a special file


def _walk_cases() -> list[tuple[str, str]]:
    inputs = [
        "train CONFIG",
        "train --set train.init_from",
        "distill --config",
        "prepare-bpe --spm-model",
        "prepare-bpe --tokenizer-from",
        "prepare-bpe --trainpref",
        "translate -c",
        "translate -i",
        "translate --shortlist",
        "translate --terminology",
        "score --hyp",
        "score --ref",
        "average-checkpoints",
        "export",
        "plot curves",
        "plot attention",
    ]
    streams = {"prepare-bpe --trainpref", "translate -i", "score --hyp", "score --ref"}
    # a FIFO with no writer where a stream is read is waited on, as `cat` waits: a pipe is a
    # feature there (test_a_named_pipe_corpus_is_read_once_into_a_copy,
    # test_translate_decompresses_gzip_from_a_fifo_a_pipe_and_standard_input)
    return [
        (role, kind)
        for role in inputs
        for kind in ("zero", "fifo", "dir")
        if not (kind == "fifo" and role in streams)
    ]


# the issue's own cases run in every suite; the whole walk (40 commands, ~4 minutes) is slow
FAST = {
    ("train CONFIG", "zero"),
    ("train CONFIG", "fifo"),
    ("distill --config", "zero"),
    ("prepare-bpe --spm-model", "zero"),
    ("prepare-bpe --spm-model", "fifo"),
    ("translate -i", "zero"),
}
WALK = [
    pytest.param(
        role, kind, id=f"{role}-{kind}", marks=() if (role, kind) in FAST else pytest.mark.slow
    )
    for role, kind in _walk_cases()
]


@pytest.mark.parametrize(("role", "kind"), WALK)
def test_every_input_that_is_a_special_file_is_one_line_and_no_hang(
    role, kind, prepared, random_checkpoint, raw_corpus, tmp_path
):
    """Issue 57, item 5: /dev/zero as a config was a MemoryError traceback (train, distill
    --config, prepare-bpe --spm-model), a FIFO config or sentencepiece model blocked for ever.
    Every file read whole goes through `nmt.atomic.read_regular`; a text stream refuses a
    device (no line ends) and a directory."""
    bad = tmp_path / "bad"
    run, out = tmp_path / "run", tmp_path / "out"
    ckpt, corpus = str(random_checkpoint), raw_corpus.prefix("train")
    if role == "prepare-bpe --trainpref":
        plant(tmp_path / "corpus.en", kind)
        shutil.copy(f"{corpus}.de", tmp_path / "corpus.de")
        bad = tmp_path / "corpus.en"
    elif role == "plot curves":
        plant(run / "metrics.jsonl", kind)
        bad = run / "metrics.jsonl"
    else:
        plant(bad, kind)
    sets = [
        "--set",
        f"data.dir={prepared[0]}",
        "--set",
        f"train.run_dir={run}",
        "--set",
        "train.device=cpu",
        "--set",
        "train.max_updates=1",
    ]
    args = {
        "train CONFIG": ["train", str(bad), *sets],
        "train --set train.init_from": [
            "train",
            str(TINY),
            *sets,
            "--set",
            f"train.init_from={bad}",
        ],
        "distill --config": [
            "distill",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            corpus,
            "-o",
            str(out),
            "--teacher",
            ckpt,
            "--config",
            str(bad),
        ],
        "prepare-bpe --spm-model": [
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            corpus,
            "--destdir",
            str(out),
            "--spm-model",
            str(bad),
        ],
        "prepare-bpe --tokenizer-from": [
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            corpus,
            "--destdir",
            str(out),
            "--tokenizer-from",
            str(bad),
        ],
        "prepare-bpe --trainpref": [
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            str(tmp_path / "corpus"),
            "--destdir",
            str(out),
            "--vocab-size",
            "100",
        ],
        "translate -c": ["translate", "-c", str(bad)],
        "translate -i": ["translate", "-c", ckpt, "-i", str(bad)],
        "translate --shortlist": ["translate", "-c", ckpt, "--shortlist", str(bad)],
        "translate --terminology": ["translate", "-c", ckpt, "--terminology", str(bad)],
        "score --hyp": ["score", "--ref", f"{corpus}.de", "--hyp", str(bad)],
        "score --ref": ["score", "--ref", str(bad), "--hyp", f"{corpus}.de"],
        "average-checkpoints": [
            "average-checkpoints",
            ckpt,
            str(bad),
            "-o",
            str(tmp_path / "avg.pt"),
        ],
        "export": ["export", str(bad), str(out), "--format", "hf"],
        "plot curves": ["plot", "curves", str(run), "-o", str(tmp_path / "c.png")],
        "plot attention": ["plot", "attention", str(bad), "-o", str(out)],
    }[role]
    r = nmt(*args, stdin="A dog.\n", timeout=TIMEOUT, env={"OMP_NUM_THREADS": "1"})
    if role.startswith(
        ("train", "distill", "plot")
    ):  # commands that may log first (matplotlib's first use)
        assert r.returncode == 1, r.stderr
        last_error_line(r.stderr, str(bad))
    else:
        assert_one_line(r.returncode, r.stderr, str(bad))
    assert "MemoryError" not in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------- gzip through a pipe (items 4 and 6)


def test_translate_decompresses_gzip_from_a_fifo_a_pipe_and_standard_input(
    random_checkpoint, tmp_path
):
    """Issue 57, items 4 and 6: `-i FIFO` carrying gzip never ended (the FIFO was peeked,
    closed and reopened, its writer gone); `-i <(gzip -c f)` failed "Not a gzipped file";
    `gzip -c f | nmt translate` translated the compressed bytes (21 lines for 200, exit 0).
    The stream is peeked at once and decompressed as it is."""
    text = "".join(f"{s}\n" for s in SENTENCES).encode()
    plain = tmp_path / "in.txt"
    plain.write_bytes(text)
    packed = gzip.compress(text)
    (tmp_path / "in.txt.gz").write_bytes(packed)
    ckpt = str(random_checkpoint)
    expected = nmt("translate", "-c", ckpt, "-i", str(plain), timeout=TIMEOUT, check=True).stdout
    assert len(expected.splitlines()) == len(SENTENCES)

    piped = nmt("translate", "-c", ckpt, stdin=packed, timeout=TIMEOUT)
    assert piped.returncode == 0 and piped.stdout.decode() == expected, piped.stderr

    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = feed_fifo(fifo, packed)
    from_fifo = nmt("translate", "-c", ckpt, "-i", str(fifo), timeout=TIMEOUT)
    writer.join(timeout=60)
    assert from_fifo.returncode == 0 and from_fifo.stdout == expected, from_fifo.stderr

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    substituted = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m nmt translate -c "{ckpt}" -i <(gzip -c "{plain}")'],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert substituted.returncode == 0 and substituted.stdout == expected, substituted.stderr


# ------------------------------------------------------------------ YAML nested too deep (item 15)


@pytest.mark.parametrize("where", ["file", "--set"])
def test_yaml_nested_thousands_deep_is_one_line(tmp_path, where):
    """Issue 57, item 15: YAML nested 5,000 deep in a config or a --set value was a
    RecursionError traceback (PyYAML recurses once per level)."""
    deep = "[" * 5000 + "]" * 5000
    if where == "file":
        path = tmp_path / "deep.yaml"
        path.write_text(f"train:\n  lr: {deep}\n")
        with pytest.raises(ConfigError, match=rf"^{path}: malformed YAML: nested too deep$"):
            load_config(path)
    else:
        with pytest.raises(ConfigError, match=r"^--set train\.lr: the value is nested too deep$"):
            load_config(None, [f"train.lr={deep}"])


def test_a_deep_yaml_config_is_one_line_from_train_and_distill(
    tmp_path, random_checkpoint, raw_corpus
):
    """The same through the command line: `nmt train` and `nmt distill --config`."""
    path = tmp_path / "deep.yaml"
    path.write_text("train:\n  lr: " + "[" * 5000 + "]" * 5000 + "\n")
    r = nmt("train", str(path), timeout=TIMEOUT)
    assert r.returncode == 1, r.stderr
    last_error_line(r.stderr, str(path), "nested too deep")
    r = nmt(
        "distill",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        raw_corpus.prefix("train"),
        "-o",
        str(tmp_path / "d"),
        "--teacher",
        str(random_checkpoint),
        "--config",
        str(path),
        timeout=TIMEOUT,
    )
    assert r.returncode == 1, r.stderr
    last_error_line(r.stderr, str(path), "nested too deep")


# ------------------------------------------------------ a lone surrogate in a vocabulary (item 16)


def test_a_vocabulary_with_a_lone_surrogate_is_refused_naming_the_piece(test_tokenizer):
    """Issue 57, item 16: a vocab.json key spelt "\\ud800" (JSON allows it) was a
    UnicodeEncodeError traceback when the tokenizer bundled its vocabulary."""
    model = test_tokenizer.model_bytes
    pieces = [test_tokenizer.piece(i) for i in range(test_tokenizer.vocab_size)]
    pieces[7] = json.loads('"ab\\ud800"')
    with pytest.raises(
        NmtError,
        match=r"^vocab\.json: piece 7 of the vocabulary holds a lone surrogate "
        r"\('\\ud800'\), which is not text$",
    ):
        VocabTokenizer(model, model, pieces, NMT_SPECIALS, name="vocab.json")


# ------------------------------------------------------------------ prepare-bpe (item 20)


def test_prepare_that_keeps_no_training_pair_fails_and_leaves_no_output(
    tmp_path, raw_corpus, prepared
):
    """Issue 57, item 20: prepare-bpe exited 0 after keeping 0 training pairs (every pair
    dropped by the filters): data nothing can be trained on."""
    dest = tmp_path / "out"
    with pytest.raises(
        NmtError, match=r"kept 0 of \d+ training pairs, \d+ too_long; nothing to train on"
    ):
        prepare_bpe(
            options(
                dest,
                raw_corpus.prefix("train"),
                spm_model=str(prepared[0] / "spm.model"),
                max_len=1,
                min_len=0,
            ),
            progress=False,
        )
    assert not dest.exists() and list(tmp_path.iterdir()) == []


def test_sentencepiece_errors_name_the_files_and_the_option(tmp_path, raw_corpus):
    """Issue 57, item 20: sentencepiece's errors named no file or side, and a too-large
    --target-vocab-size was reported as --vocab-size."""
    prefix = raw_corpus.prefix("train")
    with pytest.raises(
        NmtError,
        match=rf"^sentencepiece training on {prefix}\.de failed \(--target-vocab-size "
        r"90000\): Vocabulary size too high",
    ):
        prepare_bpe(
            options(
                tmp_path / "sep",
                prefix,
                vocab_size=400,
                separate_vocab=True,
                target_vocab_size=90000,
            ),
            progress=False,
        )
    with pytest.raises(
        NmtError,
        match=rf"^sentencepiece training on {prefix}\.en \+ {prefix}\.de failed "
        r"\(--vocab-size 90000\)",
    ):
        prepare_bpe(options(tmp_path / "joint", prefix, vocab_size=90000), progress=False)


@pytest.mark.parametrize("size", [-5, 100])
def test_spm_model_with_another_vocab_size_is_refused(tmp_path, raw_corpus, prepared, size):
    """Issue 57, item 20: --spm-model ignored --vocab-size in silence (even -5); the same size
    as the model's is consistent and goes on."""
    spm = str(prepared[0] / "spm.model")
    with pytest.raises(
        NmtError,
        match=rf"^--vocab-size {size}: --spm-model {spm} has a vocabulary of 500; leave "
        "--vocab-size out$",
    ):
        prepare_bpe(
            options(tmp_path / "out", raw_corpus.prefix("train"), spm_model=spm, vocab_size=size),
            progress=False,
        )
    report = prepare_bpe(
        options(tmp_path / "out", raw_corpus.prefix("val"), spm_model=spm, vocab_size=500),
        progress=False,
    )
    assert report["vocab_size"] == 500


def test_a_named_pipe_corpus_is_read_once_into_a_copy(tmp_path, raw_corpus, prepared):
    """Issue 57, item 20: a FIFO corpus was "not found", though a pipe is a feature for
    corpora. prepare-bpe reads a corpus two or three times, a pipe carries it once: it is
    copied once, and the output equals that of the file."""
    spm = str(prepared[0] / "spm.model")
    source = Path(f"{raw_corpus.prefix('val')}.en")
    shutil.copy(f"{raw_corpus.prefix('val')}.de", tmp_path / "piped.de")
    fifo = tmp_path / "piped.en"
    os.mkfifo(fifo)
    writer = feed_fifo(
        fifo, gzip.compress(source.read_bytes())
    )  # gzip, as `<(zcat ...)` would not need
    r = nmt(
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        str(tmp_path / "piped"),
        "--destdir",
        str(tmp_path / "from-pipe"),
        "--spm-model",
        spm,
        "--workers",
        "1",
        timeout=TIMEOUT,
    )
    writer.join(timeout=60)
    assert r.returncode == 0, r.stderr
    expected = prepare_bpe(
        options(tmp_path / "from-file", raw_corpus.prefix("val"), spm_model=spm), progress=False
    )
    got = json.loads((tmp_path / "from-pipe" / "prepare.json").read_text())
    assert got["fingerprint"] == expected["fingerprint"]
    assert got["splits"]["train"]["files"]["en"] == str(fifo)


def test_a_device_as_a_corpus_is_refused_naming_it(tmp_path, raw_corpus):
    """A link to /dev/zero as a corpus (never ends, no line) is refused at once; a FIFO is read."""
    plant(tmp_path / "c.en", "zero")
    shutil.copy(f"{raw_corpus.prefix('val')}.de", tmp_path / "c.de")
    with pytest.raises(NmtError, match=r"c\.en: not a text file or a named pipe"):
        prepare_bpe(options(tmp_path / "out", str(tmp_path / "c"), vocab_size=100), progress=False)


# ------------------------------------------------- plot curves on an empty metrics.jsonl (item 20)


def test_plot_curves_of_an_empty_metrics_file_is_refused(tmp_path):
    """Issue 57, item 20: `plot curves` on an empty metrics.jsonl wrote an empty figure, exit 0."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    r = nmt("plot", "curves", str(run), "-o", str(tmp_path / "c.png"), timeout=TIMEOUT)
    assert r.returncode == 1, r.stderr
    last_error_line(
        r.stderr, str(run / "metrics.jsonl"), "no records to draw"
    )  # after matplotlib's first-use log
    assert not (tmp_path / "c.png").exists()


# ------------------------------------------------------------------ a megabyte constraint (item 20)


def test_a_megabyte_constraint_gives_a_short_error_line(random_checkpoint):
    """Issue 57, item 20: a 1 MB constraint gave a 1 MB error line; a rejected value is shown
    cut short (`nmt.fields.shown`)."""
    line = json.dumps({"text": "A dog.", "constraints": ["dog " * 250_000]}) + "\n"
    r = nmt("translate", "-c", str(random_checkpoint), "--json-input", stdin=line, timeout=TIMEOUT)
    error = assert_one_line(
        r.returncode, r.stderr, "<stdin>:1", "the constraint 'dog dog", "tokens, longer than"
    )
    assert len(error) < 500, len(error)
