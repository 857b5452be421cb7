"""Training: `train()` and the `Trainer`, with the loop (`run`) and one update
(`train_update`: forward and backward over the update's batches, gradient scaling, clipping,
optimizer step), read top to bottom.

Running `nmt train` again on a run directory resumes at the exact batch where it stopped.
The rest lives beside this module: `nmt.training.rundir` (the files of the run directory),
`nmt.training.state` (progress, the training checkpoint, resuming), `nmt.training.validate` (valid loss
and BLEU, best checkpoint, patience), `nmt.training.metrics` (train records, log lines, progress
bar), `nmt.training.oom` (skipping updates that ran out of memory), `nmt.training.distributed` (torchrun).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nmt import checkpoint as ckpt
from nmt import data as datamod
from nmt.config import Config
from nmt.device import autocast, configure_cuda
from nmt.errors import NmtError
from nmt.models.transformer import build_model, num_parameters, summary
from nmt.tokenizer import EOS, PAD
from nmt.training import validate as validation
from nmt.training.data import Prefetcher, TrainingData, epoch_groups
from nmt.training.distributed import Env, setup_env, teardown_env, wrap_for_training
from nmt.training.loss import TranslationLoss
from nmt.training.metrics import FiniteChecks, TrainMetrics, UpdateStats
from nmt.training.oom import OomSkips, inject_oom_faults, is_oom
from nmt.training.optim import DynamicLossScaler, build_optimizer, dropout_at, lr_at
from nmt.training.rundir import RunDir
from nmt.training.state import (
    Progress,
    build_checkpoint,
    check_compatible,
    restore,
    stop_reason,
)

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    reason: str
    update: int
    interrupted_by: int | None = None  # the signal that stopped it, if any


def train(cfg: Config, *, reset_optimizer: bool = False, reset_data: bool = False) -> TrainResult:
    """Train (or resume) the run in cfg.train.run_dir; returns why and where it stopped."""
    env = setup_env(cfg)
    trainer: Trainer | None = None
    finished = False
    try:
        trainer = Trainer(cfg, env, reset_optimizer, reset_data)
        log.info("device %s, world size %d, parameters %d", env.device, env.world_size,
                 num_parameters(trainer.model))
        reason = trainer.run()
        finished = True
        return TrainResult(reason, trainer.progress.update, trainer.interrupted_by)
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        teardown_env(env, finished)


def dry_run(cfg: Config, vocab_size: int | None) -> str:
    if vocab_size is None:
        vocab_size = int(datamod.read_meta(cfg.data.dir)["vocab_size"])
    if not EOS + 1 <= vocab_size < 2**31:  # the special tokens; token ids are at most int32
        raise NmtError(f"--vocab-size must be between {EOS + 1} and {2**31 - 1}, got {vocab_size}")
    with torch.device("meta"):  # shapes only: a big vocabulary costs no memory
        model = build_model(cfg.model, vocab_size, pad_id=PAD)
    return summary(model)


class Trainer:
    """One training run in this process: builds the model, optimizer and data from the config,
    resumes from the run directory, then `run()`s the loop of `train_update`s."""

    def __init__(self, cfg: Config, env: Env, reset_optimizer: bool, reset_data: bool):
        self.cfg, self.env = cfg, env
        t = cfg.train
        if t.precision == "fp16" and env.device.type != "cuda":
            raise NmtError("train.precision fp16 needs a CUDA device; use bf16 on CPU")
        configure_cuda(env.device)
        self.run_dir = RunDir(Path(t.run_dir), tensorboard=t.tensorboard)
        data = TrainingData.load(cfg)
        self.tokenizer, self.train_data, self.valid_data = data.tokenizer, data.train, data.valid
        self.tgt_lang, self.fingerprint = data.tgt_lang, data.fingerprint
        torch.manual_seed(t.seed)
        self.model = build_model(cfg.model, self.tokenizer.vocab_size, pad_id=PAD).to(env.device)
        # the model and its loss as one module: what DDP wraps and torch.compile compiles
        self.objective = TranslationLoss(self.model, t.label_smoothing)
        self.ddp, self.net = wrap_for_training(self.objective, env, t.compile, t.compile_mode)
        # lengths padded to a multiple of this: few distinct shapes for kernels and compile
        self.pad_to = t.pad_to_multiple or (8 if env.device.type == "cuda" else 1)
        # (update, loss sum, gradient norm) of updates whose finiteness the host has not read yet
        self.unchecked = FiniteChecks()
        self.optimizer = build_optimizer(list(self.model.parameters()), t)
        self.scaler = DynamicLossScaler(t.fp16_init_scale, t.fp16_min_scale) if t.precision == "fp16" else None
        self.progress = Progress()
        self.stop_signal: int | None = None
        self.dummy_ids: Any = None
        self.interrupted_by: int | None = None
        self.oom = OomSkips(env, self.run_dir.path)
        inject_oom_faults(self.objective, env.rank, lambda: self.progress.update + 1)
        try:
            if env.is_main:
                self.run_dir.open(self.tokenizer.model_bytes)
            self._resume(reset_optimizer, reset_data)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the run directory's train.log and metrics.jsonl (train() may run again in this process)."""
        self.run_dir.close()

    # ---------------------------------------------------------------- one update

    def _epoch_batches(self, epoch: int) -> list[list[Any]]:
        t = self.cfg.train
        batches = datamod.make_batches(
            self.train_data.src_sizes, self.train_data.tgt_sizes, t.max_tokens,
            seed=t.seed, epoch=epoch, shuffle=True, max_positions=self.cfg.model.max_positions,
            pad_to=self.pad_to,
        )
        if batches.excluded and self.env.is_main:
            log.warning("epoch %d: %d pairs longer than model.max_positions - 1 left out", epoch, batches.excluded)
        self.dummy_ids = batches[0][:1] if len(batches) else None  # one sentence: cheap, weight 0
        return epoch_groups(batches, self.env.rank, self.env.world_size, t.update_freq)

    def train_update(self, group: list[Any]) -> UpdateStats | None:
        """Forward/backward over `group` (update_freq batches: index arrays, or batches that
        `collate` made already), then one optimizer step.

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
        env, t = self.env, self.cfg.train
        self.net.train()
        if t.dropout_ramp_end:
            self.model.set_dropout(dropout_at(self.progress.update + 1, t, self.cfg.model.dropout))
        scale = self.scaler.scale if self.scaler else 1.0
        sums = torch.zeros(2, dtype=torch.float64, device=env.device)  # loss, nll: no sync per batch
        ntokens = nsent = 0.0
        oom = False
        for j, item in enumerate(group):
            # DDP all-reduces the gradients in the backward of the last batch: a rank whose shard
            # ran out, or that ran out of memory, runs a dummy batch with weight 0 there, so
            # that every rank takes part (DDP would hang otherwise).
            sync = j == len(group) - 1 or env.world_size == 1
            if oom and not (sync and env.world_size > 1):
                continue
            try:
                loss, nll, batch_tokens, batch_sents = self._forward_backward(None if oom else item, scale, sync)
            except Exception as e:
                if not is_oom(e):
                    raise
                oom = True
                self.oom.forget(e, self.optimizer, self.progress.update + 1)
                if not (sync and env.world_size > 1):
                    continue
                loss, nll, batch_tokens, batch_sents = self._forward_backward(None, scale, sync)
            sums += torch.stack([loss, nll]).double()
            ntokens += batch_tokens
            nsent += batch_sents
        ooms = float(oom)
        if env.world_size > 1:
            stats = torch.cat([sums, torch.tensor([ntokens, nsent, ooms], dtype=torch.float64, device=env.device)])
            dist.all_reduce(stats)
            ntokens, nsent, ooms = stats[2:].tolist()  # every rank must agree to skip
            sums = stats[:2]
        if ooms:
            self.oom.skip(int(ooms), self.optimizer, self.progress)
            return None
        self.oom.reset()
        next_update = self.progress.update + 1
        # DDP averaged the gradients over ranks; make them a mean over all target tokens.
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, env.world_size / (max(ntokens, 1.0) * scale))
        if t.clip_norm > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm)
        else:
            gnorm = torch.nn.utils.get_total_norm(grads)
        if self.scaler is not None:
            overflow = not math.isfinite(float(gnorm))
            self.scaler.update(overflow, next_update)
            if overflow:
                self.optimizer.zero_grad(set_to_none=True)
                self.progress.skipped_overflow += 1
                log.info("fp16 overflow at update %d: skipped, loss scale now %g", next_update, self.scaler.scale)
                return None
        else:
            self.unchecked.add(next_update, sums[0], gnorm)
        lr = lr_at(next_update - self.progress.schedule_offset, t, self.cfg.model.d_model)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.update = next_update
        return UpdateStats(sums[0], sums[1], gnorm, ntokens, nsent, lr)

    def check_finite(self) -> None:
        """Stop at the first non-finite update since the last check (`FiniteChecks`). Called
        before anything is logged, validated or saved, so no checkpoint holds its weights."""
        self.unchecked.check(self.run_dir.path)

    def _forward_backward(self, item: Any, scale: float, sync: bool) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """One batch (the dummy batch with weight 0 for None): (loss, nll, tokens, sentences) × weight."""
        env = self.env
        weight = 1.0 if item is not None else 0.0
        batch = item if isinstance(item, datamod.Batch) else datamod.collate(
            self.train_data, item if item is not None else self.dummy_ids, pin_memory=env.device.type == "cuda",
            pad_to=self.pad_to)
        batch = batch.to(env.device)
        with (nullcontext() if sync or self.ddp is None else self.ddp.no_sync()):
            loss, nll = self._batch_loss(self.net, batch)
            try:
                (loss * (scale * weight)).backward()
            except Exception as e:
                if is_oom(e) and sync and env.world_size > 1:
                    raise NmtError(
                        f"out of memory in the backward pass at update {self.progress.update + 1} on rank "
                        f"{env.rank}: DDP cannot skip an update once the gradient all-reduce has started; "
                        "lower train.max_tokens (and raise train.update_freq to keep the batch size)") from None
                raise
        return loss.detach() * weight, nll.detach() * weight, batch.tgt_tokens * weight, len(batch) * weight

    def _batch_loss(self, net: torch.nn.Module, batch: datamod.Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Label-smoothed loss and NLL summed over the batch's real target tokens (`nmt.training.loss`:
        no logits for padding, no (tokens x vocabulary) tensor in fp32 at once)."""
        with autocast(self.env.device, self.cfg.train.precision):
            return net(batch.src, batch.prev_output, batch.target_index, batch.target_tokens)

    # ---------------------------------------------------------------- the loop

    def run(self) -> str:
        cfg, p = self.cfg, self.progress
        reason = stop_reason(cfg, p)
        if reason:
            log.info("run in %s already finished at update %d (%s); nothing to do", self.run_dir.path, p.update, reason)
            return reason
        old = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._loop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _handle_signal(self, signum: int, frame: Any) -> None:
        if self.stop_signal is not None:  # a second Ctrl-C: stop now, the last checkpoint stands
            raise KeyboardInterrupt
        self.stop_signal = signum
        log.warning("%s received: finishing this update, saving a checkpoint, then stopping",
                    signal.Signals(signum).name)

    def _loop(self) -> str:
        cfg, p = self.cfg, self.progress
        start, elapsed0 = time.monotonic(), p.elapsed
        metrics = TrainMetrics(cfg, self.env, p.update, self.run_dir.emit)
        reason: str | None = None
        while reason is None:
            groups = self._epoch_batches(p.epoch)
            if not groups:
                raise NmtError(f"{cfg.data.dir}: the {cfg.data.train_split} split has no usable pairs")
            if p.updates_in_epoch >= len(groups):  # a changed train.max_tokens: the epoch is over
                p.epoch, p.updates_in_epoch = p.epoch + 1, 0
                reason = stop_reason(cfg, p)
                continue
            with self._prepared(groups[p.updates_in_epoch :]) as todo:
                for group in todo:
                    stats = self.train_update(group)
                    p.updates_in_epoch += 1
                    epoch_end = p.updates_in_epoch == len(groups)
                    p.elapsed = elapsed0 + time.monotonic() - start
                    reason = self._after_update(stats, epoch_end, metrics)
                    if reason is not None or epoch_end:
                        break
        metrics.close()
        log.info("done: %s at update %d, epoch %d, %.0f s of training", reason, p.update, p.epoch, p.elapsed)
        return reason

    def _prepared(self, groups: list[list[Any]]) -> Any:
        """The updates' batches, collated ahead in a background thread on a GPU (nmt.training.batches)."""
        if self.env.device.type != "cuda":
            return nullcontext(groups)
        return Prefetcher(self.train_data, groups, pad_to=self.pad_to, pin_memory=True)

    def _after_update(self, stats: UpdateStats | None, epoch_end: bool, metrics: TrainMetrics) -> str | None:
        """Log, validate and save as the intervals say; returns why to stop, if it is time."""
        cfg, t, p = self.cfg, self.cfg.train, self.progress
        if stats is not None:
            if p.update % t.log_interval == 0:  # a log record must not carry a NaN's numbers
                self.check_finite()
            metrics.add(stats, p, self.scaler.scale if self.scaler is not None else None)
        if epoch_end:  # now, so that this update's checkpoint resumes at the start of the next
            p.epoch, p.updates_in_epoch = p.epoch + 1, 0  # epoch and its validation runs once
        interrupted = self._agree_to_stop()
        reason = stop_reason(cfg, p)
        fresh = stats is not None  # a skipped (fp16 overflow) update leaves p.update as it was
        at_valid = fresh and t.validate_interval_updates and p.update % t.validate_interval_updates == 0
        at_save = fresh and t.save_interval_updates and p.update % t.save_interval_updates == 0
        if interrupted and reason is None:
            self.save(numbered=True, best=False)
            self.interrupted_by = self.stop_signal or signal.SIGTERM
            return (f"stopped by {signal.Signals(self.interrupted_by).name} at update {p.update}; "
                    "checkpoint written, run the same command to resume")
        if at_valid or epoch_end or reason is not None:  # the final update validates too
            self._validate_and_save(numbered=True)
            reason = reason or stop_reason(cfg, p)
        elif at_save:
            self.save(numbered=True, best=False)
        if at_valid or at_save or epoch_end:  # keep validation and saving out of the throughput figures
            metrics.restart_throughput()
        return reason

    def _agree_to_stop(self) -> bool:
        """Whether a stop signal arrived, on any rank. Ranks also take the largest elapsed time,
        so that train.max_time stops all of them after the same update (DDP hangs otherwise)."""
        flag = self.stop_signal is not None
        if self.env.world_size > 1:
            both = torch.tensor([float(flag), self.progress.elapsed], dtype=torch.float64, device=self.env.device)
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
            flag_f, self.progress.elapsed = both.tolist()
            flag = flag_f > 0
        return flag

    def _validate_and_save(self, numbered: bool) -> None:
        self.check_finite()
        best = False
        if self.valid_data is not None and self.env.is_main:
            started = time.monotonic()
            result = self.validate()
            best = validation.track_best(self.progress, result, self.cfg.train.best_metric)
            # elapsed: training seconds at this update (as in train records), for learning curves
            self.run_dir.emit({"type": "valid", "update": self.progress.update, "epoch": self.progress.epoch, **result,
                        "best": self.progress.best, "elapsed": self.progress.elapsed,
                        "valid_s": time.monotonic() - started})
            log.info("valid | update %d | %s | best %s", self.progress.update,
                     " | ".join(f"{k} {v:.3f}" for k, v in result.items()), f"{self.progress.best:.3f}")
        if self.env.world_size > 1:  # everyone follows rank 0's early-stopping bookkeeping
            flag = torch.tensor([self.progress.bad_validations], dtype=torch.float64, device=self.env.device)
            dist.broadcast(flag, 0)
            self.progress.bad_validations = int(flag.item())
        self.save(numbered=numbered, best=best)

    def validate(self) -> dict[str, float]:
        """Valid loss/perplexity and (if train.valid_bleu) BLEU: nmt.training.validate, with this trainer's loss."""
        assert self.valid_data is not None
        return validation.validate(self.cfg, self.model, self.tokenizer, self.valid_data, self.tgt_lang,
                                   self.env.device, lambda batch: self._batch_loss(self.objective, batch))

    # ---------------------------------------------------------------- checkpoints

    def save(self, numbered: bool, best: bool) -> None:
        """Write checkpoint_<update>.pt (if numbered), checkpoint_best.pt and checkpoint_last.pt."""
        self.check_finite()
        if self.env.is_main:
            state = build_checkpoint(self.cfg, self.model, self.tokenizer, self.optimizer, self.scaler,
                                     self.progress, self.fingerprint, self.env.device)
            self.run_dir.save_checkpoint(state, self.progress.update, numbered=numbered, best=best,
                                         keep_last=self.cfg.train.keep_last)

    def _resume(self, reset_optimizer: bool, reset_data: bool) -> None:
        state = ckpt.load_latest(self.run_dir.path) if self.run_dir.path.exists() else None
        if state is None:
            if self.env.is_main:
                self.run_dir.write_config(self.cfg)
                log.info("new run in %s\n%s", self.run_dir.path, summary(self.model))
            return
        try:
            check_compatible(state, self.cfg, self.tokenizer, self.fingerprint, self.run_dir.path, reset_data)
            self.progress = restore(state, self.model, self.optimizer, self.scaler, self.env.device,
                                    reset_optimizer=reset_optimizer, reset_data=reset_data)
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:  # loads, but not ours
            reason = " ".join(str(e).split())[:200] or type(e).__name__
            raise NmtError(f"{self.run_dir.path}: its checkpoint loads but cannot be resumed from "
                           f"({type(e).__name__}: {reason}); move it away or use a new train.run_dir") from None
        if self.env.is_main:
            self.run_dir.write_config(self.cfg)
            log.info("resumed from update %d (epoch %d, %d updates into it)", self.progress.update,
                     self.progress.epoch, self.progress.updates_in_epoch)
