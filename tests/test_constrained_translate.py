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
from helpers import assert_one_line, nmt_here, save_random_model

from nmt import Translator
from nmt.checkpoint import atomic_save, load_checkpoint
from nmt.errors import NmtError
from nmt.terminology import Request
from nmt.tokenizer import Tokenizer, VocabTokenizer

pytestmark = pytest.mark.usefixtures("isolated")


def imported_style(checkpoint: Path, dest: Path, languages: tuple[str, ...] = ()) -> Path:
    """`checkpoint` with its vocabulary as an imported (OPUS-MT) model has it: a VocabTokenizer
    over the same sentencepiece model and ids, but without byte pieces (a character outside
    the vocabulary is <unk>); their ids hold the language tokens `languages`, then unused pieces."""
    state = load_checkpoint(checkpoint)
    tok = Tokenizer.from_bytes(state["tokenizer"]["model"])
    spare = iter([*languages, *(f"<unused{i}>" for i in range(tok.vocab_size))])
    pieces = [
        next(spare) if re.fullmatch(r"<0x[0-9A-F]{2}>", p) else p
        for p in map(tok.piece, range(tok.vocab_size))
    ]
    vocab = VocabTokenizer(
        tok.model_bytes, tok.model_bytes, pieces, tok.specials, name="imported-style"
    )
    atomic_save({**state, "tokenizer": {"model": vocab.model_bytes, "sha256": vocab.sha256}}, dest)
    return dest


@pytest.fixture(scope="module")
def imported(trained_checkpoint, tmp_path_factory) -> Translator:
    return Translator.load(
        imported_style(trained_checkpoint, tmp_path_factory.mktemp("imp") / "a.pt"),
        beam=4,
        threads=1,
    )


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


def test_constraints_appear_avoided_words_do_not_and_the_prefix_starts(
    translator, lines, plain, raw_corpus
):
    """For each line: a reference word the plain output lacks is asked for and appears; the
    plain output's first word is avoided and disappears; a prefix starts the output."""
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    wanted = [
        (words_not_in(p, [w for w in r.split() if w.isalpha()]) or ["Hund"])[0]
        for p, r in zip(plain, refs)
    ]
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


def test_random_constraints_always_appear_and_batching_changes_nothing(
    trained_checkpoint, translator, lines, raw_corpus
):
    """A property over random constraints (1-3 words from the references, any order): each
    appears in the output, and the batch of all lines equals each line alone and --workers 2."""
    rng = random.Random(5)
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    asks = [rng.sample(r.split(), k=min(len(r.split()), rng.randint(1, 3))) for r in refs]
    together = translator.translate_nbest(lines, 2, constraints=asks)
    for text, ask, hyps in zip(lines, asks, together):
        assert all(phrase in hyps[0].text for phrase in ask), (ask, hyps[0].text)
        alone = translator.translate_nbest([text], 2, constraints=[ask])[0]
        assert [h.text for h in alone] == [
            h.text for h in hyps
        ]  # scores: padding moves the last bits
        assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], rel=1e-5)
    workers = Translator.load(trained_checkpoint, beam=4, threads=2, workers=2)
    assert workers.translate(lines, constraints=asks) == [h[0].text for h in together]


def test_json_input_keeps_one_line_out_per_line_in(trained_checkpoint, translator, lines, tmp_path):
    requests = [
        {"text": lines[0], "constraints": ["Hund"]},
        {"text": ""},
        {"text": lines[1], "avoid": ["Ein"]},
        {"text": lines[2], "prefix": "Zwei", "constraints": ["Park", "Hund"], "ordered": True},
        {"text": lines[3]},
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests))
    out = tmp_path / "out.de"
    assert (
        nmt_here(
            "translate",
            "-c",
            str(trained_checkpoint),
            "-i",
            str(src),
            "-o",
            str(out),
            "--json-input",
            "--beam",
            "4",
        )
        == 0
    )
    got = out.read_text().split("\n")
    assert len(got) == len(requests) + 1 and got[-1] == "" and got[1] == ""
    api = translator.translate(
        [r["text"] for r in requests],
        constraints=[r.get("constraints", []) for r in requests],
        avoid=[r.get("avoid", []) for r in requests],
        prefix=[r.get("prefix", "") for r in requests],
        ordered=[r.get("ordered", False) for r in requests],
    )
    assert got[:-1] == api
    assert (
        "Hund" in got[0]
        and got[3].startswith("Zwei")
        and got[3].index("Park") < got[3].rindex("Hund")
    )
    assert got[4] == translator.translate([lines[3]])[0]
    # issue 34: the command carries each line's Request whole; so may a program
    assert translator.translate([Request(**r) for r in requests]) == api
    with pytest.raises(
        NmtError, match=r"^translate: texts\[0\] is a Request: ask its constraints in it"
    ):
        translator.translate([Request(lines[0])], constraints=[["Hund"]])


