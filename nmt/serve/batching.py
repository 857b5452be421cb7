"""Dynamic batching across clients: one decode worker per model owns torch.

Requests are split into sentences (`Job`s) and queued. When the worker is free it takes the
oldest waiting sentence and, behind it in arrival order, the others with the same decode
settings (`Job.key`: sentences of different settings never share a batch) while the padded
batch (sentences x the longest source) stays within a token budget. There is no timer by
default: what is waiting when the worker is free goes; `max_wait` (seconds) holds a batch
that is not full until its oldest sentence has waited that long. A batch that fails is
decoded again one sentence at a time, so one bad sentence fails alone. A job whose future was
cancelled (its client went away, its deadline passed) is dropped when it comes up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
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
    queued: float = field(default_factory=time.monotonic)


# decode(key, jobs) -> one result per job, in order; raising fails the batch
Decode = Callable[[Hashable, list[Job]], list[Any]]
# The server's torch work (loading, warm-up, every batch of every model) runs on this one thread.
# OpenMP, torch's intra-op threads, keeps a team per calling thread; with a second team beside it
# on the same cores it stops spinning between parallel regions, and a lone sentence decoded on
# 2 threads took ~30% longer (docs/benchmarks.md).
TORCH = ThreadPoolExecutor(1, thread_name_prefix="nmt-torch")


class Batcher:
    """The queue and the worker thread of one model; `on_batch(size, seconds)` is told of each batch."""

    def __init__(self, decode: Decode, *, batch_tokens: int, max_queue: int, max_wait: float = 0.0,
                 on_batch: Callable[[int, float], None] = lambda n, s: None, name: str = "model"):
        self.decode, self.batch_tokens, self.max_queue, self.max_wait = decode, batch_tokens, max_queue, max_wait
        self.on_batch = on_batch
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"nmt-serve-{name}", daemon=True)
        self._thread.start()

    def depth(self) -> int:
        return len(self._jobs)

    def submit(self, jobs: list[Job]) -> bool:
        """Queue all of `jobs`, or none of them (False) where the queue would hold more than max_queue."""
        with self._cond:
            if self._closed or len(self._jobs) + len(jobs) > self.max_queue:
                return False
            self._jobs.extend(jobs)
            self._cond.notify()
            return True

    def close(self) -> None:
        """Stop the worker once the batch it decodes is done; jobs still queued are cancelled."""
        with self._cond:
            self._closed = True
            for job in self._jobs:
                job.future.cancel()
            self._jobs.clear()
            self._cond.notify()
        self._thread.join()

    def _take(self) -> list[Job]:
        """The next batch (see the module's docstring), never empty; [] once closed."""
        with self._cond:
            while True:
                self._jobs = deque(j for j in self._jobs if not j.future.cancelled())
                if self._closed:
                    return []
                if not self._jobs:
                    self._cond.wait()
                    continue
                batch: list[Job] = []
                rest: deque[Job] = deque()
                longest = 0
                key = self._jobs[0].key
                for job in self._jobs:
                    longest_with = max(longest, job.tokens)
                    if job.key == key and (not batch or longest_with * (len(batch) + 1) <= self.batch_tokens):
                        batch.append(job)
                        longest = longest_with
                    else:
                        rest.append(job)
                wait = self.max_wait - (time.monotonic() - batch[0].queued)
                full = any(j.key == key for j in rest)
                if wait > 0 and not full:
                    self._cond.wait(wait)
                    continue
                self._jobs = rest
                batch = [j for j in batch if j.future.set_running_or_notify_cancel()]
                if batch:  # else all its jobs were cancelled meanwhile: look again
                    return batch

    def _run(self) -> None:
        while batch := self._take():
            start = time.perf_counter()
            outcomes = self._decoded(batch)
            self.on_batch(len(batch), time.perf_counter() - start)  # counted before anyone is answered
            for job, (ok, result) in zip(batch, outcomes, strict=True):
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
            return [(True, r) for r in TORCH.submit(self.decode, jobs[0].key, jobs).result()]
        except Exception as exc:
            return [self._decoded([job])[0] for job in jobs] if len(jobs) > 1 else [(False, exc)]
