"""Paragraphs in, paragraphs out: a text cut into sentences (nmt.segment), each translated, and
the translations put back in the text's structure, through the API (`split=True`) and
`nmt translate --split-sentences`.

A text's sentences translated together give what each gives alone (batching changes nothing), so
a split translation is checked against the translations of its sentences one by one, with the
small trained model of conftest (a random one gives every sentence the same translation).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line, nmt_here, save_random_model

from nmt import Translator
from nmt.api import joined
from nmt.errors import NmtError
from nmt.segment import INSTALL, segment
from nmt.terminology import Request

pytest.importorskip("sentencex")
pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")  # conftest

STRUCTURED = (
    "  A dog runs.  Two men talk.\r\n\r\nA cat sleeps. \U0001f600\n\n\n#nmt https://x.org  "
)
SENTENCES = ["A dog runs.", "Two men talk.", "A cat sleeps."]


def fits_words(n: int):
    return lambda text: len(text.split()) <= n


def pieces(text: str, lang: str = "en", fits=lambda _: True) -> list[str]:
    return [text[a:b] for a, b in segment(text, lang, fits).spans]


# ------------------------------------------------------------------ segmentation


def test_lines_blank_lines_crlf_and_spaces_are_kept_as_sent():
    part = segment(STRUCTURED, "en", lambda _: True)
    assert [STRUCTURED[a:b] for a, b in part.spans] == SENTENCES
    assert not part.cut
    text, starts = part.joined(["<1>", "<2>", "<3>"])
    assert text == "  <1>  <2>\r\n\r\n<3> \U0001f600\n\n\n#nmt https://x.org  "
    assert [text[s : s + 3] for s in starts] == ["<1>", "<2>", "<3>"]
    assert part.joined(SENTENCES)[0] == STRUCTURED


@pytest.mark.parametrize(
    "text",
    [
        "\U0001f600\U0001f44d",
        "123 456",
        "...!?",
        "https://example.org/a?b=c",
        "@alice@example.social",
        "#FediBlock",
        "2024-05-01 12:00",
        "",
        " \r\n\t",
    ],
)
def test_a_text_with_nothing_to_translate_has_no_sentences(text):
    part = segment(text, "en", lambda _: True)
    assert part.spans == []
    assert part.joined([])[0] == text


def test_the_rules_of_the_source_language_and_the_fallback():
    text = "Am 3. Mai kam er. Dann ging er."
    assert pieces(text, "de") == ["Am 3. Mai kam er.", "Dann ging er."]
    assert pieces(text, "DE") == pieces(text, "de")
    # a language sentencex lacks, and a model without one: English rules
    assert pieces(text, "") == pieces(text, "xx") == ["Am 3.", "Mai kam er.", "Dann ging er."]


def test_a_sentence_too_long_is_cut_at_spaces_or_after_punctuation():
    text = "one two three, four five six seven eight nine ten eleven twelve."
    part = segment(text, "en", fits_words(5))
    assert part.cut
    assert [text[a:b] for a, b in part.spans] == [
        "one two three, four five",
        "six seven eight nine ten",
        "eleven twelve.",
    ]
    assert part.joined([text[a:b] for a, b in part.spans])[0] == text
    assert pieces("aaaa,bbbb,cccc", fits=lambda s: len(s) <= 12) == ["aaaa,bbbb,", "cccc"]


def test_a_word_too_long_is_cut_where_it_must():
    text = "x" * 25
    assert pieces(text, fits=lambda s: len(s) <= 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_without_sentencex_one_line_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencex", None)  # import sentencex raises ImportError
    with pytest.raises(NmtError, match="nmt\\[split\\]") as e:
        segment("A dog runs.", "en", lambda _: True)
    assert str(e.value) == INSTALL


# ------------------------------------------------------------------ the API


@pytest.fixture(scope="module")
def ckpt(trained_checkpoint) -> Path:
    return trained_checkpoint  # conftest: it translates different sentences differently


@pytest.fixture(scope="module")
def translator(ckpt) -> Translator:
    return Translator.load(ckpt, device="cpu")


def test_each_sentence_is_translated_as_alone_and_put_in_its_place(translator):
    alone = translator.translate(SENTENCES)
    assert len(set(alone)) == 3
    text = "A dog runs. Two men talk."
    got = translator.translate([text, STRUCTURED, "\U0001f600", "", "  "], split=True)
    assert got == [
        f"{alone[0]} {alone[1]}",
        f"  {alone[0]}  {alone[1]}\r\n\r\n{alone[2]} \U0001f600\n\n\n#nmt https://x.org  ",
        "\U0001f600",
        "",
        "",
    ]
    assert translator.translate([text]) != got[:1]  # whole, the text is one sentence


def test_nbest_of_one_sentence_and_the_best_of_several(translator):
    (alone,) = translator.translate_nbest(["A dog runs."], 3, alignment=True)
    (one,) = translator.translate_nbest([" A dog runs. "], 3, alignment=True, split=True)
    assert [(h.text, h.score, h.alignment) for h in one] == [
        (f" {h.text} ", h.score, h.alignment) for h in alone
    ]
    first, second = translator.translate_nbest(SENTENCES[:2], alignment=True, attention=True)
    (both,) = translator.translate_nbest(
        ["A dog runs. Two men talk."], 3, alignment=True, split=True
    )
    assert len(both) == 1
    assert both[0].text == f"{first[0].text} {second[0].text}"
    assert both[0].logprob == pytest.approx(first[0].logprob + second[0].logprob)
    assert both[0].score == pytest.approx(first[0].score + second[0].score)
    assert first[0].attention is not None
    source = len(first[0].attention.source) - 1
    target = len(first[0].attention.target) - 1
    assert both[0].alignment == [
        *first[0].alignment,
        *[(i + source, j + target) for i, j in second[0].alignment],
    ]


def test_a_text_too_long_for_the_model_is_translated_whole_in_pieces_with_a_warning(
    test_tokenizer, raw_corpus, tmp_path, caplog
):
    path = save_random_model(
        tmp_path / "short.pt", test_tokenizer, seed=2, model={"max_positions": 24}
    )
    tr = Translator.load(path, device="cpu")
    prose = " ".join(line.rstrip(".") for line in raw_corpus.lines("train", "en")[:20])
    assert len(tr.encode([prose], None)[0]) > 100
    part = tr.segmented(prose)
    assert part.cut and len(part.spans) > 4
    sentences = [prose[a:b] for a, b in part.spans]
    assert all(len(tr.encode([s], None)[0]) <= 23 for s in sentences)
    assert "".join(sentences).replace(" ", "") == prose.replace(" ", "")  # nothing left out
    with caplog.at_level(logging.WARNING, logger="nmt.api"):
        (got,) = tr.translate([prose], split=True)
    assert got == part.joined(tr.translate(sentences))[0]
    assert "texts[0]: a sentence longer than the model's maximum of 23 tokens" in caplog.text


@pytest.mark.parametrize(
    "kwargs",
    [{"attention": True}, {"constraints": [["Hund"]]}, {"prefix": ["Ein"]}],
)
def test_split_takes_no_attention_nor_constraints(translator, kwargs):
    with pytest.raises(NmtError, match="split=True takes no attention, constraints"):
        translator.translate_nbest(["A dog runs."], split=True, **kwargs)
    with pytest.raises(NmtError, match=r"texts\[0\] is Request, not str"):
        translator.translate([Request("A dog runs.")], split=True)
    with pytest.raises(NmtError, match="split"):
        translator.translate(["A dog runs."], split="yes")


def test_joined_gives_a_blank_text_nothing_and_keeps_a_text_without_sentences(translator):
    assert joined(translator.segmented("  "), []) == []
    assert [h.text for h in joined(translator.segmented("42 \U0001f600"), [])] == ["42 \U0001f600"]


# ------------------------------------------------------------------ nmt translate


def test_the_command_translates_each_line_sentence_by_sentence(ckpt, translator, tmp_path, capsys):
    lines = [
        "A dog runs. Two men talk.",
        "",
        "  A cat sleeps.  \U0001f600",
        "\U0001f600 123",
        "Hi.",
    ]
    src = tmp_path / "in.txt"
    src.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    args = ["translate", "-c", str(ckpt), "--device", "cpu", "-i", str(src), "-o", str(out)]
    assert nmt_here(*args, "--split-sentences") == 0
    assert out.read_text(encoding="utf-8").split("\n") == [
        *translator.translate(lines, split=True),
        "",
    ]
    assert nmt_here(*args, "--split-sentences", "--attention", str(tmp_path / "a.npz")) == 1
    assert_one_line(1, capsys.readouterr().err, "--split-sentences", "--attention")
