"""The `train` records of metrics.jsonl, their train.log lines and the progress bar.

Every train.log_interval updates: loss and nll per target token over the interval's updates
(token-weighted, like fairseq; one batch's loss swings with its lengths), mean gnorm, the
current lr, and throughput since the last log line, validation or save.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.config import Config
from nmt.errors import NmtError
from nmt.training.distributed import Env
from nmt.training.optim import DynamicLossScaler, dropout_at
from nmt.training.state import Progress

log = logging.getLogger(__name__)


@dataclass
class UpdateStats(Mapping[str, float]):
    """What one update produced (`Trainer.train_update`). The loss sums and the gradient norm
    stay on the device: `stats["loss"]` reads them (and waits for the device); the train
    records sum them on the device and read them once per log line."""

    loss_sum: torch.Tensor  # label-smoothed loss summed over the target tokens, nats (0-dim)
    nll_sum: torch.Tensor  # the same for the NLL
    gnorm: torch.Tensor  # the gradient norm before clipping (0-dim)
    tokens: float  # target tokens of the update (all ranks)
    sentences: float
    lr: float

    KEYS = ("loss", "nll", "tokens", "sentences", "lr", "gnorm")

    def __getitem__(self, key: str) -> float:
        """loss and nll in bits per target token, gnorm, tokens, sentences, lr (as floats)."""
        per_token = max(self.tokens, 1.0) * math.log(2)
        if key == "loss":
            return float(self.loss_sum) / per_token
        if key == "nll":
            return float(self.nll_sum) / per_token
        if key in self.KEYS:  # gnorm, tokens, sentences, lr
            return float(getattr(self, key))
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)


class FiniteChecks:
    """The (update, loss sum, gradient norm) of updates whose finiteness the host has not read
    yet: `check` reads them all at once (one wait for the device) and stops at the first
    non-finite one, naming its update."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def add(self, update: int, loss_sum: torch.Tensor, gnorm: torch.Tensor) -> None:
        self.pending.append((update, loss_sum, gnorm))

    def updates(self) -> list[int]:
        return [u for u, _, _ in self.pending]

    def check(self, run_dir: Path) -> None:
        if not self.pending:
            return
        values = torch.stack(
            [torch.stack([loss.float(), gnorm.float()]) for _, loss, gnorm in self.pending]
        )
        updates = self.updates()
        self.pending.clear()
        for update, (loss, gnorm) in zip(updates, values.tolist(), strict=True):
            if not math.isfinite(loss):
                raise NmtError(
                    f"non-finite loss at update {update}; stopped without saving (checkpoints in "
                    f"{run_dir} are intact). Try a lower train.lr or train.clip_norm"
                )
            if not math.isfinite(gnorm):
                raise NmtError(
                    f"non-finite gradient norm at update {update}; stopped without saving "
                    f"(checkpoints in {run_dir} are intact)"
                )


class TrainMetrics:
    """`add()` each update's statistics; `emit` writes a record (RunDir.emit)."""

    def __init__(
        self, cfg: Config, env: Env, initial_update: int, emit: Callable[[dict[str, Any]], None]
    ):
        self.cfg = cfg
        self.emit = emit
        self.restart_throughput()  # throughput since the last log line, validation or save
        # since the last log line: loss, nll (nats) and gnorm summed on the device (3,), over
        # loss_updates updates of loss_tokens target tokens
        self.sums = torch.zeros(3, dtype=torch.float64, device=env.device)
        self.loss_tokens = 0.0
        self.loss_updates = 0
        self.bar = _progress_bar(env, initial_update, cfg.train.max_updates)

    def add(self, stats: UpdateStats, p: Progress, scaler: DynamicLossScaler) -> None:
        """Count an update that was taken (`stats` from Trainer.train_update); log when it is
        time."""
        self.tokens += stats.tokens
        self.updates += 1
        self.loss_tokens += stats.tokens
        self.loss_updates += 1
        self.sums += torch.stack([stats.loss_sum, stats.nll_sum, stats.gnorm])

        # the progress bar every update (its figures every 10), a record every train.log_interval
        t = self.cfg.train
        bar = self.bar
        if bar is not None:
            bar.update(1)
        if p.update % t.log_interval and not (bar is not None and p.update % 10 == 0):
            return
        dt = max(time.monotonic() - self.started, 1e-9)
        ntok = max(self.loss_tokens, 1.0) * math.log(2)
        loss_sum, nll_sum, gnorm_sum = self.sums.tolist()
        loss = loss_sum / ntok
        nll = nll_sum / ntok
        record = {
            "type": "train",
            "update": p.update,
            "epoch": p.epoch,
            "loss": loss,
            "nll": nll,
            "ppl": 2**nll,
            "lr": stats.lr,
            "gnorm": gnorm_sum / max(self.loss_updates, 1),
            "updates_logged": self.loss_updates,
            "tgt_tokens": self.loss_tokens,
            "tgt_tokens_per_s": self.tokens / dt,
            "updates_per_s": self.updates / dt,
            "elapsed": p.elapsed,
            "oom_skipped": p.oom_skipped,
        }
        if (rss := _rss_mb()) is not None:
            record["rss_mb"] = rss
        if scaler.enabled:  # fp16
            record["loss_scale"] = scaler.scale
        if t.dropout_ramp_end:
            record["dropout"] = dropout_at(p.update, t, self.cfg.model.dropout)
        if bar is not None:
            bar.set_postfix(
                loss=f"{loss:.3f}",
                lr=f"{stats.lr:.2e}",
                tok_s=f"{record['tgt_tokens_per_s']:.0f}",
                refresh=False,
            )
        if p.update % t.log_interval == 0:
            self.emit(record)
            log.info(
                "train | epoch %(epoch)d | update %(update)d | loss %(loss).3f | nll %(nll).3f | "
                "ppl %(ppl).2f | lr %(lr).3e | gnorm %(gnorm).3f | "
                "tgt tok/s %(tgt_tokens_per_s).0f | ups %(updates_per_s).2f",
                record,
            )
            self.restart_throughput()
            self.sums.zero_()
            self.loss_tokens = 0.0
            self.loss_updates = 0

    def restart_throughput(self) -> None:
        """After a log line, or a validation or a save (to keep them out of the throughput
        figures): the throughput is measured again from now."""
        self.tokens = 0.0
        self.updates = 0
        self.started = time.monotonic()

    def close(self) -> None:
        if self.bar is not None:  # a bar without a total is falsy
            self.bar.close()


def _rss_mb() -> float | None:
    """This process' resident memory (Linux; None elsewhere): cheap enough for every log line."""
    try:
        pages = int(Path("/proc/self/statm").read_bytes().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _progress_bar(env: Env, initial: int, total: int) -> Any:
    if not (env.is_main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total or None, initial=initial, unit="upd", dynamic_ncols=True, leave=False)
