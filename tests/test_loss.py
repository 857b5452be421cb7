"""The training objective: the chunked projection + label-smoothed loss equals the plain one
(loss, NLL and both gradients), in fp32 and under bf16 and fp16 autocast (on CUDA too, with
`make test-gpu`), for any chunking; the model's decoder states at host-made indices equal its
masked forward; padding lengths to a multiple changes no loss or gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import label_smoothed_nll_loss
from torch._dynamo.utils import counters

from nmt import data as datamod
from nmt.config import ModelConfig
from nmt.models.transformer import Transformer
from nmt.tokenizer import NMT_SPECIALS
from nmt.training.loss import TranslationLoss, projected_smoothed_loss


def reference(
    states: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    eps: float,
    bias: torch.Tensor | None = None,
):
    return label_smoothed_nll_loss(
        F.linear(states, weight, bias), target, eps, ignore_index=NMT_SPECIALS.pad
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_rows", [1, 7, 64, None])
@pytest.mark.parametrize("with_bias", [False, True])  # model.output_bias
def test_chunked_loss_and_gradients_equal_the_plain_loss(eps, chunk_rows, with_bias):
    torch.manual_seed(0)
    states = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(29, 16, requires_grad=True)
    bias = (0.1 * torch.randn(29)).requires_grad_() if with_bias else None
    target = torch.randint(4, 29, (37,))
    loss, nll = projected_smoothed_loss(states, weight, target, eps, chunk_rows, bias)
    (1.7 * loss).backward()
    ref_states, ref_weight = (
        states.detach().clone().requires_grad_(),
        weight.detach().clone().requires_grad_(),
    )
    ref_bias = None if bias is None else bias.detach().clone().requires_grad_()
    ref_loss, ref_nll = reference(ref_states, ref_weight, target, eps, ref_bias)
    (1.7 * ref_loss).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states.grad, ref_states.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, ref_weight.grad, rtol=1e-5, atol=1e-6)
    if bias is not None:
        torch.testing.assert_close(bias.grad, ref_bias.grad, rtol=1e-5, atol=1e-6)
    assert not nll.requires_grad


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_loss_under_autocast_is_close_to_the_plain_loss(dtype, with_bias, device):
    # under autocast the chunks keep p in half precision and add the -b terms after the matmuls: the
    # gradients are those of the fp64 loss within the half dtype's rounding (a wrong -b is ~10% off
    # here)
    torch.manual_seed(1)
    states = torch.randn(50, 32).to(device).requires_grad_()
    weight = torch.randn(40, 32).to(device).requires_grad_()
    bias = (0.1 * torch.randn(40)).to(device).requires_grad_() if with_bias else None
    target = torch.randint(4, 40, (50,)).to(device)
    with torch.autocast(device, dtype=dtype):
        loss, _ = projected_smoothed_loss(states, weight, target, 0.1, 8, bias)
    loss.backward()
    leaves = [
        t.detach().double().requires_grad_()
        for t in (states, weight) + ((bias,) if with_bias else ())
    ]
    ref_loss, _ = reference(leaves[0], leaves[1], target, 0.1, leaves[2] if with_bias else None)
    ref_loss.backward()
    assert loss.dtype == torch.float32 and weight.grad.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref_loss.detach().double(), rtol=1e-2, atol=0)
    for leaf, ref in zip((states, weight, bias), leaves):
        assert ((leaf.grad.double() - ref.grad).norm() / ref.grad.norm()).item() < 1e-2


def test_without_gradients_the_loss_is_the_same():
    torch.manual_seed(2)
    states, weight, target = torch.randn(20, 8), torch.randn(15, 8), torch.randint(4, 15, (20,))
    with torch.no_grad():
        loss, nll = projected_smoothed_loss(states, weight, target, 0.1, 3)
    ref_loss, ref_nll = reference(states, weight, target, 0.1)
    torch.testing.assert_close((loss, nll), (ref_loss, ref_nll), rtol=1e-5, atol=1e-5)


def small_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        ffn_dim=64,
        heads=4,
        dropout=0.0,
        max_positions=64,
    )
    return Transformer(cfg, 50, pad_id=NMT_SPECIALS.pad).eval()


def test_decoder_states_at_host_indices_equal_the_masked_forward(prepared):
    data = datamod.ParallelData.load(prepared[0], "valid")
    model = Transformer(
        small_model().cfg, prepared[1]["vocab_size"], pad_id=NMT_SPECIALS.pad
    ).eval()
    batch = datamod.collate(data, [3, 9, 1, 20, 7], NMT_SPECIALS)
    mask = batch.target != NMT_SPECIALS.pad
    assert torch.equal(batch.target_index, mask.reshape(-1).nonzero().squeeze(1))
    assert torch.equal(batch.target_tokens, batch.target[mask])
    with torch.no_grad():
        logits = model(batch.src, batch.prev_output)[mask]
        states = model.decoder_states(batch.src, batch.prev_output, batch.target_index)
        torch.testing.assert_close(F.linear(states, model.output_weight), logits)


def test_padding_to_a_multiple_of_8_changes_no_loss_or_gradient(prepared):
    data = datamod.ParallelData.load(prepared[0], "train")
    vocab = prepared[1]["vocab_size"]
    model = Transformer(small_model().cfg, vocab, pad_id=NMT_SPECIALS.pad)
    objective = TranslationLoss(model, 0.1)
    ids = next(
        list(range(i, i + 12))
        for i in range(len(data))  # lengths that 8 changes
        if datamod.collate(data, list(range(i, i + 12)), NMT_SPECIALS).src.size(1) % 8
    )
    results = []
    for pad_to in (1, 8):
        batch = datamod.collate(data, ids, NMT_SPECIALS, pad_to=pad_to)
        assert batch.src.size(1) % pad_to == 0 and batch.target.size(1) % pad_to == 0
        model.zero_grad()
        loss, nll = objective(batch.src, batch.prev_output, batch.target_index, batch.target_tokens)
        loss.backward()
        results.append(
            (loss.detach(), nll, {k: p.grad.clone() for k, p in model.named_parameters()})
        )
    (loss1, nll1, grads1), (loss8, nll8, grads8) = results
    torch.testing.assert_close(loss8, loss1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll8, nll1, rtol=1e-5, atol=1e-5)
    for key, grad in grads1.items():
        torch.testing.assert_close(grads8[key], grad, rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.slow
def test_compiled_objective_gives_the_loss_and_gradients_of_the_eager_one(prepared):
    """train.compile: torch.compile of the model and loss (inductor, on the CPU here) changes
    the loss and gradients of a fixed batch by float rounding only; a second batch shape
    (pad_to 8 keeps shapes few) runs too, and later batches, whose counts of real target tokens
    all differ, compile nothing more (the loss's chunk loop runs eagerly: traced, it compiled
    again for every count)."""
    data = datamod.ParallelData.load(prepared[0], "train")
    vocab = prepared[1]["vocab_size"]
    model = Transformer(small_model().cfg, vocab, pad_id=NMT_SPECIALS.pad)
    eager = TranslationLoss(model, 0.1)
    compiled = torch.compile(TranslationLoss(model, 0.1))
    for ids in (list(range(8)), list(range(100, 116))):
        batch = datamod.collate(data, ids, NMT_SPECIALS, pad_to=8)
        results = []
        for objective in (eager, compiled):
            model.zero_grad()
            loss, nll = objective(
                batch.src, batch.prev_output, batch.target_index, batch.target_tokens
            )
            loss.backward()
            results.append(
                (loss.detach(), nll, {k: p.grad.clone() for k, p in model.named_parameters()})
            )
        (loss_e, nll_e, grads_e), (loss_c, nll_c, grads_c) = results
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(nll_c, nll_e, rtol=1e-5, atol=1e-4)
        for key, grad in grads_e.items():
            torch.testing.assert_close(grads_c[key], grad, rtol=1e-3, atol=1e-5, msg=key)

    def graphs_after(first: int) -> int:
        batch = datamod.collate(data, list(range(first, first + 16)), NMT_SPECIALS, pad_to=8)
        compiled(batch.src, batch.prev_output, batch.target_index, batch.target_tokens)[
            0
        ].backward()
        return counters["stats"]["unique_graphs"]

    # a length that changes for the first time compiles once more (automatic dynamic): which
    # batch first changes which length depends on the corpus (Multi30k, or the synthetic one
    # of a clone without it), so two batches settle them
    graphs_after(150)
    settled = graphs_after(200)
    assert graphs_after(250) == settled
