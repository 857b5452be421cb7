"""`nmt serve`: real server processes on free loopback ports (tests/serving.py), polled on
/ready; what they answer is compared with `nmt translate` and the Python API on the same
checkpoint and engine (each test of a server runs on torch and on CTranslate2: the `engine`
fixture). The batcher and the HTML splitting are also tested on their own, in process."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip(
    "starlette", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)
pytest.importorskip(
    "uvicorn", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)

from serving import ROOT, Server, slow_on_ctranslate2, translate_offline  # noqa: E402

from nmt import Translator  # noqa: E402
from nmt.options import ServeOptions  # noqa: E402
from nmt.serve.app import Service  # noqa: E402
from nmt.serve.batching import TORCH, Batcher, Job  # noqa: E402
from nmt.serve.libretranslate import Markup  # noqa: E402
from nmt.serve.model import JobKey, Model  # noqa: E402
from nmt.serve.stream import Stream  # noqa: E402


@pytest.fixture(scope="module")
def lines(raw_corpus) -> list[str]:
    return raw_corpus.lines("test", "en")[:24]


@pytest.fixture(scope="module")
def server(engine, trained_checkpoint):
    with Server(*engine.args, "--model", f"en-de={trained_checkpoint}") as s:
        yield s


@pytest.fixture(scope="module")
def reference(engine, trained_checkpoint):
    """The Python API on the same checkpoint and engine, the same defaults as the server's."""
    return engine.load(trained_checkpoint)


def best(answer: dict) -> list[str]:
    return [t["text"] for t in answer["translations"]]


# ------------------------------------------------------------------ endpoints


def test_every_endpoint_answers(server):
    assert server.get("/health")[:2] == (200, {"status": "ok"})
    assert server.get("/ready")[:2] == (200, {"status": "ready"})
    status, models, _ = server.get("/v1/models")
    assert status == 200 and [(m["name"], m["source"], m["target"]) for m in models["models"]] == [
        ("en-de", "en", "de")
    ]
    assert server.get("/languages")[:2] == (
        200,
        [
            {"code": "de", "name": "German", "targets": ["de"]},
            {"code": "en", "name": "English", "targets": ["de", "en"]},
        ],
    )
    status, page, headers = server.get("/")
    assert (
        status == 200
        and "<html" in page.lower()
        and "default-src 'self'" in headers["content-security-policy"]
    )
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), (
        "the page loads nothing from elsewhere"
    )
    server.post("/v1/translate", {"texts": ["A dog."]})
    status, metrics, _ = server.get("/metrics")
    assert status == 200
    for name in (
        "nmt_requests_total",
        "nmt_sentences_total",
        "nmt_batch_sentences_bucket",
        "nmt_queue_sentences",
        "nmt_request_seconds_bucket",
    ):
        assert name in metrics, name
    assert re.search(r'nmt_requests_total\{endpoint="translate",status="200"\} [1-9]', metrics)


def test_the_openapi_description_has_every_route_and_no_other(server):
    from nmt.options import ServeOptions
    from nmt.serve.app import Service

    status, spec, _ = server.get("/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    routes = {
        (r.path, m.lower())
        for r in Service({}, ServeOptions(), []).app().routes
        for m in r.methods - {"HEAD"}
    }
    assert routes == {(path, method) for path, ops in spec["paths"].items() for method in ops}


# ------------------------------------------------------------------ translations


def test_translations_equal_nmt_translate(server, engine, trained_checkpoint, lines):
    status, answer, _ = server.post("/v1/translate", {"texts": lines})
    assert status == 200 and best(answer) == translate_offline(
        trained_checkpoint, lines, *engine.args
    )
    status, answer, _ = server.post("/v1/translate", {"texts": lines[:8], "beam": 2, "lenpen": 0.6})
    assert status == 200 and best(answer) == translate_offline(
        trained_checkpoint, lines[:8], *engine.args, "--beam", "2", "--lenpen", "0.6"
    )


def test_32_concurrent_clients_with_mixed_settings_get_what_translate_gives(
    server, engine, trained_checkpoint, lines
):
    settings = [{}, {"beam": 2}, {"beam": 1}, {"nbest": 2}]
    expected = {
        i: [
            h[0].text
            for h in engine.load(
                trained_checkpoint, **{k: v for k, v in s.items() if k != "nbest"}
            ).translate_nbest(lines)
        ]
        for i, s in enumerate(settings)
    }

    def client(c: int) -> list[tuple[int, str, str]]:
        got = []
        for j, line in enumerate(lines[c % 4 :: 4]):
            which = (c + j) % len(settings)
            status, answer, _ = server.post("/v1/translate", {"texts": [line], **settings[which]})
            assert status == 200, answer
            got.append((which, line, answer["translations"][0]["text"]))
        return got

    with ThreadPoolExecutor(32) as pool:
        results = [r for rs in pool.map(client, range(32)) for r in rs]
    assert len(results) == 32 * len(lines) // 4
    for which, line, text in results:
        assert text == expected[which][lines.index(line)], (settings[which], line)


