"""Benchmark the chunked training loss alone (`nmt.training.loss.projected_smoothed_loss`, its
forward and backward) and its error against an fp64 reference, for this checkout's `nmt` and,
with --repo, another checkout's, alternated in the same process:

    .venv/bin/python scripts/bench_loss.py [--repo OTHER_CHECKOUT] [--device cuda] \
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
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def load(checkout: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, checkout / "nmt" / "training" / "loss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module, states, weight, target, dtype):
    states, weight = states.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast(states.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss, _ = module.projected_smoothed_loss(states, weight, target, 0.1)
    loss.backward()
    return [loss, states.grad, weight.grad]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, help="another checkout whose loss runs alongside")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=25000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    modules = [("this", load(ROOT, "loss_this"))] + ([(str(args.repo), load(args.repo, "loss_other"))] if args.repo else [])
    torch.manual_seed(0)
    states = torch.randn(args.rows, args.dim, device=args.device)
    weight = 0.05 * torch.randn(args.vocab, args.dim, device=args.device)
    target = torch.randint(4, args.vocab, (args.rows,), device=args.device)
    reference = run(modules[0][1], states.double(), weight.double(), target, None)
    print("| checkout | precision | ms per loss + backward | rel. error: loss | d states | d weight |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for precision in args.precision:
        for name, module in modules[::-1]:
            out = run(module, states, weight, target, DTYPES[precision])
            errors = [((x.double() - r).norm() / r.norm()).item() for x, r in zip(out, reference)]
            for _ in range(2):
                run(module, states, weight, target, DTYPES[precision])
            sync()
            start = time.perf_counter()
            for _ in range(args.repeat):
                run(module, states, weight, target, DTYPES[precision])
            sync()
            ms = (time.perf_counter() - start) / args.repeat * 1e3
            print(f"| {name} | {precision} | {ms:.2f} | " + " | ".join(f"{e:.2e}" for e in errors) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
