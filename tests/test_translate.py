"""`nmt translate`: the I/O contract through the real CLI, batching invariance, n-best lists,
scores equal to teacher-forced log-probs, ensembles, the last-run default, atomic -o.

Nothing is trained: the checkpoints hold randomly initialised tiny Transformers (and an RNN
encoder-decoder, for the properties both architectures must have) and a small
sentencepiece model learnt from the `raw_corpus` fixture (Multi30k, or synthetic text). A
random model never chooses EOS, so decoding is kept short with max_len_a = 0, max_len_b = 6.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from helpers import ROOT, assert_one_line, greedy_search, nmt, nmt_here, save_random_model

from nmt.decoding import predict
from nmt.decoding.predict import load_models, translate_token_lists
from nmt.decoding.search import beam_search, length_penalty
from nmt.decoding.shortlist import Shortlist, load_shortlist, save_shortlist
from nmt.models.kernels import PackedLinear, packing_works
from nmt.tokenizer import NMT_SPECIALS, Tokenizer, train_sentencepiece

# the commands in a subprocess: this checkout's nmt, one OpenMP thread
ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
MAX_POSITIONS = 256  # configs/tiny.yaml
FIRST_WORD = max(NMT_SPECIALS.ids()) + 1  # the lowest id that is not a special token


@dataclass(frozen=True)
class Setup:
    a: Path  # random model, seed 1
    b: Path  # random model, seed 2, same sentencepiece model
    other_spm: Path  # random model with another sentencepiece model
    # random RNN encoder-decoder with attention (nmt.models.rnn), seed 4, same sentencepiece model
    rnn: Path
    sentences: list[str]  # 40 source sentences of varied length
    words: list[str]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def setup(raw_corpus, test_tokenizer, tmp_path_factory) -> Setup:
    root, spm = tmp_path_factory.mktemp("translate"), test_tokenizer
    train = raw_corpus.lines("train", "en") + raw_corpus.lines("train", "de")
    other = Tokenizer.from_file(train_sentencepiece(train, root / "other", 450))
    sentences = raw_corpus.lines("test", "en")
    return Setup(
        a=save_random_model(root / "a.pt", spm, seed=1),
        b=save_random_model(root / "b.pt", spm, seed=2),
        other_spm=save_random_model(root / "other.pt", other, seed=3),
        rnn=save_random_model(
            root / "rnn.pt", spm, seed=4, model={"arch": "rnn", "rnn_hidden": 32}
        ),
        sentences=sentences,
        words=" ".join(train).split(),
    )


def translate_file(tmp_path: Path, lines: list[str], *args: str, name: str = "out") -> bytes:
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / f"{name}.txt"
    assert nmt_here("translate", "-i", str(src), "-o", str(out), *args) == 0
    return out.read_bytes()


def one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert_one_line(r.returncode, r.stderr, needle)
    assert r.stdout == b""


# ------------------------------------------------------------------ the I/O contract


def test_io_contract_one_output_line_per_input_line(setup):
    long_line = " ".join((setup.words * 20)[:3000])  # > 3000 tokens
    lines = [
        b"A man is riding a bike.\r",  # CRLF
        b"",
        b"  \t  ",
        long_line.encode(),
        b"A dog \xff\xfe runs in the \xc3 park.",  # invalid UTF-8
        b"Two dogs\rplay in\xe2\x80\xa8the snow.\r",  # bare CR and U+2028 inside; CRLF
        b" \r",  # whitespace-only, CRLF
        b"A woman sings.",  # no final newline
    ]
    r = nmt("translate", "-c", str(setup.a), stdin=b"\n".join(lines), env=ENV)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode("utf-8")  # strict: the output is valid UTF-8
    assert out.endswith("\n")
    got = out.split("\n")[:-1]
    assert len(got) == len(lines)
    for line in got:
        assert not any(c in line for c in "\r\t\u2028\u2029\x0b\x0c\x85"), repr(line)
    assert got[1] == got[2] == got[6] == ""
    err = r.stderr.decode()
    assert "<stdin>:4:" in err and "truncated" in err
    assert "<stdin>:5:" in err and "invalid UTF-8" in err
    assert "WARNING" not in out and "truncated" not in out
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 2, err


def test_empty_input_gives_empty_output(setup):
    r = nmt("translate", "-c", str(setup.a), stdin=b"", env=ENV)
    assert (r.returncode, r.stdout) == (0, b""), r.stderr.decode()


def test_missing_checkpoint_is_one_line(tmp_path):
    one_line_error(
        nmt("translate", "-c", str(tmp_path / "nope.pt"), stdin=b"hi\n", env=ENV), "nope.pt"
    )


def test_corrupt_checkpoint_is_one_line(setup, tmp_path):
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(setup.a.read_bytes()[:5000])
    one_line_error(nmt("translate", "-c", str(bad), stdin=b"hi\n", env=ENV), "truncated.pt")


@pytest.mark.parametrize("model", ["a", "rnn"])
def test_batching_does_not_change_the_output(setup, tmp_path, model):
    lines, checkpoint = setup.sentences, str(getattr(setup, model))
    ref = translate_file(tmp_path, lines, "-c", checkpoint, "--batch-size", "64", name="ref")
    assert ref.count(b"\n") == len(lines)
    for args in (
        ["--batch-size", "1"],
        ["--batch-size", "3"],
        ["--max-tokens", "50"],
        ["--batch-size", "3", "--workers", "3"],
        ["--batch-size", "64"],
    ):
        assert translate_file(tmp_path, lines, "-c", checkpoint, *args) == ref, args


def test_workers_give_the_same_hypotheses_and_scores(setup):
    """Batches decoded at once on several threads: the same hypotheses, scores and order as one
    after the other, and the caller's torch thread count is restored."""
    loaded = load_models([setup.a], torch.device("cpu"))
    cfg = replace(loaded.config.decode, batch_size=4)
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences[:30]]
    one = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=loaded.tokenizer.specials,
        nbest=2,
        max_positions=MAX_POSITIONS,
    )
    threads = torch.get_num_threads()
    for workers in (2, 3):
        many = translate_token_lists(
            loaded.model,
            seqs,
            cfg,
            specials=loaded.tokenizer.specials,
            nbest=2,
            max_positions=MAX_POSITIONS,
            workers=workers,
        )
        assert [[(h.tokens, h.score) for h in hs] for hs in many] == [
            [(h.tokens, h.score) for h in hs] for hs in one
        ]
        assert torch.get_num_threads() == threads


