"""`nmt serve`: what one request may ask of the server. Every string a request carries is bounded
by --max-chars, attention by --max-attention; a float setting too large for a float is a 400; a
request's work runs off the event loop and within its deadline, and nothing it sends is kept once
it is answered. Most tests call the ASGI application in process (`asgi`); the API
keys file is read by the command, so its test starts a real server (tests/serving.py). Each runs
on torch and on CTranslate2 (the `engine` fixture)."""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "starlette", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)
pytest.importorskip(
    "uvicorn", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)

from helpers import nmt  # noqa: E402
from serving import Engine, Server, asgi_request, in_process, slow_on_ctranslate2  # noqa: E402

from nmt import Translator  # noqa: E402
from nmt.errors import ConfigError  # noqa: E402
from nmt.fields import coerce  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

BIG = 10**400  # 1e400 written out: JSON has integers of any length
LINE = "A dog runs through the park."


async def asgi(
    app: Any,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """`asgi_request` with a JSON body (or raw bytes) sent as application/json."""
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    head = {"content-type": "application/json", **(headers or {})}
    return await asgi_request(app, method, path, raw, head)


def call(
    app: Any, method: str, path: str, body: Any = None, **kw: Any
) -> tuple[int, dict[str, str], Any]:
    return asyncio.run(asgi(app, method, path, body, **kw))


@pytest.fixture(scope="module")
def translator(engine: Engine, random_checkpoint: Path) -> Translator:
    return engine.load(random_checkpoint, beam=2)


@pytest.fixture(scope="module")
def roomy(engine: Engine, random_checkpoint: Path) -> Translator:
    """Room for long phrases: 100 tokens an output (the checkpoint's decode settings allow 6)."""
    return engine.load(random_checkpoint, beam=2, max_len_b=100)


serving = in_process


# ------------------------------------------------------------------ --max-chars bounds everything


LONG = "Katze " * 10  # 60 characters, over a --max-chars of 50
CARRIED = [
    (
        "constraints",
        {"texts": [{"text": LINE, "constraints": ["Hund", LONG]}]},
        'texts[0]: "constraints" has 64',
    ),
    ("avoid", {"texts": [LINE, {"text": LINE, "avoid": [LONG]}]}, 'texts[1]: "avoid" has 60'),
    ("prefix", {"texts": [{"text": LINE, "prefix": LONG}]}, 'texts[0]: "prefix" has 60'),
    ("terminology", {"texts": [LINE], "terminology": {"dog": LONG}}, '"terminology" has 63'),
    (
        "many terms",
        {"texts": [LINE], "terminology": {f"t{i}": "x" for i in range(20)}},
        '"terminology" has 70',
    ),
    (
        "a lone surrogate in avoid",
        {"texts": [{"text": LINE, "avoid": ["\ud800"]}]},
        'texts[0]: "avoid" holds a NUL or a lone surrogate',
    ),
]


@pytest.mark.parametrize(("body", "message"), [c[1:] for c in CARRIED], ids=[c[0] for c in CARRIED])
def test_max_chars_bounds_every_phrase_and_term_a_request_carries(engine, roomy, body, message):
    """--max-chars bounded the texts alone: a 900,000-character avoided phrase went through."""
    with serving(roomy, max_chars=50) as (_, app):
        status, _, answer = call(app, "POST", "/v1/translate", body)
        assert (status, list(answer)) == (400, ["error"]), answer
        assert message in answer["error"], answer
        assert "more than this server's limit of 50" in answer["error"] or "surrogate" in message
        within = {"texts": [{"text": LINE, "avoid": ["Katze"]}]}
        status, _, answer = call(app, "POST", "/v1/translate", within)
        assert engine.answered(status, answer, "lexical constraints"), answer


def _reachable(root: Any) -> Iterator[Any]:
    """Every object reachable from `root` through references, modules, classes and functions
    aside (their globals reach the whole interpreter, this test's own strings included)."""
    seen, todo = set(), [root]
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.CodeType)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        yield obj
        todo.extend(gc.get_referents(obj))


def test_nothing_a_request_sends_is_kept_once_it_is_answered(engine, translator):
    """The index of each avoided phrase was cached for ever (Surfaces._index: ~17 bytes per byte,
    4,096 phrases), and each request's decode settings kept a translator of their own."""
    marker = f"Zqx{os.getpid()}jv"  # made here: no constant of this module holds it
    lenpen = 0.5 + os.getpid() % 1000 / 7919
    with serving(translator) as (service, app):
        body = {"texts": [{"text": LINE, "avoid": [f"{marker} Katze"]}], "lenpen": lenpen}
        status, _, answer = call(app, "POST", "/v1/translate", body)
        assert engine.answered(status, answer, "lexical constraints"), answer
        kept = [
            o
            for o in _reachable(service)
            if _holds(o, marker) or (isinstance(o, float) and o == lenpen)
        ]
    assert not kept, kept[:3]


