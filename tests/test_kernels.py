"""The CPU decoding kernels (nmt.models.kernels): packed fp32 and int8 linear layers against
nn.Linear, one row independent of the rest of its batch, which modules are replaced, and int8's
one-line errors."""

from __future__ import annotations

import copy
import platform
import subprocess
import sys

import pytest
import torch
from torch import nn

from nmt import device as nmt_device
from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.models import kernels
from nmt.models.kernels import Int8Linear, PackedLinear, check_int8, packing_works, quantize_decoder
from nmt.models.transformer import Transformer
from nmt.tokenizer import NMT_SPECIALS

V = 60


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes, one of them all zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.logspace(-3, 2, n)[:, None]
    x[n // 2] = 0
    return x


@pytest.mark.parametrize("d_in, d_out, bias", [(64, 48, True), (256, 1000, False), (200, 3, True)])
def test_int8_linear_is_close_to_fp32_row_by_row(d_in, d_out, bias):
    torch.manual_seed(1)
    lin = nn.Linear(d_in, d_out, bias=bias)
    q = Int8Linear(lin.weight, lin.bias)
    x = rows(41, d_in)
    with torch.no_grad():
        want, got = lin(x), q(x)
    assert got.shape == want.shape and got.dtype == torch.float32 and torch.isfinite(got).all()
    # the error of each row scales with that row (a per-row activation scale), not with the batch
    xw = (x.abs() @ lin.weight.abs().t()).detach()  # bound on |x W^T| before cancellation
    err = (got - want).abs()
    assert (err <= 0.02 * xw + 1e-6).all()
    assert torch.equal(
        got[20], lin.bias if bias else torch.zeros(d_out)
    )  # the zero row: exactly the bias
    assert err.max() > 0  # it really is quantised


# a Marian-like model (issue 26): its own output matrix with a bias, swish, a zero decoder start
MARIAN = {"tie_output": False, "output_bias": True, "activation": "swish", "decoder_start": "zeros"}


def make(seed: int = 0, **model: object) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=64,
        ffn_dim=128,
        heads=4,
        max_positions=64,
        **model,
    )  # type: ignore[arg-type]
    out = Transformer(cfg, V, pad_id=NMT_SPECIALS.pad).eval()
    if out.output_bias is not None:  # initialised to zeros: make it count
        with torch.no_grad():
            out.output_bias.normal_()
    return out


def decode_side_by_side(a_model: Transformer, b_model: Transformer, steps: int = 5):
    """The log-probs (N, V) of two models' decode steps of the same sources, step by step, both
    fed the first model's best tokens."""
    g = torch.Generator().manual_seed(4)
    src = torch.randint(4, V, (3, 9), generator=g)
    src[1, 6:] = NMT_SPECIALS.pad  # padding
    tokens = torch.full((3,), 2)
    a, b = a_model.encode(src), b_model.encode(src)  # both run without gradients
    for _ in range(steps):
        la, a = a_model.decode_step(tokens, a)
        lb, b = b_model.decode_step(tokens, b)
        yield la, lb
        tokens = la.argmax(-1)


def test_quantize_decoder_replaces_the_decoder_linears_and_the_output_only():
    model = quantize_decoder(make())
    decoder = [m for m in model.decoder.modules() if isinstance(m, (nn.Linear, Int8Linear))]
    assert decoder and all(isinstance(m, Int8Linear) for m in decoder)
    assert len(decoder) == 2 * (2 + 3 + 2)  # per layer: self qkv, out; cross q, kv, out; fc1, fc2
    assert all(
        isinstance(m, nn.Linear)
        for m in model.encoder.modules()
        if isinstance(m, (nn.Linear, Int8Linear))
    )
    assert isinstance(model.cpu_output, Int8Linear)
    assert model.tgt_embed.tokens.weight.dtype == torch.float32  # the embedding lookup stays fp32


@pytest.mark.parametrize("model", [{}, MARIAN])
def test_int8_decode_steps_are_close_to_fp32(model):
    fp32 = make(**model)
    for la, lb in decode_side_by_side(fp32, quantize_decoder(copy.deepcopy(fp32))):
        spread = (la.amax(-1) - la.amin(-1)).min().item()  # ~6 nats for this model
        assert 0 < (la - lb).abs().max().item() < 0.02 * spread  # about 1% of it
        assert (la.exp() - lb.exp()).abs().max().item() < 0.01


@pytest.mark.parametrize("options", [{}, MARIAN])
def test_a_projection_over_a_token_subset_equals_those_columns_of_the_full_one(options):
    model = quantize_decoder(make(**options))
    vocab = torch.tensor([0, 3, 17, 59, 8])
    x = rows(6, 64)
    full = model.output(x)
    part = model.projection(vocab)(model.decoder_norm(x))
    assert torch.equal(part, full[:, vocab])  # a weight row's scale is its own


def test_int8_where_it_cannot_run_is_one_line(monkeypatch):
    with pytest.raises(NmtError, match="int8 is for CPU decoding; on meta use bf16 or fp16"):
        check_int8(torch.device("meta"))

    def missing():
        raise RuntimeError(
            "Could not run 'quantized::linear_with_input_q_dq_qweight_dq_output_fp32'\nmore"
        )

    monkeypatch.setattr(kernels, "_int8_linear_op", missing)
    with pytest.raises(NmtError) as e:
        check_int8(torch.device("cpu"))
    assert "x86 int8 kernels (fbgemm)" in str(e.value) and "Could not run" in str(e.value)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ packed fp32

