"""`--engine ctranslate2`: CTranslate2 decodes what torch decodes (nmt.engine).

The properties: the same best translations as the torch engine, nearly always the same
n-best lists, scores within CTranslate2's rounding (~1e-3 per token); forced-decoding scores
the same; where a search reaches its length limit, the scores of what CTranslate2 returns are
still torch's scores of those tokens; what it cannot honour is refused in one line under
`ctranslate2` and left to torch under `auto`. The cache: one conversion per checkpoint
content, never a stale, partial, corrupt or foreign entry, two processes converting at once
both ending with one good copy, and a cache that cannot be written falling back to a temporary
folder.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nmt import engine
from nmt.api import Translator
from nmt.decoding.predict import score_token_lists
from nmt.decoding.search import length_penalty
from nmt.errors import NmtError

pytest.importorskip(
    "ctranslate2", reason="ctranslate2 is not installed (pip install nmt[ctranslate2])"
)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def sources(raw_corpus) -> list[str]:
    """Sentences the trained model translates before its length limit: there the engines agree
    (the limit is the one place they may not, `test_at_the_length_limit_...`)."""
    return raw_corpus.lines("train", "en")[:60]


def load(checkpoint: Path, cache_dir: Path, engine_name: str, **options) -> Translator:
    """The API takes a path as a str too: the cache folder is passed as one."""
    return Translator.load(checkpoint, engine=engine_name, cache_dir=str(cache_dir), **options)


@pytest.mark.parametrize(
    "settings",
    [
        {"beam": 4},
        {"beam": 1},
        {"beam": 3, "lenpen_style": "none"},
        {"beam": 4, "min_len": 0},
    ],
)
def test_ctranslate2_gives_torchs_translations_n_best_and_scores(
    trained_checkpoint, sources, cache, settings
):
    torch_tr = load(trained_checkpoint, cache, "torch", **settings)
    ct2_tr = load(trained_checkpoint, cache, "ctranslate2", **settings)
    assert ct2_tr.engine is not None and torch_tr.engine is None
    nbest = min(3, settings["beam"])
    expected = torch_tr.translate_nbest(sources, nbest)
    got = ct2_tr.translate_nbest(sources, nbest)
    assert [ts[0].text for ts in got] == [ts[0].text for ts in expected]
    # CTranslate2's kernels sum log-probs to within ~1e-3 of torch's per token
    # (docs/translating.md): partial hypotheses whose scores are that close may be pruned the
    # other way, which changes a lower rank of an n-best list now and then
    same = sum([u.text for u in us] == [t.text for t in ts] for ts, us in zip(expected, got))
    assert same >= 0.9 * len(sources)
    for ts, us in zip(expected, got):
        for t, u in zip(ts, us):
            if t.text == u.text:
                assert u.score == pytest.approx(t.score, rel=3e-3, abs=1e-4)
                assert u.logprob == pytest.approx(t.logprob, rel=3e-3, abs=1e-4)
    assert ct2_tr.translate(["", "  "]) == ["", ""]


def test_forced_decoding_scores_are_torchs(trained_checkpoint, sources, cache):
    torch_tr = load(trained_checkpoint, cache, "torch")
    ct2_tr = load(trained_checkpoint, cache, "ctranslate2")
    targets = torch_tr.translate(sources)
    targets[0] = "ein ganz anderer Satz"
    for normalize in (False, True):
        expected = torch_tr.score(sources + [""], targets + ["x"], normalize=normalize)
        got = ct2_tr.score(sources + [""], targets + ["x"], normalize=normalize)
        assert got[:-1] == pytest.approx(expected[:-1], abs=1e-4)
        assert got[-1] == expected[-1] == float("-inf")


def test_at_the_length_limit_the_scores_are_those_of_the_tokens_returned(
    trained_checkpoint, sources, cache
):
    """Where the search reaches a limit, CTranslate2 stops without the EOS torch forces there
    (the one place the engines may choose differently, docs/translating.md); the scores it
    reports are still torch's for the tokens it returns, forced EOS included."""
    tr = load(trained_checkpoint, cache, "ctranslate2", max_len_a=0.0, max_len_b=3)
    seqs = tr.encode(sources, None)
    hyps = tr.engine.translate(seqs, tr.decode, 2, tr.loaded.max_positions, "the model")
    assert all(len(h.tokens) <= 3 for hs in hyps for h in hs)
    assert any(len(h.tokens) == 3 for hs in hyps for h in hs)
    pairs = [(i, h) for i, hs in enumerate(hyps) for h in hs]
    expected = score_token_lists(
        tr.loaded.model,
        [seqs[i] for i, _ in pairs],
        [h.tokens for _, h in pairs],
        tr.decode,
        specials=tr.loaded.tokenizer.specials,
    )
    for (_, h), logprobs in zip(pairs, expected):
        assert h.logprob == pytest.approx(sum(logprobs), rel=1e-4, abs=1e-4)
        lp = length_penalty(len(h.tokens) + 1, tr.decode.lenpen, tr.decode.lenpen_style)
        assert h.score == pytest.approx(sum(logprobs) / lp, abs=1e-4)


