"""Plain helpers that several test modules share (the shared fixtures are in conftest.py).

Test modules import them with `from helpers import ...`: pyproject's pytest settings put
tests/ on sys.path (`pythonpath = ["tests"]`). No test module imports another one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt import checkpoint as ckpt
from nmt import cli
from nmt import data as datamod
from nmt.checkpoint import atomic_save
from nmt.config import SECTIONS, Config, DecodeConfig, config_to_dict, load_config
from nmt.decoding.search import SearchModel, token_search, top_candidates
from nmt.errors import NmtError
from nmt.models.transformer import build_model
from nmt.tokenizer import NMT_SPECIALS, Tokenizer
from nmt.training.loss import smoothed_cross_entropy, smoothing_weights
from nmt.training.trainer import Env, Trainer, train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/tiny.yaml"
# One thread: these models are tiny, and a shared 2-core machine thrashes with more.
THREADS = int(os.environ.get("NMT_TEST_THREADS", "1"))
TORCHRUN = Path(sys.executable).with_name("torchrun")

needs_torchrun = pytest.mark.skipif(
    not TORCHRUN.exists() or not torch.distributed.is_available(),
    reason="needs torchrun and torch.distributed",
)


# ------------------------------------------------------------------ the command line


def nmt(
    *args: str,
    cwd: Path = ROOT,
    stdin: str | bytes = "",
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """`python -m nmt ARGS` in a subprocess, its output captured. A str stdin gives str stdout
    and stderr; bytes give bytes. `env`: variables set on top of os.environ. `check`: assert
    that the command succeeded, showing the end of its stderr if not."""
    r = subprocess.run(
        [sys.executable, "-m", "nmt", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=isinstance(stdin, str),
        env=None if env is None else {**os.environ, **env},
        timeout=timeout,
    )
    if check:
        assert r.returncode == 0, f"nmt {' '.join(args)} failed:\n{r.stderr[-3000:]}"
    return r


def nmt_here(*args: str) -> int:
    """The real command line in this process (faster than a subprocess): its exit status."""
    try:
        cli.main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


# a log record at INFO, e.g. which engine decodes (`--engine auto` says so before any error)
INFO_RECORD = re.compile(r"\d\d:\d\d:\d\d \| INFO \| ")


def one_error_line(err: str | bytes, *needles: str) -> str:
    """The one line of a failed command's stderr: apart from INFO log records, exactly one
    non-blank line, starting with `nmt`, no traceback, naming each of `needles`."""
    err = err.decode() if isinstance(err, bytes) else err
    lines = [line for line in err.splitlines() if line.strip() and not INFO_RECORD.match(line)]
    assert len(lines) == 1 and lines[0].startswith("nmt") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def assert_one_line(code: int, err: str | bytes, *needles: str, status: int = 1) -> str:
    """Exit `status`, and `one_error_line(err, *needles)`."""
    assert code == status, (code, err)
    return one_error_line(err, *needles)


def last_error_line(err: str | bytes, *needles: str) -> str:
    """The error line of a command that logged before it failed (training, distill): of
    stderr's lines exactly one starts with `nmt: error: `, it is the last one, there is no
    traceback, and it names each of `needles`."""
    err = err.decode() if isinstance(err, bytes) else err
    errors = [line for line in err.splitlines() if line.startswith("nmt: error: ")]
    assert len(errors) == 1 and err.rstrip("\n").endswith(errors[0]) and "Traceback" not in err, err
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def dead_pid() -> int:
    """The pid of a process that has ended (for the leftovers of a killed writer)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def set_args(sets: Mapping[str, object]) -> list[str]:
    """`--set key=value` for each item."""
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


# ------------------------------------------------------------------ configs