packed_only = pytest.mark.skipif(
    not packing_works(), reason="this torch build has no oneDNN (mkldnn) linear kernels"
)


@packed_only
@pytest.mark.parametrize("d_in, d_out, bias", [(64, 48, True), (256, 1000, False), (200, 3, True)])
def test_packed_linear_equals_nn_linear_to_rounding(d_in, d_out, bias):
    torch.manual_seed(1)
    lin = nn.Linear(d_in, d_out, bias=bias)
    packed = PackedLinear(lin.weight, lin.bias)
    x = rows(41, d_in)
    with torch.no_grad():
        want, got = lin(x), packed(x)
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * x.abs().max().item())
        assert torch.equal(
            packed(x.view(1, 41, d_in)), got.view(1, 41, d_out)
        )  # leading dims are rows
        assert packed(x[:0]).shape == (0, d_out)


@pytest.mark.parametrize("kernel", [Int8Linear, pytest.param(PackedLinear, marks=packed_only)])
def test_a_row_does_not_depend_on_its_batch(kernel):
    torch.manual_seed(2)
    lin = nn.Linear(96, 130)
    fast = kernel(lin.weight, lin.bias)
    x = rows(50, 96, seed=3)
    with torch.no_grad():
        full = fast(x)  # 50 rows (packed: padded to 56)
        for m in (1, 2, 7, 8, 9, 16, 33):
            assert torch.equal(fast(x[:m]), full[:m]), m
            assert torch.equal(fast(x[-m:]), full[-m:]), m
        assert torch.equal(fast(x.view(5, 10, 96)), full.view(5, 10, 130))  # leading dims are rows


@packed_only
@pytest.mark.parametrize("options", [{}, MARIAN])
def test_packed_fp32_output_decodes_as_the_plain_one(options):
    plain = make(**options)
    packed = copy.deepcopy(plain)
    packed.cpu_output = PackedLinear(packed.output_weight, packed.output_bias)
    for la, lb in decode_side_by_side(plain, packed):
        torch.testing.assert_close(lb, la, rtol=0, atol=1e-4)
    with torch.no_grad():
        vocab = torch.tensor([0, 3, 17, 59, 8])
        x = rows(6, 64)
        want = packed.projection()(x)[:, vocab]  # a shortlist's rows go through F.linear
        torch.testing.assert_close(
            packed.projection(vocab)(x), want, rtol=1e-5, atol=1e-5 * x.abs().max().item()
        )


KEPT = """
import os, sys
import torch
from nmt.device import configure_device, keep_freed_memory
if sys.argv[1] == "kept":
    configure_device(torch.device("cpu"))
    print(keep_freed_memory())
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
torch.set_num_threads(1)
before = resident()
torch.ones(12 << 20)  # a 48 MiB block (a large model's self-attention cache), written and freed
print((resident() - before) >> 20)
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc"
)
def test_cpu_decoding_keeps_the_memory_it_frees():
    """By default glibc maps a block above 32 MiB afresh at each allocation and unmaps it when
    it is freed, so that each use page-faults it in again; after configure_device(cpu) freed
    memory stays with the process for the next allocations."""

    def run(mode: str) -> list[int]:
        out = subprocess.run(
            [sys.executable, "-c", KEPT, mode], capture_output=True, text=True, check=True
        )
        return [int(x) for x in out.stdout.split()]

    [returned] = run("default")
    threshold, kept = run("kept")
    assert threshold in (1 << 30, 1 << 25)  # an older glibc refuses more than 32 MiB
    assert returned < 8  # MiB still resident after the 48 MiB block was freed
    # under a 32 MiB threshold the 48 MiB block is still mapped apart, and unmapped when freed
    assert kept >= 44 if threshold == 1 << 30 else kept < 8


class FussyLibc:
    """A C library whose mallopt takes at most `limit` for the mmap threshold."""

    def __init__(self, limit: int) -> None:
        self.limit, self.took = limit, {}

    def mallopt(self, param: int, value: int) -> int:
        if param == nmt_device._M_MMAP_THRESHOLD and value > self.limit:
            return 0
        self.took[param] = value
        return 1


@pytest.mark.parametrize("limit, want", [(1 << 30, 1 << 30), (1 << 25, 1 << 25), (1 << 20, 0)])
def test_keep_freed_memory_takes_what_glibc_allows(monkeypatch, limit, want):
    """The 1 GiB mmap threshold, else glibc's 32 MiB cap, else nothing; the trim threshold is set
    only with one of them (alone it would pin the mmap threshold at its 128 KiB default)."""
    libc = FussyLibc(limit)
    monkeypatch.setattr(nmt_device.sys, "platform", "linux")
    monkeypatch.setattr(nmt_device.ctypes, "CDLL", lambda name: libc)
    assert nmt_device.keep_freed_memory() == want
    assert libc.took.get(nmt_device._M_TRIM_THRESHOLD) == (1 << 30 if want else None)
