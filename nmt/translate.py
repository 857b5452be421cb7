"""`nmt translate`: raw text in, detokenized translations out, one line for every line.

The I/O contract: only `\\n` ends a line (input is read as bytes and split on b"\\n"); a
trailing `\\r` (CRLF files) is dropped; invalid UTF-8 is replaced and reported with its
line number; empty and whitespace-only lines give empty lines without touching the model;
over-long lines are truncated with a warning; a translation never contains a line break
or a tab. Input is read in bounded chunks, each sorted by length into batches and written
back in input order, so memory stays flat on any input size.

`translate_token_lists` is the one prediction path, shared with validation in training.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import secrets
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt.checkpoint import LAST_RUN_FILE, load_checkpoint
from nmt.config import Config, DecodeConfig, config_from_dict
from nmt.device import PRECISIONS, autocast, configure_cuda, resolve_device
from nmt.errors import NmtError
from nmt.model import Transformer
from nmt.quantize import check_int8, quantize_decoder
from nmt.search import Hypothesis, beam_search
from nmt.shortlist import SPECIALS, Shortlist, load_shortlist
from nmt.tokenizer import BOS, EOS, PAD, UNK, Tokenizer

log = logging.getLogger(__name__)
CHUNK_LINES = 4096
_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
DECODE_PRECISIONS = (*PRECISIONS, "int8")  # int8: CPU, see nmt.quantize


@dataclass
class TranslateOptions:
    checkpoints: list[str] = field(default_factory=list)
    input: str | None = None
    output: str | None = None
    beam: int | None = None
    lenpen: float | None = None
    lenpen_style: str | None = None
    max_len_a: float | None = None
    max_len_b: int | None = None
    min_len: int | None = None
    no_repeat_ngram_size: int | None = None
    nbest: int = 1
    scores: bool = False
    batch_size: int | None = None
    max_tokens: int | None = None
    device: str = "auto"
    precision: str = "fp32"
    threads: int = 0
    workers: int = 0  # batches decoded at once on CPU; 0 = one per torch thread
    shortlist: str | None = None  # a file from `nmt shortlist`


# ------------------------------------------------------------------ models


class Ensemble:
    """Several models behind the search protocol: the mean of their log-probabilities."""

    def __init__(self, models: Sequence[Any]):
        self.models = list(models)

    def encode(self, src: torch.Tensor, shortlist: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[Any]:
        return [m.encode(src, shortlist) for m in self.models]

    def decode_step(self, tokens: torch.Tensor, states: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        outs = [m.decode_step(tokens, s) for m, s in zip(self.models, states)]
        lprobs = torch.stack([o[0] for o in outs]).mean(dim=0)  # (N, V)
        return lprobs, [o[1] for o in outs]

    def reorder(self, states: list[Any], index: torch.Tensor) -> list[Any]:
        return [m.reorder(s, index) for m, s in zip(self.models, states)]


class _Shortlisted:
    """A model behind the search protocol over a batch's shortlist (nmt.shortlist): the search
    sees columns 0 .. K-1 of `vocab` (K,) instead of token ids; `allowed` (B, K) per sentence."""

    def __init__(self, model: Any, vocab: torch.Tensor, allowed: torch.Tensor):
        self.model, self.shortlist = model, (vocab, allowed)

    def encode(self, src: torch.Tensor) -> Any:
        return self.model.encode(src, self.shortlist)

    def decode_step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        return self.model.decode_step(tokens, state)

    def reorder(self, state: Any, index: torch.Tensor) -> Any:
        return self.model.reorder(state, index)


@dataclass
class Loaded:
    model: Any  # a Transformer or an Ensemble of them
    tokenizer: Tokenizer
    config: Config
    max_positions: int


def resolve_checkpoints(paths: list[str]) -> list[Path]:
    """The given checkpoints, or the averaged/best one of the last `nmt train` run here."""
    if paths:
        return [Path(p) for p in paths]
    marker = Path(LAST_RUN_FILE)
    if not marker.exists():
        raise NmtError("no --checkpoint given and no `nmt train` run recorded in this directory "
                       f"({LAST_RUN_FILE} not found)")
    run_dir = Path(marker.read_text(encoding="utf-8").strip())
    for name in ("checkpoint_avg.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        if (run_dir / name).exists():
            log.info("using %s (the last `nmt train` run here)", run_dir / name)
            return [run_dir / name]
    raise NmtError(f"{run_dir}: no checkpoint_avg.pt, checkpoint_best.pt or checkpoint_last.pt found")


def load_models(paths: list[Path], device: torch.device, precision: str = "fp32") -> Loaded:
    """The checkpoints' models on `device` (an Ensemble for several); precision int8 quantises
    each decoder (nmt.quantize), the others are applied by autocast while decoding."""
    if precision == "int8":
        check_int8(device)
    configure_cuda(device)
    models, tokenizer, first_cfg, first_hash = [], None, None, None
    for path in paths:
        state = load_checkpoint(path, mmap=True)  # the weights are copied into the model once
        cfg = config_from_dict(state["config"], where=str(path))
        tok_hash = state["tokenizer"]["sha256"]
        if first_hash is not None and tok_hash != first_hash:
            raise NmtError(f"{path}: its sentencepiece model differs from {paths[0]}'s; an ensemble needs one vocabulary")
        if tokenizer is None:
            tokenizer = Tokenizer.from_bytes(state["tokenizer"]["model"])
            first_cfg, first_hash = cfg, tok_hash
        model = Transformer(cfg.model, int(state["vocab_size"]), pad_id=PAD)
        model.load_state_dict(state["model"])
        model = model.to(device).eval()
        models.append(quantize_decoder(model) if precision == "int8" else model)
        del state
    assert tokenizer is not None and first_cfg is not None
    max_pos = min(m.cfg.max_positions for m in models)
    return Loaded(models[0] if len(models) == 1 else Ensemble(models), tokenizer, first_cfg, max_pos)


# ------------------------------------------------------------------ the prediction path


def _batches(lengths: Sequence[int], batch_size: int, max_tokens: int) -> Iterator[list[int]]:
    """Indices sorted by length (longest first), cut into batches."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for i in order:
        longest = lengths[batch[0]] + 1 if batch else lengths[i] + 1
        full = len(batch) >= batch_size or (max_tokens and (len(batch) + 1) * longest > max_tokens)
        if batch and full:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def load_shortlist_for(path: str, loaded: Loaded, beam: int) -> Shortlist:
    """A file from `nmt shortlist`, checked against the loaded model's vocabulary and the beam."""
    shortlist = load_shortlist(path, vocab_size=loaded.tokenizer.vocab_size, spm_sha256=loaded.tokenizer.sha256)
    if SPECIALS + shortlist.frequent.numel() <= beam:  # a list must outnumber the beam
        raise NmtError(f"{path}: {shortlist.frequent.numel()} frequent tokens are too few for "
                       f"beam {beam}; rebuild it with nmt shortlist --frequent {beam}")
    return shortlist