def with_overrides(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of `cfg` with some keys changed, e.g. with_overrides(cfg, train={"lr": 1e-3})."""
    new = {}
    for name in SECTIONS:
        part = getattr(cfg, name)
        new[name] = dataclasses.replace(part, **sections.get(name, {}))
    return Config(**new)


# ------------------------------------------------------------------ synthetic data


def synthetic_pairs(
    task: str,
    n: int,
    *,
    seed: int,
    min_len: int = 3,
    max_len: int = 12,
    alphabet: Sequence[str] = "0123456789",
) -> list[tuple[str, str]]:
    """`n` pairs of space-separated symbol strings: the target copies, reverses or sorts
    (in alphabet order) the source."""
    rank = {symbol: i for i, symbol in enumerate(alphabet)}
    transforms = {
        "copy": lambda xs: xs,
        "reverse": lambda xs: xs[::-1],
        "sort": lambda xs: sorted(xs, key=rank.__getitem__),
    }
    if task not in transforms:
        raise NmtError(f"unknown synthetic task {task!r} (copy, reverse or sort)")
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        symbols = [rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len))]
        pairs.append((" ".join(symbols), " ".join(transforms[task](symbols))))
    return pairs


def write_parallel(
    pairs: Sequence[tuple[str, str]], prefix: str | Path, src_lang: str, tgt_lang: str
) -> tuple[Path, Path]:
    """Write PREFIX.src_lang and PREFIX.tgt_lang, one sentence per line (for prepare-bpe)."""
    paths = (Path(f"{prefix}.{src_lang}"), Path(f"{prefix}.{tgt_lang}"))
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for side, path in enumerate(paths):
        lines = [pair[side] for pair in pairs]
        if any("\n" in line for line in lines):
            raise ValueError("write_parallel: a sentence contains a newline")
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


# ------------------------------------------------------------------ models and training runs


def save_random_model(
    path: Path, tokenizer: Tokenizer, seed: int, model: dict[str, Any] | None = None, **decode: Any
) -> Path:
    """A checkpoint of a randomly initialised configs/tiny.yaml model (its settings
    changed by `model`) with this tokenizer, decoding with beam 4 and at most 6 tokens (a
    random model never chooses EOS)."""
    cfg = load_config(TINY)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, **(model or {})),
        decode=dataclasses.replace(cfg.decode, beam=4, max_len_a=0.0, max_len_b=6, **decode),
    )
    torch.manual_seed(seed)
    model = build_model(
        cfg.model, tokenizer.vocab_size, tokenizer.specials.pad, tokenizer.source_vocab_size
    )
    atomic_save(
        {
            "format_version": 1,
            "model": model.state_dict(),
            "config": config_to_dict(cfg),
            "vocab_size": tokenizer.vocab_size,
            "tokenizer": {"model": tokenizer.model_bytes, "sha256": tokenizer.sha256},
            "update": 0,
            "epoch": 0,
        },
        path,
    )
    return path


def tiny(
    data_dir: Path, run_dir: Path, model: dict[str, Any] | None = None, **train_opts: Any
) -> Config:
    """configs/tiny.yaml on the CPU with THREADS threads, logging every update."""
    base = load_config(TINY)
    return with_overrides(
        base,
        data={"dir": str(data_dir)},
        model=model or {},
        train={
            "run_dir": str(run_dir),
            "log_interval": 1,
            "device": "cpu",
            "threads": THREADS,
            **train_opts,
        },
    )


def make_trainer(cfg: Config) -> Trainer:
    torch.set_num_threads(cfg.train.threads)  # as train() does
    return Trainer(cfg, Env(torch.device("cpu")), reset_optimizer=False, reset_data=False)


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The records of one type ("train", "valid", ...) in RUN_DIR/metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["update"]: r["loss"] for r in records(run_dir, "train")}


def weights(run_dir: Path, name: str = "checkpoint_last.pt") -> dict[str, torch.Tensor]:
    return ckpt.load_checkpoint(run_dir / name)["model"]


def assert_same_weights(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6
) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=0, atol=atol), key


def updates_per_epoch(cfg: Config) -> int:
    meta = datamod.read_meta(cfg.data.dir)
    d = datamod.ParallelData.load(cfg.data.dir, "train", meta["source_lang"], meta["target_lang"])
    batches = datamod.make_batches(
        d.src_sizes,
        d.tgt_sizes,
        cfg.train.max_tokens,
        seed=cfg.train.seed,
        epoch=1,
        max_positions=cfg.model.max_positions,
    )
    return -(-len(batches) // cfg.train.update_freq)


# ------------------------------------------------------------------ data-parallel runs (torchrun)


def ddp_settings(
    data_dir: Path, run_dir: Path, max_updates: int, max_tokens: int = 1024
) -> dict[str, object]:
    # dropout 0: each rank has its own dropout masks, one process draws them in another order
    return {
        "data.dir": str(data_dir),
        "train.run_dir": str(run_dir),
        "train.max_updates": max_updates,
        "train.max_tokens": max_tokens,
        "train.log_interval": 1,
        "train.device": "cpu",
        "train.threads": 1,
        "train.save_interval_updates": 3,
        "train.validate_interval_updates": 4,
        "model.dropout": 0.0,
    }


def torchrun_command(sets: Mapping[str, object]) -> list[str]:
    """`torchrun` with 2 processes of `nmt train configs/tiny.yaml --set ...`."""
    return [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "nmt",
        "train",
        str(TINY),
        *set_args(sets),
    ]


def train_single(
    prepared: tuple[Path, dict], run_dir: Path, max_updates: int, max_tokens: int = 1024
) -> Config:
    """One process seeing both ranks' batches: update_freq 2 over the same batch stream."""
    sets = ddp_settings(prepared[0], run_dir, max_updates, max_tokens)
    cfg = load_config(TINY, [f"{k}={v}" for k, v in sets.items()] + ["train.update_freq=2"])
    threads = torch.get_num_threads()
    try:
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    return cfg


def assert_equal_runs(ddp_dir: Path, single_dir: Path) -> None:
    a = ckpt.load_checkpoint(ddp_dir / "checkpoint_last.pt")
    b = ckpt.load_checkpoint(single_dir / "checkpoint_last.pt")
    assert a["update"] == b["update"] and a["epoch"] == b["epoch"]
    assert not any(k.startswith("module.") for k in a["model"])  # the bare model, no DDP prefix
    for key, value in b["model"].items():
        assert torch.allclose(a["model"][key], value, rtol=0, atol=1e-5), key
    train_a, train_b = records(ddp_dir, "train"), records(single_dir, "train")
    assert [r["update"] for r in train_a] == [
        r["update"] for r in train_b
    ]  # logged once, by rank 0
    for ra, rb in zip(train_a, train_b, strict=True):
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    valid_a, valid_b = records(ddp_dir, "valid"), records(single_dir, "valid")
    assert [r["update"] for r in valid_a] == [r["update"] for r in valid_b]
    assert sorted(p.name for p in ddp_dir.glob("*.pt")) == sorted(
        p.name for p in single_dir.glob("*.pt")
    )


# ------------------------------------------------------------------ the plain loss


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over non-padding targets, unchunked:
    the reference the training loss (`nmt.training.loss.projected_smoothed_loss`) is checked
    against.

    logits (N, V) in any dtype, target (N,). Computed in fp32. The smoothed target puts
    1 - epsilon on the gold token and epsilon / (V - 1) on every other token (as fairseq),
    so loss = (1 - epsilon - eps_i) * nll + eps_i * sum_v(-log p_v), eps_i = epsilon / (V-1).
    The gradient comes from `_SmoothedCrossEntropy` in one pass over (N, V).
    """
    if not logits.requires_grad:
        return smoothed_cross_entropy(logits, target, epsilon, ignore_index)[:2]
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon, ignore_index)
    return loss, nll


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy with a hand-written backward.

    Per kept row, loss = -(a * lp[gold] + b * sum_v lp[v]) with a = 1 - epsilon - eps_i,
    b = eps_i (`smoothing_weights`), so d loss / d logit_v = (a + b V) p_v - b - a [v = gold].
    Computed in place in the saved log-probabilities.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss, nll, lprobs, keep = smoothed_cross_entropy(logits, target, epsilon, ignore_index)
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor, grad_nll: Any) -> tuple[Any, ...]:
        lprobs, target, keep = ctx.saved_tensors
        vocab = lprobs.size(-1)
        a, b = smoothing_weights(ctx.epsilon, vocab)
        grad = lprobs.exp_().mul_(a + b * vocab)  # the saved buffer becomes the gradient
        if b:
            grad.sub_(b)
        # -a at each kept row's gold token; a scatter, not rows = keep.nonzero(), which would
        # make the host wait for the device to say how many rows there are
        grad.scatter_add_(
            1, target.clamp(min=0).unsqueeze(1), torch.where(keep, -a, 0.0).unsqueeze(1)
        )
        grad.mul_(torch.where(keep, grad_loss.float(), 0.0).unsqueeze(1))
        return grad.to(ctx.dtype), None, None, None


# ------------------------------------------------------------------ greedy search


def first_maximum(
    scores: torch.Tensor, sent_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy's pick: each row's highest score, ties to the lower token id (`top_candidates`)."""
    best_score, best = top_candidates(scores, scores.new_zeros(scores.size(0), 1), 1)
    return best_score.view(-1), best.view(-1)


def greedy_search(
    model: SearchModel,
    src: torch.Tensor,
    cfg: DecodeConfig,
    *,
    pad: int = NMT_SPECIALS.pad,
    unk: int = NMT_SPECIALS.unk,
    bos: int = NMT_SPECIALS.bos,
    eos: int = NMT_SPECIALS.eos,
    max_len: int | None = None,
) -> list[list[int]]:
    """src (B, S) -> for each sentence the argmax output tokens, without EOS: `token_search`
    picking the first maximum, the reference that beam 1 (translate's greedy) must equal.

    Same length limits and token rules as `beam_search` (which it equals with beam 1).
    `max_len` is the model's number of positions; see `max_output_lengths`.
    """
    hyps = token_search(
        model, src, cfg, first_maximum, pad=pad, unk=unk, bos=bos, eos=eos, max_len=max_len
    )
    return [h.tokens for h in hyps]


def first_train_pairs(raw_corpus: Any, root: Path, lines: int) -> Path:
    """`root`/train.en and train.de: the first `lines` pairs of raw_corpus's train split."""
    pairs = list(
        zip(
            raw_corpus.lines("train", "en")[:lines],
            raw_corpus.lines("train", "de")[:lines],
            strict=True,
        )
    )
    write_parallel(pairs, root / "train", "en", "de")
    return root


def distill_command(
    teacher: Path, corpus: Path, raw_corpus: Any, out: Path, *extra: str, shard: int
) -> list[str]:
    """`nmt distill` of `corpus`/train.en-de with `teacher` into `out`, shards of `shard` lines,
    one thread, validated on raw_corpus's val split."""
    return [
        "distill",
        "--teacher",
        str(teacher),
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        str(corpus / "train"),
        "--validpref",
        raw_corpus.prefix("val"),
        "--out",
        str(out),
        "--shard-lines",
        str(shard),
        "--threads",
        "1",
        *extra,
    ]