def test_terminology_adds_constraints_and_reports(
    trained_checkpoint, lines, raw_corpus, tmp_path, capsys
):
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
    assert (
        nmt_here(
            "translate",
            "-c",
            str(trained_checkpoint),
            "-i",
            str(src),
            "-o",
            str(out),
            "--terminology",
            str(terms),
            "--beam",
            "4",
        )
        == 0
    )
    got = out.read_text().split("\n")[:-1]
    asked = [
        [t for s, t in pairs if s.lower() in [w.lower() for w in re.findall(r"\w+", line)]]
        for line in lines
    ]
    for want, output in zip(asked, got):
        assert all(t in output for t in want), (want, output)
    n_lines, n_terms = sum(map(bool, asked)), sum(map(len, asked))
    summary = [line for line in capsys.readouterr().err.splitlines() if "terminology:" in line]
    assert summary and summary[-1].endswith(
        f"terminology: {n_lines} lines had terms; {n_terms} of their {n_terms} terms are in the "
        "translations"
    ), summary


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"text": "A dog."}\n{"text": "x", "constraints": [""]}\n',
            'in.jsonl:2: "constraints"[0] is empty',
        ),
        ('{"text": "A dog."}\n\n{oops\n', "in.jsonl:3: not a JSON object"),
        (
            '{"text": "A dog.", "constraints": ["' + "Hund " * 40 + '"]}\n',
            "in.jsonl:1: the constraint",
        ),
        # issue 33: what can never fit; JSON nested too deep for Python's parser; nothing left once
        # normalized
        (
            '{"text": "A dog."}\n'
            + json.dumps({"text": "A dog.", "constraints": [f"Wort{i}" for i in range(300)]})
            + "\n",
            "in.jsonl:2: the 300 constraints need at least",
        ),
        (
            '{"text": "A dog."}\n' + "[" * 100_000 + "]" * 100_000 + "\n",
            "in.jsonl:2: not a request (JSON nested too",
        ),
        (
            '{"text": "A dog.", "avoid": ["\\u200b\\u200c"]}\n',
            "in.jsonl:1: the avoided '\\u200b\\u200c' is empty once",
        ),
        (
            '{"text": "A dog.", "prefix": "Ein Hund", "avoid": ["Hund"]}\n',
            "in.jsonl:1: the prefix 'Ein Hund' holds the",
        ),
    ],
)
def test_bad_json_input_is_one_line_naming_the_line(
    trained_checkpoint, tmp_path, capsys, content, message
):
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    out = tmp_path / "out.de"
    code = nmt_here(
        "translate", "-c", str(trained_checkpoint), "-i", str(src), "-o", str(out), "--json-input"
    )
    assert_one_line(code, capsys.readouterr().err, "nmt: error: ", message)
    assert not out.exists()


def test_constraints_and_sampling_are_refused(trained_checkpoint, tmp_path, capsys):
    sampler = Translator.load(trained_checkpoint, sampling=True)
    with pytest.raises(NmtError, match="texts\\[0\\]: lexical constraints need beam search"):
        sampler.translate(["A dog."], constraints=[["Hund"]])
    terms = tmp_path / "t.tsv"
    terms.write_text("dog\tHund\n")
    src = tmp_path / "in.en"
    src.write_text("A dog.\n")
    assert (
        nmt_here(
            "translate",
            "-c",
            str(trained_checkpoint),
            "-i",
            str(src),
            "--sampling",
            "--terminology",
            str(terms),
        )
        == 1
    )
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
    assert (
        nmt_here(
            "translate", "-c", str(trained_checkpoint), "-i", str(src), "--terminology", str(terms)
        )
        == 1
    )
    assert f"{terms}:2: expected 'source term<TAB>target term'" in capsys.readouterr().err


