"""Running out of memory in an update (docs/reliability.md): every rank skips an update in
which any ran out of memory; MAX_CONSECUTIVE_OOM in a row stop training. Also the
NMT_FAULT_OOM_AT seam that simulates such an error in tests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nmt.errors import NmtError, one_line
from nmt.training.distributed import Env
from nmt.training.state import Progress

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_OOM = 10  # then stop: skipping every batch is not training
# Fault injection for tests (docs/reliability.md): "RANK:UPDATE[,RANK:UPDATE...]" makes the
# model's forward raise torch.OutOfMemoryError once on that rank at that update.
FAULT_OOM_ENV = "NMT_FAULT_OOM_AT"


def is_oom(error: BaseException) -> bool:
    """A failed allocation: CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError
    ("DefaultCPUAllocator: can't allocate memory"), skipped the same way."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError)
        and any(
            s in str(error)
            for s in ("out of memory", "can't allocate memory", "DefaultCPUAllocator")
        )
    )


class OomSkips:
    """The out-of-memory errors of one training run: `forget` one on this rank, `skip` the
    update on every rank, `reset` after an update that ran."""

    def __init__(self, env: Env, run_dir: Path):
        self.env = env
        self.run_dir = run_dir
        self.consecutive = 0

    def forget(self, error: BaseException, optimizer: torch.optim.Optimizer, update: int) -> None:
        """After an out-of-memory error in `update`: drop its gradients and cached memory."""
        optimizer.zero_grad(set_to_none=True)
        if self.env.device.type == "cuda":
            torch.cuda.empty_cache()
        log.warning(
            "out of memory at update %d%s: skipping the update (%s)",
            update,
            f" on rank {self.env.rank}" if self.env.world_size > 1 else "",
            one_line(error),
        )

    def skip(self, ranks: int, optimizer: torch.optim.Optimizer, p: Progress) -> None:
        """Every rank skips an update in which any ran out of memory: its batches are consumed,
        the update is not counted (the schedule does not advance) and its gradients are dropped."""
        optimizer.zero_grad(set_to_none=True)
        p.oom_skipped += 1
        self.consecutive += 1
        update = p.update + 1
        if self.consecutive >= MAX_CONSECUTIVE_OOM:
            raise NmtError(
                f"out of memory in {self.consecutive} consecutive updates (last: update {update}); "
                f"checkpoints in {self.run_dir} are intact. Lower train.max_tokens (and raise "
                "train.update_freq to keep the batch size)"
            )
        if self.env.is_main:
            log.warning(
                "update %d skipped: out of memory on %d rank(s); %d update(s) skipped so far",
                update,
                ranks,
                p.oom_skipped,
            )

    def reset(self) -> None:
        self.consecutive = 0


def inject_oom_faults(model: torch.nn.Module, rank: int, next_update: Callable[[], int]) -> None:
    """The NMT_FAULT_OOM_AT test seam: raise torch.OutOfMemoryError from the model's forward,
    once, on the given rank(s) at the given update(s)."""
    spec = os.environ.get(FAULT_OOM_ENV)
    if not spec:
        return
    try:
        targets = {(int(r), int(u)) for r, u in (item.split(":") for item in spec.split(","))}
    except ValueError:
        raise NmtError(f"{FAULT_OOM_ENV}={spec!r}: expected RANK:UPDATE[,RANK:UPDATE...]") from None

    def hook(module: torch.nn.Module, args: Any) -> None:
        key = (rank, next_update())
        if module.training and key in targets:
            targets.remove(key)  # once
            raise torch.OutOfMemoryError(f"simulated by {FAULT_OOM_ENV}={spec}")

    model.register_forward_pre_hook(hook)
