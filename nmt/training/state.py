"""Training progress and the training checkpoint: what it holds beyond the model, resuming from
it, and starting a new run from another checkpoint's weights (`init_from_checkpoint`).

A run resumes at the exact batch where it stopped: the batch order of an epoch is a function
of (seed, epoch) only, and the checkpoint holds the optimizer, loss scaler, RNG states and
position in the epoch (`Progress`). A resume is refused when the model config, the tokenizer
or (unless --reset-data) the training data changed.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from nmt import checkpoint as ckpt
from nmt.config import (
    TRAINING_ONLY_MODEL_KEYS,
    Config,
    changed_keys,
    config_from_dict,
)
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer
from nmt.training.optim import DynamicLossScaler

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Counters saved in every training checkpoint."""

    update: int = 0
    epoch: int = 1
    updates_in_epoch: int = 0  # update groups of `epoch` already consumed
    elapsed: float = 0.0  # seconds of training, summed over resumes
    best: float | None = None
    # what `best` is: "bleu" or "loss" ("": a checkpoint from before it was kept)
    best_metric: str = ""
    bad_validations: int = 0
    schedule_offset: int = 0  # --reset-optimizer restarts the warm-up here
    skipped_overflow: int = 0
    oom_skipped: int = 0  # updates skipped because a rank ran out of memory
    history: list[str] = field(default_factory=list)


def stop_reason(cfg: Config, p: Progress) -> str | None:
    t = cfg.train
    if t.max_updates and p.update >= t.max_updates:
        return f"reached train.max_updates={t.max_updates}"
    if t.max_epochs and p.epoch > t.max_epochs:
        return f"reached train.max_epochs={t.max_epochs}"
    if t.max_time and p.elapsed >= t.max_time:
        return f"reached train.max_time={t.max_time:g}s"
    if t.patience and p.bad_validations >= t.patience:
        return f"no improvement in {t.patience} validations (train.patience)"
    return None


def data_fingerprint(meta: dict[str, Any], source_lang: str, target_lang: str) -> str:
    """Whether the training data is still the same: the prepared files' fingerprint (prepare.json:
    the sentencepiece model and the train files) and the direction read from them, e.g.
    "3f2a...:en->de". The same files read de->en are other training data."""
    return f"{meta.get('fingerprint', '')}:{source_lang}->{target_lang}"


def build_checkpoint(
    cfg: Config,
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    optimizer: torch.optim.Optimizer,
    scaler: DynamicLossScaler,
    progress: Progress,
    fingerprint: str,
    device: torch.device,
) -> dict[str, Any]:
    """The training checkpoint (docs/architecture.md, "Checkpoints"); tensors on the CPU."""
    rng = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }
    train_state = {
        "progress": asdict(progress),
        "optimizer": ckpt.to_cpu(optimizer.state_dict()),
        "scaler": scaler.state_dict(),
        "rng": rng,
        "fingerprint": fingerprint,
    }
    return ckpt.checkpoint_dict(
        ckpt.to_cpu(model.state_dict()),
        cfg,
        tokenizer,
        update=progress.update,
        epoch=progress.epoch,
        train_state=train_state,
    )


def restore(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: DynamicLossScaler,
    device: torch.device,
    *,
    reset_optimizer: bool,
    reset_data: bool,
) -> Progress:
    """Load a training checkpoint into the model, optimizer, loss scaler and RNGs; returns its
    progress. --reset-optimizer keeps a fresh optimizer and restarts the warm-up here;
    --reset-data restarts the epoch, the best validation and patience."""
    model.load_state_dict(state["model"])
    ts = state["train_state"]
    progress = Progress(**ts["progress"])
    if reset_optimizer:
        progress.schedule_offset = progress.update
        progress.history.append(f"reset optimizer at update {progress.update}")
    else:
        optimizer.load_state_dict(ts["optimizer"])
        scaler.load_state_dict(ts.get("scaler"))
    if reset_data:  # the valid set may have changed too (another data.dir, the reverse direction)
        progress.updates_in_epoch = 0
        progress.history.append(f"reset data at update {progress.update}")
        if progress.best is not None:
            log.info(
                "--reset-data: the best validation so far (%.3f) and checkpoint_best.pt are on "
                "the old data; the next validation starts a new best (and patience) and replaces "
                "checkpoint_best.pt",
                progress.best,
            )
        progress.best = None
        progress.bad_validations = 0
    rng = ts["rng"]
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
    return progress


