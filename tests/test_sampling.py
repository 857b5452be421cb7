"""`translate --sampling`: a seed repeats its outputs whatever the batching, `--topk 1` is
greedy search, top-k / top-p keep only the tokens they should, temperature sharpens, and
the I/O contract holds (one line per input, empty lines empty)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import greedy_search, nmt_here, save_random_model

from nmt.api import Translator
from nmt.config import DecodeConfig
from nmt.decoding.predict import load_models, translate_token_lists
from nmt.decoding.sampling import sampler
from nmt.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def checkpoints(test_tokenizer, tmp_path_factory) -> dict[str, Path]:
    root, spm = tmp_path_factory.mktemp("sampling"), test_tokenizer
    return {
        "transformer": save_random_model(root / "t.pt", spm, seed=1),
        "rnn": save_random_model(
            root / "r.pt", spm, seed=2, model={"arch": "rnn", "rnn_hidden": 32}
        ),
    }


@pytest.fixture(scope="module")
def lines(raw_corpus) -> list[str]:
    test = raw_corpus.lines("test", "en")[:20]
    return [*test[:5], "", *test[5:]]


def sample_file(tmp_path: Path, lines: list[str], *args: str, name: str = "out") -> list[str]:
    src, out = tmp_path / "in.txt", tmp_path / f"{name}.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert nmt_here("translate", "-i", str(src), "-o", str(out), "--sampling", *args) == 0
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) == len(lines) + 1
    return got[:-1]


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_a_seed_repeats_whatever_the_batching(checkpoints, lines, tmp_path, arch):
    ckpt = str(checkpoints[arch])
    ref = sample_file(tmp_path, lines, "-c", ckpt, "--seed", "7", "--batch-size", "64", name="ref")
    assert ref[5] == "" and all(ref[i] for i in range(len(lines)) if i != 5)
    for args in (
        ["--batch-size", "1"],
        ["--batch-size", "3", "--workers", "2"],
        ["--buffer-lines", "4"],
        ["--batch-size", "64"],
    ):
        assert sample_file(tmp_path, lines, "-c", ckpt, "--seed", "7", *args) == ref, args
    other = sample_file(tmp_path, lines, "-c", ckpt, "--seed", "8", name="other")
    assert other != ref  # another seed, other samples
    assert (
        sample_file(tmp_path, lines, "-c", ckpt, "--seed", "7", "--topk", "5", name="topk") != ref
    )


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_topk_1_equals_greedy(checkpoints, lines, arch):
    loaded = load_models([checkpoints[arch]], torch.device("cpu"))
    seqs = [loaded.tokenizer.encode(s) for s in lines if s]
    cfg = replace(loaded.config.decode, sampling=True, topk=1, temperature=3.0, seed=11)
    ids = loaded.tokenizer.specials
    sampled = translate_token_lists(loaded.model, seqs, cfg, specials=ids, max_positions=256)
    width = max(map(len, seqs)) + 1
    src = torch.tensor([s + [ids.eos] + [ids.pad] * (width - len(s) - 1) for s in seqs])
    with torch.inference_mode():
        greedy = greedy_search(loaded.model, src, loaded.config.decode, max_len=256)
    assert [h[0].tokens for h in sampled] == greedy
    # and through the API, text for text (sampling decodes with torch: so does the greedy search)
    tr = Translator.load(checkpoints[arch], device="cpu", sampling=True, topk=1)
    assert tr.translate(lines) == Translator.load(
        checkpoints[arch], device="cpu", beam=1, engine="torch"
    ).translate(lines)


def test_sampled_scores_are_the_model_logprobs(checkpoints, lines):
    loaded = load_models([checkpoints["transformer"]], torch.device("cpu"))
    seq = loaded.tokenizer.encode(lines[0])
    cfg = replace(loaded.config.decode, sampling=True, seed=3, temperature=1.5)
    ids = loaded.tokenizer.specials
    hyp = translate_token_lists(loaded.model, [seq], cfg, specials=ids, max_positions=256)[0][0]
    with torch.inference_mode():
        logits = loaded.model(
            torch.tensor([seq + [ids.eos]]), torch.tensor([[ids.bos, *hyp.tokens]])
        )
    lprobs = torch.log_softmax(logits.float(), -1)[0]
    assert hyp.positional_scores[:-1] == pytest.approx(
        [lprobs[t, tok].item() for t, tok in enumerate(hyp.tokens)], abs=1e-4
    )
    assert hyp.logprob == pytest.approx(sum(hyp.positional_scores))


def draws(cfg: DecodeConfig, row: list[float], n: int = 400) -> set[int]:
    """The tokens `n` sentences draw at their first step from the distribution `row`."""
    scores = torch.tensor([row] * n).log()
    _, tokens = sampler(cfg, list(range(n)))(scores, torch.arange(n))
    return set(tokens.tolist())


def test_topk_topp_and_temperature_keep_the_right_tokens():
    probs = [0.5, 0.3, 0.15, 0.05, 0.0]
    base = DecodeConfig(sampling=True)
    assert draws(base, probs) == {0, 1, 2, 3}  # never a zero-probability token
    assert draws(replace(base, topk=2), probs) == {0, 1}
    assert draws(replace(base, topk=1), probs) == {0}
    assert draws(replace(base, topp=0.5), probs) == {0}  # the first token already has p
    assert draws(replace(base, topp=0.7), probs) == {0, 1}
    assert draws(replace(base, topp=0.81), probs) == {0, 1, 2}
    assert draws(replace(base, temperature=0.01), probs) == {0}  # almost greedy
    tie = [0.4, 0.4, 0.2, 0.0, 0.0]
    assert draws(replace(base, topk=1), tie) == {0}  # ties go to the lower id, as greedy's


def test_sampling_options_are_checked(checkpoints):
    for option, value, needle in (
        ("topk", -1, "topk="),
        ("topp", 0.0, "topp="),
        ("temperature", 0.0, "temperature="),
    ):
        with pytest.raises(NmtError, match=needle):
            Translator.load(
                checkpoints["transformer"], device="cpu", sampling=True, **{option: value}
            )
    with pytest.raises(NmtError, match="sampling gives one output"):
        Translator.load(checkpoints["transformer"], device="cpu", sampling=True).translate_nbest(
            ["A dog."], 2
        )


@pytest.mark.parametrize("temperature", [1e-300, 1e-46, 1e-5])
def test_a_temperature_near_zero_is_greedy(checkpoints, lines, tmp_path, temperature):
    """Issue 25 (4): float32 log-probs divided by a tiny temperature overflowed to NaN and every
    sentence came out empty. Towards 0, sampling becomes greedy search (torch's, as sampling's)."""
    ckpt = checkpoints["transformer"]
    greedy = Translator.load(ckpt, device="cpu", beam=1, engine="torch").translate(lines)
    assert sum(map(bool, greedy)) == len(lines) - 1
    assert (
        Translator.load(ckpt, device="cpu", sampling=True, temperature=temperature).translate(lines)
        == greedy
    )
    if temperature == 1e-300:  # and through the command
        assert sample_file(tmp_path, lines, "-c", str(ckpt), "--temperature", "1e-300") == greedy


@pytest.mark.parametrize("temperature", [1e39, 1e300, 1.7e308])
def test_a_huge_temperature_draws_uniformly_from_the_allowed_tokens(
    checkpoints, lines, temperature
):
    probs = [0.97, 0.01, 0.01, 0.01, 0.0]
    assert draws(DecodeConfig(sampling=True, temperature=temperature), probs) == {0, 1, 2, 3}
    assert draws(DecodeConfig(sampling=True, temperature=temperature, topk=2), probs) == {0, 1}
    out = Translator.load(
        checkpoints["transformer"], device="cpu", sampling=True, temperature=temperature
    ).translate(lines)
    assert len(out) == len(lines) and out[5] == "" and sum(map(bool, out)) >= len(lines) - 2
