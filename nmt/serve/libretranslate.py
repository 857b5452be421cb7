"""LibreTranslate's API (`POST /translate`, `GET /languages`) over the served models, and HTML
in, HTML out for its `format: "html"` (what Mastodon sends): the text between tags is translated,
the tags, comments and entities' markup are kept as they were."""

from __future__ import annotations

import html
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from nmt.serve.app import ApiError, Model, Service
from nmt.serve.batching import Job

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


def languages(models: dict[str, Model]) -> list[dict[str, Any]]:
    """GET /languages: each source language of the served models and its targets."""
    targets: dict[str, set[str]] = {}
    for m in models.values():
        targets.setdefault(m.source, set()).update(m.targets)
    return [
        {"code": c, "name": NAMES.get(c, c), "targets": sorted(t)}
        for c, t in sorted(targets.items())
        if c
    ]


def _pair(models: dict[str, Model], source: str, target: str) -> tuple[Model, str | None]:
    """The one model that translates `source` (or auto) into `target`, and the >>xxx<< token that
    says it."""
    found = [m for m in models.values() if target in m.targets and source in ("auto", m.source)]
    if len(found) != 1:
        why = "no model translates" if not found else "several models translate"
        raise ApiError(400, f"{why} {source} to {target}; GET /languages lists the pairs")
    return found[0], (None if target == found[0].target else f">>{target}<<")


@dataclass(frozen=True)
class _Asked:
    """A /translate request as checked: its model, its texts as documents (HTML cut into runs of
    text, or plain), the jobs of their runs, and what its answer holds."""

    model: Model
    docs: list[Markup]
    jobs: list[Job]
    alternatives: int
    fmt: str


async def translate(service: Service, request: Any) -> Any:
    """POST /translate: JSON or form data, as LibreTranslate takes and answers it; the request
    checked, its HTML parsed and its answer made on a thread (`Service.off_loop`)."""
    p = await service._payload(request, form=True)  # and authorized
    deadline = service.deadline()
    asked = await service.off_loop(deadline, _asked, service, p)
    results: list[Any] = []
    if asked.jobs:
        results = await service._run(request, asked.model, asked.jobs, deadline, full=429)
    return await service.off_loop(deadline, _answer, asked, p, results)


def _asked(service: Service, p: dict[str, Any]) -> _Asked:
    for key in ("q", "source", "target"):
        if p.get(key) in (None, "", []):
            raise ApiError(400, f"Invalid request: missing {key} parameter")
    fmt = p.get("format") or "text"
    texts = service._texts(p["q"], "q")
    try:
        alternatives = int(p.get("alternatives") or 0)
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400
        alternatives = -1
    if not 0 <= alternatives <= 10 or fmt not in ("text", "html"):
        raise ApiError(400, "Invalid request: alternatives must be 0 to 10 and format text or html")
    model, lang = _pair(service.models, str(p["source"]), str(p["target"]))
    beam = max(model.translator.decode.beam, alternatives + 1)
    settings, _ = model.variant(
        {"beam": beam} if beam != model.translator.decode.beam else {}, alternatives + 1
    )
    docs = [Markup(t) if fmt == "html" else Markup.plain(t) for t in texts]
    segments = [s for d in docs for s in d.texts]
    jobs = service._jobs(model, ("translate", *settings, False, lang), segments, segments)
    return _Asked(model, docs, jobs, alternatives, fmt)


def _answer(asked: _Asked, p: dict[str, Any], results: list[Any]) -> dict[str, Any]:
    """The answer, as LibreTranslate gives it: one text (q a str) is answered without lists."""
    out = []
    alts = []
    for d in asked.docs:
        hyps = results[: len(d.texts)]
        results = results[len(d.texts) :]
        out.append(d.join([h[0].text if h else "" for h in hyps]))
        alts.append(
            [h.text for h in hyps[0][1:]] if asked.fmt == "text" and hyps and hyps[0] else []
        )
    # nmt does not detect languages: the only model into `target` says
    detected = {"confidence": 0.0, "language": asked.model.source}
    answer = {
        "translatedText": out,
        "alternatives": alts if asked.alternatives else None,
        "detectedLanguage": [detected] * len(out) if p["source"] == "auto" else None,
    }
    return {k: v[0] if isinstance(p["q"], str) else v for k, v in answer.items() if v is not None}


_UNTRANSLATED = (
    "script",
    "style",
    "code",
    "pre",
)  # as LibreTranslate's HTML path leaves them (and translate="no")
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


def _keep(form: str) -> Any:
    """A handler that keeps its construct as it was written (`form` with its data for {})."""
    return lambda self, data: self.parts.append(form.format(data))


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

    handle_comment, handle_decl, handle_pi = (_keep(f) for f in ("<!--{}-->", "<!{}>", "<?{}>"))

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
