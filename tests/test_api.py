"""The Python API (`nmt.Translator`) and streaming: the API gives what `nmt translate` prints,
results do not depend on batching or buffering, forced-decoding scores equal the search's own,
blank and bad inputs are handled, and `nmt translate` answers a co-process line by line.

The checkpoints hold randomly initialised tiny Transformers (helpers.save_random_model):
these are properties of the code, not of a trained model.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, nmt, save_random_model

from nmt import Translation, Translator
from nmt.decoding.predict import score_token_lists, translate_token_lists
from nmt.errors import NmtError

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
ANSWER_TIMEOUT = 60  # seconds a co-process may take per answer (model loading included)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def ckpt(test_tokenizer, tmp_path_factory) -> Path:
    return save_random_model(tmp_path_factory.mktemp("api") / "a.pt", test_tokenizer, seed=1)


@pytest.fixture(scope="module")
def translator(ckpt) -> Translator:
    return Translator.load(ckpt, device="cpu")


@pytest.fixture(scope="module")
def sentences(raw_corpus) -> list[str]:
    return raw_corpus.lines("test", "en")[:24]


# ------------------------------------------------------------------ the API equals the command


def test_api_nbest_with_scores_equals_the_command_output(ckpt, translator, sentences):
    lines = [*sentences[:10], "", "  "]
    r = nmt(
        "translate",
        "-c",
        str(ckpt),
        "--device",
        "cpu",
        "--nbest",
        "3",
        "--scores",
        "--threads",
        "1",
        env=ONE_THREAD,
        stdin="".join(s + "\n" for s in lines).encode(),
    )
    assert r.returncode == 0, r.stderr.decode()
    expected = []
    for hyps in translator.translate_nbest(lines, 3):
        expected.append("\t".join(f"{h.score:.4f}\t{h.text}" for h in hyps))
    assert r.stdout.decode().split("\n")[:-1] == expected


def test_translate_is_the_first_of_the_nbest(ckpt, sentences):
    # torch's search: CTranslate2 returns only its n best, so at a length limit (which a random
    # model reaches) its 1-best can differ from the first of a longer list (the translating guide)
    translator = Translator.load(ckpt, device="cpu", engine="torch")
    nbest = translator.translate_nbest(sentences, 4)
    assert translator.translate(sentences) == [hyps[0].text for hyps in nbest]
    for hyps in nbest:
        assert len(hyps) == 4 and all(isinstance(h, Translation) for h in hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_decode_options_of_load_are_those_of_the_command(ckpt, sentences):
    api = Translator.load(ckpt, device="cpu", beam=2, lenpen=0.6, lenpen_style="gnmt", max_len_b=4)
    r = nmt(
        "translate",
        "-c",
        str(ckpt),
        "--device",
        "cpu",
        "--beam",
        "2",
        "--lenpen",
        "0.6",
        "--lenpen-style",
        "gnmt",
        "--max-len-b",
        "4",
        "--threads",
        "1",
        env=ONE_THREAD,
        stdin="".join(s + "\n" for s in sentences[:6]).encode(),
    )
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split("\n")[:-1] == api.translate(sentences[:6])
    assert (api.decode.beam, api.decode.lenpen_style) == (2, "gnmt")


# ------------------------------------------------------------------ batching and streaming


def test_output_does_not_depend_on_batching_or_buffering(ckpt, translator, sentences):
    expected = translator.translate(sentences)
    assert Translator.load(ckpt, device="cpu", batch_size=1).translate(sentences) == expected
    assert Translator.load(ckpt, device="cpu", max_tokens=40).translate(sentences) == expected
    assert [translator.translate([s])[0] for s in sentences[:8]] == expected[:8]
    for buffer in (1, 7, 100):
        assert list(translator.translate_stream(iter(sentences), buffer_lines=buffer)) == expected


def test_stream_answers_a_line_before_reading_the_next(translator, sentences):
    read = []

    def source():
        for s in sentences[:3]:
            read.append(s)
            yield s

    stream = translator.translate_stream(source())
    first = next(stream)
    assert len(read) == 1 and first == translator.translate(sentences[:1])[0]
    assert len(list(stream)) == 2 and len(read) == 3


# ------------------------------------------------------------------ inputs


def test_blank_inputs_give_empty_outputs_without_the_model(translator, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the model was called")

    monkeypatch.setattr(translator.loaded.model, "encode", boom)
    assert translator.translate(["", " ", "\t \u3000", "\n"]) == ["", "", "", ""]
    assert translator.translate_nbest(["", " "], 2) == [[], []]
    assert translator.translate([]) == []


def test_line_breaks_and_bad_characters_inside_an_input_are_cleaned(translator):
    out = translator.translate(
        ["A dog\nruns.", "A dog runs.", "A cat\x00 \udcff sits\u2028down.\r"]
    )
    assert len(out) == 3 and out[0] == out[1]
    assert not any(c in o for o in out for c in "\n\r\t\u2028")


def test_an_overlong_input_is_truncated_with_a_warning(translator, caplog):
    long = " ".join(["dog"] * 600)
    with caplog.at_level("WARNING"):
        assert len(translator.translate(["A cat.", long])) == 2
    assert "texts[1]" in caplog.text and "truncated" in caplog.text


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda t: t.translate("A dog."), "got one str"),
        (lambda t: t.translate(["A dog.", None]), "texts[1] is NoneType"),
        (
            lambda t: t.translate_nbest(["A dog."], 9),
            "nbest must be between 1 and the beam size (4)",
        ),
        (lambda t: list(t.translate_stream(["A dog."], buffer_lines=0)), "buffer_lines"),
        (lambda t: t.score(["A dog."], ["Ein Hund.", "x"]), "1 sources but 2 targets"),
        (lambda t: t.score(["A dog."], ["Hund " * 300]), "targets[0]"),
    ],
)
def test_bad_calls_raise_one_line_nmt_errors(translator, call, needle):
    with pytest.raises(NmtError) as e:
        call(translator)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"beam": 0}, "beam= must be at least 1"),
        ({"beam": "5"}, "beam= must be an integer"),
        ({"bem": 5}, "unknown option bem="),
        ({"input": "x.txt"}, "unknown option input="),  # stream I/O belongs to the command
        ({"precision": "int4"}, "precision= must be one of"),
        ({"workers": -1}, "workers= must not be negative"),
        ({"lenpen_style": "log"}, "lenpen_style= must be one of"),
        # issue 25 (9): one rule for every option: a number is a number, a bool a bool, never a str
        ({"lenpen": "1"}, "lenpen= must be a number"),
        ({"temperature": "0.5"}, "temperature= must be a number"),
        ({"sampling": "no"}, "sampling= must be true or false"),
        ({"threads": 2.0}, "threads= must be an integer"),
        # issue 33 (9): a TypeError before
        ({"terminology": 5}, "terminology= must be a path (str or os.PathLike), got int"),
        ({"shortlist": b"sl.pt"}, "shortlist= must be a path (str or os.PathLike), got bytes"),
    ],
)
def test_bad_load_options_are_one_line_errors(ckpt, options, needle):
    with pytest.raises(NmtError) as e:
        Translator.load(ckpt, device="cpu", **options)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("checkpoints", "needle"),
    [
        (None, "got NoneType"),
        (123, "got int"),
        ([None], "checkpoints[0] is NoneType"),
        (b"a.pt", "got bytes"),
        (["a.pt", b"b.pt"], "checkpoints[1] is bytes"),
    ],
)
def test_load_refuses_what_is_not_a_path_naming_it(checkpoints, needle):
    """Issue 25 (9): these were TypeErrors."""
    with pytest.raises(NmtError) as e:
        Translator.load(checkpoints, device="cpu")
    assert needle in str(e.value) and "checkpoints" in str(e.value) and "\n" not in str(e.value)


def test_a_missing_checkpoint_is_an_nmt_error(tmp_path):
    with pytest.raises(NmtError, match="nope.pt"):
        Translator.load(tmp_path / "nope.pt")


S = ["A dog runs."]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda t: t.translate(None), "translate: texts must be an iterable of str, got NoneType"),
        (lambda t: t.translate(5), "translate: texts must be an iterable of str, got int"),
        (lambda t: t.translate(b"A dog."), "got bytes"),
        (lambda t: t.translate_nbest(S, None), "nbest must be an integer, got None"),
        (lambda t: t.translate_nbest(S, "2"), "nbest must be an integer, got '2'"),
        (lambda t: t.translate_nbest(S, 1.5), "nbest must be an integer, got 1.5"),
        (lambda t: t.translate_nbest(S, True), "nbest must be an integer, got True"),
        (lambda t: t.translate_nbest(S, first_index="x"), "first_index must be an integer"),
        (lambda t: t.translate_nbest(S, first_index=-1), "first_index must be 0 or more"),
        (lambda t: t.translate_nbest(S, alignment="no"), "alignment must be true or false"),
        (lambda t: t.translate_nbest(S, attention=1), "attention must be true or false"),
        (
            lambda t: t.translate_stream(None),
            "translate_stream: lines must be an iterable of str, got NoneType",
        ),
        (lambda t: t.translate_stream(5), "lines must be an iterable of str, got int"),
        (lambda t: t.translate_stream("A dog runs."), "got one str: pass [text]"),  # issue 25 (10)
        (
            lambda t: t.translate_stream(S, buffer_lines="2"),
            "buffer_lines must be an integer, got '2'",
        ),
        (
            lambda t: t.translate_stream(S, buffer_lines=None),
            "buffer_lines must be an integer, got None",
        ),
        (
            lambda t: t.translate_stream(S, buffer_lines=2.5),
            "buffer_lines must be an integer, got 2.5",
        ),
        (lambda t: t.translate_stream(S, buffer_lines=2**63), "buffer_lines must be between 1 and"),
        (
            lambda t: list(t.translate_stream(["A dog.", "A cat.", None], buffer_lines=2)),
            "lines[2] is NoneType",
        ),
        (lambda t: t.score(None, None), "score: sources must be an iterable of str, got NoneType"),
        (lambda t: t.score(S, None), "score: targets must be an iterable of str, got NoneType"),
        (
            lambda t: t.score("A dog.", ["Ein Hund."]),
            "sources must be an iterable of str, got one str",
        ),
        (
            lambda t: t.score([None], ["Ein Hund."]),
            "sources[0] is NoneType, not str",
        ),  # issue 25 (14)
        (lambda t: t.score(["A dog.", "A cat."], ["Ein Hund.", 7]), "targets[1] is int, not str"),
        (lambda t: t.score(S, S, normalize="x"), "normalize must be true or false"),
    ],
)
def test_wrong_argument_types_are_nmt_errors_naming_the_argument(translator, call, needle):
    """Issue 25 (9, 10, 14): TypeErrors and ValueErrors of Python, or a str streamed character
    by character; a stream's arguments are checked when it is made, before any line is read."""
    with pytest.raises(NmtError) as e:
        call(translator)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_score_and_translate_take_any_iterable_of_str(translator, raw_corpus):
    sources, targets = raw_corpus.lines("test", "en")[:3], raw_corpus.lines("test", "de")[:3]
    assert translator.score(iter(sources), (t for t in targets)) == translator.score(
        sources, targets
    )
    assert (
        translator.translate(tuple(sources))
        == translator.translate(iter(sources))
        == translator.translate(sources)
    )


