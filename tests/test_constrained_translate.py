"""Lexical constraints through the interfaces (issue 27): `nmt translate --json-input`,
`--terminology`, and `Translator.translate` / `translate_nbest` arguments, on a trained tiny
model (`trained_checkpoint`): what is asked appears, what is avoided does not, the line
contract holds, batching and workers change nothing, and bad input is one line naming the
file and line."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from helpers import nmt_here

from nmt import Translator
from nmt.errors import NmtError

pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(scope="module")
def lines(raw_corpus) -> list[str]:
    return raw_corpus.lines("test", "en")[:12]


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> Translator:
    return Translator.load(trained_checkpoint, beam=4, threads=1)


@pytest.fixture(scope="module")
def plain(translator, lines) -> list[str]:
    return translator.translate(lines)


def words_not_in(output: str, candidates: list[str]) -> list[str]:
    return [w for w in candidates if w not in output.split()]


def test_constraints_appear_avoided_words_do_not_and_the_prefix_starts(translator, lines, plain, raw_corpus):
    """For each line: a reference word the plain output lacks is asked for and appears; the
    plain output's first word is avoided and disappears; a prefix starts the output."""
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    wanted = [(words_not_in(p, [w for w in r.split() if w.isalpha()]) or ["Hund"])[0] for p, r in zip(plain, refs)]
    out = translator.translate(lines, constraints=[[w] for w in wanted])
    assert all(w in o for w, o in zip(wanted, out)), list(zip(wanted, out))
    firsts = [p.split()[0] for p in plain]
    avoided = translator.translate(lines, avoid=[[w] for w in firsts])
    assert all(f not in a.split() for f, a in zip(firsts, avoided)), list(zip(firsts, avoided))
    prefixed = translator.translate(lines, prefix=["Zwei Männer"] * len(lines))
    assert all(p.startswith("Zwei Männer") for p in prefixed), prefixed


def test_without_constraints_nothing_changes(translator, lines, plain):
    assert translator.translate(lines, constraints=[[] for _ in lines]) == plain
    assert translator.translate(lines, avoid=[[] for _ in lines], prefix=[""] * len(lines)) == plain


def test_random_constraints_always_appear_and_batching_changes_nothing(trained_checkpoint, translator, lines,
                                                                        raw_corpus):
    """A property over random constraints (1-3 words from the references, any order): each
    appears in the output, and the batch of all lines equals each line alone and --workers 2."""
    rng = random.Random(5)
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    asks = [rng.sample(r.split(), k=min(len(r.split()), rng.randint(1, 3))) for r in refs]
    together = translator.translate_nbest(lines, 2, constraints=asks)
    for text, ask, hyps in zip(lines, asks, together):
        assert all(phrase in hyps[0].text for phrase in ask), (ask, hyps[0].text)
        alone = translator.translate_nbest([text], 2, constraints=[ask])[0]
        assert [h.text for h in alone] == [h.text for h in hyps]  # scores: padding moves the last bits
        assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], rel=1e-5)
    workers = Translator.load(trained_checkpoint, beam=4, threads=2, workers=2)
    assert workers.translate(lines, constraints=asks) == [h[0].text for h in together]


def test_json_input_keeps_one_line_out_per_line_in(trained_checkpoint, translator, lines, tmp_path):
    requests = [{"text": lines[0], "constraints": ["Hund"]}, {"text": ""}, {"text": lines[1], "avoid": ["Ein"]},
                {"text": lines[2], "prefix": "Zwei", "constraints": ["Park", "Hund"], "ordered": True},
                {"text": lines[3]}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests))
    out = tmp_path / "out.de"
    assert nmt_here("translate", "-c", str(trained_checkpoint), "-i", str(src), "-o", str(out), "--json-input",
                    "--beam", "4") == 0
    got = out.read_text().split("\n")
    assert len(got) == len(requests) + 1 and got[-1] == "" and got[1] == ""
    api = translator.translate([r["text"] for r in requests], constraints=[r.get("constraints", []) for r in requests],
                               avoid=[r.get("avoid", []) for r in requests],
                               prefix=[r.get("prefix", "") for r in requests],
                               ordered=[r.get("ordered", False) for r in requests])
    assert got[:-1] == api
    assert "Hund" in got[0] and got[3].startswith("Zwei") and got[3].index("Park") < got[3].rindex("Hund")
    assert got[4] == translator.translate([lines[3]])[0]


