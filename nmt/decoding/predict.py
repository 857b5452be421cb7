"""Prediction as a library: load checkpoints, batch, beam-search; token ids in, hypotheses out.

`translate_token_lists` is the one prediction path: the Python API (nmt.api, under
`nmt translate`, which only reads and writes streams) and validation BLEU in training both
call it; `score_token_lists` is forced decoding through the same model protocol. Batches are
formed by length for speed; results never depend on the batching.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from nmt.atomic import open_regular_file
from nmt.checkpoint import LAST_RUN_FILE, check_direction, load_model_checkpoint
from nmt.config import Config, DecodeConfig, check_decode, check_nbest
from nmt.data import pad_rows
from nmt.decoding.constraints import Constraints
from nmt.decoding.sampling import sampler
from nmt.decoding.search import NAN_LOGPROBS, Hypothesis, beam_search, token_search
from nmt.decoding.shortlist import Shortlist, load_shortlist
from nmt.device import autocast, configure_device
from nmt.errors import NmtError
from nmt.models.kernels import PackedLinear, check_int8, packing_works, quantize_decoder
from nmt.models.transformer import build_model
from nmt.tokenizer import SpecialIds, Tokenizer

log = logging.getLogger(__name__)


def decode_autocast(device: torch.device, precision: str) -> Any:
    """The autocast a decode at `precision` runs under: int8 under fp32, its decoder being
    quantised already (`load_models`); bf16 and fp16 as `nmt.device.autocast`."""
    return autocast(device, "fp32" if precision == "int8" else precision)


class Ensemble:
    """Several models behind the search protocol: the mean of their log-probabilities."""

    def __init__(self, models: Sequence[Any]):
        self.models = list(models)

    def encode(
        self, src: torch.Tensor, shortlist: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> list[Any]:
        return [m.encode(src, shortlist) for m in self.models]

    def decode_step(
        self, tokens: torch.Tensor, states: list[Any]
    ) -> tuple[torch.Tensor, list[Any]]:
        lprobs, new_states = zip(*(m.decode_step(tokens, s) for m, s in zip(self.models, states)))
        return torch.stack(lprobs).mean(dim=0), list(new_states)  # (N, V)

    def reorder(self, states: list[Any], index: torch.Tensor) -> list[Any]:
        return [m.reorder(s, index) for m, s in zip(self.models, states)]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [m.merge(x, y) for m, x, y in zip(self.models, a, b)]


class _Shortlisted:
    """A model behind the search protocol over a batch's shortlist (nmt.decoding.shortlist): the
    search sees columns 0 .. K-1 of `vocab` (K,) instead of token ids; `allowed` (B, K) per
    sentence."""

    def __init__(self, model: Any, vocab: torch.Tensor, allowed: torch.Tensor):
        self.model = model
        self.shortlist = (vocab, allowed)
        # the rest of the protocol is the model's own
        self.decode_step = model.decode_step
        self.reorder = model.reorder

    def encode(self, src: torch.Tensor) -> Any:
        return self.model.encode(src, self.shortlist)


@dataclass
class Loaded:
    model: Any  # a Transformer, an RNN (nmt.models.rnn) or an Ensemble of them
    tokenizer: Tokenizer
    config: Config
    max_positions: int
    name: str = "the model"  # its checkpoints, for messages


def resolve_checkpoints(paths: list[str]) -> list[Path]:
    """The given checkpoints, or the averaged/best one of the last `nmt train` run here."""
    if paths:
        return [Path(p) for p in paths]
    marker = Path(LAST_RUN_FILE)
    try:  # never through a symlink, never blocking on a FIFO (nmt.atomic.open_regular_file)
        fd = open_regular_file(marker, os.O_RDONLY, "the last-run marker", create=False)
    except FileNotFoundError:
        raise NmtError(
            "no --checkpoint given and no `nmt train` run recorded in this directory "
            f"({LAST_RUN_FILE} not found)"
        ) from None
    except NmtError as e:
        raise NmtError(f"{e}, or give --checkpoint") from None
    try:
        with open(fd, "rb") as f:
            run_dir = Path(f.read(65536).decode("utf-8").strip())
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "not a UTF-8 path"
        raise NmtError(
            f"{marker.resolve()}: cannot read the last run ({reason}); give --checkpoint"
        ) from None
    for name in ("checkpoint_avg.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        checkpoint = run_dir / name
        if checkpoint.exists():
            log.info("using %s (the last `nmt train` run here)", checkpoint)
            return [checkpoint]
    raise NmtError(
        f"{run_dir}: no checkpoint_avg.pt, checkpoint_best.pt or checkpoint_last.pt found"
    )


def load_models(paths: list[Path], device: torch.device, precision: str = "fp32") -> Loaded:
    """The checkpoints' models on `device` (an Ensemble for several); precision int8 quantises
    each Transformer's decoder; in fp32 on the CPU its output projection is packed for oneDNN
    (nmt.models.kernels); bf16 and fp16 are applied by autocast while decoding."""
    if precision == "int8":
        check_int8(device)
    configure_device(device)
    models = []
    tokenizer = None
    first_cfg = None
    for path in paths:
        ckpt = load_model_checkpoint(path, mmap=True)  # the weights are copied into the model once
        cfg = ckpt.config
        if tokenizer is None:
            tokenizer = ckpt.tokenizer
            first_cfg = cfg
        elif ckpt.tokenizer.sha256 != tokenizer.sha256:
            raise NmtError(
                f"{path}: its sentencepiece model differs from {paths[0]}'s; an ensemble needs one "
                "vocabulary"
            )
        check_direction(
            path,
            cfg,
            (first_cfg or cfg).data,
            f"as {paths[0]} does; an ensemble needs one direction",
        )
        if precision == "int8" and cfg.model.arch != "transformer":
            raise NmtError(
                f"{path}: --precision int8 quantises a Transformer's decoder; this is model.arch "
                f"{cfg.model.arch}"
            )
        model: Any = build_model(
            cfg.model, tokenizer.vocab_size, tokenizer.specials.pad, tokenizer.source_vocab_size
        )
        ckpt.load_into(model)
        model = model.to(device).eval()
        if precision == "int8":
            model = quantize_decoder(model)
        elif (
            precision == "fp32"
            and device.type == "cpu"
            and cfg.model.arch == "transformer"
            and packing_works()
        ):
            model.cpu_output = PackedLinear(model.output_weight, model.output_bias)
        models.append(model)
        del ckpt
    assert tokenizer is not None and first_cfg is not None
    max_pos = min(m.cfg.max_positions for m in models)
    name = ", ".join(map(str, paths))
    model = models[0] if len(models) == 1 else Ensemble(models)
    return Loaded(model, tokenizer, first_cfg, max_pos, name)


def nan_error(name: str, precision: str) -> NmtError:
    """The error of a model (`name`: its checkpoints) that computed NaN log-probabilities at
    `precision`, where its translations would otherwise come out empty, with no score."""
    hint = "" if precision == "fp32" else f" at precision {precision} (try fp32)"
    return NmtError(
        f"{name}: {NAN_LOGPROBS}{hint}; its weights overflow float32 or are damaged, it cannot "
        "translate"
    )


# ------------------------------------------------------------------ the prediction path


def _batches(lengths: Sequence[int], batch_size: int, max_tokens: int) -> Iterator[list[int]]:
    """Indices sorted by length (longest first), cut into batches."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for i in order:
        longest = lengths[batch[0] if batch else i] + 1
        full = len(batch) >= batch_size or (max_tokens and (len(batch) + 1) * longest > max_tokens)
        if batch and full:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def load_shortlist_for(path: str, loaded: Loaded, beam: int) -> Shortlist:
    """A file from `nmt shortlist`, checked against the loaded model's vocabulary and the beam."""
    shortlist = load_shortlist(path, loaded.tokenizer)
    # a list must outnumber the beam
    if len(loaded.tokenizer.specials.ids()) + shortlist.frequent.numel() <= beam:
        raise NmtError(
            f"{path}: {shortlist.frequent.numel()} frequent tokens are too few for beam {beam}; "
            f"rebuild it with nmt shortlist --frequent {beam}"
        )
    return shortlist


