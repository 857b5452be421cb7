"""HTML in, HTML out (LibreTranslate's `format: "html"`, what Mastodon sends): the text between
tags is translated, the tags, comments and entities' markup are kept as they were."""

from __future__ import annotations

import html
from html.parser import HTMLParser


class Markup(HTMLParser):
    """`texts`: the runs of text to translate, in order; `join(translations)` puts them back
    between the markup (escaped). A run that is only whitespace is kept, not translated."""

    def __init__(self, document: str):
        super().__init__(convert_charrefs=True)
        self.parts: list[str | int] = []  # markup as str, a text run as its index in `texts`
        self.texts: list[str] = []
        self.is_html = True
        self.feed(document)
        self.close()

    @classmethod
    def plain(cls, text: str) -> Markup:
        doc = cls("")
        doc.parts, doc.texts, doc.is_html = [0], [text], False
        return doc

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.parts.append(len(self.texts))
            self.texts.append(data)
        else:
            self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.parts.append(self.get_starttag_text() or f"<{tag}>")

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag: str) -> None:
        self.parts.append(f"</{tag}>")

    def handle_comment(self, data: str) -> None:
        self.parts.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.parts.append(f"<!{decl}>")

    def join(self, translations: list[str]) -> str:
        if not self.is_html:
            return translations[0]
        return "".join(p if isinstance(p, str) else _spaced(self.texts[p], html.escape(translations[p], quote=False))
                       for p in self.parts)


def _spaced(original: str, translation: str) -> str:
    """The translation with the original run's leading and trailing whitespace (between tags it matters)."""
    lead, trail = original[: len(original) - len(original.lstrip())], original[len(original.rstrip()):]
    return lead + translation.strip() + trail