def test_constraints_with_shortlists_ensembles_int8_and_alignments(
    trained_checkpoint, prepared, lines, plain, raw_corpus, tmp_path
):
    """The other decoding options keep working with constraints: a shortlist that lacks the
    asked word (its tokens join the sentence's list), an ensemble, int8, n-best with
    alignments; each output contains what was asked."""
    refs = raw_corpus.lines("test", "de")[: len(lines)]
    wanted = [
        [(words_not_in(p, [w for w in r.split() if w.isalpha()]) or ["Hund"])[0]]
        for p, r in zip(plain, refs)
    ]
    shortlist = tmp_path / "sl.pt"
    assert (
        nmt_here(
            "shortlist", str(prepared[0]), "-o", str(shortlist), "--top", "2", "--frequent", "5"
        )
        == 0
    )
    for options in ({"shortlist": str(shortlist)}, {"precision": "int8"}):
        tr = Translator.load(trained_checkpoint, beam=4, threads=1, **options)
        out = tr.translate(lines, constraints=wanted)
        assert all(w[0] in o for w, o in zip(wanted, out)), (options, list(zip(wanted, out)))
        # avoided texts too: over a shortlist, the search's columns are mapped back to the tokens'
        # text
        avoided = written(out)
        assert not [
            o
            for o in tr.translate(lines, avoid=[avoided] * len(lines))
            if any(a in o for a in avoided)
        ]
    ensemble = Translator.load([trained_checkpoint, trained_checkpoint], beam=4, threads=1)
    assert ensemble.translate(lines, constraints=wanted) == Translator.load(
        trained_checkpoint, beam=4, threads=1
    ).translate(lines, constraints=wanted)
    nbest = Translator.load(trained_checkpoint, beam=4, threads=1).translate_nbest(
        lines, 3, constraints=wanted, alignment=True
    )
    for w, hyps in zip(
        wanted, nbest
    ):  # (a hypothesis that ran out of room unmet ranks after those that met all)
        assert len(hyps) == 3 and w[0] in hyps[0].text and all(h.alignment for h in hyps)


def test_constraints_that_do_not_fit_together_warn_naming_the_text(trained_checkpoint, caplog):
    """Two words, each a token, three times each: 3 + 3 tokens that cannot overlap, in 5 output
    tokens. Nothing says in advance that they cannot fit (they use 2 distinct tokens, 2 phrases
    of 3 need 4), so the translation ends without one, and a warning names the text, how many
    were not met and why."""
    # constraints decode with torch: the text without them too, where the length limit is reached
    short = Translator.load(
        trained_checkpoint, beam=4, threads=1, max_len_a=0.0, max_len_b=5, engine="torch"
    )
    tok = short.loaded.tokenizer
    words = [
        p[1:]
        for p in map(tok.piece, range(tok.vocab_size))
        if p[1:].isalpha() and len(p) > 3 and len(tok.encode_target(p[1:])) == 1
    ][:2]
    asks = [" ".join([w] * 3) for w in words]
    assert len(words) == 2 and all(len(tok.encode_target(a)) == 3 for a in asks)
    with caplog.at_level("WARNING"):
        out = short.translate(["A dog.", "A cat."], constraints=[asks, []])
    assert len(out) == 2 and out[1] == short.translate(["A cat."])[0]
    warnings = [r.getMessage() for r in caplog.records if "constraints not met" in r.getMessage()]
    assert warnings == ["texts[0]: 1 of 2 constraints not met: 1 not within the length limit"]
    assert sum(a in out[0] for a in asks) == 1


def test_constraints_that_can_never_fit_are_refused_naming_the_text(translator):
    """Hundreds of one-word constraints for a translation of at most a few tokens (2,000 took
    1.5 GB and 48 s before they were refused): refused at once, naming the text; an ordered
    list whose tokens add up past the limit too."""
    words = [f"Wort{i}" for i in range(2000)]
    with pytest.raises(
        NmtError, match=r"^texts\[1\]: the 2000 constraints need at least \d+ tokens, more than the"
    ):
        translator.translate(["A cat.", "A dog."], constraints=[[], words])
    with pytest.raises(NmtError, match=r"^texts\[0\]: the 20 constraints need at least"):
        translator.translate(["A dog."], constraints=[["Hund"] * 20], ordered=True)
    assert translator.translate(
        ["A dog."], constraints=[["Hund"] * 20]
    )  # unordered, one occurrence meets all