def need_beam_search(cfg: DecodeConfig, where: str) -> None:
    """The one rule that lexical constraints need beam search (sampling picks each token
    regardless): an NmtError naming `where` under `cfg.sampling`."""
    if cfg.sampling:
        raise NmtError(
            f"{where}: lexical constraints need beam search; they cannot be combined with sampling"
        )


def decode_workers(workers: int, device: torch.device) -> int:
    """Batches decoded at once: as asked on CPU (0 = one per torch thread), always 1 on GPU."""
    return (workers or torch.get_num_threads()) if device.type == "cpu" else 1


def translate_token_lists(
    model: Any,
    seqs: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    *,
    specials: SpecialIds,
    nbest: int = 1,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    max_positions: int | None = None,
    workers: int = 1,
    shortlist: Shortlist | None = None,
    first_index: int = 0,
    constraints: Sequence[Constraints | None] | None = None,
    model_name: str = "the model",
    abandoned: Callable[[int], bool] | None = None,
) -> list[list[Hypothesis]]:
    """Beam-search every token sequence (without eos); results in input order. `specials` are
    the special ids of the model's vocabulary (`Tokenizer.specials`). With `cfg.sampling`, one
    sample each instead (nmt.decoding.sampling): sequence i draws from the generator of input
    sentence first_index + i.

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
    (an approximation, see nmt.decoding.shortlist); the list depends on the sentence only, so
    batching still changes nothing.

    `constraints[i]` (beam search only): the lexical constraints of sequence i
    (nmt.decoding.constraints), or None; their tokens join the sentence's shortlist.

    A model that computes NaN is an NmtError naming `model_name` (`nan_error`).

    `abandoned(i)`: whether nobody waits for sequence i any more (nmt serve); asked before each
    step of its search, which then ends it as at its length limit (`beam_search`'s `gone`).
    """
    if constraints is not None and any(c is not None for c in constraints):
        need_beam_search(cfg, "translate_token_lists: constraints")
    device = torch.device(device)
    limit = (max_positions - 1) if max_positions else None
    seqs = [list(s[:limit]) if limit else list(s) for s in seqs]
    results: list[list[Hypothesis]] = [[] for _ in seqs]
    todo = [i for i, s in enumerate(seqs) if s]
    lengths = [len(seqs[i]) for i in todo]
    batches = [
        [todo[j] for j in batch] for batch in _batches(lengths, cfg.batch_size, cfg.max_tokens)
    ]

    def run(ids: list[int]) -> None:
        src = pad_rows([[*seqs[i], specials.eos] for i in ids], specials.pad)  # (B, S)
        search_model = model
        vocab = None
        ids_out = asdict(specials)
        cons = None if constraints is None else [constraints[i] for i in ids]
        gone = None if abandoned is None else lambda row: abandoned(ids[row])
        if shortlist is not None:  # the search numbers outputs by columns of the batch's vocabulary
            vocab, allowed = shortlist.batch_vocab(
                src, specials, [c.tokens() if c else set() for c in cons or []]
            )
            search_model = _Shortlisted(model, vocab.to(device), allowed.to(device))
            ids_out = {k: int(torch.searchsorted(vocab, v)) for k, v in ids_out.items()}
            if cons is not None:
                columns = vocab.tolist()
                cons = [c.mapped(columns) if c else None for c in cons]
        with torch.inference_mode(), decode_autocast(device, precision):  # both are per thread
            if cfg.sampling:
                pick = sampler(cfg, [first_index + i for i in ids])
                hyps = [
                    [h]
                    for h in token_search(
                        search_model,
                        src.to(device),
                        cfg,
                        pick,
                        **ids_out,
                        max_len=max_positions,
                        source_pad=specials.pad,
                        gone=gone,
                    )
                ]
            else:
                hyps = beam_search(
                    search_model,
                    src.to(device),
                    cfg,
                    nbest=nbest,
                    **ids_out,
                    max_len=max_positions,
                    source_pad=specials.pad,
                    constraints=cons,
                    gone=gone,
                )
        for i, h in zip(ids, hyps):
            if vocab is not None:  # token columns -> token ids
                h = [replace(hyp, tokens=vocab[hyp.tokens].tolist()) for hyp in h]
            results[i] = h

    try:
        _run_batches(run, batches, min(decode_workers(workers, device), len(batches)))
    except FloatingPointError:  # the search's NAN_LOGPROBS
        raise nan_error(model_name, precision) from None
    return results