def check_compatible(
    state: dict[str, Any],
    cfg: Config,
    tokenizer: Tokenizer,
    fingerprint: str,
    run_dir: Path,
    reset_data: bool,
) -> None:
    """Refuse to resume `state` (the run's checkpoint) with another tokenizer or model config, or
    (unless reset_data) other training data; the NmtError names what changed."""
    # the run's config with the defaults of keys added since it was written (an upgrade of nmt
    # must not read a new key as a change)
    old_cfg = config_from_dict(state["config"], where=str(run_dir))
    # token ids would mean other pieces, even with --reset-data
    if (state.get("tokenizer") or {}).get("sha256") != tokenizer.sha256:
        raise NmtError(
            f"{run_dir}: resume refused, the tokenizer of {cfg.data.dir} (spm.model) differs from "
            "the run's; prepare the new data with --spm-model from the run or use a new "
            "train.run_dir"
        )
    changed = [f"{key}: {a!r} -> {b!r}" for key, a, b in changed_keys(old_cfg, cfg, "model")]
    if changed:
        raise NmtError(
            f"{run_dir}: resume refused, the model config changed ({'; '.join(changed)}); use a "
            "new train.run_dir"
        )
    if reset_data:
        return
    # data.dir may move and the valid split change: the fingerprint says whether the
    # training data is still the same.
    # A run saved before its languages were resolved from prepare.json names none: its fingerprint
    # still holds the direction.
    unnamed = [f"data.{k}" for k in ("source_lang", "target_lang") if not getattr(old_cfg.data, k)]
    data_changed = [
        f"{key}: {a!r} -> {b!r}"
        for key, a, b in changed_keys(old_cfg, cfg, "data")
        if key not in ("data.dir", "data.valid_split", *unnamed)
    ]
    old_files, _, old_direction = str(state["train_state"].get("fingerprint") or "").partition(":")
    new_files, _, new_direction = fingerprint.partition(":")
    # checkpoints written before the direction was part of the fingerprint have none: their
    # files still count
    if old_direction and old_direction != new_direction:
        data_changed.append(
            f"the run translates {old_direction} but the data is now read {new_direction}"
        )
    if old_files != new_files:
        data_changed.append(f"the prepared data in {cfg.data.dir} (fingerprint)")
    if data_changed:
        raise NmtError(
            f"{run_dir}: resume refused, the training data changed ({'; '.join(data_changed)}); "
            "pass --reset-data to continue on the new data"
        )


def init_from_checkpoint(cfg: Config, model: torch.nn.Module, tokenizer: Tokenizer) -> None:
    """Fine-tuning (train.init_from): copy the model weights of that checkpoint into `model`, the
    new run's, as fairseq's --finetune-from-model and Marian's --pretrained-model do; the
    optimizer, schedule, progress and data position stay fresh. Loaded by the one loader, with
    its checks (weights only, no code from the file). Refused in one line naming
    train.init_from and the checkpoint where its model config differs from `cfg.model` in a key
    other than `TRAINING_ONLY_MODEL_KEYS`, or its tokenizer is not data.dir's."""
    path = Path(cfg.train.init_from)
    try:
        source = ckpt.load_model_checkpoint(
            path, mmap=True
        )  # the weights are copied into the model once
        changed = [
            c
            for c in changed_keys(source.config, cfg, "model")
            if c[0].partition(".")[2] not in TRAINING_ONLY_MODEL_KEYS
        ]
        if changed:
            key, theirs, ours = changed[0]
            raise NmtError(
                f"{path}: {key} is {theirs!r} in the checkpoint but {ours!r} in this run's config; "
                "set it as the checkpoint has it"
            )
        if source.tokenizer.sha256 != tokenizer.sha256:
            raise NmtError(
                f"{path}: tokenizer differs from the one of {cfg.data.dir} (spm.model); prepare "
                f"the data with `nmt prepare-bpe --tokenizer-from {path}`"
            )
        source.load_into(model)
    except NmtError as e:
        raise NmtError(f"train.init_from {e}") from None