def test_terms_that_cannot_all_fit_go_unmet_with_a_warning(trained_checkpoint, tmp_path, caplog):
    """A terminology's terms are not the line's own request: a line with more terms than its
    translation can hold is translated, with a warning, not refused (one line would stop a run)."""
    terms = tmp_path / "terms.tsv"
    terms.write_text("".join(f"w{i}\tWort{i}\n" for i in range(30)))
    tr = Translator.load(trained_checkpoint, beam=4, threads=1, terminology=str(terms))
    with caplog.at_level("WARNING"):
        out = tr.translate([" ".join(f"w{i}" for i in range(30))])
    assert out[0] and any("constraints not met" in r.getMessage() for r in caplog.records)


def written(texts: list[str]) -> list[str]:
    """Phrases in `texts`: punctuation and letters, a word, pieces of words (inside, at the end),
    a phrase across two words: the model writes each of them with pieces of its own choosing."""
    words = sorted({w.strip(".,") for t in texts for w in t.split() if len(w.strip(".,")) >= 5})
    pairs = sorted(
        {" ".join(t.split()[i : i + 2])[2:-2] for t in texts for i in range(len(t.split()) - 1)}
    )
    derived = [words[0], words[len(words) // 2][1:3], words[-1][-3:], pairs[len(pairs) // 2]]
    return [p for p in (".", ",", "e", "ß") if any(p in t for t in texts)] + derived


@pytest.mark.parametrize("kind", ["sentencepiece", "imported"])
def test_avoided_phrases_never_appear_in_the_text(kind, translator, imported, lines):
    """A property over phrases the model writes unasked (`written`) and both tokenizer kinds:
    no translation of the n-best holds an avoided phrase, inside a word or not."""
    tr = translator if kind == "sentencepiece" else imported
    phrases = written([h.text for hs in tr.translate_nbest(lines[:8], 4) for h in hs])
    assert len(phrases) >= 6
    for phrase in phrases:
        hyps = tr.translate_nbest(lines[:8], 4, avoid=[[phrase]] * 8)
        assert all(hs for hs in hyps)
        assert not [h.text for hs in hyps for h in hs if phrase in h.text], phrase
    # as text: whitespace runs are one space, none at the ends
    assert all(
        phrases[-1] not in t for t in tr.translate(lines[:8], avoid=[[f" {phrases[-1]}  "]] * 8)
    )


def test_a_decoded_text_is_its_tokens_surfaces(translator, imported):
    """What the search matches avoided text against (`Tokenizer.surfaces`) is what decode
    writes, for random token sequences of both tokenizer kinds (byte pieces aside: sentencepiece
    writes one U+FFFD a bad byte)."""
    rng = random.Random(0)
    for tok in (translator.loaded.tokenizer, imported.loaded.tokenizer):
        surfaces = tok.surfaces()
        for _ in range(500):
            ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 8))]
            text = b"".join(surfaces[i] for i in ids).decode(errors="replace")
            assert tok.decode(ids).strip() == text.strip() or "\ufffd" in text, ids


def test_an_avoided_phrase_the_search_cannot_see_is_warned_about(test_tokenizer, tmp_path, caplog):
    """A random model writes bytes that do not decode; the text shows U+FFFD where the tokens'
    bytes hold none. Avoiding it: a warning names each line whose translation holds it all the
    same, and only those."""
    tr = Translator.load(
        save_random_model(tmp_path / "r.pt", test_tokenizer, 1), threads=1, max_len_b=24
    )
    texts = ["A dog.", "Two men.", "A cat in the park.", "Hello"]
    with caplog.at_level("WARNING"):
        out = tr.translate(texts, avoid=[["\ufffd"]] * len(texts))
    warned = {
        r.getMessage().split(":")[0]
        for r in caplog.records
        if "the avoided '\ufffd' is in the" in r.getMessage()
    }
    assert warned == {f"texts[{i}]" for i, o in enumerate(out) if "\ufffd" in o} != set()


def test_a_prefix_that_holds_an_avoided_phrase_is_refused_and_one_with_unk_warns(
    translator, imported, caplog
):
    """A prefix is forced: one that holds an avoided phrase (as text, also inside a word) asks
    for the impossible, naming the text; one with pieces the vocabulary lacks is forced as
    <unk>, with a warning naming the text."""
    for prefix in ("Ein Hund", "Die Hunde"):
        with pytest.raises(
            NmtError, match=rf"^texts\[1\]: the prefix '{prefix}' holds the avoided 'Hund'"
        ):
            translator.translate(["A cat.", "A dog."], prefix=["", prefix], avoid=[[], ["Hund"]])
    with caplog.at_level("WARNING"):
        out = imported.translate(["A dog.", "A cat."], prefix=["", "Ωmega"])
    warnings = [r.getMessage() for r in caplog.records if "prefix" in r.getMessage()]
    assert warnings == [
        "texts[1]: the prefix 'Ωmega' has pieces the model's vocabulary lacks: forced as <unk>"
    ]
    assert out[1].startswith("\u2047")


