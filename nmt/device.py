"""Device choice and mixed-precision contexts, shared by training and translation.

torch is imported where it is used: config.py checks `train.device` with `is_device_name`, and
reading a config (`nmt train --dump-config`) stays free of torch.
"""

from __future__ import annotations

import os
import re
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from nmt.errors import NmtError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = "auto, cpu, cuda or cuda:N"


def is_device_name(name: object) -> bool:
    """Whether `name` is a device nmt runs on (DEVICES). torch knows more (meta, mps, xla, ...),
    which fail later with a traceback: `train.device` and `--device` of `nmt translate` and
    the API all refuse them by this one rule. N as torch parses it: no leading zero, below 2^31."""
    return isinstance(name, str) and re.fullmatch(r"auto|cpu|cuda(:(0|[1-9][0-9]{0,8}))?", name) is not None


def resolve_device(name: str) -> torch.device:
    """auto -> CUDA when present, else CPU; cuda / cuda:N checked for availability."""
    import torch

    if not is_device_name(name):
        raise NmtError(f"unknown device {name!r}: use {DEVICES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise NmtError(f"device {name!r} asked for, but CUDA is not available (use --device cpu)")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise NmtError(f"device {name!r} asked for, but there are {torch.cuda.device_count()} CUDA devices "
                       "(numbered from 0)")
    return device


def memory_bytes(device: torch.device) -> int | None:
    """The memory of `device`: a CUDA device's own, the machine's RAM for the CPU; None where
    the platform does not say."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


def configure_cuda(device: torch.device) -> None:
    """Before a model runs on `device`: on CUDA, turn off cuDNN's attention backend for
    scaled_dot_product_attention (flash and memory-efficient attention remain).

    cuDNN attention builds an execution plan for every new tensor shape, ~25 ms of CPU time
    per call, and token-based batches and incremental decoding change shape at nearly every
    call: on an H100 it made bf16/fp16 training of configs/multi30k.yaml ~16x slower (1.7
    against 27 updates/s; docs/benchmarks.md).
    """
    import torch

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
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
