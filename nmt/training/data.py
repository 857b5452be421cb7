"""The data of a training run, its epochs' batches, and their preparation off the device's
critical path.

`TrainingData.load` reads what a config's data.dir holds for training: the direction, the
tokenizer, the train and valid splits, and the fingerprint that resuming checks.

`epoch_updates` gives this rank's updates of an epoch (each a list of update_freq index
arrays; `EMPTY_SHARD` where the rank's share has run out), `dummy_batch` what such a rank runs
with weight 0, so that it takes part in DDP's gradient all-reduce. On a GPU, `prefetched`
(a `Prefetcher`) collates and pins the next updates' batches in a background thread while
the device runs the current one, so that the host's numpy work (a few milliseconds for a
25k-token batch) never leaves the GPU waiting; the copies to the device are then asynchronous
(pinned memory, non_blocking). On the CPU there is nothing to overlap with: batches are collated in
line.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt import data as datamod
from nmt.config import Config, DataConfig, check_beam_fits
from nmt.errors import NmtError
from nmt.tokenizer import SpecialIds, Tokenizer
from nmt.training.distributed import Env
from nmt.training.state import data_fingerprint

log = logging.getLogger(__name__)

PREFETCH_UPDATES = 2  # updates collated ahead of the one on the device


@dataclass
class TrainingData:
    fingerprint: str  # the training data's, direction included (nmt.training.state)
    tokenizer: Tokenizer
    train: datamod.ParallelData  # in the direction read (its src_lang, tgt_lang)
    valid: datamod.ParallelData | None  # None where data.dir has no data.valid_split

    @classmethod
    def load(cls, cfg: Config) -> TrainingData:
        d = cfg.data
        t = cfg.train
        meta = datamod.read_meta(d.dir)
        tokenizer = Tokenizer.from_file(Path(d.dir) / "spm.model")
        if tokenizer.sha256 != meta["spm"]["sha256"]:
            raise NmtError(
                f"{Path(d.dir) / 'spm.model'}: not the tokenizer the data was prepared with "
                "(prepare.json's spm.sha256); run nmt prepare-bpe again"
            )
        # the checkpoints' decode settings must be usable
        check_beam_fits(cfg.decode.beam, tokenizer.vocab_size, "decode.beam")
        if t.valid_bleu:
            check_beam_fits(t.valid_beam, tokenizer.vocab_size, "train.valid_beam")
        # the direction: the config's, or prepare.json's where it names none
        train = datamod.ParallelData.load(d.dir, d.train_split, d.source_lang, d.target_lang)
        src = train.src_lang
        tgt = train.tgt_lang
        # no validation where the default split was not prepared; a split named otherwise must exist
        has_valid = d.valid_split in meta["splits"] or d.valid_split != DataConfig.valid_split
        valid = datamod.ParallelData.load(d.dir, d.valid_split, src, tgt) if has_valid else None
        return cls(data_fingerprint(meta, src, tgt), tokenizer, train, valid)


class EmptyShard:
    """The marker of a batch that this rank does not have: its share of the epoch has run out."""

    def __repr__(self) -> str:
        return "EMPTY_SHARD"


EMPTY_SHARD = EmptyShard()


def shard_batches(batches: list, rank: int, world_size: int) -> list:
    """Rank `rank`'s share of `batches`: every world_size-th batch from `rank`.

    All ranks get the same number of entries, since DDP hangs if one rank stops early:
    ranks that run out get `EMPTY_SHARD` at the end, for which the trainer runs the dummy
    batch with weight 0. world_size 1 returns `batches` itself.
    """
    if world_size == 1:
        return batches
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_batches: rank {rank} not in [0, {world_size})")
    mine = batches[rank::world_size]
    per_rank = -(-len(batches) // world_size)
    return mine + [EMPTY_SHARD] * (per_rank - len(mine))


def epoch_updates(
    cfg: Config, data: datamod.ParallelData, env: Env, epoch: int, pad_to: int
) -> list[list[Any]]:
    """This rank's share (`shard_batches`) of the batches of `epoch` (a function of the seed
    and the epoch only: resuming rebuilds them), in updates of train.update_freq batches."""
    t = cfg.train
    batches = datamod.make_batches(
        data.src_sizes,
        data.tgt_sizes,
        t.max_tokens,
        seed=t.seed,
        epoch=epoch,
        shuffle=True,
        max_positions=cfg.model.max_positions,
        pad_to=pad_to,
    )
    if batches.excluded and env.is_main:
        log.warning(
            "epoch %d: %d pairs longer than model.max_positions - 1 left out",
            epoch,
            batches.excluded,
        )
    local = shard_batches(batches, env.rank, env.world_size)
    return [local[i : i + t.update_freq] for i in range(0, len(local), t.update_freq)]


def dummy_batch(specials: SpecialIds, pad_to: int) -> datamod.Batch:
    """What a rank without a batch of its own runs, with weight 0, where DDP all-reduces the
    gradients (every rank must take part): one empty pair, its source and target just EOS."""
    empty = datamod.TokenArray(np.zeros(0, np.int64), np.zeros(2, np.int64))
    return datamod.collate(datamod.ParallelData("", "", empty, empty), [0], specials, pad_to=pad_to)


class Prefetcher(AbstractContextManager["Prefetcher"]):
    """Iterate over `groups` as lists of collated `Batch`es (`EMPTY_SHARD` stays), made by a
    background thread at most PREFETCH_UPDATES ahead. An error in the thread is raised here;
    `close()` (or leaving a `with` block) stops the thread."""

    def __init__(
        self,
        data: datamod.ParallelData,
        groups: Sequence[Sequence[np.ndarray | EmptyShard]],
        specials: SpecialIds,
        *,
        pad_to: int,
        pin_memory: bool,
    ):
        self.groups = groups
        # index arrays -> a Batch
        self.collate = partial(
            datamod.collate, data, specials=specials, pin_memory=pin_memory, pad_to=pad_to
        )
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="nmt-prefetch")

    def _collated(
        self, group: Sequence[np.ndarray | EmptyShard]
    ) -> list[datamod.Batch | EmptyShard]:
        return [ids if isinstance(ids, EmptyShard) else self.collate(ids) for ids in group]

    def __iter__(self) -> Iterator[list[datamod.Batch | EmptyShard]]:
        ahead: deque[Future[list[datamod.Batch | EmptyShard]]] = deque()
        for group in self.groups:
            ahead.append(self.pool.submit(self._collated, group))
            if len(ahead) > PREFETCH_UPDATES:
                yield ahead.popleft().result()  # an error in the thread is raised here
        while ahead:
            yield ahead.popleft().result()

    def close(self) -> None:
        """Stop the thread: the updates not yet started are dropped."""
        self.pool.shutdown(cancel_futures=True)

    def __exit__(self, *exc: Any) -> None:
        self.close()


def prefetched(
    data: datamod.ParallelData,
    updates: list[list[Any]],
    specials: SpecialIds,
    device: torch.device,
    pad_to: int,
) -> AbstractContextManager[Any]:
    """The updates' batches: collated ahead by a `Prefetcher` on a GPU, as they are (index
    arrays, collated in line) on the CPU."""
    if device.type != "cuda":
        return nullcontext(updates)
    return Prefetcher(data, updates, specials, pad_to=pad_to, pin_memory=True)
