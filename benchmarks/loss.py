"""The chunked training loss alone (`nmt.training.loss.projected_smoothed_loss`, its forward
and backward) and its error against an fp64 reference, for this checkout's `nmt` and, with
--repo, another checkout's, alternated in the same process:

    python -m benchmarks loss [--repo OTHER_CHECKOUT] [--device cuda] \\
        [--rows 25000] [--dim 512] [--vocab 32000] [--precision bf16 fp16 fp32]

The rows are the real target tokens of one update (`configs/base.yaml` holds ~22,000 of them
in 50,000 positions); states and weight are random (N(0, 1) and N(0, 0.05^2)), label
smoothing 0.1. Each row: ms per loss + backward (mean of --repeat calls after 2 warm-ups),
and the relative error (L2) of the loss and of both gradients against this checkout's loss
on fp64 states and weight (its gradients are fp64; its loss total is summed in fp32).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.common import ROOT, write_json

PRECISIONS = ("fp32", "bf16", "fp16")


def load(checkout: Path, name: str) -> ModuleType:
    """`nmt/training/loss.py` of `checkout` as a module of its own (the loss imports only torch)."""
    spec = importlib.util.spec_from_file_location(name, checkout / "nmt" / "training" / "loss.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module: ModuleType, states: Any, weight: Any, target: Any, dtype: Any) -> list[Any]:
    """The loss and both gradients."""
    import torch

    states = states.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    with torch.autocast(
        states.device.type, dtype=dtype or torch.float32, enabled=dtype is not None
    ):
        loss, _ = module.projected_smoothed_loss(states, weight, target, 0.1)
    loss.backward()
    return [loss, states.grad, weight.grad]


def main(argv: list[str] | None = None) -> list[dict]:
    import torch

    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks loss", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--repo", type=Path, help="another checkout whose loss runs alongside")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=25000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp16"], choices=PRECISIONS)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda"):
        sync = torch.cuda.synchronize
    else:

        def sync() -> None:
            pass

    modules = [("this", load(ROOT, "loss_this"))]
    if args.repo:
        modules.append((str(args.repo), load(args.repo, "loss_other")))
    torch.manual_seed(0)
    states = torch.randn(args.rows, args.dim, device=args.device)
    weight = 0.05 * torch.randn(args.vocab, args.dim, device=args.device)
    target = torch.randint(4, args.vocab, (args.rows,), device=args.device)
    reference = run(modules[0][1], states.double(), weight.double(), target, None)
    print(
        "| checkout | precision | ms per loss + backward | rel. error: loss | d states | d weight |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rows = []
    for precision in args.precision:
        for name, module in modules[::-1]:
            out = run(module, states, weight, target, dtypes[precision])
            errors = [((x.double() - r).norm() / r.norm()).item() for x, r in zip(out, reference)]
            for _ in range(2):
                run(module, states, weight, target, dtypes[precision])
            sync()
            start = time.perf_counter()
            for _ in range(args.repeat):
                run(module, states, weight, target, dtypes[precision])
            sync()
            ms = (time.perf_counter() - start) / args.repeat * 1e3
            cells = " | ".join(f"{e:.2e}" for e in errors)
            print(f"| {name} | {precision} | {ms:.2f} | {cells} |", flush=True)
            rows.append({"checkout": name, "precision": precision, "ms": ms, "errors": errors})
    write_json(args.json, rows)
    return rows
