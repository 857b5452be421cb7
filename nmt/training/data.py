"""The data of a training run, its epochs' batches, and their preparation off the device's
critical path.

`TrainingData.load` reads what a config's data.dir holds for training: the direction, the
tokenizer, the train and valid splits, and the fingerprint that resuming checks.

`epoch_groups` gives this rank's updates of an epoch (each a list of update_freq index
arrays; None where a rank has run out and must run a dummy batch). On a GPU, `Prefetcher`
collates and pins the next updates' batches in a background thread while the device runs
the current one, so that the host's numpy work (a few milliseconds for a 25k-token batch)
never leaves the GPU waiting; the copies to the device are then asynchronous (pinned memory,
non_blocking). On the CPU there is nothing to overlap with: batches are collated in line.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt import data as datamod
from nmt.config import Config
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer
from nmt.training.state import data_fingerprint

PREFETCH_UPDATES = 2  # updates collated ahead of the one on the device


@dataclass
class TrainingData:
    src_lang: str
    tgt_lang: str
    fingerprint: str  # the training data's, direction included (nmt.training.state)
    tokenizer: Tokenizer
    train: datamod.ParallelData
    valid: datamod.ParallelData | None  # None where data.dir has no data.valid_split

    @classmethod
    def load(cls, cfg: Config) -> TrainingData:
        d, t = cfg.data, cfg.train
        meta = datamod.read_meta(d.dir)
        src, tgt = d.source_lang or meta["source_lang"], d.target_lang or meta["target_lang"]
        tokenizer = Tokenizer(Path(d.dir) / "spm.model")
        if t.valid_bleu and t.valid_beam >= tokenizer.vocab_size:  # as decode.beam (config.check_decode)
            raise NmtError(f"train.valid_beam must be smaller than the vocabulary ({tokenizer.vocab_size}), "
                           f"got {t.valid_beam}")
        train = datamod.ParallelData.load(d.dir, d.train_split, src, tgt)
        valid = datamod.ParallelData.load(d.dir, d.valid_split, src, tgt) if d.valid_split in meta.get("splits", {}) \
            else None
        return cls(src, tgt, data_fingerprint(meta, src, tgt), tokenizer, train, valid)


def epoch_groups(batches: Sequence[Any], rank: int, world_size: int, update_freq: int) -> list[list[Any]]:
    """This rank's share of an epoch's batches (`nmt.data.shard_batches`), in updates of
    `update_freq` batches."""
    local = datamod.shard_batches(list(batches), rank, world_size)
    return [local[i : i + update_freq] for i in range(0, len(local), update_freq)]


class Prefetcher:
    """Iterate over `groups` as lists of collated `Batch`es (None stays None), made by a
    background thread at most PREFETCH_UPDATES ahead. An error in the thread is raised here;
    `close()` (or leaving a `with` block) stops the thread."""

    _DONE = object()

    def __init__(self, data: datamod.ParallelData, groups: Sequence[Sequence[np.ndarray | None]], *,
                 pad_to: int, pin_memory: bool):
        self.data, self.groups, self.pad_to, self.pin = data, groups, pad_to, pin_memory
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=PREFETCH_UPDATES)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._work, name="nmt-prefetch", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            for group in self.groups:
                batches = [None if ids is None else
                           datamod.collate(self.data, ids, pin_memory=self.pin, pad_to=self.pad_to) for ids in group]
                if not self._put(batches):
                    return
            self._put(self._DONE)
        except BaseException as e:  # handed to the consumer, which raises it
            self._put(e)

    def _put(self, item: Any) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[list[datamod.Batch | None]]:
        while True:
            item = self.queue.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
