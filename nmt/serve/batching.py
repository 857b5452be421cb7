"""Dynamic batching across clients: one decode worker per model owns torch.

Requests are split into sentences (`Job`s) and queued. When the worker is free it takes the
oldest waiting sentence and, behind it in arrival order, the others with the same decode
settings (`Job.key`: sentences of different settings never share a batch) while the padded
batch (sentences x the longest source) stays within a token budget. There is no timer by
default: what is waiting when the worker is free goes; `max_wait` (seconds) holds a batch
that is not full until its oldest sentence has waited that long. A batch that fails is
decoded again one sentence at a time, so one bad sentence fails alone. A job whose future was
cancelled (its client went away, its deadline passed) is dropped when it comes up.

Where the model and the batch's settings allow, `stream(key)` gives a running search instead
(nmt.serve.stream): the batch is its first sentences, and before each of its steps the
sentences of its key waiting at the head of the queue join it, within the same budget, until
it has none left. If a step fails, its sentences are decoded again one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from nmt.errors import NmtError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One sentence waiting: `item` is what the decode function gets (a text, a Request, a
    source and target pair), `tokens` its source length for the budget, `index` its place in
    its request (sampling's generator), `where` how errors name it."""

    key: Hashable
    item: Any
    tokens: int
    index: int = 0
    where: str = ""
    future: Future = field(default_factory=Future)
    abandoned: bool = (
        False  # running, but its request was answered otherwise (504) or its client went away
    )
    queued: float = field(default_factory=time.monotonic)


def gathered(jobs: list[Job]) -> asyncio.Future[list[Any]]:
    """The results of `jobs` on the running event loop (their futures gathered). Once their
    futures are cancelled (a 504, a client gone, the server stopping) it holds a CancelledError,
    read here: asyncio logged each as "_GatheringFuture exception was never retrieved"."""
    results = asyncio.gather(*[asyncio.wrap_future(j.future) for j in jobs])
    results.add_done_callback(lambda f: f.cancelled() or f.exception())
    return results


# decode(key, jobs) -> one result per job, in order; raising fails the batch. A key is the
# server's (nmt.serve.model.JobKey): the batcher only compares keys, so any type will do
Decode = Callable[[Any, list[Job]], list[Any]]
# stream(key) -> a search that jobs of `key` join (`run(jobs)` -> [(job, result)] of those that
# ended), or None
Streams = Callable[[Any], Any]
# The server's torch work (loading, warm-up, every batch of every model) runs on this one thread.
# OpenMP, torch's intra-op threads, keeps a team per calling thread; with a second team beside it
# on the same cores it stops spinning between parallel regions, and a lone sentence decoded on
# 2 threads took ~30% longer (docs/benchmarks.md). Running searches take lanes: lane 0 is this
# thread, lane i another, each search on its share of the threads (nmt.serve.stream).
TORCH = ThreadPoolExecutor(1, thread_name_prefix="nmt-torch")
_LANES = [TORCH]


def lane(i: int) -> ThreadPoolExecutor:
    """The thread of decode lane i."""
    while len(_LANES) <= i:
        _LANES.append(ThreadPoolExecutor(1, thread_name_prefix=f"nmt-torch-{len(_LANES)}"))
    return _LANES[i]


