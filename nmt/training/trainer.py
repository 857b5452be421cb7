"""Training: `train()` and the `Trainer`, with the loop (`run`) and one update
(`train_update`: forward and backward over the update's batches, gradient scaling, clipping,
optimizer step), read top to bottom.

Running `nmt train` again on a run directory resumes at the exact batch where it stopped.
The rest lives beside this module: `nmt.training.data` (an epoch's updates for this rank,
the empty-shard marker and the dummy batch, prefetching), `nmt.training.rundir` (the files of
the run directory), `nmt.training.state` (progress, the training checkpoint, resuming),
`nmt.training.validate` (valid loss and BLEU, best checkpoint, patience),
`nmt.training.metrics` (train records, log lines, progress bar), `nmt.training.oom` (skipping
updates that ran out of memory), `nmt.training.optim` (schedules, the loss scaler, clipping,
Adam), `nmt.training.distributed` (torchrun, DDP, the collectives, stop signals).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from nmt import checkpoint as ckpt
from nmt import data as datamod
from nmt.config import Config
from nmt.device import autocast, configure_device, resolve_precision
from nmt.errors import NmtError, one_line
from nmt.models.transformer import num_parameters, summary
from nmt.tokenizer import NMT_SPECIALS
from nmt.training import validate as validation
from nmt.training.data import EMPTY_SHARD, TrainingData, dummy_batch, epoch_updates, prefetched
from nmt.training.distributed import (
    Env,
    StopSignals,
    from_main,
    gradient_sync,
    max_over_ranks,
    setup_env,
    sum_over_ranks,
    teardown_env,
    wrap_for_training,
)
from nmt.training.loss import TranslationLoss
from nmt.training.metrics import FiniteChecks, TrainMetrics, UpdateStats
from nmt.training.oom import OomSkips, inject_oom_faults, is_oom
from nmt.training.optim import DynamicLossScaler, build_optimizer, dropout_at, lr_at, scale_and_clip
from nmt.training.rundir import RunDir
from nmt.training.sizing import build_training_model, meta_model
from nmt.training.state import (
    Progress,
    build_checkpoint,
    check_compatible,
    init_from_checkpoint,
    restore,
    stop_reason,
)

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    reason: str
    update: int
    interrupted_by: int | None  # the signal that stopped it, if any


def train(cfg: Config, *, reset_optimizer: bool = False, reset_data: bool = False) -> TrainResult:
    """Train (or resume) the run in cfg.train.run_dir; returns why and where it stopped."""
    env = setup_env(cfg)
    trainer: Trainer | None = None
    finished = False
    try:
        trainer = Trainer(cfg, env, reset_optimizer, reset_data)
        log.info(
            "device %s, world size %d, parameters %d",
            env.device,
            env.world_size,
            num_parameters(trainer.model),
        )
        reason = trainer.run()
        finished = True
        return TrainResult(reason, trainer.progress.update, trainer.interrupted_by)
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        teardown_env(env, finished)


def dry_run(cfg: Config, vocab_size: int | None) -> str:
    source_vocab = None  # --vocab-size: a joint vocabulary
    if vocab_size is None:
        meta = datamod.read_meta(cfg.data.dir)
        vocab_size = meta["vocab_size"]
        source_vocab = meta.get("source_vocab_size")
    least = max(NMT_SPECIALS.ids()) + 1  # the special tokens of the vocabulary nmt trains
    if not least <= vocab_size < 2**31:  # token ids are at most int32
        raise NmtError(f"--vocab-size must be between {least} and {2**31 - 1}, got {vocab_size}")
    return summary(
        meta_model(cfg.model, vocab_size, NMT_SPECIALS.pad, source_vocab=source_vocab)
    )  # shapes only: a big vocabulary costs no memory


class Trainer:
    """One training run in this process: builds the model, optimizer and data from the config,
    resumes from the run directory, then `run()`s the loop of `train_update`s."""

    def __init__(self, cfg: Config, env: Env, reset_optimizer: bool, reset_data: bool):
        self.env = env
        t = cfg.train
        # train.precision auto is resolved here, on this device; the config keeps "auto"
        self.precision, self.precision_reason = resolve_precision(t.precision, env.device)
        if self.precision == "fp16" and env.device.type != "cuda":
            raise NmtError("train.precision fp16 needs a CUDA device; use bf16 on CPU")
        configure_device(env.device)
        self.run_dir = RunDir(Path(t.run_dir), tensorboard=t.tensorboard)
        data = TrainingData.load(cfg)
        # the direction read, prepare.json's where the config names none, is saved: its
        # checkpoints say what they translate (nmt serve's languages, ensembles', averages' checks)
        languages = replace(
            cfg.data, source_lang=data.train.src_lang, target_lang=data.train.tgt_lang
        )
        cfg = replace(cfg, data=languages)
        self.cfg = cfg
        self.tokenizer = data.tokenizer
        self.train_data = data.train
        self.valid_data = data.valid
        self.fingerprint = data.fingerprint
        torch.manual_seed(t.seed)
        # the bare model (saved, validated) and what an update calls: the model and its loss
        # as one module, under DDP and torch.compile when asked (nmt.training.distributed)
        self.model = build_training_model(cfg.model, self.tokenizer, env.device)
        # fine-tuning: a new run starts from train.init_from's weights, checked before the run
        # directory is touched; a run with checkpoints resumes them (`_resume`)
        self.init_from = (
            t.init_from if t.init_from and not ckpt.has_checkpoints(self.run_dir.path) else ""
        )
        self.progress = Progress()
        if self.init_from:
            init_from_checkpoint(cfg, self.model, self.tokenizer)
            # where the run's weights came from, kept in its checkpoints
            self.progress.history.append(f"initialized from {Path(self.init_from).resolve()}")
        objective = TranslationLoss(self.model, t.label_smoothing)
        inject_oom_faults(objective, env.rank, lambda: self.progress.update + 1)
        self.training_loss = wrap_for_training(objective, env, t.compile, t.compile_mode)
        # lengths padded to a multiple of this: few distinct shapes for kernels and compile
        self.pad_to = t.pad_to_multiple or (8 if env.device.type == "cuda" else 1)
        self.dummy = dummy_batch(self.tokenizer.specials, self.pad_to).to(env.device)
        # (update, loss sum, gradient norm) of updates whose finiteness the host has not read yet
        self.unchecked = FiniteChecks()
        self.optimizer = build_optimizer(list(self.model.parameters()), t)
        self.scaler = DynamicLossScaler(
            t.fp16_init_scale, t.fp16_min_scale, enabled=self.precision == "fp16"
        )
        self.signals = StopSignals()
        self.interrupted_by: int | None = None
        self.oom = OomSkips(env, self.run_dir.path)
        try:
            if env.is_main:
                self.run_dir.open(self.tokenizer.model_bytes)
            self._resume(reset_optimizer, reset_data)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the run directory's train.log and metrics.jsonl (train() may run again in this
        process)."""
        self.run_dir.close()

    # ---------------------------------------------------------------- one update

    def epoch_updates(self, epoch: int) -> list[list[Any]]:
        """This rank's updates of `epoch`: update_freq index arrays each (or `EMPTY_SHARD`)."""
        return epoch_updates(self.cfg, self.train_data, self.env, epoch, self.pad_to)

    def train_update(self, group: list[Any]) -> UpdateStats | None:
        """Forward/backward over `group` (update_freq batches: index arrays, batches that
        `collate` made already, or `EMPTY_SHARD`), then one optimizer step.

        Returns the update's statistics, or None when it was skipped: an fp16 overflow, or a
        rank that ran out of memory (then every rank skips it; the update is not counted).
        Gradients are sums over target tokens, divided at the end by the total token count
        over all batches and ranks: accumulation equals one large batch.

        The host never waits for the device here in one process with bf16 or fp32: token
        counts come from the CPU-side batch, loss sums and the gradient norm stay on the
        device (`UpdateStats`), and whether they were finite is read later, all at once
        (`check_finite`), before anything is logged or saved. fp16 reads the gradient norm
        now (whether to skip this update and halve the scale), and DDP reads the ranks'
        out-of-memory flag (whether every rank skips).
        """
        t = self.cfg.train
        update = self.progress.update + 1
        self.training_loss.train()
        if t.dropout_ramp_end:
            self.model.set_dropout(dropout_at(update, t, self.cfg.model.dropout))
        sums, ntokens, nsent, oom = self._forward_backward_all(group)
        sums, (ntokens, nsent, ooms) = sum_over_ranks(self.env, sums, [ntokens, nsent, float(oom)])
        if ooms:  # every rank skips an update in which any ran out of memory
            self.oom.skip(int(ooms), self.optimizer, self.progress)
            return None
        self.oom.reset()
        # DDP averaged the gradients over ranks; make them a mean over all target tokens.
        gnorm = scale_and_clip(
            list(self.model.parameters()),
            self.env.world_size / (max(ntokens, 1.0) * self.scaler.scale),
            t.clip_norm,
        )
        if self.scaler.overflowed(gnorm, update):
            self.optimizer.zero_grad(set_to_none=True)
            self.progress.skipped_overflow += 1
            log.info(
                "fp16 overflow at update %d: skipped, loss scale now %g", update, self.scaler.scale
            )
            return None
        self.unchecked.add(update, sums[0], gnorm)
        lr = lr_at(update - self.progress.schedule_offset, t, self.cfg.model.d_model)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.update = update
        return UpdateStats(sums[0], sums[1], gnorm, ntokens, nsent, lr)

    def _forward_backward_all(self, group: list[Any]) -> tuple[torch.Tensor, float, float, bool]:
        """The update's batches on this rank: their (loss, nll) sums (float64, on the device),
        target tokens and sentences, and whether this rank ran out of memory (then it runs no
        more batches of the update and its gradients are gone)."""
        sums = torch.zeros(2, dtype=torch.float64, device=self.env.device)  # no sync per batch
        ntokens = nsent = 0.0
        oom = False
        for j, item in enumerate(group):
            # DDP all-reduces the gradients in the backward of the last batch. Every rank must
            # take part (DDP hangs otherwise): one without a batch there (its shard ran out, or
            # it ran out of memory) runs the dummy batch with weight 0.
            all_reduce = self.env.world_size > 1 and j == len(group) - 1
            if item is not EMPTY_SHARD and not oom:
                try:
                    batch = self._on_device(item)
                    sums += self._forward_backward(batch, self.scaler.scale, all_reduce)
                    ntokens += batch.num_target_tokens
                    nsent += len(batch)
                    continue
                except Exception as e:
                    if not is_oom(e):
                        raise
                    oom = True
                    self.oom.forget(e, self.optimizer, self.progress.update + 1)
            if all_reduce:
                self._forward_backward(self.dummy, 0.0, all_reduce)
        return sums, ntokens, nsent, oom

    def _on_device(self, item: Any) -> datamod.Batch:
        if not isinstance(item, datamod.Batch):  # index arrays: collated here
            item = datamod.collate(
                self.train_data,
                item,
                self.tokenizer.specials,
                pin_memory=self.env.device.type == "cuda",
                pad_to=self.pad_to,
            )
        return item.to(self.env.device)

    def _forward_backward(
        self, batch: datamod.Batch, loss_scale: float, all_reduce: bool
    ) -> torch.Tensor:
        """One batch, its loss × loss_scale (0 for the dummy batch) backpropagated: its (loss,
        nll) sums, float64 on the device. With `all_reduce` DDP all-reduces the gradients."""
        with gradient_sync(self.training_loss, self.env, all_reduce):
            loss, nll = self._batch_loss(self.training_loss, batch)
            try:
                (loss * loss_scale).backward()
            except Exception as e:
                if is_oom(e) and all_reduce:
                    raise NmtError(
                        f"out of memory in the backward pass at update {self.progress.update + 1} "
                        f"on rank {self.env.rank}: DDP cannot skip an update once the gradient "
                        "all-reduce has started; lower train.max_tokens (and raise "
                        "train.update_freq to keep the batch size)"
                    ) from None
                raise
        return torch.stack([loss.detach(), nll.detach()]).double()

    def check_finite(self) -> None:
        """Stop at the first non-finite update since the last check (`FiniteChecks`). Called
        before anything is logged, validated or saved, so no checkpoint holds its weights."""
        self.unchecked.check(self.run_dir.path)

    def _batch_loss(
        self, net: torch.nn.Module, batch: datamod.Batch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Label-smoothed loss and NLL summed over the batch's real target tokens
        (`nmt.training.loss`: no logits for padding, no (tokens x vocabulary) tensor in fp32 at
        once)."""
        with autocast(self.env.device, self.precision):
            return net(batch.src, batch.prev_output, batch.target_index, batch.target_tokens)

    # ---------------------------------------------------------------- the loop

    def _announce_precision(self) -> None:
        """Say in train.log and in a `start` record of metrics.jsonl (a new run's first record)
        which precision the run trains in from this start on, and why."""
        record = {
            "type": "start",
            "update": self.progress.update,
            "precision": self.precision,
            "precision_reason": self.precision_reason,
        }
        log.info("precision %(precision)s (%(precision_reason)s)", record)
        self.run_dir.emit(record)

    def run(self) -> str:
        """Train until a stop reason (`stop_reason`) or a stop signal; returns why it stopped."""
        cfg = self.cfg
        p = self.progress
        reason = stop_reason(cfg, p)
        if reason:
            log.info(
                "run in %s already finished at update %d (%s); nothing to do",
                self.run_dir.path,
                p.update,
                reason,
            )
            return reason
        self._announce_precision()
        start = time.monotonic() - p.elapsed  # the training seconds of earlier sessions count
        metrics = TrainMetrics(cfg, self.env, p.update, self.run_dir.emit)
        with self.signals:
            while reason is None:
                updates = self.epoch_updates(p.epoch)
                if not updates:
                    raise NmtError(
                        f"{cfg.data.dir}: the {cfg.data.train_split} split has no usable pairs"
                    )
                if p.updates_in_epoch >= len(
                    updates
                ):  # a changed train.max_tokens: the epoch is over
                    p.epoch += 1
                    p.updates_in_epoch = 0
                    reason = stop_reason(cfg, p)
                    continue
                with prefetched(
                    self.train_data,
                    updates[p.updates_in_epoch :],
                    self.tokenizer.specials,
                    self.env.device,
                    self.pad_to,
                ) as todo:
                    for group in todo:
                        stats = self.train_update(group)
                        p.updates_in_epoch += 1
                        epoch_end = p.updates_in_epoch == len(updates)
                        p.elapsed = time.monotonic() - start
                        reason = self._after_update(stats, epoch_end, metrics)
                        if reason is not None:  # else the epoch's last update ends the loop
                            break
        metrics.close()
        log.info(
            "done: %s at update %d, epoch %d, %.0f s of training",
            reason,
            p.update,
            p.epoch,
            p.elapsed,
        )
        return reason

    def _after_update(
        self, stats: UpdateStats | None, epoch_end: bool, metrics: TrainMetrics
    ) -> str | None:
        """Log, validate and save as the intervals say; returns why to stop, if it is time."""
        cfg = self.cfg
        t = cfg.train
        p = self.progress
        if stats is not None:
            if p.update % t.log_interval == 0:  # a log record must not carry a NaN's numbers
                self.check_finite()
            metrics.add(stats, p, self.scaler)
        if epoch_end:  # now, so that this update's checkpoint resumes at the start of the next
            p.epoch += 1  # epoch and its validation runs once
            p.updates_in_epoch = 0
        # in this order: agreeing to stop also agrees p.elapsed across ranks, which stop_reason
        # reads (reading it first would let ranks disagree and hang DDP)
        interrupted = self._agree_to_stop()
        reason = stop_reason(cfg, p)
        fresh = stats is not None  # a skipped (fp16 overflow) update leaves p.update as it was
        at_valid = (
            fresh and t.validate_interval_updates and p.update % t.validate_interval_updates == 0
        )
        at_save = fresh and t.save_interval_updates and p.update % t.save_interval_updates == 0
        if interrupted and reason is None:
            self.save(best=False)
            self.interrupted_by = self.signals.received or signal.SIGTERM
            return (
                f"stopped by {signal.Signals(self.interrupted_by).name} at update {p.update}; "
                "checkpoint written, run the same command to resume"
            )
        if at_valid or epoch_end or reason is not None:  # the final update validates too
            self._validate_and_save()
            reason = reason or stop_reason(cfg, p)
        elif at_save:
            self.save(best=False)
        # keep validation and saving out of the throughput figures
        if at_valid or at_save or epoch_end:
            metrics.restart_throughput()
        return reason

    def _agree_to_stop(self) -> bool:
        """Whether a stop signal arrived, on any rank. Ranks also take the largest elapsed time,
        so that train.max_time stops all of them after the same update (DDP hangs otherwise)."""
        stop, self.progress.elapsed = max_over_ranks(
            self.env, [float(self.signals.received is not None), self.progress.elapsed]
        )
        return stop > 0

    def _validate_and_save(self) -> None:
        p = self.progress
        self.check_finite()
        best = False
        if self.valid_data is not None and self.env.is_main:
            started = time.monotonic()
            result = self.validate()
            best = validation.track_best(p, result, self.cfg.train.best_metric)
            # elapsed: training seconds at this update (as in train records), for learning curves
            self.run_dir.emit(
                {
                    "type": "valid",
                    "update": p.update,
                    "epoch": p.epoch,
                    **result,
                    "best": p.best,
                    "elapsed": p.elapsed,
                    "valid_s": time.monotonic() - started,
                }
            )
            log.info(
                "valid | update %d | %s | best %s",
                p.update,
                " | ".join(f"{k} {v:.3f}" for k, v in result.items()),
                f"{p.best:.3f}",
            )
        # everyone follows rank 0's early-stopping bookkeeping
        p.bad_validations = int(from_main(self.env, p.bad_validations))
        self.save(best=best)

    def validate(self) -> dict[str, float]:
        """Valid loss/perplexity and (if train.valid_bleu) BLEU: nmt.training.validate, with this
        trainer's loss."""
        assert self.valid_data is not None
        objective = TranslationLoss(
            self.model, self.cfg.train.label_smoothing
        )  # without DDP and compile
        return validation.validate(
            self.cfg,
            self.model,
            self.tokenizer,
            self.valid_data,
            self.env.device,
            lambda batch: self._batch_loss(objective, batch),
            self.precision,
        )

    # ---------------------------------------------------------------- checkpoints

    def save(self, best: bool) -> None:
        """Write checkpoint_<update>.pt, checkpoint_last.pt and (if `best`) checkpoint_best.pt."""
        self.check_finite()
        if self.env.is_main:
            state = build_checkpoint(
                self.cfg,
                self.model,
                self.tokenizer,
                self.optimizer,
                self.scaler,
                self.progress,
                self.fingerprint,
                self.env.device,
            )
            self.run_dir.save_checkpoint(
                state, self.progress.update, best=best, keep_last=self.cfg.train.keep_last
            )

    def _resume(self, reset_optimizer: bool, reset_data: bool) -> None:
        state = ckpt.load_latest(self.run_dir.path)  # None: a new run
        if state is None:
            if self.env.is_main:
                self.run_dir.write_config(self.cfg)
                start = f", its weights from {self.init_from}" if self.init_from else ""
                log.info("new run in %s%s\n%s", self.run_dir.path, start, summary(self.model))
            return
        try:
            check_compatible(
                state, self.cfg, self.tokenizer, self.fingerprint, self.run_dir.path, reset_data
            )
            self.progress = restore(
                state,
                self.model,
                self.optimizer,
                self.scaler,
                self.env.device,
                reset_optimizer=reset_optimizer,
                reset_data=reset_data,
            )
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            RuntimeError,
        ) as e:  # loads, but not ours
            raise NmtError(
                f"{self.run_dir.path}: its checkpoint loads but cannot be resumed from "
                f"({type(e).__name__}: {one_line(e)}); move it away or use a new train.run_dir"
            ) from None
        if self.env.is_main:
            if self.cfg.train.init_from:
                log.info(
                    "train.init_from %s ignored: %s has checkpoints, the run resumes from them",
                    self.cfg.train.init_from,
                    self.run_dir.path,
                )
            if not stop_reason(self.cfg, self.progress):  # a finished run changes nothing
                self.run_dir.write_config(self.cfg)
            log.info(
                "resumed from update %d in %s (epoch %d, %d updates into it)",
                self.progress.update,
                self.run_dir.path,
                self.progress.epoch,
                self.progress.updates_in_epoch,
            )
