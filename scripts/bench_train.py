"""Benchmark the trainer: target tokens/s and peak memory of a fixed number of updates.

    .venv/bin/python scripts/bench_train.py [--data-dir ../shared/data/multi30k] [--precision fp32 bf16]
        [--threads 2] [--max-tokens 4096] [--device cpu] [--updates 30] [--json FILE]

Multi30k en-de is prepared once (vocab 8000) into a temporary directory (or --prepared DIR,
reused if it exists). Each measurement runs in a fresh subprocess, so that its peak RSS
(getrusage) is its own: the model of --config (default configs/multi30k.yaml: 3+3 layers,
d_model 256) trains --warmup updates, then --updates timed ones through
`Trainer.train_update` (forward, backward, optimizer step; no validation or checkpoints).
On CUDA the peak is torch.cuda.max_memory_allocated, and --gpu-base also measures
configs/base.yaml in bf16 and fp16 with model FLOP/s as a fraction of --peak-tflops.
Prints one markdown table row per measurement; --json FILE writes the figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared/data/multi30k"
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16/fp16 tensor cores


def prepare(data_dir: Path, dest: Path, vocab: int) -> None:
    from nmt.prepare import PrepareOptions, prepare_bpe

    if (dest / "prepare.json").is_file():
        return
    prepare_bpe(PrepareOptions(source_lang="en", target_lang="de", trainpref=str(data_dir / "train"),
                               validpref=str(data_dir / "val"), destdir=str(dest), vocab_size=vocab),
                progress=False)


def train_flops(model_cfg, vocab: int, src_shape: tuple[int, int], tgt_shape: tuple[int, int]) -> float:
    """Forward+backward FLOPs of one padded batch (3x the forward's multiply-adds x 2)."""
    (b, s), (_, t) = src_shape, tgt_shape
    d, f = model_cfg.d_model, model_cfg.ffn_dim
    enc_layer = 2 * b * s * (4 * d * d + 2 * d * f) + 4 * b * s * s * d
    dec_layer = 2 * b * t * (4 * d * d + 2 * d * f) + 4 * b * t * t * d  # self-attention and FFN
    dec_layer += 2 * b * t * 2 * d * d + 2 * b * s * 2 * d * d + 4 * b * t * s * d  # cross-attention
    output = 2 * b * t * d * vocab
    forward = model_cfg.encoder_layers * enc_layer + model_cfg.decoder_layers * dec_layer + output
    return 3.0 * forward


def measure(spec: dict) -> dict:
    """In the child: build a Trainer, run warm-up and timed updates, report."""
    import torch

    from nmt.config import load_config, replace
    from nmt.train import Env, Trainer

    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    cfg = load_config(spec["config"])
    train_opts = {"run_dir": spec["run_dir"], "precision": spec["precision"], "device": spec["device"],
                  "update_freq": 1, "valid_bleu": False}
    if spec["max_tokens"]:
        train_opts["max_tokens"] = spec["max_tokens"]
    cfg = replace(cfg, data={"dir": spec["prepared"]}, train=train_opts)
    device = torch.device(spec["device"])
    trainer = Trainer(cfg, Env(device), reset_optimizer=False, reset_data=False)
    groups = trainer._epoch_batches(1)
    need = spec["warmup"] + spec["updates"]
    groups = (groups * (need // len(groups) + 1))[:need]
    flops = 0.0
    cuda = device.type == "cuda"
    for i, group in enumerate(groups):
        if i == spec["warmup"]:
            if cuda:
                torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0.0
        stats = trainer.train_update(group)
        if i >= spec["warmup"] and stats is not None:
            tokens += stats["tokens"]
            for ids in group:
                src_len = int(trainer.train_data.src_sizes[ids].max()) + 1
                tgt_len = int(trainer.train_data.tgt_sizes[ids].max()) + 1
                flops += train_flops(cfg.model, trainer.tokenizer.vocab_size, (len(ids), src_len),
                                     (len(ids), tgt_len))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if hasattr(trainer, "close"):  # (older trainers: to compare before/after a change)
        trainer.close()
    result = {
        "config": Path(spec["config"]).name, "device": str(device), "precision": spec["precision"],
        "threads": torch.get_num_threads(), "max_tokens": cfg.train.max_tokens, "updates": spec["updates"],
        "tgt_tokens_per_s": tokens / seconds, "seconds": seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "model_tflops": flops / seconds / 1e12,
    }
    if cuda:
        result["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
        result["gpu"] = torch.cuda.get_device_name()
        peak = spec["peak_tflops"] or next((v for k, v in PEAK_TFLOPS.items() if k in result["gpu"]), 0.0)
        if peak and spec["precision"] != "fp32":
            result["mfu"] = result["model_tflops"] / peak
    return result


def row(r: dict) -> str:
    mem = f"{r['peak_cuda_gb']:.2f} GB (CUDA)" if "peak_cuda_gb" in r else f"{r['peak_rss_gb']:.2f} GB (RSS)"
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    return (f"| {r['config']} | {r['device']} | {r['precision']} | {r['threads']} | {r['max_tokens']} | "
            f"{r['tgt_tokens_per_s']:,.0f} | {mem} | {r['model_tflops']:.3f} | {mfu} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--prepared", type=Path, help="prepared data directory (made if missing)")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--config", type=Path, default=REPO / "configs/multi30k.yaml")
    ap.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--max-tokens", type=int, default=0, help="0 = the config's")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--gpu-base", action="store_true", help="on CUDA: also configs/base.yaml in bf16 and fp16")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="0 = by GPU name (H100: 989 dense bf16)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(measure(json.loads(args._child))))
        return

    import torch

    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    with tempfile.TemporaryDirectory() as tmp:
        prepared = args.prepared or Path(tmp) / "data-bin"
        prepare(args.data_dir, prepared, args.vocab)
        runs = [(args.config.resolve(), p) for p in args.precision]
        if args.gpu_base and device.startswith("cuda"):
            runs += [(REPO / "configs/base.yaml", "bf16"), (REPO / "configs/base.yaml", "fp16")]
        print("| config | device | precision | threads | max_tokens | tgt tok/s | peak memory | model TFLOP/s | MFU |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        results = []
        for i, (config, precision) in enumerate(runs):
            spec = {"config": str(config), "precision": precision, "threads": args.threads,
                    "max_tokens": args.max_tokens, "device": device, "prepared": str(prepared),
                    "run_dir": str(Path(tmp) / f"run{i}"), "warmup": args.warmup, "updates": args.updates,
                    "peak_tflops": args.peak_tflops}
            out = subprocess.run([sys.executable, __file__, "--_child", json.dumps(spec)], cwd=tmp,
                                 capture_output=True, text=True)
            if out.returncode:
                print(f"| {config.name} | {device} | {precision} | failed: {out.stderr.strip()[-300:]} |")
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(row(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