def test_nbest_scores_and_alignment_spans(server, reference, lines):
    status, answer, _ = server.post(
        "/v1/translate", {"texts": lines[:4], "nbest": 3, "alignment": True}
    )
    assert status == 200
    for line, result, hyps in zip(
        lines, answer["translations"], reference.translate_nbest(lines[:4], 3), strict=False
    ):
        assert [h["text"] for h in result["nbest"]] == [h.text for h in hyps]
        assert [h["score"] for h in result["nbest"]] == pytest.approx(
            [h.score for h in hyps], abs=1e-4
        )
        for h in result["nbest"]:
            assert h["alignment"], h
            for link in h["alignment"]:
                (a, b), (c, d) = link["source"], link["target"]
                assert (
                    0 <= a < b <= len(line) and line[a:b].strip() and 0 <= c < d <= len(h["text"])
                )


def test_attention_through_the_api(server, lines):
    status, answer, _ = server.post("/v1/translate", {"texts": lines[:1], "attention": True})
    att = answer["translations"][0]["nbest"][0]["attention"]
    assert status == 200 and att["source"][-1] == att["target"][-1] == "</s>"
    assert len(att["weights"]) == len(att["target"]) and all(
        len(r) == len(att["source"]) for r in att["weights"]
    )
    assert all(sum(r) == pytest.approx(1, abs=1e-2) for r in att["weights"])


def test_constraints_avoid_and_terminology_through_the_api(server, engine, reference, lines):
    line = lines[0]
    plain = reference.translate([line])[0]
    word = plain.split()[0]
    asked = {
        "constraints": [
            {"text": line, "constraints": ["Katze"]},
            {"text": line, "avoid": [word]},
            line,
        ],
        "prefix": [{"text": line, "prefix": "Eine Katze"}],
    }
    got = {k: server.post("/v1/translate", {"texts": texts})[:2] for k, texts in asked.items()}
    got["terminology"] = server.post(
        "/v1/translate", {"texts": [line], "terminology": {line.split()[1]: "Katze"}}
    )[:2]
    for status, answer in got.values():
        assert engine.answered(status, answer, "lexical constraints"), answer
    if engine.refusal("lexical constraints"):  # CTranslate2 decodes none of them: 400s
        return
    forced, avoided, same = best(got["constraints"][1])
    assert "Katze" in forced and word not in avoided and same == plain
    assert best(got["prefix"][1])[0].startswith("Eine Katze")
    assert forced == reference.translate([line], constraints=[["Katze"]])[0]
    assert "Katze" in best(got["terminology"][1])[0]


def test_sampling_draws_as_the_command_does(server, engine, trained_checkpoint, lines):
    """Text i of a request draws from generator (seed, i), as line i does in `nmt translate`.
    CTranslate2 seeds a batch, not a sentence: it refuses sampling, as the command does."""
    status, answer, _ = server.post(
        "/v1/translate", {"texts": lines[:6], "sampling": True, "seed": 3}
    )
    assert engine.answered(status, answer, "sampling"), answer
    if engine.refusal("sampling"):
        return
    assert best(answer) == translate_offline(
        trained_checkpoint, lines[:6], "--sampling", "--seed", "3"
    )


