"""Optimisation pieces: the learning-rate schedule, label-smoothed loss, fp16 loss scaling.

Each is small and pure enough to be tested on its own (tests/test_optim.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

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
    if warmup > 0 and step < warmup:
        return cfg.warmup_init_lr + (cfg.lr - cfg.warmup_init_lr) * step / warmup
    return cfg.lr * math.sqrt(max(warmup, 1) / step) if warmup > 0 else cfg.lr


def dropout_at(update: int, cfg: TrainConfig, dropout: float) -> float:
    """Sub-layer dropout for the given update (1-based): `dropout` (model.dropout) up to
    dropout_ramp_start, linear to dropout_ramp_to at dropout_ramp_end, constant after.

    A pure function of the update number, so a resumed run uses the same values.
    """
    start, end = cfg.dropout_ramp_start, cfg.dropout_ramp_end
    if end == 0 or update <= start:
        return dropout
    if update >= end:
        return cfg.dropout_ramp_to
    return dropout + (cfg.dropout_ramp_to - dropout) * (update - start) / (end - start)


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over non-padding targets.

    logits (N, V) in any dtype, target (N,). Computed in fp32. The smoothed target puts
    1 - epsilon on the gold token and epsilon / (V - 1) on every other token (as fairseq),
    so loss = (1 - epsilon - eps_i) * nll + eps_i * sum_v(-log p_v), eps_i = epsilon / (V-1).
    The gradient comes from `_SmoothedCrossEntropy` in one pass over (N, V).
    """
    if not logits.requires_grad:
        return _smoothed_ce(logits, target, epsilon, ignore_index)[:2]
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon, ignore_index)
    return loss, nll


def _smoothed_ce(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                 ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, nll, lprobs (N, V) fp32, keep (N,) bool): the forward pass of the loss."""
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V) fp32
    keep = target != ignore_index
    gold = lprobs.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)  # (N,)
    nll = -torch.where(keep, gold, 0.0).sum()
    if epsilon == 0.0:
        return nll, nll.detach(), lprobs, keep
    # the (N,) row sums masked, not rows of lprobs selected: no (N, V) copy
    smooth = -torch.where(keep, lprobs.sum(dim=-1), 0.0).sum()
    eps_i = epsilon / (lprobs.size(-1) - 1)
    return (1.0 - epsilon - eps_i) * nll + eps_i * smooth, nll.detach(), lprobs, keep


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy with a hand-written backward.

    Per kept row, loss = -(a * lp[gold] + b * sum_v lp[v]) with a = 1 - epsilon - eps_i,
    b = eps_i, so d loss / d logit_v = (a + b V) p_v - b - a [v = gold]. Computed in place in
    the saved log-probabilities: autograd's chain (log_softmax, gather, sum, where) costs
    several (N, V) passes and buffers, ~8% of a CPU training update at V = 8000.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        loss, nll, lprobs, keep = _smoothed_ce(logits, target, epsilon, ignore_index)
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor, grad_nll: Any) -> tuple[Any, ...]:
        lprobs, target, keep = ctx.saved_tensors
        vocab = lprobs.size(-1)
        b = ctx.epsilon / (vocab - 1) if ctx.epsilon else 0.0
        a = 1.0 - ctx.epsilon - b
        grad = lprobs.exp_().mul_(a + b * vocab)  # the saved buffer becomes the gradient
        if b:
            grad.sub_(b)
        rows = keep.nonzero().squeeze(1)
        grad[rows, target[rows]] -= a
        grad.mul_(torch.where(keep, grad_loss.float(), 0.0).unsqueeze(1))
        return grad.to(ctx.dtype), None, None, None


class DynamicLossScaler:
    """fp16 loss scaling: multiply the loss by `scale` before backward.

    An update whose gradients overflow (inf/NaN) is skipped, not counted, and the scale
    halves; after `growth_interval` clean updates in a row the scale doubles. Falling
    below `min_scale` means fp16 cannot represent this model's gradients: stop and say so.
    """

    def __init__(self, init_scale: float = 128.0, min_scale: float = 1e-4, growth_interval: int = 2000):
        self.scale = float(init_scale)
        self.min_scale = min_scale
        self.growth_interval = growth_interval
        self.clean_updates = 0

    def update(self, overflow: bool, at_update: int) -> None:
        if overflow:
            self.scale /= 2.0
            self.clean_updates = 0
            if self.scale < self.min_scale:
                raise NmtError(
                    f"fp16 loss scale fell below train.fp16_min_scale ({self.min_scale:g}) at update "
                    f"{at_update}: gradients keep overflowing. Try train.precision=bf16, a lower "
                    "train.lr, longer train.warmup_updates, or train.clip_norm"
                )
        else:
            self.clean_updates += 1
            if self.clean_updates % self.growth_interval == 0:
                self.scale *= 2.0

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "clean_updates": self.clean_updates}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self.clean_updates = int(state["clean_updates"])


FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def build_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam (beta 0.9/0.98, eps 1e-9 in the paper); AdamW when weight_decay > 0."""
    cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
    return cls(
        params,
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        # One kernel for all parameters (CPU and CUDA): 3x faster than the per-tensor loop.
        fused=all(p.dtype in FUSED_DTYPES for p in params),
    )
