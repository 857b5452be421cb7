"""A served model: its translator, its languages, its queue, the translator of a request's own
decode settings, and the decode function its queue's workers call (nmt.serve.batching). A
sentence waits in that queue as a `Job` whose key (`JobKey`) says what is done with it."""

from __future__ import annotations

from collections.abc import Sequence
from copy import copy
from dataclasses import dataclass, replace
from typing import Any, Literal

from nmt.api import Translation, Translator
from nmt.decoding.predict import decode_config
from nmt.serve.batching import TORCH, Batcher, Job
from nmt.serve.stream import Stream, can_stream
from nmt.terminology import Request


@dataclass(frozen=True)
class JobKey:
    """What the sentences of one batch share (sentences of different keys never share one):
    the task and its settings. Made for each request, never kept: what a request sends stays in
    memory only while it is answered."""

    task: Literal["translate", "score"]
    # decode settings over the served ones, as sorted (name, value) pairs
    overrides: tuple[tuple[str, Any], ...] = ()
    nbest: int = 1
    # each hypothesis' attention and alignment decoded too
    attend: bool = False
    # the target-language token (">>fra<<"), None for the model's own
    lang: str | None = None
    # scoring: the log-probability divided by the target's length
    normalize: bool = False
    # no lexical constraints: the sentence can join a running search (nmt.serve.stream)
    plain: bool = True

    @classmethod
    def translation(
        cls, overrides: dict[str, Any], nbest: int, attend: bool, lang: str | None
    ) -> JobKey:
        return cls("translate", tuple(sorted(overrides.items())), nbest, attend, lang)


@dataclass(eq=False)
class Model:
    """A served checkpoint: its translator, languages and queue. A request's other decode settings
    get a translator of their own (`variant`), made again wherever needed and never kept."""

    name: str
    translator: Translator
    source: str
    target: str
    batcher: Batcher | None = None
    # sentences join a running search where they can (--no-continuous: batches)
    continuous: bool = True
    # torch threads of a running search, with others and alone (nmt.serve.stream)
    threads: tuple[int, int] = (1, 1)

    @property
    def targets(self) -> list[str]:
        tokens = [t[2:-2] for t in self.translator.loaded.tokenizer.language_tokens()]
        return sorted({self.target, *tokens} - {""})

    def variant(self, key: JobKey) -> Translator:
        """The translator of the key's decode settings over the served ones (checked: an NmtError,
        a 400, if wrong): a shallow copy of the served one (model, options, terminology), made in
        well under a millisecond."""
        base = self.translator
        if not key.overrides and key.nbest == 1:
            return base
        tr = copy(base)
        tr.decode = decode_config(
            base.decode,
            dict(key.overrides),
            key.nbest,
            vocab_size=base.loaded.tokenizer.vocab_size,
            option=lambda k: f'"{k}"',
        )
        return tr

    def jobs(
        self, key: JobKey, items: list[Any], texts: list[str], owners: Sequence[int]
    ) -> list[Job]:
        """The jobs of `items` (sentences, Requests, source and target pairs), whose sources are
        `texts`, of the request's texts `owners` (item i of text owners[i]); a sentence with
        lexical constraints never joins a running search. A job's index (its sampling generator)
        is its item's place in the request, as `Translator.translate_nbest` numbers sentences."""
        encode = self.translator.loaded.tokenizer.encode
        constrained = replace(key, plain=False)
        return [
            Job(
                constrained if isinstance(item, Request) and item.asks() else key,
                item,
                tokens=len(encode(text)) + 1,
                index=i,
                where=f"texts[{owner}]",
            )
            for i, (item, text, owner) in enumerate(zip(items, texts, owners, strict=True))
        ]

    def stream(self, key: JobKey) -> Stream | None:
        """The batcher's `stream` (continuous batching, nmt.serve.stream) for a key whose sentences
        can join one."""
        if key.task != "translate" or not key.plain or not self.continuous:
            return None
        tr = self.variant(key)
        return Stream(tr, key.nbest, key.attend, key.lang, self.threads) if can_stream(tr) else None

    def decode(self, key: JobKey, jobs: list[Job]) -> list[Any]:
        """The worker's decode function (nmt.serve.batching): the results of a batch of one key,
        decoded by CTranslate2 on the worker's own thread (it releases the interpreter lock, so
        each worker keeps one of its `inter_threads` busy), or by torch on the one torch thread."""
        tr = self.variant(key)
        if (
            tr.engine is not None
            and key.plain
            and not key.attend
            and tr.on_engine(constrained=False)
        ):
            return self._decoded(tr, key, jobs)
        return TORCH.submit(self._decoded, tr, key, jobs).result()

    def _decoded(self, tr: Translator, key: JobKey, jobs: list[Job]) -> list[Any]:
        """The results of a batch of one key, decoded by `tr`, its translator (`variant`)."""
        if key.task == "score":
            return self.translator.score(
                [j.item[0] for j in jobs], [j.item[1] for j in jobs], normalize=key.normalize
            )
        if tr.decode.sampling:  # a sentence's generator is its index in its request: one at a time
            return [_translated(tr, key, [j])[0] for j in jobs]
        # cut into the command's batches (decode.batch_size), one per CPU worker: a batch of at
        # most batch_size runs whole on every thread, faster than cut in halves
        # (docs/benchmarks.md)
        return _translated(tr, key, jobs)


def _translated(tr: Translator, key: JobKey, jobs: list[Job]) -> list[list[Translation]]:
    """The hypotheses of `jobs`, sentence i the request's sentence jobs[0].index + i (sampling's
    generator); a sentence nobody waits for any more (a 504, a client gone) ends at its search's
    next step."""
    return tr.translate_nbest(
        [j.item for j in jobs],
        key.nbest,
        where=lambda i: jobs[i].where,
        first_index=jobs[0].index,
        alignment=key.attend,
        attention=key.attend,
        target_lang=key.lang,
        abandoned=lambda i: jobs[i].abandoned,
    )