def test_a_failing_batch_stops_the_workers_with_its_error(setup, monkeypatch):
    loaded = load_models([setup.a], torch.device("cpu"))
    cfg = replace(loaded.config.decode, batch_size=2)
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences[:20]]

    def failing(model, src, *args, **kwargs):
        raise RuntimeError("out of memory in batch")

    monkeypatch.setattr("nmt.decoding.predict.beam_search", failing)
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="out of memory in batch"):
        translate_token_lists(
            loaded.model,
            seqs,
            cfg,
            specials=loaded.tokenizer.specials,
            max_positions=MAX_POSITIONS,
            workers=2,
        )
    assert torch.get_num_threads() == threads


def test_negative_workers_is_one_line(setup):
    one_line_error(
        nmt("translate", "-c", str(setup.a), "--workers", "-1", stdin=b"a\n", env=ENV), "--workers"
    )


def test_nbest_with_scores(setup, tmp_path):
    out = translate_file(
        tmp_path, setup.sentences[:8], "-c", str(setup.a), "--nbest", "3", "--scores"
    )
    rows = out.decode().split("\n")[:-1]
    assert len(rows) == 8
    for row in rows:
        fields = row.split("\t")
        assert len(fields) == 6, row
        scores = [float(s) for s in fields[0::2]]
        assert scores == sorted(scores, reverse=True)
    # distinct hypotheses (on tokens: distinct token sequences may detokenize identically)
    loaded = load_models([setup.a], torch.device("cpu"))
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences[:8]]
    for hyps in translate_token_lists(
        loaded.model,
        seqs,
        loaded.config.decode,
        specials=loaded.tokenizer.specials,
        nbest=3,
        max_positions=MAX_POSITIONS,
    ):
        assert len({tuple(h.tokens) for h in hyps}) == 3


