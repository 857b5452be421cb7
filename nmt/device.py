"""Device choice and mixed-precision contexts, shared by training and translation.

torch is imported where it is used: config.py checks `train.device` with `is_device_name`, and
reading a config (`nmt train --dump-config`) stays free of torch.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from nmt.errors import NmtError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = "auto, cpu, cuda or cuda:N"
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
_M_MMAP_THRESHOLD = -3


def is_device_name(name: object) -> bool:
    """Whether `name` is a device nmt runs on (DEVICES). torch knows more (meta, mps, xla, ...),
    which fail later with a traceback: `train.device` and `--device` of `nmt translate` and
    the API all refuse them by this one rule. N as torch parses it: no leading zero, below 2^31."""
    return (
        isinstance(name, str)
        and re.fullmatch(r"auto|cpu|cuda(:(0|[1-9][0-9]{0,8}))?", name) is not None
    )


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
        raise NmtError(
            f"device {name!r} asked for, but there are {torch.cuda.device_count()} CUDA devices "
            "(numbered from 0)"
        )
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


# how many times an idle OpenMP thread of `nmt serve` spins before it sleeps (libgomp's default:
# 300,000); docs/benchmarks.md, "One client beside busy processes"
SERVE_SPIN_COUNT = "10000"


def spin_briefly() -> None:
    """Have OpenMP's idle threads spin briefly, then sleep (OMP_WAIT_POLICY=ACTIVE with
    GOMP_SPINCOUNT=10000), unless the environment sets either; it takes effect only before torch
    loads its OpenMP runtime, which reads them once.

    For `nmt serve`, whose lone request's search runs on every thread: with libgomp's default
    spin, beside busy processes its threads spun against their load (one client 1.4-1.8
    sentences/s, p50 0.5 s); sleeping at once (PASSIVE) cost an idle server 29% (11.1-11.3
    against 15.6). A brief spin keeps the idle speed (15.7-15.8) and most of the busy one (5.7-6.0).
    """
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    os.environ["GOMP_SPINCOUNT"] = SERVE_SPIN_COUNT


def configure_device(device: torch.device) -> None:
    """Before a model trains or decodes on `device`.

    On CUDA, turn off cuDNN's attention backend for scaled_dot_product_attention (flash and
    memory-efficient attention remain): cuDNN attention builds an execution plan for every new
    tensor shape, ~25 ms of CPU time per call, and token-based batches and incremental decoding
    change shape at nearly every call: on an H100 it made bf16/fp16 training of
    configs/multi30k.yaml ~16x slower (1.7 against 27 updates/s; docs/benchmarks.md).

    On the CPU, `keep_freed_memory`.
    """
    import torch

    if device.type == "cuda" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    if device.type == "cpu":
        keep_freed_memory()


def keep_freed_memory() -> int:
    """Have glibc's malloc keep the memory the process frees for its next allocations: blocks of
    any size come from its heaps (mmap threshold 1 GiB, or 32 MiB where glibc takes no more),
    and the main heap is trimmed only when 1 GiB lies free at its top (trim threshold). Returns
    the mmap threshold set: 0 where none was (off Linux, or where the C library is not glibc or
    refuses).

    By default glibc maps a block of more than its mmap threshold afresh and unmaps it when
    freed, raising the threshold to the size of each block freed (up to 32 MiB). A beam search
    allocates its self-attention cache anew at each step, one position longer, and a training update
    activations of a new shape, so nearly every such block is larger than the threshold:
    each is mapped, page-faulted in (the kernel zeroing it) and unmapped again. Kept, an
    OPUS-MT-sized model decoded 5-8% faster at batch 32 on 2 threads and CPU training of
    configs/multi30k.yaml 3-4% faster (docs/benchmarks.md). The cost: a process's resident
    memory stays near its peak instead of shrinking between batches, and two decode workers
    keep more of it (their threads' heaps).
    """
    libc = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
    mallopt = getattr(libc, "mallopt", lambda param, value: 0)  # 1 where it took the value
    # older glibc refuses an mmap threshold above 32 MiB; a trim threshold set alone would fix the
    # mmap threshold at its 128 KiB default, worse than the dynamic one
    size = next((s for s in (1 << 30, 1 << 25) if mallopt(_M_MMAP_THRESHOLD, s) == 1), 0)
    return size if size and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 else 0


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 in hardware: CUDA with bf16 (Ampere and later), or a CPU
    with AVX512-BF16 or AMX. Elsewhere autocast emulates bf16 on the CPU, about 30x slower than
    fp32 on an AVX2-only CPU."""
    import torch

    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def resolve_precision(precision: str, device: torch.device) -> tuple[str, str]:
    """The precision that `train.precision` names on `device`, and why: `auto` is bf16 where
    the device computes bf16 natively (`native_bf16`), fp32 elsewhere; any other is itself."""
    if precision != "auto":
        return precision, "as configured"
    if native_bf16(device):
        return "bf16", f"auto: {device.type} computes bf16 natively"
    return "fp32", f"auto: {device.type} has no native bf16"


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
