"""`nmt serve` translates sentences, not texts: a real server (tests/serving.py) on a trained
checkpoint, given multi-line, multi-sentence, HTML, too-long and emoji-only texts through
/v1/translate and LibreTranslate's /translate, answers what `nmt translate --split-sentences`
gives for the same lines, alone and under 32 concurrent clients; on torch and on CTranslate2
(the `engine` fixture)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "starlette", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)
pytest.importorskip("sentencex", reason="sentence splitting needs sentencex")

from serving import Server, translate_offline  # noqa: E402

from nmt import Translator  # noqa: E402
from nmt.serve.libretranslate import Markup  # noqa: E402

EMOJI = "🎉 👍🏽 ✨"
CLIENTS = 32


@pytest.fixture(scope="module")
def sentences(raw_corpus) -> list[str]:
    """Test-set sentences, each ending with a full stop."""
    return [line.rstrip(" .") + "." for line in raw_corpus.lines("test", "en")[:30]]


@pytest.fixture(scope="module")
def reference(engine, trained_checkpoint) -> Translator:
    return engine.load(trained_checkpoint)


@pytest.fixture(scope="module")
def texts(sentences, reference) -> dict[str, str]:
    """The cases: three lines with blank lines and CRLF; two sentences; about 2,000 tokens of
    prose, one of its sentences longer than the model (a run-on of clauses); emoji only."""
    run_on = ", ".join(s.rstrip(".") for s in sentences[10:30]) + "."
    prose = " ".join([*sentences[:10], run_on] * 3)
    limit = reference.loaded.max_positions - 1
    assert len(reference.encode([run_on], None)[0]) > limit
    assert len(reference.encode([prose], None)[0]) > 1500
    return {
        "lines": "\r\n\r\n".join(sentences[:3]),
        "two": f"{sentences[3]} {sentences[4]}",
        "long": prose,
        "emoji": EMOJI,
    }


@pytest.fixture(scope="module")
def post(sentences) -> str:
    """A Mastodon-shaped post: paragraphs of sentences, a link around a hashtag."""
    words = sentences[5].rstrip(".").split()
    half = len(words) // 2
    return (
        f"<p>{sentences[6]} {sentences[7]}</p><p>{' '.join(words[:half])} "
        '<a href="https://example.social/tags/tag" class="mention hashtag" rel="tag">'
        f"<span>#tag</span></a> {' '.join(words[half:])}.</p>"
    )


def offline(ckpt: Path, texts: list[str], *args: str) -> list[str]:
    """Each text translated by `nmt translate --split-sentences ARGS`, line by line, its lines
    put back with the text's own line breaks."""
    lines = [text.replace("\r\n", "\n").split("\n") for text in texts]
    out = iter(translate_offline(ckpt, [x for ls in lines for x in ls], "--split-sentences", *args))
    return [
        ("\r\n" if "\r\n" in text else "\n").join(next(out) for _ in ls)
        for text, ls in zip(texts, lines, strict=True)
    ]


@pytest.fixture(scope="module")
def expected(engine, trained_checkpoint, texts, post) -> dict[str, str]:
    """The offline answer of each case on the server's engine; the post's text nodes each
    translated as a line."""
    markup = Markup(post)
    runs = [run.strip() for run in markup.texts]
    done = offline(trained_checkpoint, [*texts.values(), *runs], *engine.args)
    out = dict(zip(texts, done, strict=False))
    out["post"] = markup.join(done[len(texts) :])
    return out


@pytest.fixture(scope="module")
def server(engine, trained_checkpoint):
    model = f"en-de={trained_checkpoint}"
    with Server(*engine.args, "--model", model, "--max-chars", "50000") as s:
        yield s


def v1(server: Server, text: str) -> dict[str, Any]:
    status, answer, _ = server.post("/v1/translate", {"texts": [text]}, timeout=600)
    assert status == 200, answer
    return answer["translations"][0]


def libre(server: Server, text: str, fmt: str = "text") -> tuple[str, dict[str, str]]:
    body = {"q": text, "source": "en", "target": "de", "format": fmt}
    status, answer, headers = server.post("/translate", body, timeout=600)
    assert status == 200, answer
    return answer["translatedText"], headers


def tags(html: str) -> list[str]:
    return re.findall(r"<[^>]*>", html)


def test_lines_blank_lines_and_crlf_keep_their_structure(server, texts, expected):
    text = texts["lines"]
    for answer in (v1(server, text)["text"], libre(server, text)[0]):
        assert answer == expected["lines"]
        parts = answer.split("\r\n")
        assert len(parts) == 5 and parts[1] == parts[3] == ""
        assert "\n" not in answer.replace("\r\n", "")
        assert all(p and p not in text for p in parts[::2])  # each line translated


