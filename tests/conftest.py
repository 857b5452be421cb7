"""Shared fixtures: a small raw en-de corpus and the dataset prepare-bpe makes of it, a
prepared copy task, and `in_tmp` (run a test in its tmp_path). Shared plain functions are in
helpers.py.

The corpus is the first few hundred lines of Multi30k, found at `../shared/data/multi30k`
next to the repository (the NMT_MULTI30K environment variable overrides). Where the data
is absent, a synthetic bilingual corpus with the same layout stands in, so no test is
skipped for want of data.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import shutil
import signal
import tempfile
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.register_assert_rewrite("helpers")  # its asserts explain themselves like the tests' own

from helpers import synthetic_pairs, write_parallel  # noqa: E402
from serving import ENGINES, Engine  # noqa: E402

from nmt.prepare import PrepareOptions, prepare_bpe  # noqa: E402
from nmt.textio import read_lines  # noqa: E402

# The Ctrl-C tests send SIGINT to commands they start, as a terminal would. A shell without job
# control starts a background job (`make test &` in a script) with SIGINT ignored, which every
# child inherits and keeps: the test's Ctrl-C would then never arrive. Children see it again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# `--engine auto`, the default, converts a checkpoint for CTranslate2 into $XDG_CACHE_HOME/nmt:
# the tests' conversions (in process, and in the children, which inherit it) go to a folder of
# the test session, never to the user's cache
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="nmt-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)

MULTI30K = Path(
    os.environ.get("NMT_MULTI30K") or Path(__file__).resolve().parents[2] / "shared/data/multi30k"
)
SPLIT_LINES = {"train": 300, "val": 60, "test": 40}  # test <- Multi30k's test_2016_flickr
TEST_VOCAB = 500  # enough for 256 byte pieces + the characters + some merges


@dataclass(frozen=True)
class RawCorpus:
    dir: Path
    origin: str  # "multi30k" or "synthetic"
    src_lang: str = "en"
    tgt_lang: str = "de"

    def prefix(self, split: str) -> str:
        return str(self.dir / split)

    def lines(self, split: str, lang: str) -> list[str]:
        return list(read_lines(f"{self.prefix(split)}.{lang}"))


def _multi30k(split: str, lang: str, n: int) -> list[str] | None:
    name = "test_2016_flickr" if split == "test" else split
    path = MULTI30K / f"{name}.{lang}.gz"
    return list(islice(read_lines(path), n)) if path.is_file() else None


def _synthetic_corpus(n: int, seed: int) -> list[tuple[str, str]]:
    """Sentences of made-up words with a made-up word-by-word 'translation'."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "te", "su", "ra", "ne", "po", "di", "ga", "bu", "fe"]
    umlauted = ["ä", "ö", "ü", "ß", "ei", "ch", "sch"]

    def word(parts: list[str]) -> str:
        return "".join(rng.choice(parts) for _ in range(rng.randint(1, 3)))

    lexicon = [(word(syllables), word(syllables + umlauted)) for _ in range(300)]
    pairs = []
    for _ in range(n):
        words = [rng.choice(lexicon) for _ in range(rng.randint(4, 14))]
        src = " ".join(w[0] for w in words).capitalize() + "."
        tgt = " ".join(w[1] for w in words).capitalize() + "."
        pairs.append((src, tgt))
    return pairs


@pytest.fixture(scope="session")
def raw_corpus(tmp_path_factory: pytest.TempPathFactory) -> RawCorpus:
    """train / val / test prefixes (300 / 60 / 40 pairs) of en-de text under one directory."""
    root = tmp_path_factory.mktemp("raw")
    origin = "multi30k"
    for i, (split, n) in enumerate(SPLIT_LINES.items()):
        src, tgt = _multi30k(split, "en", n), _multi30k(split, "de", n)
        pairs = list(zip(src, tgt, strict=True)) if src and tgt else None
        if pairs is None:
            origin, pairs = "synthetic", _synthetic_corpus(n, seed=i)
        write_parallel(pairs, root / split, "en", "de")
    return RawCorpus(root, origin)


