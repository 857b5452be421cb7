"""Optimisation pieces: the learning-rate and dropout schedules, fp16 loss scaling (a no-op
outside fp16), gradient scaling and clipping, Adam.

The loss is `nmt.training.loss`.

Each is small and pure enough to be tested on its own (tests/test_optim.py).
"""

from __future__ import annotations

import math

import torch

from nmt.config import TrainConfig
from nmt.errors import NmtError


def lr_at(update: int, cfg: TrainConfig, d_model: int) -> float:
    """Learning rate for the given update number (1-based: the update about to be made).

    noam (Vaswani et al. 2017, eq. 3): lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
    inverse_sqrt (fairseq): linear warm-up from warmup_init_lr to lr over warmup_updates,
    then lr * sqrt(warmup_updates / step).
    """
    step = max(update, 1)
    warmup = cfg.warmup_updates
    if cfg.lr_schedule == "noam":
        return cfg.lr * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if warmup == 0:
        return cfg.lr
    if step < warmup:
        return cfg.warmup_init_lr + (cfg.lr - cfg.warmup_init_lr) * step / warmup
    return cfg.lr * math.sqrt(warmup / step)


def dropout_at(update: int, cfg: TrainConfig, dropout: float) -> float:
    """Sub-layer dropout for the given update (1-based): `dropout` (model.dropout) up to
    dropout_ramp_start, linear to dropout_ramp_to at dropout_ramp_end, constant after.

    A pure function of the update number, so a resumed run uses the same values.
    """
    start = cfg.dropout_ramp_start
    end = cfg.dropout_ramp_end
    if end == 0 or update <= start:
        return dropout
    if update >= end:
        return cfg.dropout_ramp_to
    return dropout + (cfg.dropout_ramp_to - dropout) * (update - start) / (end - start)


class DynamicLossScaler:
    """fp16 loss scaling: multiply the loss by `scale` before backward.

    An update whose gradients overflow (inf/NaN) is skipped, not counted, and the scale
    halves; after `growth_interval` clean updates in a row the scale doubles. Falling
    below `min_scale` means fp16 cannot represent this model's gradients: stop and say so.

    Not `enabled` (bf16 and fp32 need no scaling, as torch.amp.GradScaler(enabled=False)):
    the scale stays 1, no update overflows and there is no state to save.
    """

    def __init__(
        self,
        init_scale: float = 128.0,
        min_scale: float = 1e-4,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        self.enabled = enabled
        self.min_scale = min_scale
        self.growth_interval = growth_interval
        self.scale = float(init_scale) if enabled else 1.0
        self.clean_updates = 0

    def overflowed(self, gnorm: torch.Tensor, at_update: int) -> bool:
        """Whether update `at_update`'s gradients overflowed, their norm being `gnorm` (then
        skip the update); adjusts the scale. Not enabled: False, without reading `gnorm`
        (which would make the host wait for the device)."""
        if not self.enabled:
            return False
        overflow = not math.isfinite(float(gnorm))
        self.update(overflow, at_update)
        return overflow

    def update(self, overflow: bool, at_update: int) -> None:
        if overflow:
            self.scale /= 2.0
            self.clean_updates = 0
            if self.scale < self.min_scale:
                raise NmtError(
                    f"fp16 loss scale fell below train.fp16_min_scale ({self.min_scale:g}) at "
                    f"update {at_update}: gradients keep overflowing. Try train.precision=bf16, a "
                    "lower train.lr, longer train.warmup_updates, or train.clip_norm"
                )
        else:
            self.clean_updates += 1
            if self.clean_updates % self.growth_interval == 0:
                self.scale *= 2.0

    def state_dict(self) -> dict[str, float | int] | None:
        return {"scale": self.scale, "clean_updates": self.clean_updates} if self.enabled else None

    def load_state_dict(self, state: dict[str, float | int] | None) -> None:
        """Resume the scale (an fp16 run's state); nothing to do when not enabled or no state."""
        if self.enabled and state:
            self.scale = float(state["scale"])
            self.clean_updates = int(state["clean_updates"])


def scale_and_clip(
    params: list[torch.nn.Parameter], factor: float, clip_norm: float
) -> torch.Tensor:
    """Multiply the gradients by `factor`, then clip their norm to `clip_norm` (if > 0);
    returns the norm before clipping, on the device."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, factor)
    if clip_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, clip_norm)
    return torch.nn.utils.get_total_norm(grads)


FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def build_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam (beta 0.9/0.98, eps 1e-9 in the paper); AdamW when weight_decay > 0."""
    cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
    # fused: one kernel for all parameters (CPU and CUDA), 3x faster than the per-tensor loop
    return cls(
        params,
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        fused=all(p.dtype in FUSED_DTYPES for p in params),
    )