def test_spaces_around_and_between_lines_are_kept(server, sentences):
    text = f"  {sentences[0]}  \n\n\t{sentences[1]}\n"
    answer = v1(server, text)["text"]
    assert re.fullmatch(r"  \S.*\S  \n\n\t\S.*\S\n", answer), answer


def test_two_sentences_are_each_translated_as_alone(server, texts, sentences, reference):
    alone = [reference.translate([s])[0] for s in sentences[3:5]]
    answer = v1(server, texts["two"])
    assert answer["text"] == f"{alone[0]} {alone[1]}"
    assert "split" not in answer and len(answer["nbest"]) == 1
    assert libre(server, texts["two"])[0] == answer["text"]


def test_one_sentence_keeps_its_nbest(server, sentences, reference):
    status, answer, _ = server.post("/v1/translate", {"texts": [sentences[8]], "nbest": 3})
    hyps = reference.translate_nbest([sentences[8]], 3)[0]
    assert status == 200
    assert [h["text"] for h in answer["translations"][0]["nbest"]] == [h.text for h in hyps]


def test_alignment_spans_point_into_the_text_and_its_translation(server, texts):
    text = texts["two"]
    status, answer, _ = server.post("/v1/translate", {"texts": [text], "alignment": True})
    hyp = answer["translations"][0]["nbest"][0]
    second = text.index(text.split(". ")[1])
    assert status == 200 and hyp["alignment"]
    assert any(a["source"][0] >= second for a in hyp["alignment"])  # the second sentence's
    for a in hyp["alignment"]:
        assert 0 <= a["source"][0] < a["source"][1] <= len(text)
        assert 0 <= a["target"][0] < a["target"][1] <= len(hyp["text"])


def test_a_mastodon_post_keeps_its_tags(server, post, expected):
    answer = libre(server, post, "html")[0]
    assert answer == expected["post"]
    assert tags(answer) == tags(post) and "#tag" in answer


def test_two_thousand_tokens_are_split_translated_whole_and_say_so(
    server, texts, expected, reference
):
    text = texts["long"]
    answer = v1(server, text)
    assert answer["split"] is True and answer["text"] == expected["long"]
    # no sentence lost: the pieces sent to the model cover all of the text but the spaces between
    # them (counting the periods of the translation instead depended on what the model writes)
    left = text
    for start, end in reversed(reference.segmented(text).spans):
        left = left[:start] + left[end:]
    assert left.strip() == ""
    translated, headers = libre(server, text)
    assert translated == expected["long"]
    assert headers["warning"].startswith('299 - "')
    assert "warning" not in {k.lower() for k in libre(server, texts["two"])[1]}


def test_emoji_only_comes_back_unchanged(server, expected):
    assert v1(server, EMOJI)["text"] == EMOJI == expected["emoji"]
    assert libre(server, EMOJI)[0] == EMOJI


def test_a_text_kept_whole_and_too_long_is_400_naming_the_limit(server, texts, reference):
    limit = reference.loaded.max_positions - 1
    body = {"texts": [{"text": texts["long"], "prefix": "Ein"}]}
    status, answer, _ = server.post("/v1/translate", body)
    assert status == 400 and f"maximum of {limit}" in answer["error"]
    assert "texts[0]" in answer["error"]


def test_score_refuses_a_pair_longer_than_the_model(server, texts, reference):
    limit = reference.loaded.max_positions - 1
    body = {"sources": ["A dog.", texts["long"]], "targets": ["Ein Hund.", "Ein Hund."]}
    status, answer, _ = server.post("/v1/score", body)
    assert status == 400 and "sources[1]" in answer["error"] and str(limit) in answer["error"]
    body = {"sources": ["A dog."], "targets": [texts["long"]]}
    status, answer, _ = server.post("/v1/score", body)
    assert status == 400 and "targets[0]" in answer["error"]


def test_32_clients_get_the_offline_split_translation(server, texts, post, expected):
    cases = [*[(name, text, "text") for name, text in texts.items()], ("post", post, "html")]

    def ask(i: int) -> tuple[str, str]:
        name, text, fmt = cases[i % len(cases)]
        if fmt == "text" and i % 2:
            return name, v1(server, text)["text"]
        return name, libre(server, text, fmt)[0]

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(ask, range(CLIENTS), timeout=900))
    assert len(answers) == CLIENTS
    for name, answer in answers:
        assert answer == expected[name], name