def _holds(obj: Any, marker: str) -> bool:
    """Whether `obj` is a str or bytes holding `marker` (as text, or as the UTF-8 of an avoided
    text)."""
    if isinstance(obj, str):
        return marker in obj
    return isinstance(obj, bytes) and marker.encode() in obj


# ------------------------------------------------------------------ attention and the deadline


def test_alignment_or_attention_past_max_attention_is_400_naming_the_cap(translator):
    """4.9 KB of request (beam 16, nbest 16, min_len 1000) asked for a 133 MB answer."""
    with serving(translator, max_attention=1000) as (_, app):
        small = call(app, "POST", "/v1/translate", {"texts": [LINE], "attention": True, "nbest": 2})
        assert small[0] == 200, small
        att = small[2]["translations"][0]["nbest"][0]["attention"]
        assert len(att["weights"]) == len(att["target"]) and len(att["weights"][0]) == len(
            att["source"]
        )
        for flag in ("attention", "alignment"):
            status, _, answer = call(
                app, "POST", "/v1/translate", {"texts": [LINE] * 8, flag: True, "nbest": 2}
            )
            assert status == 400, answer
            assert f'"{flag}" of these texts may need' in answer["error"], answer
            assert "more than this server's limit of 1,000 (--max-attention)" in answer["error"]


def _blocking(
    monkeypatch: pytest.MonkeyPatch, name: str, release: threading.Event, events: list[str]
) -> None:
    """Make the function `name` (module.function, of nmt.serve) wait (at most 60 s) until
    `release` is set, noting when it is called and when it goes on."""
    module, function = name.split(".")
    original = getattr(importlib.import_module(f"nmt.serve.{module}"), function)

    def held(*args: Any, **kw: Any) -> Any:
        events.append("called")
        release.wait(60)
        events.append("released")
        return original(*args, **kw)

    monkeypatch.setattr(f"nmt.serve.{name}", held)


@pytest.mark.parametrize(
    ("name", "body", "needs"),
    [
        (
            "app.terminology_from_pairs",
            {"texts": [LINE], "terminology": {"dog": "Hund"}},
            "lexical constraints",
        ),
        ("answers._hypothesis", {"texts": [LINE], "attention": True}, None),
    ],
    ids=["terminology", "answer"],
)
def test_a_request_s_work_never_holds_up_the_event_loop(
    engine, translator, monkeypatch, name, body, needs
):
    """A request's terminology was compiled and matched, and its answer built, on the event loop:
    25,000 terms froze every client, /health included, for 13.5 s. Here that work is held until
    /health has been answered, which only a free event loop can do."""
    release, events = threading.Event(), []
    _blocking(monkeypatch, name, release, events)

    async def both(app: Any) -> tuple[tuple[int, dict[str, str], Any], int]:
        slow = asyncio.ensure_future(asgi(app, "POST", "/v1/translate", body))
        for _ in range(
            6000
        ):  # until the request's work is held (on the old code: never, the loop is)
            if events:
                break
            await asyncio.sleep(0.01)
        health = await asgi(app, "GET", "/health")
        events.append("health")
        release.set()
        return await slow, health[0]

    with serving(translator) as (_, app):
        (status, _, answer), health = asyncio.run(both(app))
    assert health == 200 and engine.answered(status, answer, needs), answer
    assert events == ["called", "health", "released"]


@slow_on_ctranslate2
def test_an_answer_is_built_within_the_deadline(translator, monkeypatch):
    """An answer with attention was built after --timeout had passed (91 s against 60 s). Here
    its building is held (the sentence itself decodes in well under the 10 s)."""
    release, events = threading.Event(), []
    _blocking(monkeypatch, "answers._hypothesis", release, events)

    async def late(app: Any) -> tuple[int, Any]:
        status, _, answer = await asgi(
            app, "POST", "/v1/translate", {"texts": [LINE], "attention": True}
        )
        release.set()  # the thread building it goes on once released, its answer dropped
        return status, answer

    with serving(translator, timeout=10) as (_, app):
        status, answer = asyncio.run(late(app))
    assert status == 504 and "longer than this server's limit of 10 s" in answer["error"], answer
    assert events[0] == "called", "decoded within the deadline: its answer was being built"


