"""LibreTranslate's API (`POST /translate`, `GET /languages`, `POST /detect`,
`GET /frontend/settings`) over the served models, and HTML in, HTML out for its
`format: "html"` (what Mastodon sends): the text between tags is translated, the tags, comments
and entities' markup are kept as they were. Language codes are read in any case."""

from __future__ import annotations

import html
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from nmt.api import joined
from nmt.segment import Segmented, per_text
from nmt.serve.batching import Job
from nmt.serve.model import JobKey, Model
from nmt.serve.requests import ApiError, Limits

# the Warning header's text where a sentence was too long for the model
CUT = "a sentence longer than the model's maximum was translated in pieces"
NAMES = {
    "ar": "Arabic",
    "cs": "Czech",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "it": "Italian",
    "ja": "Japanese",
    "mg": "Malagasy",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ru": "Russian",
    "uk": "Ukrainian",
    "zh": "Chinese",
}


def _served(models: dict[str, Model]) -> dict[str, set[str]]:
    """Each language of the served models and the languages it translates into: a model's source
    into its targets, and, as in LibreTranslate, every language into itself (answered as it is).
    Weblate offers a pair only where both of its languages are listed."""
    targets: dict[str, set[str]] = {}
    for m in models.values():
        for code in (m.source, *m.targets):
            targets.setdefault(code, {code})
        targets[m.source].update(m.targets)
    targets.pop("", None)  # a model whose config names no language
    return targets


def languages(models: dict[str, Model]) -> list[dict[str, Any]]:
    """GET /languages: each language of the served models and its targets."""
    return [
        {"code": c, "name": NAMES.get(c, c), "targets": sorted(t)}
        for c, t in sorted(_served(models).items())
    ]


def frontend_settings(limits: Limits, models: dict[str, Model]) -> dict[str, Any]:
    """GET /frontend/settings: LibreTranslate's page settings, for clients that read its limits;
    no suggestions, no files."""
    target = next((m.target for m in models.values()), "")
    return {
        "charLimit": limits.opts.max_chars,
        "frontendTimeout": 500,
        "apiKeys": bool(limits.keys),
        "keyRequired": bool(limits.keys),
        "suggestions": False,
        "filesTranslation": False,
        "supportedFilesFormat": [],
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": target, "name": NAMES.get(target, target)},
        },
    }


async def detect(limits: Limits, models: dict[str, Model], request: Any) -> Any:
    """POST /detect, as the `libretranslate` client's detect() sends it: nmt detects no language,
    so the answer is the served models' source languages, each as likely (one: confidence 100)."""
    p = await limits.payload(request, form=True)  # and authorized
    if p.get("q") in (None, "", []):
        raise ApiError(400, "Invalid request: missing q parameter")
    await limits.off_loop(limits.deadline(), limits.texts, p["q"], "q")
    sources = sorted({m.source for m in models.values() if m.source})
    return [{"confidence": 100 / len(sources), "language": s} for s in sources]


def _pair(models: dict[str, Model], source: str, target: str) -> tuple[Model, str | None]:
    """The one model that translates `source` (or auto) into `target` (both lower case), and the
    >>xxx<< token that says it, as the model spells it."""
    found = []
    for m in models.values():
        spelled = {t.lower(): t for t in m.targets}
        if target in spelled and source in ("auto", m.source.lower()):
            found.append((m, spelled[target]))
    if len(found) != 1:
        why = "no model translates" if not found else "several models translate"
        raise ApiError(400, f"{why} {source} to {target}; GET /languages lists the pairs")
    model, lang = found[0]
    return model, (None if lang == model.target else f">>{lang}<<")


@dataclass(frozen=True)
class _Asked:
    """A /translate request as checked: its model, its texts as documents (HTML cut into runs of
    text, or plain), their runs cut into sentences and the jobs of these sentences, and what its
    answer holds. A text asked in its own language has no model and no jobs."""

    model: Model | None
    docs: list[Markup]
    # the runs of text of all docs, in order, as sentences
    parts: list[Segmented]
    jobs: list[Job]
    alternatives: int
    fmt: str
    # the texts' language: the model's source (detectedLanguage where it was "auto")
    source: str


async def translate(limits: Limits, models: dict[str, Model], request: Any) -> Any:
    """POST /translate: JSON or form data, as LibreTranslate takes and answers it; the request
    checked, its HTML parsed and its answer made on a thread (`Limits.off_loop`)."""
    p = await limits.payload(request, form=True)  # and authorized
    deadline = limits.deadline()
    asked = await limits.off_loop(deadline, _asked, limits, models, p)
    results: list[Any] = []
    if asked.model is not None and asked.jobs:
        results = await limits.run(request, asked.model, asked.jobs, deadline, full=429)
    return await limits.off_loop(deadline, _answer, asked, p, results)


