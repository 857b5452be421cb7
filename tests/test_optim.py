"""LR schedule values, label smoothing against a hand computation, fp16 loss scaling."""

import math

import pytest
import torch
from helpers import label_smoothed_nll_loss

from nmt.config import TrainConfig
from nmt.errors import NmtError
from nmt.training.optim import DynamicLossScaler, dropout_at, lr_at


def test_noam_schedule_matches_the_paper_formula():
    cfg = TrainConfig(lr_schedule="noam", lr=1.0, warmup_updates=4000)
    for step in (1, 100, 3999, 4000, 4001, 10_000, 100_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert lr_at(step, cfg, 512) == pytest.approx(expected, rel=1e-12)
    # peak at the end of warm-up: 512^-0.5 * 4000^-0.5 ~ 7.0e-4
    assert lr_at(4000, cfg, 512) == pytest.approx(6.988e-4, rel=1e-3)


def test_inverse_sqrt_schedule_warms_up_linearly_then_decays():
    cfg = TrainConfig(lr_schedule="inverse_sqrt", lr=1e-3, warmup_updates=100, warmup_init_lr=0.0)
    assert lr_at(50, cfg, 512) == pytest.approx(5e-4)
    assert lr_at(100, cfg, 512) == pytest.approx(1e-3)
    assert lr_at(400, cfg, 512) == pytest.approx(1e-3 * math.sqrt(100 / 400))
    rates = [lr_at(s, cfg, 512) for s in range(1, 1000)]
    peak = rates.index(max(rates))
    assert peak == 99 and all(a <= b for a, b in zip(rates[:peak], rates[1 : peak + 1]))
    assert all(a >= b for a, b in zip(rates[peak:], rates[peak + 1 :]))


def test_dropout_ramp_holds_then_rises_linearly_then_holds():
    cfg = TrainConfig(dropout_ramp_start=100, dropout_ramp_end=300, dropout_ramp_to=0.3)
    assert [dropout_at(u, cfg, 0.1) for u in (1, 50, 100)] == [0.1, 0.1, 0.1]
    assert dropout_at(200, cfg, 0.1) == pytest.approx(0.2)
    assert dropout_at(101, cfg, 0.1) == pytest.approx(0.1 + 0.2 / 200)
    assert [dropout_at(u, cfg, 0.1) for u in (300, 301, 10_000)] == [0.3, 0.3, 0.3]
    rates = [dropout_at(u, cfg, 0.1) for u in range(1, 400)]
    assert all(a <= b for a, b in zip(rates, rates[1:]))
    down = TrainConfig(
        dropout_ramp_start=0, dropout_ramp_end=10, dropout_ramp_to=0.0
    )  # falling works too
    assert dropout_at(5, down, 0.2) == pytest.approx(0.1) and dropout_at(10, down, 0.2) == 0.0
    assert (
        dropout_at(10_000, TrainConfig(dropout_ramp_to=0.3), 0.1) == 0.1
    )  # no ramp: model.dropout


def test_label_smoothing_against_hand_computation():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    target = torch.tensor([1, 2, 0])  # the last row is padding (pad id 0)
    eps, V = 0.1, 4
    loss, nll = label_smoothed_nll_loss(logits, target, eps, ignore_index=0)
    exp_loss = exp_nll = 0.0
    for row, t in ((0, 1), (1, 2)):
        z = logits[row].tolist()
        logz = math.log(sum(math.exp(v) for v in z))
        lp = [v - logz for v in z]
        q = [eps / (V - 1)] * V
        q[t] = 1 - eps
        exp_loss += -sum(qi * li for qi, li in zip(q, lp))
        exp_nll += -lp[t]
    assert loss.item() == pytest.approx(exp_loss, rel=1e-6)
    assert nll.item() == pytest.approx(exp_nll, rel=1e-6)


def test_no_smoothing_is_plain_cross_entropy():
    torch.manual_seed(0)
    logits, target = torch.randn(7, 11), torch.randint(1, 11, (7,))
    loss, nll = label_smoothed_nll_loss(logits, target, 0.0, ignore_index=0)
    ref = torch.nn.functional.cross_entropy(logits, target, ignore_index=0, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6) and nll.item() == pytest.approx(
        ref.item(), rel=1e-6
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_written_loss_gradient_equals_autograd(eps, dtype):
    """The loss' backward is written by hand; autograd through log_softmax is the reference."""
    torch.manual_seed(1)
    logits = torch.randn(23, 17).to(dtype).requires_grad_()
    target = torch.randint(1, 17, (23,))
    target[::4] = 0  # padding rows get no gradient
    loss, nll = label_smoothed_nll_loss(logits, target, eps, ignore_index=0)
    (2.5 * loss).backward()
    assert logits.grad is not None and logits.grad.dtype == dtype and not nll.requires_grad

    ref_logits = logits.detach().float().requires_grad_()
    lp = torch.log_softmax(ref_logits, -1)
    keep = target != 0
    q = torch.full_like(lp, eps / 16).scatter_(1, target.unsqueeze(1), 1 - eps)
    ref = -(q * lp)[keep].sum()
    (2.5 * ref).backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert (logits.grad[~keep] == 0).all()
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(logits.grad.float(), ref_logits.grad, rtol=tol, atol=tol)


def test_loss_scaler_halves_on_overflow_and_grows_after_clean_updates():
    s = DynamicLossScaler(init_scale=128.0, min_scale=1.0, growth_interval=3)
    s.update(overflow=True, at_update=1)
    assert s.scale == 64.0
    for _ in range(3):
        s.update(overflow=False, at_update=1)
    assert s.scale == 128.0
    state = s.state_dict()
    t = DynamicLossScaler()
    t.load_state_dict(state)
    assert t.scale == 128.0 and t.clean_updates == s.clean_updates


def test_loss_scaler_floor_gives_an_actionable_error():
    s = DynamicLossScaler(init_scale=4.0, min_scale=1.0)
    s.update(True, 7)
    s.update(True, 7)
    with pytest.raises(NmtError, match="update 7.*bf16"):
        s.update(True, 7)


def test_loss_scaler_not_enabled_is_a_no_op():
    """Outside fp16 (enabled=False): scale 1, never an overflow, the norm not even read, no
    state."""
    s = DynamicLossScaler(init_scale=128.0, enabled=False)
    assert s.scale == 1.0
    assert not s.overflowed(torch.tensor(float("inf")), at_update=1)
    assert s.scale == 1.0 and s.clean_updates == 0
    assert s.state_dict() is None
    s.load_state_dict({"scale": 64.0, "clean_updates": 5})  # an fp16 run resumed in bf16
    assert s.scale == 1.0 and s.clean_updates == 0
    enabled = DynamicLossScaler(init_scale=128.0)
    assert enabled.overflowed(torch.tensor(float("inf")), at_update=1) and enabled.scale == 64.0
    assert not enabled.overflowed(torch.tensor(3.0), at_update=2) and enabled.clean_updates == 1