def test_n_best_lists_rank_by_the_scores_they_report(random_checkpoint, cache):
    """A random model never chooses EOS: every hypothesis reaches the length limit, where its
    scores are recomputed with the EOS torch forces there; the list is then ranked by them."""
    tr = load(random_checkpoint, cache, "ctranslate2")
    texts = ["A dog runs.", "Two men sit on a bench.", "A girl.", "The red car is fast."]
    lists = tr.translate_nbest(texts, 4)
    for hyps in lists:
        scores = [h.score for h in hyps]
        assert len(scores) == 4 and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"lenpen_style": "gnmt"}, "lenpen_style gnmt"),
        ({"sampling": True}, "sampling"),
        ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size"),
        ({"min_len": 3}, "min_len"),
    ],
)
def test_ctranslate2_refuses_what_it_cannot_honour_and_auto_stays_on_torch(
    trained_checkpoint, cache, caplog, options, named
):
    with pytest.raises(NmtError, match=f"engine= ctranslate2 cannot honour {named}") as e:
        load(trained_checkpoint, cache, "ctranslate2", **options)
    assert "\n" not in str(e.value)
    caplog.set_level(logging.INFO, logger="nmt.api")
    tr = load(trained_checkpoint, cache, "auto", **options)
    assert tr.engine is None
    assert f"engine torch (auto: CTranslate2 cannot honour {named}" in caplog.text


def test_an_ensemble_and_terminology_stay_on_torch(trained_checkpoint, tmp_path, cache):
    with pytest.raises(NmtError, match="cannot honour an ensemble"):
        load([trained_checkpoint, trained_checkpoint], cache, "ctranslate2")
    terms = tmp_path / "terms.tsv"
    terms.write_text("dog\tHund\n")
    with pytest.raises(NmtError, match="cannot honour terminology"):
        load(trained_checkpoint, cache, "ctranslate2", terminology=terms)
    assert load([trained_checkpoint] * 2, cache, "auto").engine is None