def decode_workers(workers: int, device: torch.device) -> int:
    """Batches decoded at once: as asked on CPU (0 = one per torch thread), always 1 on GPU."""
    if device.type != "cpu":
        return 1
    return workers or torch.get_num_threads()


def translate_token_lists(
    model: Any,
    seqs: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    *,
    nbest: int = 1,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    max_positions: int | None = None,
    workers: int = 1,
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Beam-search every token sequence (without EOS); results in input order.

    Sequences longer than max_positions - 1 are truncated (the caller warns). Batches are
    formed by length for speed; the results do not depend on how sentences are batched.

    workers > 1 (CPU; 0 = one per torch thread, see `decode_workers`): that many batches are
    decoded at once, each on its own thread with one intra-op thread, instead of one batch
    with every thread (Marian's --cpu-threads, CTranslate2's inter_threads). A small model's
    matmuls are too small to share cores well, and the search's Python work of one batch
    overlaps the other's matmuls.

    precision bf16/fp16 decodes under autocast; int8 expects a model from
    `load_models(..., precision="int8")`, whose decoder is already quantised.

    With a `shortlist` each sentence is decoded over its own list of likely target tokens
    (an approximation, see nmt.shortlist); the list depends on the sentence only, so
    batching still changes nothing.
    """
    device = torch.device(device)
    limit = (max_positions - 1) if max_positions else None
    seqs = [list(s[:limit]) if limit else list(s) for s in seqs]
    results: list[list[Hypothesis]] = [[] for _ in seqs]
    todo = [i for i, s in enumerate(seqs) if s]
    lengths = [len(seqs[i]) for i in todo]
    batches = [[todo[j] for j in batch] for batch in _batches(lengths, cfg.batch_size, cfg.max_tokens)]

    def run(ids: list[int]) -> None:
        width = max(len(seqs[i]) for i in ids) + 1
        src = torch.full((len(ids), width), PAD, dtype=torch.long)
        for row, i in enumerate(ids):
            src[row, : len(seqs[i]) + 1] = torch.tensor([*seqs[i], EOS])
        search_model, vocab = model, None
        if shortlist is not None:
            vocab, allowed = shortlist.batch_vocab(src, PAD)
            search_model = _Shortlisted(model, vocab.to(device), allowed.to(device))
        amp = autocast(device, "fp32" if precision == "int8" else precision)  # int8: the model is quantised
        with torch.inference_mode(), amp:  # both are per thread
            hyps = beam_search(search_model, src.to(device), cfg, nbest=nbest, pad=PAD, unk=UNK, bos=BOS, eos=EOS,
                               max_len=max_positions)
        for i, h in zip(ids, hyps):
            if vocab is not None:  # token columns -> token ids
                h = [replace(hyp, tokens=vocab[hyp.tokens].tolist()) for hyp in h]
            results[i] = h

    workers = min(decode_workers(workers, device), len(batches))
    if workers <= 1:
        for ids in batches:
            run(ids)
        return results
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // workers))
    pool = ThreadPoolExecutor(workers, thread_name_prefix="nmt-decode")
    try:
        for _ in pool.map(run, batches):  # re-raises a worker's exception (or Ctrl-C) here
            pass
    finally:
        pool.shutdown(cancel_futures=True)  # after an error, the batches not yet started are dropped
        torch.set_num_threads(threads)
    return results


# ------------------------------------------------------------------ text I/O


def read_chunks(stream: BinaryIO, chunk_lines: int) -> Iterator[list[tuple[int, bytes]]]:
    """(line number, raw bytes) chunks; only b"\\n" ends a line; a final line without one counts."""
    chunk: list[tuple[int, bytes]] = []
    lineno = 0
    for raw in stream:  # binary iteration splits on b"\n" only
        lineno += 1
        chunk.append((lineno, raw[:-1] if raw.endswith(b"\n") else raw))
        if len(chunk) >= chunk_lines:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def decode_line(raw: bytes, lineno: int, name: str) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        log.warning("%s:%d: invalid UTF-8 replaced", name, lineno)
        return raw.decode("utf-8", errors="replace")


def clean_output(text: str) -> str:
    """A translation on one line: line breaks, tabs and other separators become spaces."""
    return _BREAKS.sub(" ", text).strip()


def format_line(hyps: list[Hypothesis], tokenizer: Tokenizer, nbest: int, scores: bool) -> str:
    fields: list[str] = []
    for h in hyps[:nbest]:
        if scores:
            fields.append(f"{h.score:.4f}")
        fields.append(clean_output(tokenizer.decode(h.tokens)))
    if not hyps and (scores or nbest > 1):
        return ""
    return "\t".join(fields)


def translate_stream(loaded: Loaded, cfg: DecodeConfig, inp: BinaryIO, out: Any, *, name: str, nbest: int,
                     scores: bool, device: torch.device, precision: str, workers: int = 1,
                     shortlist: Shortlist | None = None, chunk_lines: int = CHUNK_LINES) -> int:
    """Translate `inp` to `out` chunk by chunk; returns the number of lines written."""
    limit = loaded.max_positions - 1
    bar = _bar()
    written = 0
    for chunk in read_chunks(inp, chunk_lines):
        texts = [decode_line(raw, n, name) for n, raw in chunk]
        seqs = [loaded.tokenizer.encode(t) if t.strip() else [] for t in texts]
        for (n, _), s in zip(chunk, seqs):
            if len(s) > limit:
                log.warning("%s:%d: %d tokens, truncated to the model's maximum of %d", name, n, len(s), limit)
        hyps = translate_token_lists(loaded.model, seqs, cfg, nbest=nbest, device=device, precision=precision,
                                     max_positions=loaded.max_positions, workers=workers, shortlist=shortlist)
        for h in hyps:
            out.write(format_line(h, loaded.tokenizer, nbest, scores) + "\n")
        out.flush()
        written += len(chunk)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return written


def _bar() -> Any:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(unit="line", dynamic_ncols=True, leave=False)


def decode_config(base: DecodeConfig, opts: TranslateOptions) -> DecodeConfig:
    """The checkpoint's decode settings with the command-line options on top."""
    changes = {k: getattr(opts, k) for k in ("beam", "lenpen", "lenpen_style", "max_len_a", "max_len_b",
                                               "min_len", "no_repeat_ngram_size", "batch_size", "max_tokens")
               if getattr(opts, k) is not None}
    cfg = replace(base, **changes)
    if cfg.beam < 1:
        raise NmtError(f"--beam must be at least 1, got {cfg.beam}")
    if cfg.lenpen_style not in ("gnmt", "length", "none"):
        raise NmtError(f"--lenpen-style must be gnmt, length or none, got {cfg.lenpen_style!r}")
    if opts.nbest < 1 or opts.nbest > cfg.beam:
        raise NmtError(f"--nbest must be between 1 and the beam size ({cfg.beam}), got {opts.nbest}")
    if cfg.batch_size < 1 or cfg.max_tokens < 0:
        raise NmtError("--batch-size must be at least 1 and --max-tokens not negative")
    if not math.isfinite(cfg.lenpen):
        raise NmtError("--lenpen must be a finite number")
    return cfg


def translate_main(opts: TranslateOptions) -> None:
    if opts.precision not in DECODE_PRECISIONS:
        raise NmtError(f"--precision must be one of {', '.join(DECODE_PRECISIONS)}, got {opts.precision!r}")
    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    if opts.workers < 0:
        raise NmtError(f"--workers must be 0 (one per CPU thread) or more, got {opts.workers}")
    # int8 decoding exists on the CPU only: there, auto means the CPU even where CUDA is present
    device = resolve_device("cpu" if opts.precision == "int8" and opts.device == "auto" else opts.device)
    if opts.input is not None and not Path(opts.input).is_file():
        raise NmtError(f"{opts.input}: input file not found")
    loaded = load_models(resolve_checkpoints(opts.checkpoints), device, opts.precision)
    cfg = decode_config(loaded.config.decode, opts)
    shortlist = load_shortlist_for(opts.shortlist, loaded, cfg.beam) if opts.shortlist else None
    inp = open(opts.input, "rb") if opts.input else sys.stdin.buffer
    name = opts.input or "<stdin>"
    try:
        if opts.output:
            # written to a temporary next to it and renamed at the end: an error or an interrupt
            # leaves no partial file (and an existing one unchanged)
            out_path = Path(opts.output)
            tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                with open(tmp, "w", encoding="utf-8", newline="\n") as out:
                    translate_stream(loaded, cfg, inp, out, name=name, nbest=opts.nbest, scores=opts.scores,
                                     device=device, precision=opts.precision, workers=opts.workers,
                                     shortlist=shortlist)
                tmp.replace(out_path)
            except OSError as e:
                raise NmtError(f"{opts.output}: cannot write ({e.strerror})") from None
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        else:
            out = open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)
            translate_stream(loaded, cfg, inp, out, name=name, nbest=opts.nbest, scores=opts.scores,
                             device=device, precision=opts.precision, workers=opts.workers, shortlist=shortlist)
    finally:
        if opts.input:
            inp.close()