# ------------------------------------------------------------------ forced decoding


def test_forced_decoding_of_a_hypothesis_gives_the_search_log_probs(translator, sentences):
    loaded, tok = translator.loaded, translator.loaded.tokenizer
    seqs = [tok.encode(s) for s in sentences]
    results = translate_token_lists(
        loaded.model,
        seqs,
        translator.decode,
        specials=tok.specials,
        nbest=4,
        max_positions=loaded.max_positions,
    )
    pairs = [
        (seq, text, h)
        for seq, text, hyps in zip(seqs, sentences, results, strict=True)
        for h in hyps
    ]
    # forced decoding of the search's own tokens gives its per-token log-probs
    forced = score_token_lists(
        loaded.model,
        [p[0] for p in pairs],
        [p[2].tokens for p in pairs],
        translator.decode,
        specials=tok.specials,
    )
    for got, (_, _, h) in zip(forced, pairs, strict=True):
        assert got == pytest.approx(h.positional_scores, abs=1e-4)


def test_score_of_its_own_translations_is_their_logprob(trained_checkpoint, raw_corpus):
    """Text in: where a translation's text re-encodes to the tokens the search produced (most,
    for a trained model), `score` is its logprob and, normalized, its score. torch's search:
    CTranslate2's reports log-probs within ~1e-3 a token of forced decoding's (test_engine)."""
    translator = Translator.load(trained_checkpoint, device="cpu", engine="torch")
    tok = translator.loaded.tokenizer
    sources = raw_corpus.lines("test", "en")
    results = translate_token_lists(
        translator.loaded.model,
        [tok.encode(s) for s in sources],
        translator.decode,
        specials=tok.specials,
        nbest=4,
        max_positions=translator.loaded.max_positions,
    )
    canonical = {
        (src, tok.decode(h.tokens))
        for src, hyps in zip(sources, results, strict=True)
        for h in hyps
        if tok.encode(tok.decode(h.tokens)) == h.tokens
    }
    pairs = [
        (src, h)
        for src, hyps in zip(sources, translator.translate_nbest(sources, 4), strict=True)
        for h in hyps
        if (src, h.text) in canonical
    ]
    assert len(pairs) >= 2 * len(sources)
    texts = [h.text for _, h in pairs]
    for got, (_, h) in zip(translator.score([p[0] for p in pairs], texts), pairs, strict=True):
        assert got == pytest.approx(h.logprob, abs=1e-4)
    for got, (_, h) in zip(
        translator.score([p[0] for p in pairs], texts, normalize=True), pairs, strict=True
    ):
        assert got == pytest.approx(h.score, abs=1e-4)