def _run_batches(run: Callable[[list[int]], None], batches: list[list[int]], workers: int) -> None:
    """`run` each batch: one after another, or on `workers` threads of one intra-op thread each."""
    if workers <= 1:
        for ids in batches:
            run(ids)
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // workers))
    pool = ThreadPoolExecutor(workers, thread_name_prefix="nmt-decode")
    try:
        for _ in pool.map(run, batches):  # re-raises a worker's exception (or Ctrl-C) here
            pass
    finally:
        # after an error, the batches not yet started are dropped
        pool.shutdown(cancel_futures=True)
        torch.set_num_threads(threads)


def score_token_lists(
    model: Any,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    *,
    specials: SpecialIds,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    model_name: str = "the model",
) -> list[list[float]]:
    """Forced decoding: for each non-empty source (without eos, at most max_positions - 1
    tokens) the log-probability of each token of its target followed by eos (len + 1 values);
    `specials` are the vocabulary's special ids.

    The targets are fed through the same `encode` / `decode_step` protocol as the search, so
    a hypothesis scores the log-probs the search found for it (up to batch-shape rounding),
    for ensembles and int8 too. Batched by source length like `translate_token_lists`. A model
    that computes NaN is an NmtError naming `model_name` (`nan_error`).
    """
    device = torch.device(device)
    results: list[list[float]] = [[] for _ in sources]
    amp = decode_autocast(device, precision)
    for ids in _batches([len(s) for s in sources], cfg.batch_size, cfg.max_tokens):
        src = pad_rows([[*sources[i], specials.eos] for i in ids], specials.pad)  # (B, S)
        gold = [[*targets[i], specials.eos] for i in ids]
        steps = max(map(len, gold))
        feed = pad_rows(gold, specials.pad).to(device)  # (B, T): gold tokens, padded
        out = torch.zeros(len(ids), steps)  # (B, T)
        with torch.inference_mode(), amp:
            state = model.encode(src.to(device))
            last = torch.full((len(ids),), specials.bos, dtype=torch.long, device=device)
            for t in range(steps):  # past its eos a row is fed pad; those values are dropped
                lprobs, state = model.decode_step(last, state)  # (B, V)
                out[:, t] = lprobs.float().gather(1, feed[:, t : t + 1]).squeeze(1).cpu()
                last = feed[:, t]
        if out.isnan().any():
            raise nan_error(model_name, precision)
        for row, i in enumerate(ids):
            results[i] = out[row, : len(gold[row])].tolist()
    return results


def decode_config(
    base: DecodeConfig,
    overrides: dict[str, Any],
    nbest: int = 1,
    *,
    source: str = "the checkpoint",
    vocab_size: int | None = None,
    option: Callable[[str], str] | None = None,
) -> DecodeConfig:
    """The checkpoint's decode settings with the command's (or the API's) on top, checked
    where they came from: `--beam 0` is named as an option (or as `option(key)`, e.g. the
    API's `beam=`), a value stored in the checkpoint `source` as its key (`a.pt: decode.beam`);
    a stored value that an option overrides is not checked. With `vocab_size`, the bounds that
    depend on the model too (beam < vocabulary)."""
    cfg = replace(base, **overrides)
    option = option or (lambda key: f"--{key.replace('_', '-')}")

    def name(key: str) -> str:
        return option(key) if key in overrides else f"{source}: decode.{key}"

    check_decode(cfg, name, vocab_size)
    check_nbest(nbest, cfg, option("nbest"))
    return cfg
