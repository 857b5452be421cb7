"""What `POST /v1/translate` answers: each text's hypotheses with their scores, alignments as
character spans of the source and the translation, and attention weights. Built on a thread
within the request's deadline (nmt.serve.app), as an answer with attention may be megabytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nmt.api import Translation
from nmt.decoding.alignment import layer_count, resolve_layer
from nmt.serve.batching import Job
from nmt.serve.model import Model
from nmt.terminology import Request


@dataclass(frozen=True)
class Asked:
    """A /v1/translate request as checked: its model, its texts' requests, their jobs, and whether
    its answer holds alignments and attention."""

    model: Model
    requests: list[Request]
    jobs: list[Job]
    alignment: bool
    attention: bool


def answer(asked: Asked, results: list[list[Translation]]) -> dict[str, Any]:
    """The answer to `asked`, given the hypotheses of each of its texts."""
    tr = asked.model.translator
    layer = resolve_layer(tr.alignment_layer, layer_count(tr.loaded.model) or 1)
    return {
        "model": asked.model.name,
        "translations": [
            {
                "text": hyps[0].text if hyps else "",
                "nbest": [
                    _hypothesis(h, r.text, asked.alignment, asked.attention, layer) for h in hyps
                ],
            }
            for r, hyps in zip(asked.requests, results, strict=True)
        ],
    }


def number(x: float) -> float | None:
    return round(x, 6) if x == x and abs(x) != float("inf") else None  # JSON has no infinity


def _spans(pieces: list[str], text: str) -> list[list[int] | None]:
    """Where each sentencepiece piece is in `text`: [start, end) character offsets, None for a
    piece not found in order (a language token, EOS, a character normalization changed)."""
    out = []
    pos = 0
    for piece in pieces:
        surface = piece.replace("\u2581", " ").strip()
        start = text.find(surface, pos) if surface else -1
        out.append([start, start + len(surface)] if start >= 0 else None)
        pos = start + len(surface) if start >= 0 else pos
    return out


def _hypothesis(
    t: Translation, source: str, alignment: bool, attention: bool, layer: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"text": t.text, "score": number(t.score), "logprob": number(t.logprob)}
    if t.attention is not None and (alignment or attention):
        src = _spans(t.attention.source, source)
        tgt = _spans(t.attention.target, t.text)
        if alignment:
            out["alignment"] = [
                {"source": src[i], "target": tgt[j]}
                for i, j in t.alignment or []
                if src[i] and tgt[j]
            ]
        if attention:
            weights = t.attention.weights[layer].mean(0)
            out["attention"] = {
                "source": t.attention.source,
                "target": t.attention.target,
                "weights": [[round(float(w), 4) for w in row] for row in weights],
            }
    return out