def test_terminology_adds_constraints_and_reports(trained_checkpoint, lines, raw_corpus, tmp_path, capsys):
    """Two source words of the test lines mapped to reference words: where a source word
    occurs as a word, its target term is in the translation; the summary on stderr counts
    the lines with terms and the terms met."""
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    pairs = []
    for line, ref in zip(lines, refs):
        src_word = next(w for w in line.split() if w.isalpha() and len(w) >= 3)
        tgt_word = next(w for w in reversed(ref.split()) if w.isalpha() and len(w) >= 3)
        if all(src_word.lower() != s.lower() for s, _ in pairs):
            pairs.append((src_word, tgt_word))
        if len(pairs) == 2:
            break
    terms = tmp_path / "terms.tsv"
    terms.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.de"
    assert nmt_here("translate", "-c", str(trained_checkpoint), "-i", str(src), "-o", str(out),
                    "--terminology", str(terms), "--beam", "4") == 0
    got = out.read_text().split("\n")[:-1]
    asked = [[t for s, t in pairs if s.lower() in [w.lower() for w in re.findall(r"\w+", line)]] for line in lines]
    for want, output in zip(asked, got):
        assert all(t in output for t in want), (want, output)
    n_lines, n_terms = sum(map(bool, asked)), sum(map(len, asked))
    summary = [line for line in capsys.readouterr().err.splitlines() if "terminology:" in line]
    assert summary and summary[-1].endswith(f"terminology: {n_lines} lines had terms; {n_terms} of their "
                                            f"{n_terms} terms are in the translations"), summary


@pytest.mark.parametrize("content, message", [
    ('{"text": "A dog."}\n{"text": "x", "constraints": [""]}\n', 'in.jsonl:2: "constraints"[0] is empty'),
    ('{"text": "A dog."}\n\n{oops\n', "in.jsonl:3: not a JSON object"),
    ('{"text": "A dog.", "constraints": ["' + "Hund " * 40 + '"]}\n', "in.jsonl:1: the constraint"),
])
def test_bad_json_input_is_one_line_naming_the_line(trained_checkpoint, tmp_path, capsys, content, message):
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    out = tmp_path / "out.de"
    assert nmt_here("translate", "-c", str(trained_checkpoint), "-i", str(src), "-o", str(out), "--json-input") == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("nmt: error: ") and message in err[0], err
    assert not out.exists()


def test_constraints_and_sampling_are_refused(trained_checkpoint, tmp_path, capsys):
    sampler = Translator.load(trained_checkpoint, sampling=True)
    with pytest.raises(NmtError, match="texts\\[0\\]: lexical constraints need beam search"):
        sampler.translate(["A dog."], constraints=[["Hund"]])
    terms = tmp_path / "t.tsv"
    terms.write_text("dog\tHund\n")
    src = tmp_path / "in.en"
    src.write_text("A dog.\n")
    assert nmt_here("translate", "-c", str(trained_checkpoint), "-i", str(src), "--sampling",
                    "--terminology", str(terms)) == 1
    assert "lexical constraints need beam search" in capsys.readouterr().err


def test_api_arguments_are_checked(translator):
    with pytest.raises(NmtError, match="constraints must be a list with one entry per text"):
        translator.translate(["a", "b"], constraints=[["x"]])
    with pytest.raises(NmtError, match="constraints\\[0\\] must be a non-empty string"):
        translator.translate(["a"], constraints=[[" "]])
    with pytest.raises(NmtError, match="ordered must be True, False or a list"):
        translator.translate(["a"], constraints=[["x"]], ordered="yes")