# ------------------------------------------------------------------ numbers


@pytest.mark.parametrize("key", ["lenpen", "max_len_a", "topp", "temperature"])
def test_a_float_setting_of_400_digits_is_400(translator, key):
    """1e400 written out as an integer was a 500 (OverflowError in nmt.fields.coerce)."""
    raw = (
        f'{{"texts": ["{LINE}"], "{key}": {BIG}}}'.encode()
    )  # json.dumps would write the number too
    with serving(translator) as (_, app):
        status, _, answer = call(app, "POST", "/v1/translate", raw)
    assert status == 400 and f'"{key}" must be a finite number' in answer["error"], answer
    assert len(answer["error"]) < 300, "the number is cut short in the message"
    with pytest.raises(ConfigError, match="cfg.yaml: decode.lenpen must be a finite number"):
        coerce(BIG, float, "decode.lenpen", "cfg.yaml")  # a config file's `lenpen: 1000...0`


def test_a_max_len_b_of_400_digits_means_no_limit_as_1e30_does(
    engine, translator, random_checkpoint
):
    """It passed the checks and failed in the search: a 500 from the server, a traceback from
    `nmt translate --max-len-b 1000...0`. Like --max-len-b 1e30, it leaves the model's positions
    as the only limit."""
    want = engine.load(random_checkpoint, beam=2, max_len_b=10**30).translate([LINE])
    raw = f'{{"texts": ["{LINE}"], "max_len_b": {BIG}}}'.encode()
    with serving(translator) as (_, app):
        status, _, answer = call(app, "POST", "/v1/translate", raw)
    assert status == 200 and [t["text"] for t in answer["translations"]] == want, answer
    r = nmt(
        "translate",
        "-c",
        str(random_checkpoint),
        *engine.args,
        "--beam",
        "2",
        "--max-len-b",
        str(BIG),
        stdin=LINE + "\n",
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.splitlines() == want, r.stderr[-2000:]


# ------------------------------------------------------------------ terminology, CORS, the page


@pytest.mark.parametrize("term", ["", "  "], ids=["empty", "spaces"])
def test_an_empty_term_of_a_request_is_400(translator, term):
    """{"terminology": {"": "Katze"}} forced "Katze" into every translation."""
    with serving(translator) as (_, app):
        status, _, answer = call(
            app, "POST", "/v1/translate", {"texts": [LINE], "terminology": {term: "Katze"}}
        )
    assert status == 400 and '"terminology"' in answer["error"] and "empty" in answer["error"], (
        answer
    )


def test_a_refused_cors_preflight_is_a_json_error_and_the_page_refuses_frames(translator):
    preflight = {"origin": "https://elsewhere.example", "access-control-request-method": "POST"}
    with serving(translator, cors_origins=["https://ok.example"]) as (_, app):
        status, headers, answer = call(app, "OPTIONS", "/v1/translate", headers=preflight)
        assert (status, answer) == (400, {"error": "Disallowed CORS origin"}), answer
        assert headers["content-type"] == "application/json"
        allowed = call(
            app, "OPTIONS", "/v1/translate", headers={**preflight, "origin": "https://ok.example"}
        )
        assert (
            allowed[0] == 200 and allowed[1]["access-control-allow-origin"] == "https://ok.example"
        )
        status, headers, page = call(app, "GET", "/")
    assert status == 200 and "<html" in page.lower()
    assert (
        "frame-ancestors 'none'" in headers["content-security-policy"]
        and headers["x-frame-options"] == "DENY"
    )


# ------------------------------------------------------------------ API keys


@slow_on_ctranslate2
def test_api_keys_file_comments_bom_and_the_bearer_scheme_in_any_case(
    engine, random_checkpoint, tmp_path
):
    """An indented "  # old-key" was a key, a UTF-8 BOM broke the first key, and
    "Authorization: bearer KEY" (the scheme in lower case) was 403."""
    keys = tmp_path / "keys.txt"
    keys.write_bytes("\ufefffirst-key\n  # old-key\n\tsecond-key  \n".encode())
    body = {"texts": [LINE]}
    with Server(
        *engine.args, "--model", f"en-de={random_checkpoint}", "--api-keys", str(keys)
    ) as s:
        assert s.post("/v1/translate", {**body, "api_key": "first-key"})[0] == 200
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert (
                s.post("/v1/translate", body, headers={"Authorization": f"{scheme} second-key"})[0]
                == 200
            ), scheme
        for wrong in ("# old-key", "old-key", "\ufefffirst-key"):
            assert s.post("/v1/translate", {**body, "api_key": wrong})[0] == 403, wrong
