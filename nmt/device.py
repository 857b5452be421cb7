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