def test_auto_converts_into_the_users_cache_without_cache_dir(
    trained_checkpoint, sources, tmp_path, caplog, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    caplog.set_level(logging.INFO, logger="nmt.api")
    tr = Translator.load(trained_checkpoint, engine="auto")
    assert tr.engine is not None
    assert "engine ctranslate2 (auto, its model in " in caplog.text
    assert entries(tmp_path / "xdg" / "nmt") != []
    assert tr.translate(sources[:4]) == load(trained_checkpoint, tmp_path, "torch").translate(
        sources[:4]
    )


def test_a_device_ctranslate2_cannot_open_stays_on_torch_under_auto(
    trained_checkpoint, cache, caplog, monkeypatch
):
    """A CTranslate2 built without CUDA, or one the driver is too old for, fails its
    capability check: auto names that and decodes with torch; ctranslate2 refuses it."""
    import ctranslate2

    def no_device(device: str) -> set[str]:
        raise RuntimeError("CUDA failed with error CUDA driver version is insufficient")

    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", no_device)
    with pytest.raises(NmtError, match="cannot honour device cpu \\(CUDA failed") as e:
        load(trained_checkpoint, cache, "ctranslate2")
    assert "\n" not in str(e.value)
    caplog.set_level(logging.INFO, logger="nmt.api")
    assert load(trained_checkpoint, cache, "auto").engine is None
    assert "engine torch (auto: CTranslate2 cannot honour device cpu (CUDA failed" in caplog.text


def test_a_model_the_converter_does_not_map_stays_on_torch_under_auto(
    prepared, tmp_path, cache, caplog
):
    from helpers import save_random_model

    from nmt.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(prepared[0] / "spm.model")
    no_final_norm = {"norm_first": True, "final_norm": False}
    ckpt = save_random_model(tmp_path / "m.pt", tokenizer, seed=1, model=no_final_norm)
    with pytest.raises(NmtError, match="model.final_norm=False cannot be represented"):
        load(ckpt, cache, "ctranslate2")
    caplog.set_level(logging.INFO, logger="nmt.api")
    tr = load(ckpt, cache, "auto")
    assert tr.engine is None
    assert "engine torch (auto: " in caplog.text and "final_norm=False" in caplog.text
    assert len(tr.translate(["A dog runs.", "Two men."])) == 2
    assert entries(cache) == []  # nothing half-converted is left


def test_a_call_asking_what_ctranslate2_lacks_goes_to_torch_under_auto(
    trained_checkpoint, sources, cache
):
    torch_tr = load(trained_checkpoint, cache, "torch")
    auto = load(trained_checkpoint, cache, "auto")
    strict = load(trained_checkpoint, cache, "ctranslate2")
    assert auto.engine is not None
    asked = {"prefix": ["Ein"] + [""] * (len(sources) - 1)}
    assert auto.translate(sources, **asked) == torch_tr.translate(sources, **asked)
    with pytest.raises(NmtError, match="cannot honour lexical constraints"):
        strict.translate(sources, **asked)


def test_alignments_and_attention_are_torchs_on_ctranslate2s_translations(
    trained_checkpoint, sources, cache
):
    """Both engines compute them the same way: the torch model forced on the translation."""
    torch_tr = load(trained_checkpoint, cache, "torch")
    ct2_tr = load(trained_checkpoint, cache, "ctranslate2")
    expected = torch_tr.translate_nbest(sources[:8], 2, alignment=True, attention=True)
    got = ct2_tr.translate_nbest(sources[:8], 2, alignment=True, attention=True)
    for ts, us in zip(expected, got, strict=True):
        for t, u in zip(ts, us, strict=True):
            assert (u.text, u.alignment) == (t.text, t.alignment)
            assert (u.attention.source, u.attention.target) == (
                t.attention.source,
                t.attention.target,
            )
            assert np.allclose(u.attention.weights, t.attention.weights, atol=1e-6)


def test_an_unknown_engine_is_one_line(trained_checkpoint, cache):
    with pytest.raises(
        NmtError, match=r"cache_dir= must be a path \(str or os.PathLike\), got int"
    ):
        Translator.load(trained_checkpoint, engine="ctranslate2", cache_dir=5)
    with pytest.raises(
        NmtError, match=r"engine= must be one of 'auto', 'torch', 'ctranslate2', got 'ct2'"
    ):
        load(trained_checkpoint, cache, "ct2")


def test_the_command_translates_with_ctranslate2_as_with_torch(
    trained_checkpoint, sources, tmp_path, cache
):
    source = tmp_path / "source.en"
    source.write_text("\n".join(sources) + "\n")
    outputs = {}
    for name in ("torch", "ctranslate2"):
        command = [sys.executable, "-m", "nmt", "translate", "-c", str(trained_checkpoint)]
        command += ["--engine", name, "--cache-dir", str(cache), "-i", str(source), "--scores"]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert f"engine {name}" in run.stderr or name == "torch"
        outputs[name] = [line.split("\t") for line in run.stdout.splitlines()]
    assert [t for _, t in outputs["ctranslate2"]] == [t for _, t in outputs["torch"]]
    for (a, _), (b, _) in zip(outputs["ctranslate2"], outputs["torch"]):
        assert float(a) == pytest.approx(float(b), rel=3e-3, abs=1e-4)


# ------------------------------------------------------------------ the cache


def entries(cache: Path) -> list[Path]:
    folder = cache / "ctranslate2"
    return sorted(p for p in folder.iterdir()) if folder.is_dir() else []


def test_a_checkpoint_is_converted_once_and_a_changed_one_again(
    trained_checkpoint, tmp_path, cache, monkeypatch
):
    calls = []
    real_export = engine.export
    monkeypatch.setattr(engine, "export", lambda *a, **k: calls.append(a) or real_export(*a, **k))
    first = engine.converted(trained_checkpoint, cache)
    assert engine.converted(trained_checkpoint, cache) == first
    assert len(calls) == 1 and entries(cache) == [first]
    marker = json.loads((first / engine.MARKER).read_text())
    assert (
        marker["checkpoint_sha256"] in first.name or first.name[:32] in marker["checkpoint_sha256"]
    )
    changed = tmp_path / "changed.pt"
    changed.write_bytes(trained_checkpoint.read_bytes() + b"\0")  # another content, same model
    other = engine.converted(changed, cache)
    assert other != first and len(calls) == 2
    assert set(entries(cache)) == {first, other}


@pytest.mark.parametrize("damage", ["no marker", "corrupt weights", "foreign marker", "partial"])
def test_a_damaged_entry_is_rebuilt_never_used(trained_checkpoint, cache, damage, monkeypatch):
    entry = engine.converted(trained_checkpoint, cache)
    good = (entry / "model.bin").read_bytes()
    if damage == "no marker":
        (entry / engine.MARKER).unlink()
    elif damage == "corrupt weights":
        (entry / "model.bin").write_bytes(good[: len(good) // 2] + b"\xff" * (len(good) // 2))
    elif damage == "foreign marker":
        marker = json.loads((entry / engine.MARKER).read_text())
        marker["checkpoint_sha256"] = "0" * 64
        (entry / engine.MARKER).write_text(json.dumps(marker))
    else:  # a conversion killed halfway: its folder, never renamed into place, is left over
        shutil.rmtree(entry)
        # a dead writer's temporary: pid 2**22 + 1 is above Linux's largest pid
        (cache / "ctranslate2" / f".{entry.name}.tmp-{2**22 + 1}-0abc").mkdir()
    calls = []
    real_export = engine.export
    monkeypatch.setattr(engine, "export", lambda *a, **k: calls.append(a) or real_export(*a, **k))
    again = engine.converted(trained_checkpoint, cache)
    assert again == entry and len(calls) == 1
    assert (again / "model.bin").read_bytes() == good
    assert entries(cache) == [entry]  # nothing left beside it
    assert engine._complete(
        again, json.loads((again / engine.MARKER).read_text())["checkpoint_sha256"]
    )


def test_two_processes_converting_at_once_both_end_with_one_good_entry(trained_checkpoint, cache):
    code = (
        "import sys; from pathlib import Path; from nmt.engine import converted; "
        "print(converted(Path(sys.argv[1]), Path(sys.argv[2])))"
    )
    command = [sys.executable, "-c", code, str(trained_checkpoint), str(cache)]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    paths = {run.communicate(timeout=300)[0].strip() for run in runs}
    assert all(run.returncode == 0 for run in runs)
    assert len(paths) == 1
    entry = Path(paths.pop())
    assert entries(cache) == [entry]
    checkpoint_hash = json.loads((entry / engine.MARKER).read_text())["checkpoint_sha256"]
    assert engine._complete(entry, checkpoint_hash)


def test_a_cache_that_cannot_be_written_falls_back_to_a_temporary_folder(
    trained_checkpoint, sources, tmp_path, caplog
):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    caplog.set_level(logging.WARNING, logger="nmt.engine")
    tr = load(trained_checkpoint, blocked / "cache", "ctranslate2")
    assert "cannot write the CTranslate2 cache" in caplog.text
    torch_tr = load(trained_checkpoint, blocked / "cache", "torch")
    assert tr.translate(sources[:3]) == torch_tr.translate(sources[:3])
    assert blocked.read_text() == "not a folder"


def test_a_full_cache_falls_back_to_a_temporary_folder(
    trained_checkpoint, cache, caplog, monkeypatch
):
    real_export = engine.export

    def full(checkpoint, out, **kwargs):
        if str(cache) in str(out):
            raise OSError(28, "No space left on device")
        return real_export(checkpoint, out, **kwargs)

    monkeypatch.setattr(engine, "export", full)
    caplog.set_level(logging.WARNING, logger="nmt.engine")
    folder = engine.converted(trained_checkpoint, cache)
    assert "No space left on device" in caplog.text
    assert str(cache) not in str(folder) and (folder / "model.bin").is_file()
    assert not [p for p in (cache / "ctranslate2").iterdir()]  # nothing half-written is left


# ------------------------------------------------------------------ nmt serve


def test_the_server_decodes_with_ctranslate2_and_answers_as_offline(
    trained_checkpoint, sources, cache
):
    pytest.importorskip("starlette", reason="nmt serve's extra is not installed")
    pytest.importorskip("uvicorn", reason="nmt serve's extra is not installed")
    from concurrent.futures import ThreadPoolExecutor

    from serving import Server

    expected = load(trained_checkpoint, cache, "torch").translate(sources[:24])
    args = ["--model", f"en-de={trained_checkpoint}", "--engine", "ctranslate2"]
    server = Server(*args, "--cache-dir", str(cache))
    try:
        status, answer, _ = server.post("/v1/translate", {"texts": sources[:24]})
        assert status == 200
        assert [t["text"] for t in answer["translations"]] == expected
        form = {"q": sources[:3], "source": "en", "target": "de"}
        status, answer, _ = server.post("/translate", form)
        assert status == 200 and answer["translatedText"] == expected[:3]

        def client(i: int) -> str:
            status, answer, _ = server.post("/v1/translate", {"texts": [sources[i]]})
            assert status == 200, answer
            return answer["translations"][0]["text"]

        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(client, range(24))) == expected
        status, answer, _ = server.post(
            "/v1/translate", {"texts": [sources[0]], "lenpen_style": "gnmt"}
        )
        assert status == 400 and "cannot honour lenpen_style gnmt" in answer["error"]
    finally:
        _, err = server.stop()
    assert "engine ctranslate2" in err


def test_texts_split_into_sentences_translate_as_on_torch(trained_checkpoint, sources, cache):
    pytest.importorskip("sentencex", reason="nmt[split] is not installed")
    texts = [" ".join(sources[i : i + 3]) for i in range(0, 12, 3)]
    texts.append(sources[0] + "\n\n" + sources[1])
    expected = load(trained_checkpoint, cache, "torch").translate(texts, split=True)
    assert load(trained_checkpoint, cache, "ctranslate2").translate(texts, split=True) == expected


def test_the_engine_never_produces_pad_or_bos(random_checkpoint, sources, cache):
    """torch's search never produces <pad> or <s>; nor does CTranslate2's, which only blocks
    <unk> of itself. A random model gives every token its chance at every step."""
    tr = load(random_checkpoint, cache, "ctranslate2", beam=4, max_len_a=0.0, max_len_b=40)
    specials = tr.loaded.tokenizer.specials
    hyps = tr.engine.translate(tr.encode(sources, None), tr.decode, 4, 256, "the model")
    produced = {t for hs in hyps for h in hs for t in h.tokens}
    assert len(produced) > 5
    assert not produced & {specials.pad, specials.bos, specials.unk}


def test_sentences_of_other_limits_decoded_together_are_decoded_as_alone(
    trained_checkpoint, sources, cache
):
    """One call decodes its sentences under the longest limit among them, then again under its
    own limit each sentence whose search got that far: batched equals one by one, and no
    output is longer than its own limit."""
    tr = load(trained_checkpoint, cache, "ctranslate2", beam=3, max_len_a=0.5, max_len_b=2)
    seqs = tr.encode(sources[:24], None)
    together = tr.engine.translate(seqs, tr.decode, 2, 256, "the model")
    limits = [int(0.5 * (len(s) + 1) + 2) for s in seqs]
    assert len(set(limits)) > 3
    assert all(len(h.tokens) <= limit for hs, limit in zip(together, limits) for h in hs)
    assert any(len(hs[0].tokens) == limit for hs, limit in zip(together, limits))
    for seq, hs in zip(seqs, together):
        [alone] = tr.engine.translate([seq], tr.decode, 2, 256, "the model")
        assert [h.tokens for h in alone] == [h.tokens for h in hs]
        assert [h.score for h in alone] == pytest.approx([h.score for h in hs], abs=1e-5)
