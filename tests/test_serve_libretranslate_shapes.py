"""`nmt serve`'s LibreTranslate API as its clients use it, with the requests they send, written
out by hand from their code: Mastodon (JSON, `q` a list of HTML posts, `source` maybe "auto",
targets read from GET /languages less the language itself), Weblate (form data with `api_key`;
it offers a pair only where GET /languages lists both codes) and the `libretranslate` Python
client (urllib's form data, a GET /languages with a form body, detect()). Also what differs
from LibreTranslate no more: codes in any case, a text asked in its own language answered as
it is, CORS preflight, /frontend/settings and /spec. The application is called in process, its
translator on torch and on CTranslate2 (the `engine` fixture)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip(
    "starlette", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)

from serving import Engine, asgi_request, in_process  # noqa: E402

from nmt import Translator  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LINE = "A dog runs through the park."
FORM = "application/x-www-form-urlencoded"  # what urllib sends a body as unless told


@pytest.fixture(scope="module")
def translator(engine: Engine, random_checkpoint: Path) -> Translator:
    return engine.load(random_checkpoint, beam=2)


def call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request to the ASGI `app`, with exactly the headers a client sends."""
    return asyncio.run(asgi_request(app, method, path, body, headers))


def post_json(app: Any, path: str, body: Any) -> tuple[int, Any]:
    status, _, answer = call(
        app, "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return status, answer


def post_form(app: Any, path: str, fields: dict[str, str]) -> tuple[int, Any]:
    status, _, answer = call(app, "POST", path, urlencode(fields).encode(), {"Content-Type": FORM})
    return status, answer


def test_languages_list_every_language_with_its_targets_itself_included(translator):
    """Weblate's is_supported(source, target) needs both codes listed: with only en listed it
    never offered en to de. Mastodon reads each language's targets less the language itself."""
    with in_process(translator) as (_, app):
        # Mastodon's GET carries a JSON content type; the libretranslate client's a form body
        status, _, mastodon = call(
            app, "GET", "/languages", headers={"Content-Type": "application/json"}
        )
        _, _, client = call(app, "GET", "/languages", b"", {"Content-Type": FORM})
    assert status == 200
    assert (
        mastodon
        == client
        == [
            {"code": "de", "name": "German", "targets": ["de"]},
            {"code": "en", "name": "English", "targets": ["de", "en"]},
        ]
    )
    codes = [language["code"] for language in mastodon]
    assert "en" in codes and "de" in codes  # Weblate: en -> de is supported
    offered = {lang["code"]: [t for t in lang["targets"] if t != lang["code"]] for lang in mastodon}
    assert offered == {"de": [], "en": ["de"]}  # Mastodon's map of what each translates into


def test_mastodon_html_posts_in_a_list_with_source_auto(translator):
    expected = translator.translate([LINE])[0]
    with in_process(translator) as (_, app):
        status, answer = post_json(
            app,
            "/translate",
            {
                "q": [f"<p>{LINE}</p>", "<p><br></p>"],
                "source": "auto",
                "target": "de",
                "format": "html",
                "api_key": None,
            },
        )
    assert status == 200, answer
    assert answer["translatedText"] == [f"<p>{expected}</p>", "<p><br></p>"]
    # Mastodon reads data.dig("detectedLanguage", index, "language"); a confidence to act on
    assert answer["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 2


def test_weblate_and_the_libretranslate_client_send_form_data(translator):
    expected = translator.translate([LINE])[0]
    with in_process(translator) as (_, app):
        weblate = post_form(
            app, "/translate", {"api_key": "", "q": LINE, "source": "en", "target": "de"}
        )
        client = post_form(app, "/translate", {"q": LINE, "source": "en", "target": "de"})
    assert weblate == client == (200, {"translatedText": expected})


def test_the_libretranslate_client_s_detect(translator):
    """detect(q) posts q as form data and reads a list of {confidence, language}: nmt detects
    nothing and answers the one source language it serves."""
    with in_process(translator) as (_, app):
        assert post_form(app, "/detect", {"q": LINE}) == (
            200,
            [{"confidence": 100.0, "language": "en"}],
        )
        assert post_json(app, "/detect", {"q": LINE}) == (
            200,
            [{"confidence": 100.0, "language": "en"}],
        )
        status, answer = post_form(app, "/detect", {})
        assert (status, answer) == (400, {"error": "Invalid request: missing q parameter"})
        status, answer = post_json(app, "/detect", {"q": "a\0b"})
        assert status == 400 and "NUL" in answer["error"]


def test_language_codes_are_read_in_any_case(translator):
    expected = translator.translate([LINE])[0]
    with in_process(translator) as (_, app):
        for source, target in [("EN", "DE"), ("En", "de"), ("AUTO", "De")]:
            status, answer = post_json(
                app, "/translate", {"q": LINE, "source": source, "target": target}
            )
            assert status == 200, (source, target, answer)
            assert answer["translatedText"] == expected
        assert "detectedLanguage" in answer  # AUTO is auto
        status, answer = post_json(app, "/translate", {"q": LINE, "source": "en", "target": "fr"})
        assert status == 400 and "no model translates en to fr" in answer["error"]


@pytest.mark.parametrize(
    ("source", "fmt", "text"),
    [
        ("de", "text", "Ein Hund läuft."),
        ("en", "text", LINE),
        ("EN", "html", "<p>A <b>dog</b> &amp; a cat.</p>"),
        ("auto", "text", LINE),
    ],
)
def test_a_text_asked_in_its_own_language_comes_back_as_it_is(translator, source, fmt, text):
    """LibreTranslate answers source == target with the text unchanged; nmt decoded it (into
    German, or a 400 for de to de). auto is the one source language served, as /detect says."""
    target = "en" if source == "auto" else source.lower()
    with in_process(translator) as (_, app):
        status, answer = post_json(
            app,
            "/translate",
            {"q": [text], "source": source, "target": target, "format": fmt, "alternatives": 2},
        )
    assert status == 200, answer
    assert answer["translatedText"] == [text]
    assert answer["alternatives"] == [[]]


def test_a_language_not_served_is_not_its_own_target(translator):
    with in_process(translator) as (_, app):
        status, answer = post_json(app, "/translate", {"q": LINE, "source": "fr", "target": "fr"})
    assert status == 400 and "no model translates fr to fr" in answer["error"]


def test_a_browser_s_preflight_is_answered_where_cors_is_on(translator):
    preflight = {
        "Origin": "https://example.org",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    with in_process(translator, cors_origins=["https://example.org"]) as (_, app):
        for path in ("/translate", "/detect", "/languages"):
            status, headers, _ = call(app, "OPTIONS", path, headers=preflight)
            assert status == 200, path
            assert headers["access-control-allow-origin"] == "https://example.org"
            assert "POST" in headers["access-control-allow-methods"]
    with in_process(translator) as (_, app):  # CORS off unless asked: no preflight answered
        status, headers, _ = call(app, "OPTIONS", "/translate", headers=preflight)
        assert status == 405 and "access-control-allow-origin" not in headers


def test_frontend_settings_and_spec_in_libretranslate_s_shape(translator):
    with in_process(translator, max_chars=1234) as (_, app):
        status, _, settings = call(app, "GET", "/frontend/settings")
        spec = call(app, "GET", "/spec")
        openapi = call(app, "GET", "/openapi.json")
        missing = [call(app, "POST", path)[0] for path in ("/suggest", "/translate_file")]
    assert status == 200
    assert settings == {
        "charLimit": 1234,
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": False,
        "supportedFilesFormat": [],
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": "de", "name": "German"},
        },
    }
    assert missing == [404, 404]  # as the serving guide says, and the settings above
    assert spec == openapi and spec[0] == 200
    assert {"/translate", "/languages", "/detect", "/frontend/settings"} <= set(spec[2]["paths"])
