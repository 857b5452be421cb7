"""Continuous batching: a served model's sentences join one running beam search between its
steps (`nmt.decoding.search.BeamSearch`) and are answered as soon as their search ends.

With batches, a sentence that arrives while a batch is decoded waits for the whole batch, and a
batch takes as long as its longest sentence: with n clients each sending its next sentence when
answered, they all wait on the slowest of the batch. Here the batch never ends: every step
takes in what is waiting and gives back what is done, so the rows the step computes stay
filled (docs/serving.md). It takes the plain beam search of a Transformer (or an ensemble
of them); sampling, lexical constraints, terminology and shortlists decode by batch.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from nmt.api import Translator
from nmt.data import pad_rows
from nmt.decoding.predict import decode_autocast
from nmt.decoding.search import BeamSearch


def can_stream(tr: Translator) -> bool:
    """Whether this translator's sentences can join a running search (torch's: not where
    CTranslate2 decodes them)."""
    model = tr.loaded.model
    return (
        tr.engine is None
        and not tr.decode.sampling
        and tr.shortlist is None
        and tr.terminology is None
        and all(hasattr(m, "merge") for m in getattr(model, "models", [model]))
    )


class Stream:
    """One decode setting's running search; the batcher's worker calls `run` on its lane's thread
    (nmt.serve.batching.lane)."""

    def __init__(
        self, tr: Translator, nbest: int, attend: bool, lang: str | None, threads: tuple[int, int]
    ):
        self.tr = tr
        self.attend = attend
        self.lang = lang or tr.target_lang
        self.threads = threads
        self.search = BeamSearch(
            tr.loaded.model,
            tr.decode,
            nbest=nbest,
            **asdict(tr.loaded.tokenizer.specials),
            max_len=tr.loaded.max_positions,
        )
        self.sources: dict[Any, list[int]] = {}  # a live job's source tokens

    def run(self, jobs: list[Any], alone: bool = False) -> list[tuple[Any, list[Any]]]:
        """The `jobs` (nmt.serve.batching.Job; items: texts or `Request`s without constraints) join
        the search, which decodes one step (on every thread when `alone`, the only search
        running, else on its share): the jobs that ended, each with its translations."""
        tr = self.tr
        specials = tr.loaded.tokenizer.specials
        torch.set_num_threads(self.threads[alone])
        seqs = tr.encode(
            [getattr(j.item, "text", j.item) for j in jobs], lambda i: jobs[i].where, lang=self.lang
        )
        ended: list[tuple[Any, list[Any]]] = [
            (j, []) for j, s in zip(jobs, seqs) if not s
        ]  # a blank text
        new = [(j, s) for j, s in zip(jobs, seqs) if s]
        with torch.inference_mode(), decode_autocast(tr.device, tr.precision):
            if new:
                src = pad_rows([[*s, specials.eos] for _, s in new], specials.pad)
                self.search.add(src.to(tr.device), [j for j, _ in new])
                self.sources.update(new)
            if gone := [
                j for j in self.search.books.tags if getattr(j, "abandoned", False)
            ]:  # a 504, a client gone
                self.search.expire(gone)
            done = self.search.step() if len(self.search) else []
        if done:
            seqs = [self.sources.pop(j) for j, _ in done]
            out = tr.translations(seqs, [h for _, h in done], self.attend, self.attend)
            ended += [(j, t) for (j, _), t in zip(done, out, strict=True)]
        return ended