class Batcher:
    """The queue and the worker threads of one model, one per lane (`lanes` running searches at
    once); `on_batch(decoded, size)` is told of each batch, or each step of a running search: the
    sentences it finished and those it held."""

    def __init__(
        self,
        decode: Decode,
        *,
        batch_tokens: int,
        max_queue: int,
        max_wait: float = 0.0,
        on_batch: Callable[[int, int], None] = lambda n, s: None,
        name: str = "model",
        stream: Streams = lambda key: None,
        lanes: int = 1,
    ):
        self.decode = decode
        self.batch_tokens = batch_tokens
        self.max_queue = max_queue
        self.max_wait = max_wait
        self.on_batch = on_batch
        self.stream = stream
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False  # _busy: workers decoding
        self._busy = 0
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"nmt-serve-{name}-{i}", daemon=True)
            for i in range(lanes)
        ]
        for thread in self._threads:
            thread.start()

    def depth(self) -> int:
        return len(self._jobs)

    def submit(self, jobs: list[Job]) -> bool:
        """Queue all of `jobs`, or none of them (False) where the queue would hold more than
        max_queue."""
        with self._cond:
            if self._closed or len(self._jobs) + len(jobs) > self.max_queue:
                return False
            self._jobs.extend(jobs)
            self._cond.notify_all()
            return True

    def close(self) -> None:
        """Stop the worker once the batch it decodes is done; jobs still queued are cancelled."""
        with self._cond:
            self._closed = True
            for job in self._jobs:
                job.future.cancel()
            self._jobs.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def _take(self, live: Sequence[Job] = (), lane: int = 0) -> list[Job]:
        """The next batch (see the module's docstring), never empty, for worker `lane`, which
        starts one only while `lane` others decode (lanes fill in order); [] once closed. With the
        `live` jobs of a running search: at once, the waiting jobs that join it (maybe none)."""
        with self._cond:
            while True:
                self._jobs = deque(j for j in self._jobs if not j.future.cancelled())
                if self._closed or (live and (not self._jobs or self._jobs[0].key != live[0].key)):
                    return []
                if not self._jobs or (not live and self._busy < lane):
                    self._cond.wait()
                    continue
                batch: list[Job] = []
                rest: deque[Job] = deque()
                count = len(live)
                longest = max((j.tokens for j in live), default=0)
                key = self._jobs[0].key
                for job in self._jobs:
                    longest_with = max(longest, job.tokens)
                    if job.key == key and (
                        not (batch or live) or longest_with * (count + 1) <= self.batch_tokens
                    ):
                        batch.append(job)
                        count += 1
                        longest = longest_with
                    else:
                        rest.append(job)
                # without `live` the batch holds at least the oldest job
                wait = self.max_wait - (time.monotonic() - batch[0].queued) if not live else 0
                full = any(j.key == key for j in rest)
                if wait > 0 and not full:
                    self._cond.wait(wait)
                    continue
                self._jobs = rest
                batch = [j for j in batch if j.future.set_running_or_notify_cancel()]
                if live:
                    return batch
                if batch:  # else all its jobs were cancelled meanwhile: look again
                    self._busy += 1
                    self._cond.notify_all()  # the next lane may start one now
                    return batch

    def _run(self, lane: int) -> None:
        while batch := self._take(lane=lane):
            try:
                stream = self.stream(batch[0].key)
            except Exception:  # decoded as a batch, whose errors are answers
                stream = None
            if stream is not None:
                self._flow(stream, batch, lane)
            else:
                outcomes = self._decoded(batch)
                self.on_batch(len(batch), len(batch))  # counted before anyone is answered
                self._answer(batch, outcomes)
            with self._cond:
                self._busy -= 1

    def _flow(self, stream: Any, jobs: list[Job], index: int) -> None:
        """Run `stream` on lane `index` until no sentence is left in it: `jobs` start it, others
        join it."""
        live: list[Job] = []
        while jobs or live:
            live += jobs
            # lane 0 alone: every thread (lanes fill in order, so no second OpenMP team); else its
            # share
            try:
                ended = (
                    lane(index).submit(stream.run, jobs, index == 0 and self._busy == 1).result()
                )
            except (
                Exception
            ):  # the search is lost: its sentences one at a time, so that only the bad ones fail
                self.on_batch(len(live), len(live))
                self._answer(live, [self._decoded([job])[0] for job in live])
                break
            self.on_batch(len(ended), len(live))
            finished = {job for job, _ in ended}  # a Job hashes by identity (eq=False)
            live = [job for job in live if job not in finished]
            self._answer([job for job, _ in ended], [(True, result) for _, result in ended])
            jobs = self._take(live) if live else []

    @staticmethod
    def _answer(jobs: list[Job], outcomes: list[tuple[bool, Any]]) -> None:
        for job, (ok, result) in zip(jobs, outcomes, strict=True):
            if ok:
                job.future.set_result(result)
                continue
            if not isinstance(result, NmtError):  # not a user's mistake: logged with its traceback
                log.error("%s: decoding failed", job.where, exc_info=result)
            job.future.set_exception(result)  # the job's answer is its error

    def _decoded(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """(True, result) or (False, exception) of each job; a batch that fails is decoded again
        one sentence at a time, so that only the bad ones fail."""
        try:
            return [(True, r) for r in self.decode(jobs[0].key, jobs)]
        except Exception as exc:
            return [self._decoded([job])[0] for job in jobs] if len(jobs) > 1 else [(False, exc)]
