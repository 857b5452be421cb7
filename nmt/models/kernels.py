"""The CPU decoding kernels of a model loaded for decoding (`nmt.decoding.predict.load_models`).

fp32: the output projection (`Transformer.cpu_output`), the largest product of a decode step,
is a `PackedLinear`: its weight is packed once into oneDNN's blocked layout (what torch.compile's
freezing does), where it runs 25-60% faster than torch's default kernel on a decode's batches
of 10-200 rows, and a row's result does not depend on the other rows. (Packing the other linear
layers too gained less than the run-to-run spread and cost 30-170 MB of kernels.)

Int8 (`nmt translate --precision int8`), as Marian's int8 CPU decoding: the decoder's linear
layers and the output projection multiply in int8 through PyTorch's x86 kernels (fbgemm); the
encoder, run once per sentence, stays fp32. Weights are quantised once, symmetrically with one
scale per output row. Activations are quantised at each call with one scale per row: each row
is divided by its largest absolute value and quantised with a fixed scale, and the product is
multiplied back. A row's result therefore depends on that row alone, never on the other
sentences in its batch, so batching still changes no translation (torch's dynamic quantisation
takes one scale for the whole batch and would). Activations use 7 bits (0..128) so that AVX2's
int8 instructions, which add pairs of products in int16, cannot saturate.
"""

from __future__ import annotations

import warnings
from functools import cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from nmt.errors import NmtError, one_line

if TYPE_CHECKING:
    from nmt.models.transformer import Transformer

_X_SCALE = 1 / 63.5  # a row scaled into [-1, 1] -> quint8 0..128
_X_ZERO = 64
ROWS = 8  # PackedLinear pads its input to a multiple of this many rows


def _int8_linear_op():  # type: ignore[no-untyped-def]
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32


class PackedLinear(nn.Module):
    """y = x W^T + b in fp32, W packed once for oneDNN (torch's mkldnn linear). oneDNN makes and
    keeps a kernel for each number of rows (about 0.4 MB each for the demo model's output
    projection): padding the rows to a multiple of ROWS makes a decode, whose batch shrinks
    step by step, need a few of them, not one per row count."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().float().contiguous())
        self.out_features = weight.size(0)
        self.bias = None if bias is None else bias.detach().float().clone()

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1))
        n = rows.size(0)
        if pad := -n % ROWS:
            rows = torch.cat([rows, rows.new_zeros(pad, rows.size(1))])
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y[:n].view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"out_features={self.out_features}, bias={self.bias is not None}"


@cache
def packing_works() -> bool:
    """Whether this torch build has the oneDNN kernels PackedLinear needs (x86 builds do)."""
    try:
        return torch.equal(PackedLinear(torch.eye(4))(torch.ones(1, 4)), torch.ones(1, 4))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (a scale per row) and x in 7 bits (a scale per row of x)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        super().__init__()
        w = weight.detach().float().cpu()
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12).double()
        zero = torch.zeros(w.size(0), dtype=torch.long)
        with warnings.catch_warnings():  # torch marks its quantised tensor types deprecated
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None)
        self.out_features = w.size(0)
        self.bias = None if bias is None else bias.detach().float().cpu().clone()

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1]).float()
        # (N, 1); an all-zero row stays 0
        row_max = x.abs().amax(-1, keepdim=True).clamp_min_(1e-30)
        y = _int8_linear_op()(x / row_max, _X_SCALE, _X_ZERO, self.packed)
        y = y.mul_(row_max) if self.bias is None else torch.addcmul(self.bias, y, row_max)
        return y.view(*shape[:-1], self.out_features)

    extra_repr = PackedLinear.extra_repr


def check_int8(device: torch.device) -> None:
    """One-line errors where int8 decoding cannot run: not on the CPU, or no x86 int8 kernels."""
    if device.type != "cpu":
        raise NmtError(f"--precision int8 is for CPU decoding; on {device.type} use bf16 or fp16")
    try:
        Int8Linear(torch.ones(2, 4))(torch.ones(1, 4))
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        raise NmtError(
            "--precision int8 needs PyTorch's x86 int8 kernels (fbgemm), which this torch build "
            f"lacks ({one_line(e)}); use fp32"
        ) from None


def quantize_decoder(model: Transformer) -> Transformer:
    """Replace the decoder's linear layers and the output projection by Int8Linear (in place)."""
    for module in list(model.decoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear(child.weight, child.bias))
    model.cpu_output = Int8Linear(model.output_weight, model.output_bias)
    return model
