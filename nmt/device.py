"""Device choice and mixed-precision contexts, shared by training and translation."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from nmt.errors import NmtError

PRECISIONS = ("fp32", "bf16", "fp16")


def resolve_device(name: str) -> torch.device:
    """auto -> CUDA when present, else CPU; cuda / cuda:N checked for availability."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise NmtError(f"device {name!r} asked for, but CUDA is not available (use --device cpu)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise NmtError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from None


def configure_cuda(device: torch.device) -> None:
    """Before a model runs on `device`: on CUDA, turn off cuDNN's attention backend for
    scaled_dot_product_attention (flash and memory-efficient attention remain).

    cuDNN attention builds an execution plan for every new tensor shape, ~25 ms of CPU time
    per call, and token-based batches and incremental decoding change shape at nearly every
    call: on an H100 it made bf16/fp16 training of configs/multi30k.yaml ~16x slower (1.7
    against 27 updates/s; docs/benchmarks.md).
    """
    if device.type == "cuda" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def autocast(device: torch.device, precision: str) -> Any:
    """Autocast for bf16/fp16 (parameters and optimizer state stay fp32); fp32 is a no-op."""
    if precision not in PRECISIONS:
        raise NmtError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise NmtError("fp16 needs a CUDA device; use bf16 on CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
