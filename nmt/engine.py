"""CTranslate2 as nmt's inference engine: `--engine {auto,torch,ctranslate2}`.

nmt trains and exports with PyTorch; CTranslate2 decodes the same weights with a decode loop in
C++, 1.2-2x faster on a CPU than nmt's own beam search (docs/benchmarks.md). `Translator` keeps
its API and its guarantees whichever engine decodes: this module holds what differs, one seam
(`CTranslate2Engine`: token ids in, `Hypothesis` lists out; forced-decoding log-probs) and the
rules of when the engine can stand in for torch (`refusal`).

The model is converted once (`converted`): the existing exporter (nmt.convert.ctranslate2)
writes it into a cache folder named by the checkpoint's content hash, so a changed checkpoint is
a new entry and an entry is never stale. An entry is complete only with its `nmt-cache.json`,
written last, which holds the hashes of the checkpoint and of the converted weights: a partial,
corrupt or foreign entry is rebuilt, never used. Conversion happens in a temporary folder beside
the entry and is renamed into place, so two processes converting at once both end with one
good copy. A cache that cannot be written (read-only, full) falls back to a temporary folder,
with a warning.

What the engine honours, exactly as torch decodes: beam size, length penalty (`length` and
`none`; `gnmt` is not CTranslate2's formula), the per-sentence length limit `max_len_a *
source + max_len_b` (`CTranslate2Engine.translate`), `min_len`, `<unk>`, `<pad>` and `<s>`
blocked, n-best with nmt's scores, target-language tokens, and forced-decoding scores;
alignments and attention are computed as for torch's translations (the torch model forced on
them). What stays on torch: ensembles, RNN models, terminology, lexical constraints (include,
avoid, prefix), shortlists, sampling, `no_repeat_ngram_size`, bf16 / fp16 where CTranslate2
has no such compute type on the device, a device CTranslate2 cannot open, and a model setting
the converter does not map.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt.atomic import clean_temporaries, open_for_reading, read_regular, temporary_name
from nmt.config import DecodeConfig
from nmt.convert.ctranslate2 import export, import_ctranslate2
from nmt.decoding.predict import nan_error
from nmt.decoding.search import Hypothesis, length_penalty, max_output_lengths
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)
# nmt's --precision as CTranslate2's compute type (int8: int8 weights, float32 elsewhere)
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8_float32", "bf16": "bfloat16", "fp16": "float16"}
MARKER = "nmt-cache.json"
# a new value makes every cache entry a new key: bump it when the conversion's output changes
CONVERSION = 1


def decode_refusal(cfg: DecodeConfig) -> str | None:
    """The first decode setting of `cfg` CTranslate2 cannot honour as torch does, named; None
    where there is none."""
    if cfg.sampling:
        return "sampling (CTranslate2 seeds a batch, nmt each sentence)"
    if cfg.lenpen_style == "gnmt":
        return "lenpen_style gnmt (CTranslate2 divides by length**lenpen)"
    if cfg.no_repeat_ngram_size:
        return "no_repeat_ngram_size"
    if cfg.min_len > 1:
        return "min_len above 1"
    if cfg.allow_unk:
        return "allow_unk"
    return None


def load_refusal(
    checkpoints: int, arch: str, precision: str, device: Any, shortlist: bool, terminology: bool
) -> str | None:
    """The first model option CTranslate2 cannot honour, named; None where there is none."""
    if checkpoints > 1:
        return "an ensemble of checkpoints"
    if arch != "transformer":
        return f"model.arch {arch}"
    if shortlist:
        return "shortlist"
    if terminology:
        return "terminology"
    try:
        supported = import_ctranslate2("--engine ctranslate2").get_supported_compute_types(
            device.type
        )
    except RuntimeError as e:  # a CTranslate2 built without CUDA, or a driver it cannot use
        return f"device {device.type} ({e})"
    if COMPUTE_TYPES[precision] not in supported:
        has = ", ".join(sorted(supported))
        return f"precision {precision} on {device.type} (CTranslate2 has {has})"
    return None


# ------------------------------------------------------------------ the cache


def sha256_of(stream: BinaryIO) -> str:
    """The SHA-256 of what `stream` reads, in blocks (a checkpoint may be gigabytes); closes
    it."""
    digest = hashlib.sha256()
    with stream as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _complete(entry: Path, checkpoint_hash: str) -> bool:
    """Whether `entry` is a finished conversion of the checkpoint of `checkpoint_hash`, its
    weights as they were written."""
    try:
        marker = json.loads(read_regular(entry / MARKER, "the cache entry's marker"))
        weights = sha256_of(open_for_reading(entry / "model.bin", "the cached model", None))
    except (OSError, ValueError, NmtError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("checkpoint_sha256") == checkpoint_hash
        and marker.get("conversion") == CONVERSION
        and marker.get("model_sha256") == weights
    )


def _convert_into(work: Path, checkpoint: Path, checkpoint_hash: str) -> Path:
    """Convert `checkpoint` into the new folder `work` (nmt export), its marker written last;
    returns `work`."""
    try:
        export(checkpoint, work, force=True)
        marker = {
            "checkpoint": str(checkpoint),
            "checkpoint_sha256": checkpoint_hash,
            "conversion": CONVERSION,
            "model_sha256": sha256_of(
                open_for_reading(work / "model.bin", "the converted model", None)
            ),
        }
        (work / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return work


def converted(checkpoint: Path, cache_dir: Path | None = None) -> Path:
    """The CTranslate2 conversion of `checkpoint`, from the cache or made now (see the module
    docstring); `cache_dir` None is $XDG_CACHE_HOME/nmt, or ~/.cache/nmt."""
    checkpoint_hash = sha256_of(open_for_reading(checkpoint, "the checkpoint", None))
    if cache_dir is None:
        cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nmt"
    folder = cache_dir / "ctranslate2"
    entry = folder / f"{checkpoint_hash[:32]}-{CONVERSION}"
    if _complete(entry, checkpoint_hash):
        return entry
    try:
        folder.mkdir(parents=True, exist_ok=True)
        clean_temporaries(folder, directories=True)  # what killed conversions left
        work = _convert_into(temporary_name(entry), checkpoint, checkpoint_hash)
    except OSError as e:
        fallback = Path(tempfile.mkdtemp(prefix="nmt-ctranslate2-"))
        atexit.register(shutil.rmtree, fallback, True)
        log.warning(
            "%s: cannot write the CTranslate2 cache (%s); converting into %s for this process",
            folder,
            e.strerror or e,
            fallback,
        )
        return _convert_into(fallback / "model", checkpoint, checkpoint_hash)
    log.info("converted %s for CTranslate2 into %s", checkpoint, entry)
    try:
        os.rename(work, entry)  # atomic; fails where another process put an entry there first
    except OSError:
        if _complete(entry, checkpoint_hash):  # theirs is as good as ours
            shutil.rmtree(work, ignore_errors=True)
            return entry
        old = temporary_name(entry, "old")
        os.rename(entry, old)
        os.rename(work, entry)
        shutil.rmtree(old, ignore_errors=True)
    return entry


# ------------------------------------------------------------------ decoding


class CTranslate2Engine:
    """A `ctranslate2.Translator` over a converted model: nmt's token ids in and out."""

    def __init__(
        self, model_dir: Path, tokenizer: Tokenizer, device: Any, precision: str, workers: int
    ):
        ctranslate2 = import_ctranslate2("--engine ctranslate2")
        self.precision = precision
        threads = torch.get_num_threads()
        inter = workers or threads if device.type == "cpu" else 1
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device=device.type,
            device_index=device.index or 0,
            compute_type=COMPUTE_TYPES[precision],
            inter_threads=inter,
            intra_threads=max(1, threads // inter) if device.type == "cpu" else 0,
        )
        self.source_pieces, self.target_pieces = tokenizer.vocabularies()
        self.target_ids = {piece: i for i, piece in enumerate(self.target_pieces)}
        ids = tokenizer.specials
        self.eos_piece = self.target_pieces[ids.eos]
        # what torch's search never produces (nmt.decoding.search._block_); <unk>: disable_unk
        self.blocked = [[self.target_pieces[i]] for i in {ids.pad, ids.bos} - {ids.eos}]

    def translate(
        self,
        seqs: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        nbest: int,
        max_positions: int,
        model_name: str,
    ) -> list[list[Hypothesis]]:
        """Beam-search every token sequence (without EOS), as `translate_token_lists` does:
        results in input order, [] for an empty sequence, sources truncated to the model's
        positions, a model that computes NaN an NmtError naming `model_name`.

        The sentences are decoded together, under the longest of their length limits; a search
        that ends before a sentence's own limit never met it, and is the search under that
        limit. A sentence with a hypothesis that long is decoded again, under its own limit,
        with the others of that limit. Where a search reaches a sentence's limit the engines can
        differ: torch forces EOS there and ranks the hypothesis with its log-prob, CTranslate2
        stops without it. The scores of such a hypothesis are then computed by forced decoding,
        as torch's are."""
        results: list[list[Hypothesis]] = [[] for _ in seqs]
        seqs = [seq[: max_positions - 1] for seq in seqs]
        lengths = torch.tensor([len(seq) + 1 for seq in seqs])
        limits = max_output_lengths(lengths, cfg, max_positions).tolist()
        todo = [i for i, seq in enumerate(seqs) if seq]
        found: dict[int, Any] = {}  # CTranslate2's result of each sentence
        groups = {max(limits[i] for i in todo): todo} if todo else {}  # limit: sentences
        while groups:
            pending = []
            for limit, ids in groups.items():
                futures = self.translator.translate_batch(
                    [self._pieces(seqs[i]) for i in ids],
                    max_batch_size=cfg.max_tokens or cfg.batch_size,
                    batch_type="tokens" if cfg.max_tokens else "examples",
                    asynchronous=True,
                    beam_size=cfg.beam,
                    num_hypotheses=nbest,
                    length_penalty=cfg.lenpen if cfg.lenpen_style == "length" else 0.0,
                    disable_unk=not cfg.allow_unk,
                    suppress_sequences=self.blocked,
                    max_input_length=0,
                    max_decoding_length=limit,
                    min_decoding_length=cfg.min_len,
                    return_scores=True,
                    return_end_token=True,
                )
                pending += [(i, limit, future) for i, future in zip(ids, futures)]
            groups = {}
            for i, limit, future in pending:
                found[i] = future.result()
                if limit > limits[i] <= max(map(len, found[i].hypotheses)):
                    groups.setdefault(limits[i], []).append(i)
        cut = []  # (sentence, rank) of the hypotheses that reached their limit without EOS
        for i, result in found.items():
            for k, (pieces, score) in enumerate(zip(result.hypotheses, result.scores)):
                if math.isnan(score):
                    raise nan_error(model_name, self.precision)
                ended = bool(pieces) and pieces[-1] == self.eos_piece
                if not ended:
                    cut.append((i, k))
                tokens = [self.target_ids[p] for p in pieces[: len(pieces) - ended]]
                lp = length_penalty(len(tokens) + 1, cfg.lenpen, cfg.lenpen_style)
                results[i].append(Hypothesis(tokens, score, score * lp, positional_scores=[]))
        # torch ends such an output with a forced EOS and counts its log-prob: so do its scores
        cut_sources = [seqs[i] for i, _ in cut]
        cut_targets = [results[i][k].tokens for i, k in cut]
        rescored = self.score(cut_sources, cut_targets, model_name)
        for (i, k), token_logprobs in zip(cut, rescored):
            hyp = results[i][k]
            logprob = sum(token_logprobs)
            lp = length_penalty(len(hyp.tokens) + 1, cfg.lenpen, cfg.lenpen_style)
            results[i][k] = Hypothesis(hyp.tokens, logprob / lp, logprob, positional_scores=[])
        for i in {i for i, _ in cut}:  # a rescored hypothesis ranks by its new score, as torch's
            results[i].sort(key=lambda h: h.score, reverse=True)
        return results

    def score(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], model_name: str
    ) -> list[list[float]]:
        """Forced decoding, as `score_token_lists`: the log-prob of each target token and of
        the EOS after them, given the source."""
        results = self.translator.score_batch(
            [self._pieces(s) for s in sources],
            [[self.target_pieces[t] for t in target] for target in targets],
            max_input_length=0,
        )
        logprobs = [list(r.log_probs) for r in results]
        if any(math.isnan(x) for lp in logprobs for x in lp):
            raise nan_error(model_name, self.precision)
        return logprobs

    def _pieces(self, seq: Sequence[int]) -> list[str]:
        return [self.source_pieces[t] for t in seq]