def test_an_unmet_constraint_says_why(translator, imported, caplog):
    """The warning names the reason: pieces the vocabulary lacks (the search never writes <unk>),
    an avoided phrase inside the phrase; otherwise the length limit."""
    word = max(imported.translate(["A dog."])[0].split(), key=len)  # one it can write
    with caplog.at_level("WARNING"):
        imported.translate(["A dog."], constraints=[[word, "Ωmega"]])
        translator.translate(["A dog."], constraints=[["Hunde"]], avoid=[["und"]])
    warnings = [r.getMessage() for r in caplog.records if "not met" in r.getMessage()]
    assert warnings == [
        "texts[0]: 1 of 2 constraints not met: 'Ωmega' has pieces the model's vocabulary lacks "
        "(<unk>)",
        "texts[0]: 1 of 1 constraints not met: 'Hunde' holds an avoided phrase",
    ]


@pytest.mark.parametrize(
    "kind, phrase",
    [
        ("constraints", "\u200b\u200c"),
        ("constraints", "\x01\x02"),
        ("avoid", "\u200b"),
        ("prefix", "\u200b"),
    ],
)
def test_a_phrase_with_nothing_left_once_normalized_is_one_error(translator, kind, phrase):
    value = phrase if kind == "prefix" else [phrase]
    with pytest.raises(NmtError, match=r"^texts\[0\]: the \w+ '.+' is empty once normalized"):
        translator.translate(["A dog."], **{kind: [value]})


def test_lone_surrogates_in_phrases_are_cleaned_as_texts_are(translator):
    """A phrase with a lone surrogate (undecodable bytes smuggled in) is cleaned as a text is:
    it is U+FFFD, as if given so."""
    asked = {"constraints": [["Hund\ud800"]], "avoid": [["Katze\udcff"]], "prefix": ["Ein\ud800"]}
    cleaned = {"constraints": [["Hund\ufffd"]], "avoid": [["Katze\ufffd"]], "prefix": ["Ein\ufffd"]}
    assert translator.translate(["A dog."], **asked) == translator.translate(["A dog."], **cleaned)


def test_an_unknown_language_token_warns_once_or_is_refused(
    trained_checkpoint, imported, tmp_path, caplog
):
    """A source starting with a >>xxx<< token the vocabulary lacks: where the model has no language
    tokens, it is read as <unk> with one warning a token; where it has some, refused naming the
    text and the close matches (as target_lang= is)."""
    with caplog.at_level("WARNING"):
        imported.translate([">>fra<< A dog.", ">>fra<< A cat.", ">>deu<< A man."])
    warnings = [
        r.getMessage() for r in caplog.records if "not a token of this model" in r.getMessage()
    ]
    assert [w.split(":")[0] + " " + w.split()[1] for w in warnings] == [
        "texts[0] >>fra<<",
        "texts[2] >>deu<<",
    ]
    multi = Translator.load(
        imported_style(trained_checkpoint, tmp_path / "m.pt", (">>fra<<", ">>deu<<")), threads=1
    )
    with pytest.raises(
        NmtError, match=r"^texts\[1\] fre: the model has no >>fre<< token \(did you mean fra"
    ):
        multi.translate(["A dog.", ">>fre<< A cat."])
    caplog.clear()
    with caplog.at_level("WARNING"):
        multi.translate([">>fra<< A dog."])
    assert not caplog.records


def test_json_input_streams_line_by_line_with_the_same_output(trained_checkpoint, lines, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"text": t, "constraints": ["Hund"]}) + "\n" for t in lines[:4]) + "\n"
    )
    outs = []
    for extra in ([], ["--buffer-lines", "1"]):
        out = tmp_path / f"out{len(extra)}"
        assert (
            nmt_here(
                "translate",
                "-c",
                str(trained_checkpoint),
                "-i",
                str(src),
                "-o",
                str(out),
                "--json-input",
                *extra,
            )
            == 0
        )
        outs.append(out.read_text())
    assert outs[0] == outs[1] and len(outs[0].split("\n")) == 6