# ------------------------------------------------------------------ the search through the model


@pytest.mark.parametrize(
    ("style", "alpha", "model"),
    [("length", 1.0, "a"), ("gnmt", 0.6, "a"), ("none", 0.0, "a"), ("length", 1.0, "rnn")],
)
def test_scores_are_teacher_forced_logprobs(setup, style, alpha, model):
    loaded = load_models([getattr(setup, model)], torch.device("cpu"))
    model, tok = loaded.model, loaded.tokenizer
    ids = tok.specials
    cfg = replace(loaded.config.decode, lenpen_style=style, lenpen=alpha)
    seqs = [tok.encode(s) for s in setup.sentences[:5]]
    results = translate_token_lists(
        model, seqs, cfg, specials=ids, nbest=cfg.beam, max_positions=MAX_POSITIONS
    )
    with torch.inference_mode():
        for seq, hyps in zip(seqs, results, strict=True):
            src = torch.tensor([seq + [ids.eos]])
            for h in hyps:
                target = torch.tensor([h.tokens + [ids.eos]])
                prev = torch.tensor([[ids.bos] + h.tokens])
                lprobs = torch.log_softmax(model(src, prev).float(), dim=-1)
                logprob = lprobs.gather(2, target.unsqueeze(2)).sum().item()
                expected = logprob / length_penalty(len(h.tokens) + 1, alpha, style)
                assert h.score == pytest.approx(expected, abs=1e-4)
                assert h.logprob == pytest.approx(logprob, abs=1e-4)


@pytest.mark.parametrize("model", ["a", "rnn"])
def test_beam_one_equals_greedy(setup, model):
    loaded = load_models([getattr(setup, model)], torch.device("cpu"))
    cfg = replace(loaded.config.decode, beam=1)
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences]
    ids = loaded.tokenizer.specials
    beam = translate_token_lists(loaded.model, seqs, cfg, specials=ids, max_positions=MAX_POSITIONS)
    width = max(map(len, seqs)) + 1
    src = torch.tensor([s + [ids.eos] + [ids.pad] * (width - len(s) - 1) for s in seqs])
    with torch.inference_mode():
        greedy = greedy_search(loaded.model, src, cfg, max_len=MAX_POSITIONS)
    assert [h[0].tokens for h in beam] == greedy


def test_empty_sequences_are_not_translated(setup):
    loaded = load_models([setup.a], torch.device("cpu"))
    seqs = [[], loaded.tokenizer.encode(setup.sentences[0]), []]
    out = translate_token_lists(
        loaded.model,
        seqs,
        loaded.config.decode,
        specials=loaded.tokenizer.specials,
        max_positions=MAX_POSITIONS,
    )
    assert out[0] == out[2] == [] and len(out[1]) == 1


# ------------------------------------------------------------------ ensembles


def test_ensemble_of_one_model_twice_equals_the_model(setup, tmp_path):
    lines = setup.sentences[:12]
    # an ensemble decodes with torch: so does the model alone here
    single = translate_file(tmp_path, lines, "-c", str(setup.a), "--engine", "torch", name="single")
    twice = translate_file(tmp_path, lines, "-c", str(setup.a), "-c", str(setup.a), name="twice")
    assert twice == single
    mixed = translate_file(tmp_path, lines, "-c", str(setup.a), "-c", str(setup.b), name="mixed")
    assert mixed.count(b"\n") == len(lines) and mixed != single


def test_ensemble_needs_one_sentencepiece_model(setup, tmp_path, capfd):
    src = tmp_path / "in.txt"
    src.write_text("A dog.\n", encoding="utf-8")
    code = nmt_here("translate", "-c", str(setup.a), "-c", str(setup.other_spm), "-i", str(src))
    err = capfd.readouterr().err
    assert code == 1 and "other.pt" in err and "sentencepiece" in err, err