def test_a_terminology_file_error_names_the_line(trained_checkpoint, tmp_path, capsys):
    terms = Path(tmp_path / "t.tsv")
    terms.write_text("dog\tHund\ncat\n")
    src = tmp_path / "in.en"
    src.write_text("A dog.\n")
    assert nmt_here("translate", "-c", str(trained_checkpoint), "-i", str(src), "--terminology", str(terms)) == 1
    assert f"{terms}:2: expected 'source term<TAB>target term'" in capsys.readouterr().err


def test_constraints_with_shortlists_ensembles_int8_and_alignments(trained_checkpoint, prepared, lines, plain,
                                                                    raw_corpus, tmp_path):
    """The other decoding options keep working with constraints: a shortlist that lacks the
    asked word (its tokens join the sentence's list), an ensemble, int8, n-best with
    alignments; each output contains what was asked."""
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    wanted = [[(words_not_in(p, [w for w in r.split() if w.isalpha()]) or ["Hund"])[0]] for p, r in zip(plain, refs)]
    shortlist = tmp_path / "sl.pt"
    assert nmt_here("shortlist", str(prepared[0]), "-o", str(shortlist), "--top", "2", "--frequent", "5") == 0
    for options in ({"shortlist": str(shortlist)}, {"precision": "int8"}):
        out = Translator.load(trained_checkpoint, beam=4, threads=1, **options).translate(lines, constraints=wanted)
        assert all(w[0] in o for w, o in zip(wanted, out)), (options, list(zip(wanted, out)))
    ensemble = Translator.load([trained_checkpoint, trained_checkpoint], beam=4, threads=1)
    assert ensemble.translate(lines, constraints=wanted) == Translator.load(
        trained_checkpoint, beam=4, threads=1).translate(lines, constraints=wanted)
    nbest = Translator.load(trained_checkpoint, beam=4, threads=1).translate_nbest(
        lines, 3, constraints=wanted, alignment=True)
    for w, hyps in zip(wanted, nbest):  # (a hypothesis that ran out of room unmet ranks after those that met all)
        assert len(hyps) == 3 and w[0] in hyps[0].text and all(h.alignment for h in hyps)


def test_constraints_that_do_not_fit_together_warn_naming_the_text(trained_checkpoint, caplog):
    """Five words, each short enough, cannot all fit in 4 output tokens: the translation ends
    without some of them, and a warning names the text and how many were not met."""
    short = Translator.load(trained_checkpoint, beam=4, threads=1, max_len_a=0.0, max_len_b=6)
    tok = short.loaded.tokenizer
    asks = [w for w in ["Hund", "Katze", "Vogel", "Pferd", "Haus", "Mann", "Frau", "Kind"]
            if len(tok.encode_target(w)) <= 6][:5]
    assert len(asks) == 5 and sum(len(tok.encode_target(w)) for w in asks) > 6
    with caplog.at_level("WARNING"):
        out = short.translate(["A dog.", "A cat."], constraints=[asks, []])
    assert len(out) == 2 and out[1] == short.translate(["A cat."])[0]
    warnings = [r.getMessage() for r in caplog.records if "constraints not met" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("texts[0]: ") and "of 5 constraints" in warnings[0]
    assert sum(a in out[0] for a in asks) < len(asks)


def test_json_input_streams_line_by_line_with_the_same_output(trained_checkpoint, lines, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t, "constraints": ["Hund"]}) + "\n" for t in lines[:4]) + "\n")
    outs = []
    for extra in ([], ["--buffer-lines", "1"]):
        out = tmp_path / f"out{len(extra)}"
        assert nmt_here("translate", "-c", str(trained_checkpoint), "-i", str(src), "-o", str(out), "--json-input",
                        *extra) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1] and len(outs[0].split("\n")) == 6
