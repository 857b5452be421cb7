"""The trainer: real target tokens/s, padding, peak memory, model FLOP/s and MFU.

    python -m benchmarks train [--workload multi30k|wmt] [--config C ...]
        [--precision fp32 bf16 ...] [--device cpu|cuda] [--updates 30] [--set KEY=VALUE ...]
        [--repo CHECKOUT] [--json FILE]

Workloads (each prepared once into a temporary directory, or --prepared DIR):
- multi30k: Multi30k en-de from --data-dir, a joint 8k sentencepiece vocabulary (the demo's
  data); default config configs/multi30k.yaml.
- wmt: a synthetic WMT'14 en-de-shaped corpus that needs no download (`synthetic_wmt`):
  a 32,000-piece joint vocabulary, 150,000 pairs whose lengths are drawn like WMT'14 en-de
  after a 32k BPE (means ~28 source and ~30 target tokens, a long tail clipped at 250);
  default configs base.yaml and big.yaml. Token ids are uniform: speed does not depend on
  which tokens they are.

Each measurement runs in a fresh child process (its peak memory is its own): --warmup updates
(plus --warmup-epochs whole epochs, in the order the timed updates then repeat), then --updates
timed ones through `Trainer.train_update` (forward, backward, optimizer step,
no validation or checkpoints), then on CUDA --profile updates under torch.profiler for the
share of wall time the GPU is busy: their kernel time per real target token times the timed
updates' tokens/s (the profiler slows the host, so its own wall time would understate the share;
the JSON also has kernel_ms_per_update). Figures per row:
- real target tok/s: non-pad target tokens (EOS included) per second;
- padding: the share of padded source+target positions that are padding;
- shapes/epoch: distinct (batch size, source length, target length) of one epoch's batches
  (the JSON's timed_shapes_new / _seen_once / _seen_twice: the timed updates whose shapes came
  never, once, or twice or more before; CUDA graphs, train.compile_mode=reduce-overhead, replay
  only the last; --shapes-only prints these, and the profiled updates' count, without training);
- model TFLOP/s and MFU: `real_token_flops` (docs/benchmarks.md has the formula) over the
  timed updates' real tokens, divided by the time; MFU against --peak-tflops (by GPU name:
  H100/H200 989 dense bf16/fp16).
--set KEY=VALUE (repeatable) overrides the config (e.g. train.compile=true); --repo runs
another checkout's nmt (PYTHONPATH), to compare commits in the same minutes.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    MULTI30K,
    ROOT,
    ChildFailed,
    child_env,
    peak_rss_mb,
    run_child,
    write_json,
)

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16/fp16 tensor cores
WMT_VOCAB = 32000
WMT_PAIRS = 150_000
# WMT'14 en-de after a joint 32k BPE: ~4.5M pairs with mean ~28 (en) and ~30 (de) pieces; the
# length distribution is close to log-normal. Source: lognormal(mu, sigma) with sigma 0.6 and
# mean 28; target = source x lognormal ratio (median 1.07, sigma 0.2); both clipped to [1, 250].
WMT_SRC_MU = 3.15
WMT_SRC_SIGMA = 0.6
WMT_RATIO_MEDIAN = 1.07
WMT_RATIO_SIGMA = 0.2


def prepare_multi30k(data_dir: Path, dest: Path, vocab: int) -> None:
    from nmt.prepare import PrepareOptions, prepare_bpe

    if (dest / "prepare.json").is_file():
        return
    prepare_bpe(
        PrepareOptions(
            source_lang="en",
            target_lang="de",
            trainpref=str(data_dir / "train"),
            validpref=str(data_dir / "val"),
            destdir=str(dest),
            vocab_size=vocab,
        ),
        progress=False,
    )


def synthetic_wmt(
    dest: Path, pairs: int = WMT_PAIRS, vocab: int = WMT_VOCAB, seed: int = 1
) -> None:
    """A prepared data directory (nmt.data's format) with WMT-shaped lengths and a
    `vocab`-piece sentencepiece model (a word model over made-up words: only its size matters)."""
    import numpy as np
    import sentencepiece as spm

    if (dest / "prepare.json").is_file():
        return
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(WMT_SRC_MU, WMT_SRC_SIGMA, pairs)), 1, 250).astype(np.int64)
    ratio = rng.lognormal(np.log(WMT_RATIO_MEDIAN), WMT_RATIO_SIGMA, pairs)
    tgt = np.clip(np.rint(src * ratio), 1, 250).astype(np.int64)
    for lang, lengths in (("en", src), ("de", tgt)):
        tokens = rng.integers(4, vocab, int(lengths.sum()), dtype=np.uint16)
        tokens.astype("<u2").tofile(dest / f"train.{lang}.bin")
        offsets = np.zeros(len(lengths) + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        offsets.tofile(dest / f"train.{lang}.idx")
    words = [f"w{i}" for i in range(vocab + 1000)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(" ".join(words[i : i + 20]) for i in range(0, len(words), 20)),
        model_prefix=str(dest / "spm"),
        vocab_size=vocab,
        model_type="word",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    spm_sha256 = hashlib.sha256((dest / "spm.model").read_bytes()).hexdigest()
    meta = {
        "format_version": 1,
        "source_lang": "en",
        "target_lang": "de",
        "vocab_size": vocab,
        "dtype": "uint16",
        "spm": {"model": "spm.model", "sha256": spm_sha256, "source": "synthetic"},
        "splits": {"train": {"pairs": pairs}},
        "fingerprint": f"synthetic-wmt-{pairs}-{vocab}-{seed}",
        "synthetic": {
            "src_mean": float(src.mean()),
            "tgt_mean": float(tgt.mean()),
            "src_p99": float(np.percentile(src, 99)),
            "tgt_max": int(tgt.max()),
        },
    }
    (dest / "prepare.json").write_text(json.dumps(meta, indent=1))


def real_token_flops(model_cfg, vocab: int, src_lens, tgt_lens) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of sentence pairs with these real
    lengths (source with EOS, target with BOS), padding excluded. Per pair, with d = d_model,
    f = ffn_dim, s and t the lengths:
    encoder layer 2s(4d^2 + 2df) + 4s^2 d; decoder layer 2t(4d^2 + 2df) + 2t^2 d (causal
    self-attention: half the scores) + 2t(2d^2) + 2s(2d^2) + 4tsd (cross-attention);
    output projection 2tdV."""
    import numpy as np

    s, t = np.asarray(src_lens, dtype=np.float64), np.asarray(tgt_lens, dtype=np.float64)
    d, f = model_cfg.d_model, model_cfg.ffn_dim
    enc = 2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d
    dec = (
        2 * t * (4 * d * d + 2 * d * f)
        + 2 * t * t * d
        + 2 * t * 2 * d * d
        + 2 * s * 2 * d * d
        + 4 * t * s * d
    )
    forward = model_cfg.encoder_layers * enc + model_cfg.decoder_layers * dec + 2 * t * d * vocab
    return float(3.0 * forward.sum())


def kernel_seconds(trainer, groups, table: str = "") -> tuple[float, float]:
    """CUDA kernel seconds and real target tokens of `groups` updates run under the profiler;
    `table`: also write the profiler's top operators by GPU and by CPU time to this file."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    tokens = 0.0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for group in groups:
            stats = trainer.train_update(group)
            tokens += (
                0 if stats is None else stats["tokens"] if isinstance(stats, dict) else stats.tokens
            )
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    if table:
        averages = prof.key_averages()
        Path(table).write_text(
            "".join(
                f"== by {key}, {len(groups)} updates, {wall:.3f} s\n"
                + averages.table(sort_by=key, row_limit=30)
                + "\n"
                for key in ("self_cuda_time_total", "self_cpu_time_total")
            )
        )
    kernel_us = 0.0
    for event in prof.key_averages():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            kernel_us += getattr(event, "self_device_time_total", None) or getattr(
                event, "self_cuda_time_total", 0
            )
    return kernel_us / 1e6, tokens


def measure(spec: dict) -> dict:
    """In the child: build a Trainer, run warm-up and timed updates, report."""
    import numpy as np
    import torch

    from nmt.config import load_config

    try:
        from nmt.training.trainer import Env, Trainer
    except ImportError:  # --repo: a checkout from before the subpackages (nmt/train.py)
        from nmt.train import Env, Trainer  # type: ignore[no-redef]

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    sets = [
        f"data.dir={spec['prepared']}",
        f"train.run_dir={spec['run_dir']}",
        f"train.precision={spec['precision']}",
        f"train.device={spec['device']}",
        "train.valid_bleu=false",
        *spec["sets"],
    ]
    cfg = load_config(spec["config"], sets)
    device = torch.device(spec["device"])
    trainer = Trainer(cfg, Env(device), reset_optimizer=False, reset_data=False)
    # epoch_updates was _epoch_batches before (--repo may run an older checkout)
    epoch = (
        trainer.epoch_updates if hasattr(trainer, "epoch_updates") else trainer._epoch_batches
    )(1)
    warmup = spec["warmup"] + spec.get("warmup_epochs", 0) * len(epoch)
    need = warmup + spec["updates"] + spec["profile"]
    groups = (epoch * (need // len(epoch) + 1))[:need]
    data, pad_to = trainer.train_data, getattr(trainer, "pad_to", 1)

    def padded(n):
        return -(-(n + 1) // pad_to) * pad_to

    def shape(group):  # an update's (batch, source, target) shapes; one process: no empty shards
        return tuple(
            (
                len(ids),
                padded(int(data.src_sizes[ids].max())),
                padded(int(data.tgt_sizes[ids].max())),
            )
            for ids in group
        )

    shapes = {s for group in epoch for s in shape(group)}
    # timed updates by how often their shapes came before (CUDA graphs replay a shape from its third
    # call), and the profiled ones whose shapes came twice or more
    timed = ("timed_shapes_new", "timed_shapes_seen_once", "timed_shapes_seen_twice")
    counts = dict.fromkeys((*timed, "profiled_shapes_seen_twice"), 0)
    seen: collections.Counter = collections.Counter()
    for i, group in enumerate(groups):
        key = shape(group)
        if warmup <= i < warmup + spec["updates"]:
            counts[timed[min(seen[key], 2)]] += 1
        elif i >= warmup:
            counts["profiled_shapes_seen_twice"] += seen[key] >= 2
        seen[key] += 1
    if spec.get("shapes_only"):
        return {
            "updates_per_epoch": len(epoch),
            "shapes_per_epoch": len(shapes),
            "warmup": warmup,
            "profiled": spec["profile"],
            **counts,
        }
    cuda = device.type == "cuda"
    flops = tokens = positions = real_positions = 0.0
    for i, group in enumerate(groups[: warmup + spec["updates"]]):
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        stats = trainer.train_update(group)
        if i >= spec["warmup"] and stats is not None:
            tokens += stats["tokens"] if isinstance(stats, dict) else stats.tokens
            for ids in group:
                s, t = data.src_sizes[ids] + 1, data.tgt_sizes[ids] + 1
                flops += real_token_flops(cfg.model, trainer.tokenizer.vocab_size, s, t)
                positions += len(ids) * (padded(int(s.max()) - 1) + padded(int(t.max()) - 1))
                real_positions += float(np.sum(s) + np.sum(t))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {
        "config": Path(spec["config"]).name,
        "device": str(device),
        "precision": spec["precision"],
        "sets": spec["sets"],
        "repo": spec["repo"],
        "threads": torch.get_num_threads(),
        "max_tokens": cfg.train.max_tokens,
        "update_freq": cfg.train.update_freq,
        "updates": spec["updates"],
        "tgt_tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "padding": 1 - real_positions / max(positions, 1),
        "shapes_per_epoch": len(shapes),
        "batches_per_epoch": sum(len(g) for g in epoch),
        "warmup": warmup,
        **counts,
        "peak_rss_gb": peak_rss_mb() / 2**10,
        "model_tflops": flops / seconds / 1e12,
    }
    if cuda:
        result["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
        result["gpu"] = torch.cuda.get_device_name()
        peak = spec["peak_tflops"] or next(
            (v for k, v in PEAK_TFLOPS.items() if k in result["gpu"]), 0.0
        )
        if peak and spec["precision"] != "fp32":
            result["mfu"] = result["model_tflops"] / peak
        if spec[
            "profile"
        ]:  # the profiler slows the host: its kernel time per token, at the timed speed
            kernel_s, kernel_tokens = kernel_seconds(
                trainer, groups[-spec["profile"] :], spec["table"]
            )
            result["kernel_ms_per_update"] = 1e3 * kernel_s / spec["profile"]
            result["gpu_busy"] = min(
                1.0, kernel_s / max(kernel_tokens, 1.0) * result["tgt_tokens_per_s"]
            )
    if hasattr(trainer, "close"):
        trainer.close()
    return result


HEADER = (
    "| config | device | precision | options | max_tokens × freq | real tgt tok/s | padding | "
    "shapes/epoch | peak memory | model TFLOP/s | MFU | GPU busy |\n| --- | --- | --- | --- | --- "
    "| --- | --- | --- | --- | --- | --- | --- |"
)


def row(r: dict) -> str:
    mem = (
        f"{r['peak_cuda_gb']:.2f} GB (CUDA)"
        if "peak_cuda_gb" in r
        else f"{r['peak_rss_gb']:.2f} GB (RSS)"
    )
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    busy = f"{100 * r['gpu_busy']:.0f}%" if "gpu_busy" in r else "-"
    opts = " ".join(r["sets"]) + (f" [{Path(r['repo']).name}]" if r["repo"] else "")
    return (
        f"| {r['config']} | {r['device']} | {r['precision']} | {opts or '-'} | {r['max_tokens']} × "
        f"{r['update_freq']} | {r['tgt_tokens_per_s']:,.0f} | {100 * r['padding']:.1f}% | "
        f"{r['shapes_per_epoch']} | {mem} | {r['model_tflops']:.3f} | {mfu} | {busy} |"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks train", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--workload", choices=["multi30k", "wmt"], default="multi30k")
    ap.add_argument("--data-dir", type=Path, default=MULTI30K, help="Multi30k raw files")
    ap.add_argument("--prepared", type=Path, help="prepared data directory (made if missing)")
    ap.add_argument(
        "--config",
        type=Path,
        nargs="+",
        help="default: multi30k.yaml, or base.yaml big.yaml for wmt",
    )
    ap.add_argument(
        "--precision", nargs="+", default=None, help="default: fp32 on CPU, bf16 on CUDA"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--warmup-epochs",
        type=int,
        default=0,
        help="also warm up on N whole epochs, so that the timed updates' shapes were each seen N "
        "times "
        "(CUDA graphs replay a shape from its third time)",
    )
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument(
        "--profile", type=int, default=None, help="updates under the profiler (CUDA; default 5)"
    )
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="config override, repeatable"
    )
    ap.add_argument("--repo", type=Path, help="run this checkout's nmt instead (PYTHONPATH)")
    ap.add_argument(
        "--peak-tflops", type=float, default=0.0, help="0 = by GPU name (H100: 989 dense bf16)"
    )
    ap.add_argument("--json", help="write every row here")
    ap.add_argument(
        "--profile-table", default="", help="CUDA: write the profiler's top operators here"
    )
    ap.add_argument("--no-header", action="store_true")
    ap.add_argument(
        "--shapes-only",
        action="store_true",
        help="print each row's shape counts as JSON, without training (runs anywhere)",
    )
    ap.add_argument(
        "--show-stderr",
        action="store_true",
        help="pass each run's stderr through (e.g. with TORCH_LOGS=cudagraphs,recompiles)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return []

    import torch

    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    precisions = args.precision or (["bf16"] if device.startswith("cuda") else ["fp32"])
    default_configs = ["base.yaml", "big.yaml"] if args.workload == "wmt" else ["multi30k.yaml"]
    if args.config:
        configs = [c.resolve() for c in args.config]
    else:
        configs = [ROOT / "configs" / c for c in default_configs]
    profile = args.profile if args.profile is not None else (5 if device.startswith("cuda") else 0)
    env = child_env(nmt_from=args.repo.resolve() if args.repo else None)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = args.prepared or Path(tmp) / "data-bin"
        if args.workload == "wmt":
            synthetic_wmt(prepared)
        else:
            prepare_multi30k(args.data_dir, prepared, 8000)
        if not args.no_header and not args.shapes_only:
            print(HEADER)
        results = []
        for i, (config, precision) in enumerate((c, p) for c in configs for p in precisions):
            spec = {
                "config": str(config),
                "precision": precision,
                "threads": args.threads,
                "device": device,
                "prepared": str(prepared.resolve()),
                "run_dir": str(Path(tmp) / f"run{i}"),
                "warmup": args.warmup,
                "warmup_epochs": args.warmup_epochs,
                "shapes_only": args.shapes_only,
                "updates": args.updates,
                "profile": profile,
                "peak_tflops": args.peak_tflops,
                "sets": args.sets,
                "repo": str(args.repo or ""),
                "table": str(Path(args.profile_table).resolve()) if args.profile_table else "",
            }
            try:
                results.append(
                    run_child("train", spec, env=env, cwd=tmp, show_stderr=args.show_stderr)
                )
            except ChildFailed as e:
                print(f"| {config.name} | {device} | {precision} | failed: {str(e)[-300:]} |")
                continue
            print(json.dumps(results[-1]) if args.shapes_only else row(results[-1]), flush=True)
    write_json(args.json, results)
    return results