def _asked(limits: Limits, models: dict[str, Model], p: dict[str, Any]) -> _Asked:
    for name in ("q", "source", "target"):
        if p.get(name) in (None, "", []):
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    fmt = p.get("format") or "text"
    texts = limits.texts(p["q"], "q")
    try:
        alternatives = int(p.get("alternatives") or 0)
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400
        alternatives = -1
    if not 0 <= alternatives <= 10 or fmt not in ("text", "html"):
        raise ApiError(400, "Invalid request: alternatives must be 0 to 10 and format text or html")
    source = str(p["source"]).lower()
    target = str(p["target"]).lower()
    served = {code.lower() for code in _served(models)}
    sources = {m.source.lower() for m in models.values()}
    if source == "auto" and len(sources) == 1:  # what /detect says
        source = sources.pop()
    if source == target and source in served:  # LibreTranslate answers it as it is
        return _Asked(None, [Markup.as_is(t) for t in texts], [], [], alternatives, fmt, source)
    model, lang = _pair(models, source, target)
    beam = max(model.translator.decode.beam, alternatives + 1)
    overrides = {"beam": beam} if beam != model.translator.decode.beam else {}
    key = JobKey.translation(overrides, alternatives + 1, attend=False, lang=lang)
    model.variant(key)  # checked here: a 400, not a failed batch
    docs = [Markup(t) if fmt == "html" else Markup.plain(t) for t in texts]
    # each run of text (a plain text, an HTML text node) cut into its sentences
    parts = [model.translator.segmented(run, lang) for d in docs for run in d.texts]
    sentences = [part.text[a:b] for part in parts for a, b in part.spans]
    owners = [i for i, part in enumerate(parts) for _ in part.spans]
    jobs = model.jobs(key, sentences, sentences, owners)
    return _Asked(model, docs, parts, jobs, alternatives, fmt, model.source)


def _answer(asked: _Asked, p: dict[str, Any], results: list[Any]) -> Any:
    """The answer, as LibreTranslate gives it: each run's sentences put back in its place
    (`nmt.api.joined`: one sentence's alternatives, the best of each of several); one text (q a
    str) answered without lists. A sentence too long for the model, translated in pieces, is
    said in a `Warning` header, as LibreTranslate's answer has no field for it."""
    from starlette.responses import JSONResponse

    out = []
    alts = []
    runs = [joined(part, hyps) for part, hyps in zip(asked.parts, per_text(asked.parts, results))]
    for d in asked.docs:
        hyps = runs[: len(d.texts)]
        runs = runs[len(d.texts) :]
        out.append(d.join([h[0].text if h else "" for h in hyps]))
        alts.append(
            [h.text for h in hyps[0][1:]] if asked.fmt == "text" and hyps and hyps[0] else []
        )
    # nmt does not detect languages: the only model into `target` says, as /detect does
    detected = {"confidence": 100.0, "language": asked.source}
    auto = str(p["source"]).lower() == "auto"
    fields = {
        "translatedText": out,
        "alternatives": alts if asked.alternatives else None,
        "detectedLanguage": [detected] * len(out) if auto else None,
    }
    answer = {k: v[0] if isinstance(p["q"], str) else v for k, v in fields.items() if v is not None}
    if not any(part.cut for part in asked.parts):
        return answer
    return JSONResponse(answer, headers={"Warning": f'299 - "{CUT}"'})


# as LibreTranslate's HTML path leaves them (and translate="no")
_UNTRANSLATED = ("script", "style", "code", "pre")
_VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


class Markup(HTMLParser):
    """`texts`: the runs of text to translate, in order; `join(translations)` puts them back
    between the markup (escaped). A run that is only whitespace is kept, not translated, and so
    is the text of an element LibreTranslate leaves alone (script, style, code, translate="no")
    and an unfinished tag at the end (`A dog <b`)."""

    def __init__(self, document: str):
        super().__init__(convert_charrefs=True)
        # parts: markup as str, a text run as its index in `texts`; kept: the open element whose
        # text stays
        self.parts: list[str | int] = []
        self.texts: list[str] = []
        self.is_html = True
        self.kept = ""
        self.depth = 0
        self.feed(document)
        if self.rawdata.startswith("<"):  # a tag the document never finishes: kept as written
            self.parts.append(self.rawdata)
            self.rawdata = ""
        self.close()

    @classmethod
    def as_is(cls, text: str) -> Markup:
        """A text answered as it is (asked in its own language), whatever its format."""
        doc = cls("")
        doc.parts = [text]
        return doc

    @classmethod
    def plain(cls, text: str) -> Markup:
        doc = cls("")
        doc.parts = [0]
        doc.texts = [text]
        doc.is_html = False
        return doc

    def handle_data(self, data: str) -> None:
        if data.strip() and not self.kept:
            self.parts.append(len(self.texts))
            self.texts.append(data)
        else:  # script and style text is never unescaped (CDATA_CONTENT_ELEMENTS)
            self.parts.append(
                data if self.kept in ("script", "style") else html.escape(data, quote=False)
            )

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.parts.append(self.get_starttag_text() or f"<{tag}>")
        if (
            not self.kept
            and tag not in _VOID
            and (tag in _UNTRANSLATED or ("translate", "no") in attrs)
        ):
            self.kept = tag
        self.depth += tag == self.kept

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.parts.append(self.get_starttag_text() or f"<{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        self.parts.append(f"</{tag}>")
        self.depth -= tag == self.kept
        self.kept = self.kept if self.depth else ""

    # comments, declarations and processing instructions are kept as they were written
    def handle_comment(self, data: str) -> None:
        self.parts.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.parts.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.parts.append(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:  # <![CDATA[...]]>, <![if IE]>
        self.parts.append(f"<![{data}]{']' if data.startswith('CDATA[') else ''}>")

    def join(self, translations: list[str]) -> str:
        if not self.is_html:
            return translations[0]
        return "".join(
            p
            if isinstance(p, str)
            else _spaced(self.texts[p], html.escape(translations[p], quote=False))
            for p in self.parts
        )


def _spaced(original: str, translation: str) -> str:
    """The translation with the original run's leading and trailing whitespace (between tags it
    matters)."""
    lead = original[: len(original) - len(original.lstrip())]
    trail = original[len(original.rstrip()) :]
    return lead + translation.strip() + trail
