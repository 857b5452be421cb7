"""Processes: the device this one trains on and, under torchrun, its place in the group, the
model wrapped for it (DDP, torch.compile), the few collectives that keep the ranks in step
(each returns its input unchanged in one process), and the stop signals it receives."""

from __future__ import annotations

import gc
import logging
import os
import signal
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nmt.config import Config
from nmt.device import resolve_device
from nmt.errors import ConfigError, one_line

log = logging.getLogger(__name__)

# A collective that waits longer than this raises instead of hanging (a rank that died, a
# mismatch). Generous: the other ranks wait in a broadcast while rank 0 validates and saves.
DIST_TIMEOUT = timedelta(minutes=30)


@dataclass
class Env:
    """Where this process runs: device and (for torchrun) its rank in the group."""

    device: torch.device
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_env(cfg: Config) -> Env:
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(cfg.train.device)
    if world_size == 1:
        return Env(device)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo", timeout=DIST_TIMEOUT
        )
    return Env(device, rank, world_size)


def teardown_env(env: Env, finished: bool) -> None:
    """Leave the process group that setup_env joined (train() may run again in this process).

    After a run that `finished` on this rank, the ranks first wait for each other: a rank that
    tore its gloo group down while rank 0 was still saving the last checkpoint died of SIGABRT
    ("terminate called without an active exception") in about one run in 25 on 2 busy cores.
    After an error nobody waits (the other ranks may never arrive)."""
    if env.world_size > 1 and dist.is_initialized():
        if finished:
            dist.barrier()
        gc.collect()  # the DDP reducer's reference to the group goes before the group
        dist.destroy_process_group()


def wrap_for_training(
    objective: torch.nn.Module, env: Env, compile: bool, compile_mode: str
) -> torch.nn.Module:
    """The module that training calls: `objective` under DDP when there are several processes,
    then compiled with torch.compile if asked."""
    net = objective
    if env.world_size > 1:
        # No buffer broadcast: the only buffers are the sinusoids, equal everywhere, and a
        # collective in the forward would let a rank that ran out of memory there fall out
        # of step with the others.
        net = torch.nn.parallel.DistributedDataParallel(
            objective,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            broadcast_buffers=False,
        )
    if compile:
        # a missing compiler (C++ on the CPU, C for Triton) fails here, not in the first update
        try:
            torch.compile(lambda x: x * 2 + 1)(torch.ones(2, device=env.device))
        except Exception as exc:
            # torch's advice to developers goes
            why = one_line(exc).split(" Set TORCHDYNAMO_VERBOSE")[0]
            raise ConfigError(
                f"train.compile: torch.compile cannot run on {env.device} ({why}); install a C/C++ "
                "compiler or set train.compile=false"
            ) from None
        net = torch.compile(net, mode=compile_mode)  # type: ignore[assignment]
    return net


def gradient_sync(net: torch.nn.Module, env: Env, all_reduce: bool) -> AbstractContextManager[Any]:
    """Where a backward of `net` (from `wrap_for_training`) runs: DDP all-reduces the gradients
    in it if `all_reduce`, else accumulates them locally (its `no_sync`; a compiled module
    passes the call on to the DDP module it wraps)."""
    if env.world_size == 1 or all_reduce:
        return nullcontext()
    return net.no_sync()  # type: ignore[operator]


def sum_over_ranks(
    env: Env, sums: torch.Tensor, counts: list[float]
) -> tuple[torch.Tensor, list[float]]:
    """An update's float64 sums on the device and its counts, each summed over the ranks
    (one all_reduce)."""
    if env.world_size == 1:
        return sums, counts
    packed = torch.cat([sums, torch.tensor(counts, dtype=torch.float64, device=env.device)])
    dist.all_reduce(packed)
    return packed[: len(sums)], packed[len(sums) :].tolist()


def max_over_ranks(env: Env, values: list[float]) -> list[float]:
    """Each value's maximum over the ranks (one all_reduce)."""
    if env.world_size == 1:
        return values
    packed = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(packed, op=dist.ReduceOp.MAX)
    return packed.tolist()


def from_main(env: Env, value: float) -> float:
    """Rank 0's `value`, on every rank (a broadcast)."""
    if env.world_size == 1:
        return value
    packed = torch.tensor([value], dtype=torch.float64, device=env.device)
    dist.broadcast(packed, 0)
    return packed.item()


class StopSignals:
    """SIGINT and SIGTERM (Ctrl-C, schedulers, torchrun) while in a `with` block: the first is
    `received` (training finishes the update, saves a checkpoint and stops); a second one
    stops at once (KeyboardInterrupt: the last checkpoint stands)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        log.warning(
            "%s received: finishing this update, saving a checkpoint, then stopping",
            signal.Signals(signum).name,
        )