# ------------------------------------------------------------------ files and defaults


def test_last_run_prefers_the_averaged_checkpoint(setup, tmp_path):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    shutil.copyfile(setup.a, run / "checkpoint_avg.pt")
    shutil.copyfile(setup.b, run / "checkpoint_best.pt")
    (tmp_path / ".nmt-last-run").write_text(f"{run}\n", encoding="utf-8")
    text = "".join(s + "\n" for s in setup.sentences[:4]).encode()
    r = nmt("translate", stdin=text, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr.decode()
    assert "checkpoint_avg.pt" in r.stderr.decode()
    assert r.stdout == nmt("translate", "-c", str(setup.a), stdin=text, env=ENV).stdout


def test_last_run_falls_back_to_best(setup, tmp_path, monkeypatch, capfd):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(setup.b, run / "checkpoint_best.pt")
    (tmp_path / ".nmt-last-run").write_text(f"{run}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    lines = setup.sentences[:4]
    from_run = translate_file(tmp_path, lines, name="run")
    assert "checkpoint_best.pt" in capfd.readouterr().err
    assert from_run == translate_file(tmp_path, lines, "-c", str(setup.b), name="b")


def test_no_checkpoint_and_no_run_is_one_line(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("A dog.\n", encoding="utf-8")
    assert nmt_here("translate", "-i", "in.txt") == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and ".nmt-last-run" in err, err


def test_input_and_output_files(setup, tmp_path, capfd):
    lines = setup.sentences[:6]
    out = translate_file(tmp_path, lines, "-c", str(setup.a))
    captured = capfd.readouterr()
    assert captured.out == ""  # -o: nothing on stdout
    text = "".join(s + "\n" for s in lines).encode()
    assert out == nmt("translate", "-c", str(setup.a), stdin=text, env=ENV).stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_output_is_written_atomically(setup, tmp_path, monkeypatch):
    import nmt.translate

    real = nmt.translate.format_line
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(nmt.translate, "format_line", failing)
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("A dog.\nA cat.\nA bird.\nA cow.\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="boom"):
        nmt_here("translate", "-c", str(setup.a), "-i", str(src), "-o", str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no partial file, no temporary
    out.write_text("previous\n", encoding="utf-8")
    calls.clear()
    with pytest.raises(RuntimeError, match="boom"):
        nmt_here("translate", "-c", str(setup.a), "-i", str(src), "-o", str(out))
    assert out.read_text(encoding="utf-8") == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_same_input_twice_gives_the_same_output(setup, tmp_path):
    lines = setup.sentences[:10]
    first = translate_file(tmp_path, lines, "-c", str(setup.a), name="first")
    assert translate_file(tmp_path, lines, "-c", str(setup.a), name="second") == first


# ------------------------------------------------ no output is an input (nmt.atomic.check_outputs)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# case: (translate's arguments, files named in tmp_path; the one-line error)
OVERWRITES = {
    "-o CK": (
        ["-i", "in.txt", "-o", "ck.pt"],
        "-o {d}/ck.pt is the checkpoint (--checkpoint {d}/ck.pt)",
    ),
    "-i X -o X": (
        ["-i", "in.txt", "-o", "in.txt"],
        "-o {d}/in.txt is the input (--input {d}/in.txt)",
    ),
    "-o a symlink to X": (
        ["-i", "in.txt", "-o", "link.txt"],
        "-o {d}/link.txt is the input (--input {d}/in.txt)",
    ),
    "--attention OUT -o OUT": (
        ["-i", "in.txt", "--attention", "out.txt", "-o", "out.txt"],
        "--attention {d}/out.txt is the translations (-o {d}/out.txt)",
    ),
    "--attention CK": (
        ["-i", "in.txt", "--attention", "ck.pt", "-o", "new.txt"],
        "--attention {d}/ck.pt is the checkpoint (--checkpoint {d}/ck.pt)",
    ),
    "--shortlist SL -o SL": (
        ["-i", "in.txt", "--shortlist", "sl.pt", "-o", "sl.pt"],
        "-o {d}/sl.pt is the shortlist (--shortlist {d}/sl.pt)",
    ),
}


@pytest.mark.parametrize("case", OVERWRITES)
def test_no_output_may_be_an_input_or_another_output(setup, tmp_path, capfd, case):
    d = tmp_path
    shutil.copy(setup.a, d / "ck.pt")
    (d / "in.txt").write_text("A dog runs.\nTwo cats.\n", encoding="utf-8")
    (d / "link.txt").symlink_to("in.txt")
    (d / "out.txt").write_text("earlier translations\n", encoding="utf-8")
    save_shortlist(
        _random_shortlist(load_models([setup.a], torch.device("cpu")), seed=1), d / "sl.pt"
    )
    args, needle = OVERWRITES[case]
    before = _files(d)
    assert (
        nmt_here(
            "translate",
            "-c",
            str(d / "ck.pt"),
            *(a if a.startswith("-") else str(d / a) for a in args),
        )
        == 1
    )
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle.format(d=d) in err[0] and "choose another output" in err[0], err
    assert _files(d) == before  # nothing written, nothing lost


def test_standard_streams_that_are_an_input_are_refused(setup, tmp_path):
    """`-o X < X` (standard input is the file X) and `-i X >> X` (standard output is X): the
    descriptors are compared as files too, never a pipe or a terminal."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"A dog runs.\n")
    command = [sys.executable, "-m", "nmt", "translate", "-c", str(setup.a)]
    env = {**os.environ, **ENV}
    with open(src, "rb") as stdin:
        r = subprocess.run(
            [*command, "-o", str(src)], stdin=stdin, capture_output=True, env=env, cwd=ROOT
        )
    one_line_error(r, f"-o {src} is the input (standard input)")
    with open(src, "ab") as stdout:
        r = subprocess.run(
            [*command, "-i", str(src)], stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=ROOT
        )
    err = [line for line in r.stderr.decode().splitlines() if line.strip()]
    assert (
        r.returncode == 1
        and len(err) == 1
        and f"standard output is the input (--input {src})" in err[0]
    ), err
    assert src.read_bytes() == b"A dog runs.\n"
    piped = nmt(
        "translate", "-c", str(setup.a), stdin=b"A dog runs.\n", env=ENV
    )  # a pipe is no file
    assert piped.returncode == 0 and piped.stdout.count(b"\n") == 1


# ------------------------------------------------------------------ shortlists


def _random_shortlist(loaded, seed: int, top: int = 3, frequent: int = 5) -> Shortlist:
    """A shortlist of random candidates over the model's vocabulary (a few dozen tokens a
    sentence)."""
    g = torch.Generator().manual_seed(seed)
    V = loaded.tokenizer.vocab_size
    candidates = torch.randint(FIRST_WORD, V, (V, top), generator=g)
    frequent_ids = (
        (torch.randperm(V - FIRST_WORD, generator=g)[:frequent] + FIRST_WORD).sort().values
    )
    return Shortlist(candidates, frequent_ids, V, loaded.tokenizer.sha256)


class _Masked:
    """The full-vocabulary model with each sentence's unlisted tokens at -inf and the rest
    renormalised: what decoding over the shortlist must equal, token for token."""

    def __init__(self, model, allowed: torch.Tensor):
        self.model, self.allowed = model, allowed  # (B, V) bool

    def encode(self, src):
        return self.model.encode(src), torch.arange(src.size(0))

    def decode_step(self, tokens, state):
        inner, sentence = state
        lprobs, inner = self.model.decode_step(tokens, inner)
        lprobs = lprobs.masked_fill(~self.allowed[sentence], float("-inf"))
        return lprobs - lprobs.logsumexp(1, keepdim=True), (inner, sentence)

    def reorder(self, state, index):
        return self.model.reorder(state[0], index), state[1][index]


def test_shortlist_decoding_equals_the_masked_full_vocabulary(setup):
    loaded = load_models([setup.a], torch.device("cpu"))
    cfg = replace(loaded.config.decode, batch_size=7)
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences[:20]]
    shortlist = _random_shortlist(loaded, seed=0)
    ids = loaded.tokenizer.specials
    got = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=ids,
        nbest=2,
        max_positions=MAX_POSITIONS,
        shortlist=shortlist,
    )
    exact = translate_token_lists(
        loaded.model, seqs, cfg, specials=ids, max_positions=MAX_POSITIONS
    )
    outside = 0
    with torch.inference_mode():
        for seq, hyps, full in zip(seqs, got, exact, strict=True):
            src = torch.tensor([seq + [ids.eos]])
            allowed = shortlist.allowed(src, ids)
            listed = set(allowed[0].nonzero().view(-1).tolist())
            outside += any(t not in listed for t in full[0].tokens)
            want = beam_search(
                _Masked(loaded.model, allowed),
                src,
                cfg,
                nbest=2,
                pad=ids.pad,
                unk=ids.unk,
                bos=ids.bos,
                eos=ids.eos,
                max_len=MAX_POSITIONS,
            )[0]
            assert [h.tokens for h in hyps] == [h.tokens for h in want]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-5)
            assert all(t in listed for h in hyps for t in h.tokens)
    assert outside >= 10  # the list really restricts: most full-vocabulary outputs leave it


def test_a_shortlist_of_every_token_changes_nothing(setup):
    loaded = load_models([setup.a], torch.device("cpu"))
    V = loaded.tokenizer.vocab_size
    everything = Shortlist(
        torch.full((V, 1), -1), torch.arange(FIRST_WORD, V), V, loaded.tokenizer.sha256
    )
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences[:10]]
    cfg = loaded.config.decode
    got = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=loaded.tokenizer.specials,
        nbest=2,
        max_positions=MAX_POSITIONS,
        shortlist=everything,
    )
    want = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=loaded.tokenizer.specials,
        nbest=2,
        max_positions=MAX_POSITIONS,
    )
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    assert [h.score for hs in got for h in hs] == pytest.approx(
        [h.score for hs in want for h in hs], abs=1e-5
    )


def test_shortlist_in_the_cli_batching_changes_nothing(setup, tmp_path):
    loaded = load_models([setup.a], torch.device("cpu"))
    path = tmp_path / "sl.pt"
    save_shortlist(_random_shortlist(loaded, seed=1), path)
    lines = setup.sentences
    ref = translate_file(
        tmp_path,
        lines,
        "-c",
        str(setup.a),
        "--shortlist",
        str(path),
        "--batch-size",
        "64",
        name="ref",
    )
    assert ref.count(b"\n") == len(lines)
    assert ref != translate_file(tmp_path, lines, "-c", str(setup.a), name="exact")
    for args in (
        ["--batch-size", "1"],
        ["--batch-size", "3", "--workers", "3"],
        ["--max-tokens", "50"],
    ):
        assert (
            translate_file(tmp_path, lines, "-c", str(setup.a), "--shortlist", str(path), *args)
            == ref
        ), args


def test_shortlist_of_another_vocabulary_is_one_line(setup, tmp_path):
    other = load_models([setup.other_spm], torch.device("cpu"))
    path = tmp_path / "other.pt"
    save_shortlist(_random_shortlist(other, seed=2), path)
    one_line_error(
        nmt("translate", "-c", str(setup.a), "--shortlist", str(path), stdin=b"A dog.\n", env=ENV),
        "other.pt: made for another vocabulary",
    )
    one_line_error(
        nmt(
            "translate",
            "-c",
            str(setup.a),
            "--shortlist",
            str(tmp_path / "none.pt"),
            stdin=b"A dog.\n",
            env=ENV,
        ),
        "none.pt: shortlist file not found",
    )
    loaded = load_models([setup.a], torch.device("cpu"))
    save_shortlist(_random_shortlist(loaded, seed=3, frequent=0), tmp_path / "short.pt")
    one_line_error(
        nmt(
            "translate",
            "-c",
            str(setup.a),
            "--shortlist",
            str(tmp_path / "short.pt"),
            "--beam",
            "5",
            stdin=b"A dog.\n",
            env=ENV,
        ),
        "short.pt: 0 frequent tokens are too few for beam 5",
    )


def test_nmt_shortlist_learns_from_a_prepared_directory(prepared, tmp_path):
    data_dir, report = prepared
    out = tmp_path / "sl.pt"
    assert (
        nmt_here("shortlist", str(data_dir), "-o", str(out), "--top", "10", "--frequent", "20") == 0
    )
    sl = load_shortlist(out, Tokenizer.from_file(data_dir / "spm.model"))
    assert sl.candidates.shape == (report["vocab_size"], 10) and sl.frequent.numel() == 20
    assert (sl.candidates[:, 0] >= FIRST_WORD).sum() > 100  # most source tokens have a translation
    r = nmt("shortlist", str(data_dir), "-o", str(out), "--top", "-1", stdin=b"", env=ENV)
    one_line_error(r, "--top")


# ---------------------------------------------------------------- CPU kernels (nmt.models.kernels)


def test_fp32_on_the_cpu_decodes_through_packed_linears_as_the_plain_ones(setup, monkeypatch):
    packed = load_models([setup.a], torch.device("cpu"))
    assert isinstance(packed.model.cpu_output, PackedLinear) == packing_works()
    monkeypatch.setattr(predict, "packing_works", lambda: False)  # a torch build without oneDNN
    plain = load_models([setup.a], torch.device("cpu"))
    assert plain.model.cpu_output is None
    seqs = [plain.tokenizer.encode(s) for s in setup.sentences[:16]]
    got, want = (
        translate_token_lists(
            m.model,
            seqs,
            m.config.decode,
            specials=m.tokenizer.specials,
            nbest=2,
            max_positions=MAX_POSITIONS,
        )
        for m in (packed, plain)
    )
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    assert [h.score for hs in got for h in hs] == pytest.approx(
        [h.score for hs in want for h in hs], abs=1e-4
    )


def test_int8_in_the_cli_keeps_the_io_contract_and_is_repeatable(setup, tmp_path):
    lines = [*setup.sentences[:12], "", "   ", setup.sentences[12]]
    first = translate_file(tmp_path, lines, "-c", str(setup.a), "--precision", "int8", name="first")
    assert first.count(b"\n") == len(lines) and first.split(b"\n")[12:14] == [b"", b""]
    assert (
        translate_file(tmp_path, lines, "-c", str(setup.a), "--precision", "int8", name="again")
        == first
    )


def test_int8_with_a_shortlist_of_every_token_changes_nothing(setup):
    loaded = load_models([setup.a], torch.device("cpu"), precision="int8")
    V = loaded.tokenizer.vocab_size
    everything = Shortlist(
        torch.full((V, 1), -1), torch.arange(FIRST_WORD, V), V, loaded.tokenizer.sha256
    )
    seqs = [loaded.tokenizer.encode(s) for s in setup.sentences[:10]]
    cfg = loaded.config.decode
    got = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=loaded.tokenizer.specials,
        nbest=2,
        max_positions=MAX_POSITIONS,
        precision="int8",
        shortlist=everything,
    )
    want = translate_token_lists(
        loaded.model,
        seqs,
        cfg,
        specials=loaded.tokenizer.specials,
        nbest=2,
        max_positions=MAX_POSITIONS,
        precision="int8",
    )
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    assert [h.score for hs in got for h in hs] == pytest.approx(
        [h.score for hs in want for h in hs], abs=1e-5
    )


def test_unknown_precision_is_one_line(setup):
    one_line_error(
        nmt("translate", "-c", str(setup.a), "--precision", "int4", stdin=b"a\n", env=ENV),
        "--precision must be one of 'fp32', 'bf16', 'fp16', 'int8', 'auto', got 'int4'",
    )
