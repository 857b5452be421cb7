"""What `POST /v1/translate` answers: each text's hypotheses with their scores (its sentences'
translations put back in its place), alignments as character spans of the text and of its
translation, and attention weights. Built on a thread within the request's deadline
(nmt.serve.app), as an answer with attention may be megabytes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nmt.api import Translation, joined
from nmt.decoding.alignment import layer_count, resolve_layer
from nmt.segment import Segmented, per_text
from nmt.serve.batching import Job
from nmt.serve.model import Model


@dataclass(frozen=True)
class Asked:
    """A /v1/translate request as checked: its model, its texts as sentences to translate (a text
    with constraints or a prefix, or asked for attention, as one span: translated whole), their
    jobs in order, and whether its answer holds alignments and attention."""

    model: Model
    parts: list[Segmented]
    jobs: list[Job]
    alignment: bool
    attention: bool


def answer(asked: Asked, results: list[list[Translation]]) -> dict[str, Any]:
    """The answer to `asked`, given the hypotheses of each of its sentences."""
    tr = asked.model.translator
    layer = resolve_layer(tr.alignment_layer, layer_count(tr.loaded.model) or 1)
    per = per_text(asked.parts, results)
    return {
        "model": asked.model.name,
        "translations": [
            _translation(asked, part, hyps, layer) for part, hyps in zip(asked.parts, per)
        ],
    }


def _translation(
    asked: Asked, part: Segmented, hyps: list[list[Translation]], layer: int
) -> dict[str, Any]:
    """A text's answer from its sentences' hypotheses, put back in its place (`nmt.api.joined`:
    one sentence's n-best, or the best of each of several); `"split": true` where a sentence
    was too long for the model and was translated in pieces."""
    nbest = []
    for n, whole in enumerate(joined(part, hyps)):
        used = [hyps[0][n]] if len(hyps) == 1 else [hs[0] for hs in hyps]
        nbest.append(_hypothesis(asked, part, whole, used, layer))
    answered: dict[str, Any] = {"text": nbest[0]["text"] if nbest else "", "nbest": nbest}
    if part.cut:
        answered["split"] = True
    return answered


def _hypothesis(
    asked: Asked, part: Segmented, whole: Translation, used: list[Translation], layer: int
) -> dict[str, Any]:
    """One hypothesis of a text (`whole`, made of its sentences' hypotheses `used`) as answered:
    its text and scores, with its alignment and attention where asked (attention: a text
    translated whole, one sentence)."""
    out: dict[str, Any] = {
        "text": whole.text,
        "score": number(whole.score),
        "logprob": number(whole.logprob),
    }
    if asked.alignment:
        out["alignment"] = _alignment(part, used)
    if asked.attention and len(used) == 1 and used[0].attention is not None:
        weights = used[0].attention.weights[layer].mean(0)
        out["attention"] = {
            "source": used[0].attention.source,
            "target": used[0].attention.target,
            "weights": [[round(float(w), 4) for w in row] for row in weights],
        }
    return out


def _alignment(part: Segmented, used: list[Translation]) -> list[dict[str, list[int]]]:
    """The aligned pieces of each sentence's hypothesis in `used` as character spans of the text
    and of its translation: a sentence's source spans moved by its start in the text, its target
    spans by where its translation starts in the joined one (`Segmented.joined`)."""
    out = []
    starts = part.joined([h.text for h in used])[1]
    for (first, end), h, start in zip(part.spans, used, starts, strict=True):
        if h.attention is None:
            continue
        src = _spans(h.attention.source, part.text[first:end], first)
        tgt = _spans(h.attention.target, h.text, start)
        for i, j in h.alignment or []:
            source = src[i]
            target = tgt[j]
            if source and target:
                out.append({"source": source, "target": target})
    return out


def number(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None  # JSON has no infinity or NaN


def _spans(pieces: list[str], text: str, offset: int) -> list[list[int] | None]:
    """Where each sentencepiece piece is in `text`, itself at `offset` of what the answer names:
    [start, end) character offsets there, None for a piece not found in order (a language
    token, EOS, a character normalization changed)."""
    out = []
    pos = 0
    for piece in pieces:
        surface = piece.replace("\u2581", " ").strip()
        start = text.find(surface, pos) if surface else -1
        out.append([offset + start, offset + start + len(surface)] if start >= 0 else None)
        pos = start + len(surface) if start >= 0 else pos
    return out