@slow_on_ctranslate2
def test_int8_and_a_shortlist_as_server_options(
    engine, trained_checkpoint, prepared, lines, tmp_path
):
    shortlist = tmp_path / "shortlist.pt"
    out = subprocess.run(
        [sys.executable, "-m", "nmt", "shortlist", str(prepared[0]), "-o", str(shortlist)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    args = ("--precision", "int8", "--shortlist", str(shortlist), "--beam", "2")
    if refused := engine.refusal("shortlist"):  # CTranslate2 refuses it at start: int8 alone
        out = run_serve(*engine.args, "-c", str(trained_checkpoint), "--port", "0", *args)
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out.stderr
        assert f"--{refused}; use torch or auto" in out.stderr, out.stderr
        args = ("--precision", "int8", "--beam", "2")
    with Server(*engine.args, "--model", f"en-de={trained_checkpoint}", *args) as s:
        status, answer, _ = s.post("/v1/translate", {"texts": lines[:8]})
    assert status == 200 and best(answer) == translate_offline(
        trained_checkpoint, lines[:8], *engine.args, *args
    )


def test_score_equals_the_api(server, reference, lines):
    targets = reference.translate(lines[:3])
    status, answer, _ = server.post("/v1/score", {"sources": lines[:3], "targets": targets})
    assert status == 200 and answer["scores"] == pytest.approx(
        reference.score(lines[:3], targets), abs=1e-4
    )


# ------------------------------------------------------------------ LibreTranslate


def test_libretranslate_requests_of_real_clients(server, reference, lines):
    """The requests as Mastodon's and Weblate's LibreTranslate clients send them, and the
    LibreTranslate documentation's curl example."""
    one, two = lines[0], lines[1]
    want = reference.translate([one, two])
    # Mastodon (app/lib/translation_service/libre_translate.rb): JSON, q a list of HTML, source auto
    status, answer, _ = server.post(
        "/translate",
        {
            "q": [f"<p>{one}</p>", f"<p>{two}</p>"],
            "source": "auto",
            "target": "de",
            "format": "html",
            "api_key": None,
        },
    )
    assert status == 200 and answer["translatedText"] == [f"<p>{want[0]}</p>", f"<p>{want[1]}</p>"]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "en"]
    # Weblate (weblate/machinery/libretranslate.py, its batch API): JSON, q a list, no format
    status, answer, _ = server.post(
        "/translate", {"api_key": None, "q": [one, two], "source": "en", "target": "de"}
    )
    assert status == 200 and answer == {"translatedText": want}
    # Weblate before its batch API: form data, q a string
    form = urlencode({"api_key": "", "q": one, "source": "en", "target": "de"}).encode()
    status, answer, _ = server.post(
        "/translate", raw=form, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 200 and answer == {"translatedText": want[0]}
    # the documentation: JSON, alternatives
    status, answer, _ = server.post(
        "/translate",
        {"q": one, "source": "en", "target": "de", "format": "text", "alternatives": 2},
    )
    assert (
        status == 200 and answer["translatedText"] == want[0] and len(answer["alternatives"]) == 2
    )
    status, answer, _ = server.post("/translate", {"q": one, "source": "en", "target": "fr"})
    assert status == 400 and "no model translates en to fr" in answer["error"]
    assert server.post("/translate", {"source": "en", "target": "de"})[:2] == (
        400,
        {"error": "Invalid request: missing q parameter"},
    )


def test_libretranslate_reads_raw_utf8_forms_and_the_query_string(server, reference, lines):
    """As LibreTranslate (Werkzeug's request.values): `curl -d 'q=Grüße...'` sends raw UTF-8, and
    the parameters may come in the query string, alone or beside a form body."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    text = "A dog in Zürich."
    want = reference.translate([text, lines[0]])
    status, answer, _ = server.post(
        "/translate", raw=f"q={text}&source=en&target=de".encode(), headers=form
    )
    assert (status, answer) == (200, {"translatedText": want[0]})
    status, answer, _ = server.post(
        "/translate?" + urlencode({"q": lines[0], "source": "en", "target": "de"}),
        raw=b"",
        headers={"Content-Type": ""},
    )
    assert (status, answer) == (200, {"translatedText": want[1]})
    status, answer, _ = server.post(
        "/translate?source=en&target=de", raw=urlencode({"q": text}).encode(), headers=form
    )
    assert (status, answer) == (200, {"translatedText": want[0]})


@slow_on_ctranslate2
def test_a_request_the_queue_can_never_hold_is_400_not_retry_later(
    engine, trained_checkpoint, lines
):
    with Server(*engine.args, "--model", f"en-de={trained_checkpoint}", "--max-queue", "2") as s:
        status, answer, headers = s.post("/v1/translate", {"texts": lines[:3]})
        assert (
            status == 400
            and "3 sentences, more than this server's queue holds (2)" in answer["error"]
        )
        assert (
            "Retry-After" not in headers and s.post("/v1/translate", {"texts": lines[:2]})[0] == 200
        )


@pytest.mark.parametrize(
    ("document", "texts", "joined"),
    [
        ("<![CDATA[A dog.]]><p>A cat.</p>", ["A cat."], "<![CDATA[A dog.]]><p>[A cat.]</p>"),
        ("<?php echo 1; ?><p>A cat.</p>", ["A cat."], "<?php echo 1; ?><p>[A cat.]</p>"),
        (
            "<style>p { color: red }</style><script>if (a < b && c) {}</script><p>A dog.</p>",
            ["A dog."],
            "<style>p { color: red }</style><script>if (a < b && c) {}</script><p>[A dog.]</p>",
        ),
        (
            "<p>Run <code>ls &amp; x</code> now.</p>",
            ["Run ", " now."],
            "<p>[Run] <code>ls &amp; x</code> [now.]</p>",
        ),
        (
            '<p translate="no">Acme <b>Dog</b></p>A dog.',
            ["A dog."],
            '<p translate="no">Acme <b>Dog</b></p>[A dog.]',
        ),
        ("<pre><pre>a</pre>b</pre>c", ["c"], "<pre><pre>a</pre>b</pre>[c]"),
        ('<br translate="no">A dog', ["A dog"], '<br translate="no">[A dog]'),
        ("<p>A dog <b", ["A dog "], "<p>[A dog] <b"),
        ("A dog runs. <", ["A dog runs. "], "[A dog runs.] <"),
        ("Tom &Jerry", ["Tom &Jerry"], "[Tom &amp;Jerry]"),
    ],
    ids=[
        "CDATA",
        "processing instruction",
        "script and style",
        "code",
        "translate=no",
        "nested pre",
        "void translate=no",
        "unfinished tag",
        "stray <",
        "bare ampersand",
    ],
)
def test_html_that_is_not_text_to_translate_is_kept_as_written(document, texts, joined):
    """A CDATA section or a processing instruction used to vanish; script, style and code were
    translated (LibreTranslate leaves them); an unfinished tag at the end became made-up words."""
    doc = Markup(document)
    assert doc.texts == texts
    assert doc.join([f"[{t.strip()}]" for t in doc.texts]) == joined


def test_html_runs_are_translated_and_markup_kept():
    doc = Markup('<p class="x">Hello <b>big</b> &amp; <br/>world<!-- c --></p>\n')
    assert doc.texts == ["Hello ", "big", " & ", "world"]
    assert (
        doc.join(["Hallo", "groß", "<&>", "Welt"])
        == '<p class="x">Hallo <b>groß</b> &lt;&amp;&gt; <br/>Welt<!-- c --></p>\n'
    )
    assert Markup.plain("a < b").join(["x < y"]) == "x < y"


# ------------------------------------------------------------------ bad input


BAD = [
    ("malformed JSON", "/v1/translate", b'{"texts": [', {}, 400, "not valid JSON"),
    ("not an object", "/v1/translate", b'["a"]', {}, 400, "must be a JSON object"),
    (
        "texts not a list",
        "/v1/translate",
        b'{"texts": 5}',
        {},
        400,
        '"texts" must be a string or a non-empty list',
    ),
    (
        "empty texts",
        "/v1/translate",
        b'{"texts": []}',
        {},
        400,
        '"texts" must be a string or a non-empty list',
    ),
    (
        "a text not a string",
        "/v1/translate",
        b'{"texts": ["a", 3]}',
        {},
        400,
        "texts[1] must be a string",
    ),
    (
        "nbest a string",
        "/v1/translate",
        b'{"texts": ["a"], "nbest": "2"}',
        {},
        400,
        '"nbest" must be an integer',
    ),
    ("nbest over beam", "/v1/translate", b'{"texts": ["a"], "nbest": 9}', {}, 400, "nbest"),
    ("beam zero", "/v1/translate", b'{"texts": ["a"], "beam": 0}', {}, 400, '"beam" must be'),
    (
        "alignment a string",
        "/v1/translate",
        b'{"texts": ["a"], "alignment": "yes"}',
        {},
        400,
        "true or false",
    ),
    (
        "unknown field",
        "/v1/translate",
        b'{"texts": ["a"], "beems": 2}',
        {},
        400,
        "unknown field 'beems'",
    ),
    (
        "unknown model",
        "/v1/translate",
        b'{"texts": ["a"], "model": "xx"}',
        {},
        400,
        "unknown \"model\" 'xx'",
    ),
    (
        "unknown text key",
        "/v1/translate",
        b'{"texts": [{"text": "a", "must": []}]}',
        {},
        400,
        "texts[0]: unknown key",
    ),
    ("NUL", "/v1/translate", b'{"texts": ["a\\u0000b"]}', {}, 400, "texts[0] holds a NUL"),
    ("lone surrogate", "/v1/translate", b'{"texts": ["a\\ud800"]}', {}, 400, "lone surrogate"),
    ("invalid UTF-8 JSON", "/v1/translate", b'{"texts": ["\xff"]}', {}, 400, "not valid UTF-8"),
    (
        "invalid UTF-8 form",
        "/translate",
        b"q=%FF&source=en&target=de",
        {"Content-Type": "application/x-www-form-urlencoded"},
        400,
        "not valid UTF-8",
    ),
    (
        "text over the limit",
        "/v1/translate",
        json.dumps({"texts": ["a" * 5001]}).encode(),
        {},
        400,
        "texts[0] has 5001 characters, more than this server's limit of 5000",
    ),
    (
        "10,000 texts",
        "/v1/translate",
        json.dumps({"texts": ["a"] * 10_000}).encode(),
        {},
        400,
        '"texts" has 10000 texts, more than this server\'s limit of 128',
    ),
    (
        "constraints too long",
        "/v1/translate",
        json.dumps({"texts": [{"text": "a", "constraints": ["Katze " * 100]}]}).encode(),
        {},
        400,
        "texts[0]",
    ),
    (
        "target_lang, not multilingual",
        "/v1/translate",
        b'{"texts": ["a"], "target_lang": "fra"}',
        {},
        400,
        '"target_lang" fra: the model has no target-language tokens',
    ),
    (
        "terminology not an object",
        "/v1/translate",
        b'{"texts": ["a"], "terminology": [["a", "b"]]}',
        {},
        400,
        '"terminology" must be an object',
    ),
    (
        "score lengths",
        "/v1/score",
        b'{"sources": ["a"], "targets": ["a", "b"]}',
        {},
        400,
        '1 "sources" but 2 "targets"',
    ),
    (
        "beam over the limit",
        "/v1/translate",
        b'{"texts": ["a"], "beam": 17}',
        {},
        400,
        '"beam" 17 is more than this server\'s limit of 16',
    ),
    (
        "unknown score field",
        "/v1/score",
        b'{"sources": ["a"], "targets": ["a"], "beam": 3}',
        {},
        400,
        "unknown field 'beam'",
    ),
    ("JSON nested 2,000 deep", "/v1/translate", b"[" * 2000, {}, 400, "not valid JSON"),
    (
        "alternatives 1e400",
        "/translate",
        b'{"q": "a", "source": "en", "target": "de", "alternatives": 1e400}',
        {},
        400,
        "alternatives must be 0 to 10",
    ),
    (
        "a lone surrogate echoed",
        "/translate",
        b'{"q": "a", "source": "\\ud800", "target": "de"}',
        {},
        400,
        "no model translates \\ud800 to de",
    ),
    (
        "model a list",
        "/v1/score",
        b'{"sources": ["a"], "targets": ["a"], "model": ["x"]}',
        {},
        400,
        "unknown \"model\" ['x']",
    ),
]


@pytest.mark.parametrize(
    ("path", "raw", "headers", "status", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_is_a_json_error_and_the_server_keeps_serving(
    server, path, raw, headers, status, message
):
    got, answer, _ = server.post(path, raw=raw, headers=headers)
    assert (got, list(answer)) == (status, ["error"]), answer
    assert (
        message in answer["error"]
        and "\n" not in answer["error"]
        and "Traceback" not in answer["error"]
    )
    assert server.post("/v1/translate", {"texts": ["A dog."]})[0] == 200


def test_a_body_over_the_limit_is_413_and_never_read_whole(server):
    """Said by its Content-Length (answered before the body is sent), or found while reading a
    chunked body; a raw socket, as an HTTP client library breaks off writing once answered."""
    head = b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    said = read_answer(raw_request(server.port, head + b"Content-Length: 1000001\r\n\r\n"))
    chunk = b" " * 400_000
    chunked = read_answer(
        raw_request(
            server.port,
            head + b"Transfer-Encoding: chunked\r\n\r\n",
            (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 3,
        )
    )
    for got in (said, chunked):
        assert (
            got.startswith("HTTP/1.1 413")
            and '{"error":"the request body is larger than this server\'s limit of 1000000 bytes"}'
            in got
        ), got
    assert server.post("/v1/translate", {"texts": ["A dog."]})[0] == 200


def test_empty_and_blank_texts_translate_to_empty(server):
    status, answer, _ = server.post("/v1/translate", {"texts": ["", "  \t ", "A dog."]})
    assert (
        status == 200 and best(answer)[:2] == ["", ""] and answer["translations"][0]["nbest"] == []
    )


def test_unknown_paths_and_methods_are_json_errors(server):
    assert server.get("/nope")[:2] == (404, {"error": "Not Found"})
    assert server.get("/v1/translate")[:2] == (405, {"error": "Method Not Allowed"})


def test_one_bad_sentence_never_fails_the_others_of_its_batch():
    gate = threading.Event()

    def decode(key, jobs):
        gate.wait()
        if any(j.item == "bad" for j in jobs):
            raise ValueError("bad sentence")
        return [j.item.upper() for j in jobs]

    batcher = Batcher(decode, batch_tokens=1000, max_queue=100)
    try:
        first = Job("k", "first", tokens=1)
        batcher.submit([first])  # the worker takes it and waits at the gate: the rest queue up
        while batcher.depth():
            time.sleep(0.001)
        jobs = [Job("k", t, tokens=1) for t in ("a", "bad", "b")]
        batcher.submit(jobs)
        gate.set()
        assert first.future.result(60) == "FIRST"
        assert [jobs[0].future.result(60), jobs[2].future.result(60)] == ["A", "B"]
        with pytest.raises(ValueError, match="bad sentence"):
            jobs[1].future.result(60)
    finally:
        gate.set()
        batcher.close()


def test_torch_decodes_every_model_on_the_one_torch_thread_and_ctranslate2_on_its_worker(
    reference,
):
    """Two models' batchers hand their torch batches to one thread (OpenMP keeps a team per
    calling thread, and two teams on the same cores slow each other down); CTranslate2, which
    releases the interpreter lock, decodes each on the batcher's own worker thread, so that the
    workers' batches run at once. Sentences with constraints go to torch on either engine."""
    names: list[tuple[bool, str]] = []

    def decoded(tr: Translator, key: JobKey, jobs: list[Job]) -> list[None]:
        names.append((key.plain, threading.current_thread().name))
        return [None] * len(jobs)

    models = [Model(n, reference, "en", "de") for n in ("en-de", "de-en")]
    batchers = []
    for m in models:
        m._decoded = decoded  # type: ignore[method-assign]
        batchers.append(Batcher(m.decode, batch_tokens=100, max_queue=100, name=m.name))
    try:
        plain = JobKey.translation({}, 1, False, None)
        constrained = JobKey("translate", plain=False)
        jobs = [Job(key, str(i), tokens=1) for i in range(3) for key in (plain, constrained)]
        assert batchers[0].submit(jobs[:3]) and batchers[1].submit(jobs[3:])
        for job in jobs:
            job.future.result(60)
    finally:
        for batcher in batchers:
            batcher.close()
    torch_thread = TORCH.submit(lambda: threading.current_thread().name).result()
    assert {name for plain, name in names if not plain} == {torch_thread}
    plain_threads = {name for plain, name in names if plain}
    if reference.engine is None:
        assert plain_threads == {torch_thread}
    else:
        assert plain_threads and all(name.startswith("nmt-serve-") for name in plain_threads)


def test_ctranslate2_batches_take_every_worker_also_without_continuous_batching(reference):
    """--no-continuous leaves torch's batches to one worker (they take the one torch thread in
    turn); CTranslate2's still run one per worker at once."""
    model = Model("en-de", reference, "en", "de", continuous=False)
    service = Service({"en-de": model}, ServeOptions(workers=2, continuous=False), [])
    try:
        assert model.batcher is not None
        assert len(model.batcher._threads) == (1 if reference.engine is None else 2)
    finally:
        service.close()


def test_batches_join_clients_never_settings_and_keep_to_the_budget():
    gate, batches = threading.Event(), []

    def decode(key, jobs):
        gate.wait()
        batches.append([j.item for j in jobs])
        return [None] * len(jobs)

    batcher = Batcher(decode, batch_tokens=12, max_queue=100)
    try:
        batcher.submit([Job("x", "hold", tokens=1)])
        while batcher.depth():
            time.sleep(0.001)
        client1 = [Job("a", f"1.{i}", tokens=3) for i in range(3)]
        client2 = [Job("b", "2.0", tokens=3), Job("a", "2.1", tokens=3), Job("a", "2.2", tokens=3)]
        cancelled = Job("a", "gone", tokens=3)
        assert batcher.submit(client1) and batcher.submit(client2) and batcher.submit([cancelled])
        cancelled.future.cancel()
        assert not batcher.submit([Job("a", str(i), tokens=1) for i in range(94)]), (
            "over max_queue: none queued"
        )
        gate.set()
        for job in client1 + client2:
            job.future.result(60)
    finally:
        gate.set()
        batcher.close()
    # budget 12 tokens: 4 sentences of 3; key "a" first (oldest), across both clients; "b" alone
    assert batches == [["hold"], ["1.0", "1.1", "1.2", "2.1"], ["2.2"], ["2.0"]] or batches == [
        ["hold"],
        ["1.0", "1.1", "1.2", "2.1"],
        ["2.0"],
        ["2.2"],
    ]


def test_sentences_join_the_running_search_of_their_key_and_a_failed_step_fails_only_the_bad():
    """Continuous batching (nmt.serve.stream), with a stand-in for the search that ends its oldest
    sentence each step: waiting sentences of its key join it between steps within the budget;
    another key's sentence at the head of the queue waits until it drains; a step that fails has
    its sentences decoded again one at a time."""
    gate, runs, sizes = threading.Event(), [], []

    class Search:
        def __init__(self):
            self.live = []

        def run(self, jobs, alone):
            gate.wait()
            assert alone, "one lane: its search runs alone, on every thread"
            runs.append([j.item for j in jobs])
            if any(j.item == "bad" for j in jobs):
                raise ValueError("bad sentence")
            self.live += jobs
            return [(j, j.item.upper()) for j in [self.live.pop(0)]]

    def decode(key, jobs):  # batches: another key, and a failed step's sentences one by one
        if jobs[0].item == "bad":
            raise ValueError("bad sentence")
        return [j.item.upper() + "!" for j in jobs]

    batcher = Batcher(
        decode,
        batch_tokens=4,
        max_queue=100,
        on_batch=lambda n, size: sizes.append((n, size)),
        stream=lambda key: Search() if key == "a" else None,
    )
    try:
        jobs = {t: Job(t[0], t, tokens=2) for t in ("a0", "a1", "a2", "b0", "a3")}
        batcher.submit([jobs["a0"], jobs["a1"]])
        while batcher.depth():
            time.sleep(0.001)
        batcher.submit([jobs[t] for t in ("a2", "b0", "a3")])  # queued while the first step waits
        gate.set()
        assert {t: j.future.result(60) for t, j in jobs.items()} == {
            "a0": "A0",
            "a1": "A1",
            "a2": "A2",
            "b0": "B0!",
            "a3": "A3",
        }
        # a2 joins at once (a3 would go over the budget of 4 tokens); then b0 heads the queue
        assert runs == [["a0", "a1"], ["a2"], [], ["a3"]]
        assert sizes == [(1, 2), (1, 2), (1, 1), (1, 1), (1, 1)]
        failing = [Job("a", "a4", tokens=1), Job("a", "bad", tokens=1)]
        batcher.submit(failing)
        assert failing[0].future.result(60) == "A4!"
        with pytest.raises(ValueError, match="bad sentence"):
            failing[1].future.result(60)
    finally:
        gate.set()
        batcher.close()


# torch only: continuous batching's running search, which CTranslate2 never joins (can_stream)
def test_a_sentence_nobody_waits_for_leaves_the_running_search_at_its_next_step(
    trained_checkpoint, lines
):
    """A 504 or a client gone marks its running sentences abandoned (Service._run): the search
    ends them at its next step instead of decoding them to their end (two long ones held both
    lanes past every other client's deadline)."""
    stream = Stream(Translator.load(trained_checkpoint, device="cpu"), 1, False, None, (1, 1))
    jobs = [Job("k", text, tokens=1) for text in (lines[0], "a dog and " * 100)]
    assert stream.run(jobs) == [] and stream.run([]) == []
    jobs[1].abandoned = True
    assert [job for job, _ in stream.run([])] == [jobs[1]] and len(stream.search) == 1


def test_lanes_fill_in_order_and_a_lone_search_takes_every_thread():
    """Two lanes: a search starts on lane 1 only while lane 0 decodes, so that only lane 0's
    thread ever runs on every thread (one OpenMP team); beside another search, each its share."""
    gate, seen = threading.Event(), []

    class Search:
        def run(self, jobs, alone):
            seen.append((threading.current_thread().name, jobs[0].item, alone))
            if jobs[0].item == "first":
                gate.wait()
            return [(j, j.item) for j in jobs]

    batcher = Batcher(
        lambda key, jobs: [], batch_tokens=100, max_queue=100, stream=lambda key: Search(), lanes=2
    )
    try:
        first, second, third = (
            Job(k, t, tokens=1) for k, t in (("a", "first"), ("b", "second"), ("a", "third"))
        )
        batcher.submit([first])
        while not seen:
            time.sleep(0.001)
        batcher.submit([second])
        assert second.future.result(60) == "second"  # on lane 1 while lane 0 waits at the gate
        gate.set()
        assert first.future.result(60) == "first"
        while batcher._busy:  # lane 0 done with its search
            time.sleep(0.001)
        batcher.submit([third])
        assert third.future.result(60) == "third"
    finally:
        gate.set()
        batcher.close()
    torch_thread = TORCH.submit(lambda: threading.current_thread().name).result()
    assert seen[0] == (torch_thread, "first", True) and seen[2] == (torch_thread, "third", True)
    assert seen[1][0] != torch_thread and seen[1][1:] == ("second", False)


# ------------------------------------------------------------------ limits of time and queue


def raw_request(port: int, head: bytes, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(head + body)
    return sock


def read_answer(sock: socket.socket) -> str:
    """One HTTP answer read whole from `sock` (its headers, then Content-Length bytes), which is
    then closed."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < int(
        re.search(rb"content-length: (\d+)", data, re.I).group(1)
    ):  # type: ignore[union-attr]
        more = sock.recv(65536)
        assert more, f"the connection closed after {data!r}"
        data += more
    sock.close()
    return data.decode()


@slow_on_ctranslate2
def test_slow_disconnecting_and_too_many_clients(engine, trained_checkpoint):
    with Server(
        *engine.args,
        "--model",
        f"en-de={trained_checkpoint}",
        "--read-timeout",
        "1",
        "--max-queue",
        "6",
        "--max-wait-ms",
        "8000",
        "--timeout",
        "5",
    ) as s:
        head = (
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: "
            b"100\r\n\r\n"
        )
        slow = raw_request(s.port, head, b'{"texts": [')  # then nothing more
        gone = raw_request(s.port, head, b'{"tex')
        gone.close()  # disconnects mid-request
        held = threading.Thread(target=s.post, args=("/v1/translate", {"texts": ["A dog."] * 4}))
        held.start()  # 4 of the queue's 6 places, held for company until its 5 s deadline
        wait_for_queue(s, 4)
        assert s.post("/v1/translate", {"texts": ["A dog."] * 3})[:2] == (
            503,
            {"error": "Slowdown: the translation queue is full; retry later"},
        )
        status, answer, headers = s.post(
            "/translate", {"q": ["A dog."] * 3, "source": "en", "target": "de"}
        )
        assert status == 429 and headers["retry-after"] == "1"
        held.join()
        # held 8 s for company, over the 5 s deadline
        assert s.post("/v1/translate", {"texts": ["A dog."]})[:2] == (
            504,
            {"error": "the translation took longer than this server's limit of 5 s"},
        )
        answer = read_answer(slow)
        assert (
            answer.startswith("HTTP/1.1 408")
            and '"error":"the request body did not arrive within 1 s"' in answer
        )
        assert s.get("/health")[0] == 200


def wait_for_queue(s: Server, sentences: int) -> None:
    """Until the server's queue holds `sentences` (its metrics say), for at most 60 s."""
    deadline = time.monotonic() + 60
    while f'nmt_queue_sentences{{model="en-de"}} {sentences}.0' not in s.get("/metrics")[1]:
        assert time.monotonic() < deadline, (
            f"the queue never held {sentences} sentences: {s.get('/metrics')[1]}"
        )
        time.sleep(0.02)


@slow_on_ctranslate2
def test_a_client_that_goes_away_has_its_sentences_dropped(engine, trained_checkpoint):
    model = f"en-de={trained_checkpoint}"
    with Server(*engine.args, "--model", model, "--max-wait-ms", "10000") as s:
        body = json.dumps({"texts": ["A dog."] * 5}).encode()
        head = (
            "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        client = raw_request(s.port, head.encode(), body)
        wait_for_queue(s, 5)
        client.close()  # the batch is held 10 s: it goes away before its batch is formed
        assert s.post("/v1/translate", {"texts": ["A cat."]})[0] == 200
        metrics = s.get("/metrics")[1]
        assert 'nmt_sentences_total{model="en-de"} 1.0' in metrics, metrics
        assert re.search(r'nmt_requests_total\{endpoint="translate",status="499"\} 1', metrics)


@slow_on_ctranslate2
def test_sigterm_answers_what_is_in_flight_and_exits_0(engine, trained_checkpoint, lines):
    s = Server(*engine.args, "--model", f"en-de={trained_checkpoint}", "--max-wait-ms", "10000")
    with ThreadPoolExecutor(4) as pool:
        answers = [
            pool.submit(s.post, "/v1/translate", {"texts": lines[i : i + 2]})
            for i in range(0, 8, 2)
        ]
        wait_for_queue(s, 8)  # all four in flight, held for company
        code, err = s.stop(signal.SIGTERM)
        got = [f.result(120) for f in answers]
    assert code == 0, err
    assert [a[0] for a in got] == [200] * 4 and all(len(a[1]["translations"]) == 2 for a in got)


# ------------------------------------------------------------------ safety


@slow_on_ctranslate2
def test_api_keys_cors_and_the_warning_off_loopback(engine, trained_checkpoint, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\nsecret-1\nsecret-2\n")
    with Server(
        *engine.args,
        "--model",
        f"en-de={trained_checkpoint}",
        "--api-keys",
        str(keys),
        "--cors-origin",
        "https://example.org",
    ) as s:
        assert s.post("/v1/translate", {"texts": ["A dog."]})[:2] == (
            403,
            {"error": "Invalid API key"},
        )
        assert s.post("/v1/translate", {"texts": ["A dog."], "api_key": "secret-3"})[0] == 403
        # a key JSON can carry but UTF-8 cannot (a lone surrogate) is a wrong key, not a server
        # error
        assert s.post("/v1/translate", {"texts": ["A dog."], "api_key": "\ud800"})[:2] == (
            403,
            {"error": "Invalid API key"},
        )
        assert s.post("/v1/translate", {"texts": ["A dog."], "api_key": "secret-2"})[0] == 200
        assert (
            s.post(
                "/v1/translate", {"texts": ["A dog."]}, headers={"Authorization": "Bearer secret-1"}
            )[0]
            == 200
        )
        assert s.post("/translate", {"q": "A dog.", "source": "en", "target": "de"})[:2] == (
            403,
            {"error": "Invalid API key"},
        )
        headers = s.post(
            "/v1/translate",
            {"texts": ["a"], "api_key": "secret-1"},
            headers={"Origin": "https://example.org"},
        )[2]
        assert {k.lower(): v for k, v in headers.items()}[
            "access-control-allow-origin"
        ] == "https://example.org"
        assert s.get("/v1/models")[1]["models"][0]["api_key_required"] is True
    with Server(*engine.args, "--model", f"en-de={trained_checkpoint}", "--host", "0.0.0.0") as s:
        headers = s.post(
            "/v1/translate", {"texts": ["a"]}, headers={"Origin": "https://example.org"}
        )[2]
        assert "access-control-allow-origin" not in {k.lower() for k in headers}, (
            "CORS is off unless asked"
        )
        code, err = s.stop()
    assert code == 0 and "without --api-keys: anyone who can reach it can use it" in err


def run_serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nmt", "serve", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **(env or {})},
    )


@slow_on_ctranslate2
def test_command_mistakes_are_one_line(engine, trained_checkpoint, tmp_path):
    taken = socket.create_server(("127.0.0.1", 0))
    fake = tmp_path / "fake"
    (fake / "starlette").mkdir(parents=True)
    (fake / "starlette" / "__init__.py").write_text("raise ImportError('no starlette')\n")
    cases = [
        ((), "nmt serve needs a checkpoint"),
        (("--model", "en-de"), "--model must be NAME=CHECKPOINT, got 'en-de'"),
        (
            ("-c", str(trained_checkpoint), "--port", "70000"),
            "--port must be in [0, 65535], got 70000",
        ),
        (
            ("-c", str(trained_checkpoint), "--port", str(taken.getsockname()[1])),
            "cannot listen on 127.0.0.1:",
        ),
        (("-c", str(tmp_path / "none.pt")), "none.pt"),
        (("-c", str(trained_checkpoint), "--api-keys", str(tmp_path / "nokeys")), "nokeys"),
    ]
    try:
        for args, message in cases:
            out = run_serve(*engine.args, *args)
            assert out.returncode != 0 and out.stdout == "", (args, out)
            assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, (
                args,
                out.stderr,
            )
        out = run_serve(
            *engine.args, "-c", str(trained_checkpoint), env={"PYTHONPATH": f"{fake}:{ROOT}"}
        )
        assert (
            out.returncode != 0
            and "pip install 'nmt[serve]'" in out.stderr
            and len(out.stderr.splitlines()) == 1
        )
    finally:
        taken.close()


@pytest.mark.slow
def test_memory_after_10000_requests_does_not_grow(engine, trained_checkpoint):
    """RSS after 2,000 requests and after 10,000 more (mixed: translations, errors,
    LibreTranslate)."""

    def rss(pid: int) -> int:
        return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))

    with Server(*engine.args, "--model", f"en-de={trained_checkpoint}") as s:

        def burst(n: int) -> None:
            with ThreadPoolExecutor(8) as pool:
                futures: list[Future] = [
                    pool.submit(s.post, "/v1/translate", {"texts": [f"A dog {i % 50}."]})
                    if i % 3
                    else pool.submit(s.post, "/translate", raw=b"{bad")
                    for i in range(n)
                ]
                assert {f.result()[0] for f in futures} == {200, 400}

        burst(2000)
        before = rss(s.proc.pid)
        burst(10_000)
        after = rss(s.proc.pid)
    assert after - before < 20_000, f"RSS grew from {before} kB to {after} kB"
