"""The training objective: label-smoothed cross-entropy, and the module DDP and compile see.

`TranslationLoss` wraps the model: decoder states at the real target positions (indices made
on the CPU by `nmt.data.collate`), then the output projection and the loss in row chunks
(`projected_smoothed_loss`), so that no (tokens x vocabulary) tensor exists in fp32 at once:
at 25k target tokens and a 32k vocabulary that tensor alone would be 3.2 GB, and its softmax
and gradient several more. The gradients of the projection are computed chunk by chunk in
the forward pass (the loss is the last node of the graph: its backward only scales them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# rows of one chunk: at most this many (rows x vocabulary) elements, 64 MB in fp32 (512 MB on a
# GPU, where each chunk also reads and writes the whole weight and its gradient: fewer chunks)
CHUNK_ELEMENTS = 1 << 24
CUDA_CHUNK_ELEMENTS = 1 << 27


def smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy of logits (N, V) in any dtype, target (N,), computed in fp32:
    (loss, nll, lprobs (N, V) fp32, keep (N,) bool), loss and NLL summed over the rows whose
    target is not `ignore_index`. The smoothed target puts 1 - epsilon on the gold token and
    epsilon / (V - 1) on every other token (as fairseq). `_ProjectedSmoothedLoss` computes
    the gradient from `lprobs` itself."""
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)  # (N, V)
    keep = target != ignore_index
    gold = lprobs.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)  # (N,)
    nll = -torch.where(keep, gold, 0.0).sum()
    if epsilon == 0.0:
        return nll, nll.detach(), lprobs, keep
    # the (N,) row sums masked, not rows of lprobs selected: no (N, V) copy
    smooth = -torch.where(keep, lprobs.sum(dim=-1), 0.0).sum()
    a, b = smoothing_weights(epsilon, lprobs.size(-1))
    return a * nll + b * smooth, nll.detach(), lprobs, keep


def smoothing_weights(epsilon: float, vocab: int) -> tuple[float, float]:
    """(a, b): per row, loss = -(a * lp[gold] + b * sum_v lp[v]) (fairseq's smoothing)."""
    b = epsilon / (vocab - 1)
    return 1.0 - epsilon - b, b


# traced, its chunk loop compiled again for every count of real target tokens
@torch.compiler.disable
def projected_smoothed_loss(
    states: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    chunk_rows: int | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed loss and NLL, summed over rows, of logits = states @ weight^T (+ bias).

    states (M, D) are the final decoder states of M real target tokens (no padding), weight
    (V, D) the output projection, bias (V,) its bias if any, target (M,) their labels. Equal to
    the label-smoothed cross-entropy of `F.linear(states, weight, bias)` (`smoothed_cross_entropy`),
    computed `chunk_rows` rows at a time (default: CHUNK_ELEMENTS / V, on CUDA CUDA_CHUNK_ELEMENTS /
    V), in fp32 after the matmul.
    """
    rows = chunk_rows or max(
        1, (CUDA_CHUNK_ELEMENTS if states.is_cuda else CHUNK_ELEMENTS) // weight.size(0)
    )
    trained = [t for t in (states, weight, bias) if t is not None and t.requires_grad]
    if not (torch.is_grad_enabled() and trained):
        total = torch.zeros(2, dtype=torch.float32, device=states.device)
        for start in range(0, states.size(0), rows):
            logits = F.linear(states[start : start + rows], weight, bias)
            loss, nll, _, _ = smoothed_cross_entropy(
                logits, target[start : start + rows], epsilon, -1
            )
            total += torch.stack([loss, nll])
        return total[0], total[1]
    return _ProjectedSmoothedLoss.apply(states, weight, target, epsilon, rows, bias)


class _ProjectedSmoothedLoss(torch.autograd.Function):
    """The chunked loss with its gradients computed in the forward pass, chunk by chunk:
    per row, loss = -(a * lp[gold] + b * sum_v lp[v]) (`smoothing_weights`, a + b V = 1), so
    d loss / d logit_v = p_v - b - a [v = gold], computed in place in the chunk's fp32
    log-probabilities (autograd's chain would cost several (c, V) passes and buffers); then
    d states = g @ weight, d weight += g^T @ states and d bias += the column sums of g; only one
    chunk's g exists at a time."""

    @staticmethod
    def forward(
        ctx: Any,
        states: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        epsilon: float,
        rows: int,
        bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = smoothing_weights(epsilon, weight.size(0))
        half = False  # then the chunks' gradients leave out -b (see below)
        grad_states = torch.empty_like(states)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        total = torch.zeros(2, dtype=torch.float32, device=states.device)
        low = weight
        for start in range(0, states.size(0), rows):
            h = states[start : start + rows]
            gold = target[start : start + rows]
            logits = F.linear(h, weight, bias)  # (c, V) in the autocast dtype, if any
            loss, nll, lprobs, _ = smoothed_cross_entropy(logits, gold, epsilon, -1)
            total += torch.stack([loss, nll])
            low = low.to(logits.dtype)  # the weight cast once, not per chunk
            half = logits.dtype != torch.float32
            at_gold = (torch.arange(gold.size(0), device=gold.device), gold)
            # p in the logits' dtype (on CUDA written once), the gold entries p - a from fp32; -b
            # below
            if half:
                value = lprobs[at_gold].exp_().sub_(a).to(logits.dtype)
                grad = (
                    torch.exp(lprobs, out=torch.empty_like(logits))
                    if lprobs.is_cuda
                    else lprobs.exp_().to(logits.dtype)
                )
                grad[at_gold] = value
            else:
                grad = lprobs.exp_()  # (c, V) fp32: the chunk's only big buffer
                if b:
                    grad.sub_(b)
                grad[at_gold] -= a
            grad_states[start : start + rows] = (grad @ low).to(states.dtype)
            grad_weight += (grad.t() @ h.to(grad.dtype)).float()
            if grad_bias is not None:
                grad_bias += grad.sum(0, dtype=torch.float32)
        if half and b:  # the sums of -b over the vocabulary and over the rows
            grad_states.sub_(b * low.sum(0, dtype=torch.float32))
            grad_weight.sub_(b * states.sum(0, dtype=torch.float32))
            if grad_bias is not None:
                grad_bias.sub_(b * states.size(0))
        ctx.save_for_backward(grad_states, grad_weight, grad_bias)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        loss = total[0].clone()
        nll = total[1].clone()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor, grad_nll: Any) -> tuple[Any, ...]:
        grad_states, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_loss.float()
        return (
            grad_states * scale.to(grad_states.dtype),
            (grad_weight * scale).to(ctx.weight_dtype),
            None,
            None,
            None,
            None if grad_bias is None else (grad_bias * scale).to(ctx.bias_dtype),
        )


class TranslationLoss(nn.Module):
    """The model and its training loss as one module, so that DDP (gradient hooks) and
    torch.compile see the whole forward pass: (src, prev_output, target_index,
    target_tokens) of a `nmt.data.Batch` -> (label-smoothed loss, NLL), summed over the
    real target tokens. The model's parameters are this module's `model.*`."""

    def __init__(self, model: Any, epsilon: float):
        super().__init__()
        self.model = model
        self.epsilon = epsilon

    def forward(
        self,
        src: torch.Tensor,
        prev_output: torch.Tensor,
        target_index: torch.Tensor,
        target_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        states = self.model.decoder_states(src, prev_output, target_index)  # (M, D)
        return projected_smoothed_loss(
            states,
            self.model.output_weight,
            target_tokens,
            self.epsilon,
            None,  # chunks of the default size
            self.model.output_bias,
        )