@pytest.fixture(scope="session")
def prepared(raw_corpus: RawCorpus, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(destdir, report) of prepare-bpe on `raw_corpus`: splits train, valid, test; vocab 500."""
    dest = tmp_path_factory.mktemp("prepared") / "data-bin"
    opts = PrepareOptions(
        source_lang="en",
        target_lang="de",
        trainpref=raw_corpus.prefix("train"),
        validpref=raw_corpus.prefix("val"),
        testpref=raw_corpus.prefix("test"),
        destdir=str(dest),
        vocab_size=TEST_VOCAB,
        workers=1,
    )
    return dest, prepare_bpe(opts, progress=False)


@pytest.fixture(scope="session")
def prepared_separate(
    raw_corpus: RawCorpus, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict]:
    """`prepared` with --separate-vocab: a source model of TEST_VOCAB pieces, a target one of 100
    fewer."""
    dest = tmp_path_factory.mktemp("prepared-separate") / "data-bin"
    opts = PrepareOptions(
        source_lang="en",
        target_lang="de",
        trainpref=raw_corpus.prefix("train"),
        validpref=raw_corpus.prefix("val"),
        destdir=str(dest),
        vocab_size=TEST_VOCAB,
        separate_vocab=True,
        target_vocab_size=TEST_VOCAB - 100,
        workers=1,
    )
    return dest, prepare_bpe(opts, progress=False)


@pytest.fixture(scope="session")
def copy_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared copy task (target = source; 3,000 train / 100 valid pairs, vocab 24) that a
    small model learns in a few hundred updates."""
    raw = tmp_path_factory.mktemp("copy")
    write_parallel(synthetic_pairs("copy", 3000, seed=1), raw / "train", "src", "tgt")
    write_parallel(synthetic_pairs("copy", 100, seed=2), raw / "valid", "src", "tgt")
    dest = raw / "data-bin"
    prepare_bpe(
        PrepareOptions(
            source_lang="src",
            target_lang="tgt",
            trainpref=str(raw / "train"),
            validpref=str(raw / "valid"),
            destdir=str(dest),
            vocab_size=24,
            byte_fallback=False,
            workers=1,
        ),
        progress=False,
    )
    return dest


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run the test in its tmp_path and restore torch's thread count after it: `nmt train`
    writes .nmt-last-run into the working directory and sets torch's threads. Modules use it
    with `pytestmark = pytest.mark.usefixtures("in_tmp")`."""
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ models for the prediction tests


@pytest.fixture(scope="session")
def test_tokenizer(raw_corpus: RawCorpus, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A 500-piece sentencepiece model learnt on both sides of `raw_corpus`'s train split."""
    from nmt.tokenizer import Tokenizer, train_sentencepiece

    text = raw_corpus.lines("train", "en") + raw_corpus.lines("train", "de")
    return Tokenizer.from_file(
        train_sentencepiece(text, tmp_path_factory.mktemp("spm") / "spm", 500)
    )


@pytest.fixture(scope="session")
def random_checkpoint(
    prepared: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A randomly initialised configs/tiny.yaml model (seed 1, `helpers.save_random_model`) on
    `prepared`'s sentencepiece model (vocabulary 500): for the tests of what a command does
    with a checkpoint, not with its translations. Tests copy it before they change it."""
    from helpers import save_random_model

    from nmt.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("random") / "random.pt"
    return save_random_model(path, Tokenizer.from_file(prepared[0] / "spm.model"), seed=1)


@pytest.fixture(scope="session")
def trained_checkpoint(
    prepared: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A small Transformer (2+2 layers, d_model 64) trained for 300 updates on `prepared`
    (~20 s): it ends its outputs with EOS on its own, so it decodes real sentences to real
    lengths, as a random model does not."""
    from helpers import tiny, with_overrides

    from nmt.training.trainer import train

    run = tmp_path_factory.mktemp("trained") / "run"
    cfg = tiny(
        prepared[0],
        run,
        model={"encoder_layers": 2, "decoder_layers": 2, "d_model": 64, "ffn_dim": 128, "heads": 4},
        max_updates=300,
        lr=3e-3,
        warmup_updates=50,
        max_tokens=1024,
        valid_bleu=False,
        save_interval_updates=0,
        log_interval=100,
    )
    cfg = with_overrides(cfg, decode={"beam": 4, "max_len_a": 1.5, "max_len_b": 10})
    threads = torch.get_num_threads()
    try:
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    return run / "checkpoint_last.pt"


# ------------------------------------------------------------------ the engines of the server tests


@pytest.fixture(scope="session")
def ctranslate2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`--cache-dir` of the CTranslate2 servers and translators: a checkpoint converted once."""
    return tmp_path_factory.mktemp("ctranslate2-cache")


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest, ctranslate2_cache: Path) -> Engine:
    """The engine a server test's server and offline references decode with (serving.Engine):
    a test that asks for it, or for a fixture that does, runs on each (serving.py's
    `slow_on_ctranslate2` leaves a costly one's CTranslate2 variant to `make test-slow`)."""
    if request.param == "ctranslate2":
        pytest.importorskip("ctranslate2", reason="pip install 'nmt[ctranslate2]'")
    return Engine(request.param, ctranslate2_cache)


@pytest.fixture
def restore_logging() -> Any:
    """The in-process CLI (`cli.main`) points the root logger at this test's captured stderr;
    undo that, so that a later test does not log to a closed stream
    (`pytestmark = pytest.mark.usefixtures("restore_logging")`)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    the models are tiny, and on shared cores a second thread waiting for a descheduled one
    makes every small op cost a time slice. The module's thread count is restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A test in a temporary working directory (train writes .nmt-last-run there); cli.main
    reconfigures the root logger and train sets torch's threads: both are undone after."""
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level, threads = list(root.handlers), root.level, torch.get_num_threads()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    torch.set_num_threads(threads)