def test_score_does_not_depend_on_batching(ckpt, translator, raw_corpus):
    sources, targets = raw_corpus.lines("test", "en")[:12], raw_corpus.lines("test", "de")[:12]
    batched = translator.score(sources, targets)
    one_by_one = Translator.load(ckpt, device="cpu", batch_size=1).score(sources, targets)
    assert batched == pytest.approx(one_by_one, abs=1e-4)
    assert all(s < 0 for s in batched)


def test_score_of_blank_sources_follows_translation(translator):
    assert translator.score(["", " ", "A dog."], ["", "Ein Hund.", ""])[:2] == [0.0, -math.inf]
    assert translator.score(["A dog."], [""])[0] < 0  # log P(EOS | source)


# ------------------------------------------------------------------ nmt translate as a co-process


def _read_line(stream, timeout: float) -> bytes:
    """One line from a raw pipe, failing (never hanging) if it does not come within `timeout`."""
    fd, line = stream.fileno(), b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no answer within {timeout} s (got {line!r} so far)")
        byte = os.read(fd, 1)  # one byte at a time: never read past the line
        if not byte:
            raise AssertionError(f"the process ended (got {line!r})")
        line += byte
    return line


@pytest.mark.parametrize("buffer_lines", ["1", "16"])
def test_translate_answers_a_co_process_line_by_line(ckpt, translator, sentences, buffer_lines):
    """Write a line, read its translation, repeat: the answer must come before the next line is
    sent (with --buffer-lines 16, because the input pauses). A burst of lines is answered too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nmt",
            "translate",
            "-c",
            str(ckpt),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--buffer-lines",
            buffer_lines,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        bufsize=0,
    )
    try:
        lines = [sentences[0], "", sentences[1], sentences[2]]
        for line in lines:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            assert (
                _read_line(proc.stdout, ANSWER_TIMEOUT).decode()
                == translator.translate([line])[0] + "\n"
            )
        burst = sentences[3:6]
        proc.stdin.write("".join(s + "\n" for s in burst).encode())
        proc.stdin.flush()
        answers = [_read_line(proc.stdout, ANSWER_TIMEOUT).decode() for _ in burst]
        assert answers == [t + "\n" for t in translator.translate(burst)]
        proc.stdin.close()
        assert proc.wait(timeout=ANSWER_TIMEOUT) == 0
        assert proc.stdout.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_translate_answers_each_line_typed_on_a_terminal(ckpt, translator, sentences):
    """No --buffer-lines: stdin is a terminal (a pseudo-terminal here), so each typed line is
    answered at once."""
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nmt",
            "translate",
            "-c",
            str(ckpt),
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        bufsize=0,
    )
    os.close(slave)
    try:
        for line in sentences[:2]:
            os.write(master, line.encode() + b"\n")
            assert (
                _read_line(proc.stdout, ANSWER_TIMEOUT).decode()
                == translator.translate([line])[0] + "\n"
            )
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def test_negative_buffer_lines_is_one_line(ckpt):
    r = nmt("translate", "-c", str(ckpt), "--buffer-lines", "-1", env=ONE_THREAD, stdin=b"A dog.\n")
    err = [line for line in r.stderr.decode().splitlines() if line.strip()]
    assert r.returncode == 1 and len(err) == 1 and "--buffer-lines" in err[0], r.stderr.decode()


@pytest.mark.parametrize("native, chosen", [(True, "bf16"), (False, "fp32")])
def test_precision_auto_decodes_in_bf16_only_where_the_device_computes_it_natively(
    ckpt, sentences, monkeypatch, caplog, native, chosen
):
    """Only the capability check is mocked: auto decodes exactly as the precision it chose."""
    import nmt.device

    monkeypatch.setattr(nmt.device, "native_bf16", lambda device: native)
    caplog.set_level("INFO", logger="nmt.api")
    auto = Translator.load(ckpt, device="cpu", precision="auto")
    assert auto.precision == chosen
    assert f"precision {chosen} (auto: cpu" in caplog.text
    explicit = Translator.load(ckpt, device="cpu", precision=chosen)
    assert auto.translate_nbest(sentences, 2) == explicit.translate_nbest(sentences, 2)
