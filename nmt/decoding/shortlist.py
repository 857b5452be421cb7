"""Lexical shortlists: beam search over the few hundred target tokens a sentence can need.

The output projection and softmax over the whole vocabulary are the largest part of a
decoder step of a small model. A shortlist (Marian's `--shortlist`) restricts them to, per
sentence: the special tokens, the `frequent` most frequent target tokens, the sentence's
own tokens (names and numbers are copied in a joint vocabulary), and the `top` most likely
translations p(t|s) of each of its source tokens. Log-probabilities are normalised over
that list, so scores differ slightly from full-vocabulary decoding and a token outside the
list cannot be produced: it is an approximation, off by default, to be checked with BLEU.
The list depends on the sentence alone, so batching still never changes a translation;
the projection runs over the union of a batch's lists (one matmul) with each sentence
masked to its own.

p(t|s) comes from IBM Model 1 (Brown et al. 1993), learned with EM on the binarized
training data; `nmt shortlist DATA_DIR -o FILE` writes it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nmt.atomic import FileArg, check_outputs, open_for_reading, target
from nmt.checkpoint import atomic_save
from nmt.data import META_FILE, ParallelData, bin_path, idx_path, read_meta
from nmt.errors import NmtError
from nmt.fields import check_bounds, flag
from nmt.options import ShortlistOptions
from nmt.tokenizer import SpecialIds, Tokenizer

log = logging.getLogger(__name__)

FORMAT = "nmt-shortlist"
FORMAT_VERSION = 1
_OCCURRENCES_PER_CHUNK = 4_000_000  # (source, target) token pairs handled at once in EM


@dataclass
class Shortlist:
    # (source V, top) long: per source token its likeliest target tokens, -1 = none
    candidates: Tensor
    frequent: Tensor  # (F,) long: the most frequent target tokens
    vocab_size: int  # the target vocabulary's
    spm_sha256: str
    source_lang: str = ""
    target_lang: str = ""
    # (source V,) separate vocabularies: each source token as a target token, or -1
    copies: Tensor | None = None

    def allowed(self, src: Tensor, specials: SpecialIds) -> Tensor:
        """src (B, S) token ids -> (B, V) bool: the target tokens each sentence may produce,
        the special tokens (`specials`, the vocabulary's) always among them."""
        B = src.size(0)
        V = self.vocab_size
        src = src.cpu().clamp(max=self.candidates.size(0) - 1)
        allowed = torch.zeros(B, V + 1, dtype=torch.bool)  # column V collects the -1 entries
        allowed[:, specials.ids()] = True
        allowed[:, self.frequent] = True
        real = src != specials.pad
        own = src if self.copies is None else self.copies[src]
        # (B, S, 1 + top): each source token as a target token, then its likeliest translations
        cand = torch.cat([own.unsqueeze(2), self.candidates[src]], 2)
        allowed.scatter_(1, torch.where(real.unsqueeze(2) & (cand >= 0), cand, V).view(B, -1), True)
        return allowed[:, :V]

    def batch_vocab(
        self, src: Tensor, specials: SpecialIds, extra: Sequence[Collection[int]] = ()
    ) -> tuple[Tensor, Tensor]:
        """src (B, S) -> the batch's tokens (K,) ascending, and (B, K) bool: which of them
        each sentence may produce. One output projection over the K tokens serves the whole
        batch (a per-sentence projection would read each weight for `beam` rows only); the
        mask keeps every sentence to its own list. The special tokens are always among them;
        the search numbers them by their columns (an imported model's pad is its last id).
        `extra[b]`: tokens sentence b may produce besides (its lexical constraints' tokens)."""
        allowed = self.allowed(src, specials)
        for b, tokens in enumerate(extra):
            allowed[b, list(tokens)] = True
        vocab = allowed.any(0).nonzero().view(-1)
        return vocab, allowed[:, vocab]


# ------------------------------------------------------------------ learning


def _pairs(
    src: list[np.ndarray], tgt: list[np.ndarray], null: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Every (source token, target token) pair within each sentence pair, NULL source included.

    -> source ids, target ids, and the index of the target position each pair belongs to
    (the E-step normalises over the source tokens of one target position).
    """
    src_len = torch.tensor([len(s) + 1 for s in src])  # + NULL
    tgt_len = torch.tensor([len(t) for t in tgt])
    src_flat = torch.from_numpy(
        np.concatenate([np.concatenate(([null], s)) for s in src]).astype(np.int64)
    )
    tgt_flat = torch.from_numpy(np.concatenate(tgt).astype(np.int64))
    src_start = torch.cumsum(src_len, 0) - src_len  # (n,) offset of each sentence in src_flat
    per_target = src_len.repeat_interleave(tgt_len)  # (T,) source tokens each target pairs with
    position = torch.arange(tgt_flat.numel()).repeat_interleave(per_target)  # (P,)
    first = torch.cumsum(per_target, 0) - per_target
    offset = torch.arange(position.numel()) - first[position]  # 0 .. src_len - 1
    s = src_flat[src_start.repeat_interleave(tgt_len)[position] + offset]
    return s, tgt_flat[position], position


def _chunks(data: ParallelData, ids: np.ndarray) -> list[np.ndarray]:
    """Sentence indices in runs of about _OCCURRENCES_PER_CHUNK pairs."""
    cum = np.cumsum((data.src_sizes[ids] + 1) * data.tgt_sizes[ids])
    cuts = np.searchsorted(cum, np.arange(_OCCURRENCES_PER_CHUNK, cum[-1], _OCCURRENCES_PER_CHUNK))
    return [c for c in np.split(ids, cuts) if len(c)]


def model1(
    data: ParallelData,
    chunks: list[np.ndarray],
    V: int,
    iterations: int,
    source_vocab: int,
) -> tuple[Tensor, Tensor]:
    """IBM Model 1 by EM on the sentence pairs `chunks` (see `_chunks`) of `data`: the pairs
    (s, t) that co-occur, as sorted keys s * V + t (s = `source_vocab`, the source vocabulary's
    size, is the NULL word), and p(t|s) of each."""
    null = source_vocab  # source id of the NULL word; pair key = s * V + t

    def chunk_pairs(chunk: np.ndarray) -> tuple[Tensor, Tensor]:
        s, t, position = _pairs([data.src(i) for i in chunk], [data.tgt(i) for i in chunk], null)
        return s * V + t, position

    keys = torch.unique(torch.cat([torch.unique(chunk_pairs(c)[0]) for c in chunks]))  # sorted
    key_src = keys // V
    prob = torch.ones(keys.numel(), dtype=torch.float64)  # uniform start: first E-step is uniform
    for it in range(iterations):
        counts = torch.zeros_like(prob)
        for chunk in chunks:
            key, position = chunk_pairs(chunk)
            pair = torch.searchsorted(keys, key)
            p = prob[pair]
            total = torch.zeros(int(position[-1]) + 1, dtype=p.dtype).index_add_(0, position, p)
            counts.index_add_(0, pair, p / total[position])
        norm = torch.zeros(null + 1, dtype=counts.dtype).index_add_(0, key_src, counts)
        prob = counts / norm[key_src]
        log.info("IBM model 1: iteration %d of %d done", it + 1, iterations)
    return keys, prob


# token ids: 16 times the largest vocabularies in use (~256k); the tables are V x top
MAX_VOCAB = 1 << 22


def _vocab_sizes(meta: dict, path: Path) -> tuple[int, int]:
    """prepare.json's target and source vocabulary sizes (joint: both the same), checked: the
    tables are allocated by them (a hand-edited `vocab_size: 10**12` asked for 8 TB), so each
    is at least 1 and at most what the data's token type holds (uint16: 65,535, as prepare-bpe
    chooses it) or MAX_VOCAB."""
    most = 65535 if meta["dtype"] == "uint16" else MAX_VOCAB
    V = meta["vocab_size"]
    Vs = meta.get("source_vocab_size") or V
    if not (1 <= V <= most and 1 <= Vs <= most):
        raise NmtError(
            f"{path}: vocab_size {V:,} or source_vocab_size {Vs:,} is not a vocabulary of "
            f"{meta['dtype']} tokens (1 to {most:,}); re-run nmt prepare-bpe"
        )
    return V, Vs


def _check_tokens(data_dir: str | Path, data: ParallelData, V: int, Vs: int) -> None:
    """The train split's offsets go forward and its token ids are in the vocabulary, or an
    NmtError naming the file: a sentence of negative length, or an id past a table, would
    give a wrong shortlist or fail deep in the counting (IndexError)."""
    for lang, tokens, size in (
        (data.src_lang, data.src_data, Vs),
        (data.tgt_lang, data.tgt_data, V),
    ):
        if (tokens.sizes < 0).any():
            raise NmtError(
                f"{idx_path(data_dir, 'train', lang)}: offsets go backwards (not written by nmt "
                "prepare-bpe); re-run it"
            )
        if not len(tokens.tokens):
            continue
        if not 0 <= tokens.tokens.min() <= tokens.tokens.max() < size:
            raise NmtError(
                f"{bin_path(data_dir, 'train', lang)}: token ids outside the vocabulary (0 to "
                f"{size - 1:,}, prepare.json); re-run nmt prepare-bpe"
            )


def learn_shortlist(
    data_dir: str | Path,
    *,
    top: int = 20,
    frequent: int = 100,
    iterations: int = 5,
    max_sentences: int = 1_000_000,
) -> Shortlist:
    """IBM Model 1 p(t|s) on the `train` split of a `nmt prepare-bpe` directory -> Shortlist.

    At most `max_sentences` pairs are used (evenly spaced through the corpus), which is
    plenty for the top translations of every frequent token.
    """
    check_bounds(
        ShortlistOptions,
        flag,
        top=top,
        frequent=frequent,
        iterations=iterations,
        max_sentences=max_sentences,
    )
    meta = read_meta(data_dir)
    V, Vs = _vocab_sizes(meta, Path(data_dir) / META_FILE)
    top = min(top, V)  # more is all
    frequent = min(frequent, V)
    data = ParallelData.load(data_dir, "train")
    _check_tokens(data_dir, data, V, Vs)
    ids = np.unique(
        np.linspace(0, len(data) - 1, min(len(data), max_sentences)).round().astype(np.int64)
    )
    ids = ids[(data.src_sizes[ids] > 0) & (data.tgt_sizes[ids] > 0)]
    if not len(ids):
        raise NmtError(f"{data_dir}: the train split has no non-empty sentence pair")
    chunks = _chunks(data, ids)
    keys, prob = model1(data, chunks, V, iterations, Vs)
    key_src = keys // V

    # per source token (not NULL), its targets by descending p(t|s)
    order = prob.argsort(descending=True, stable=True)
    order = order[key_src[order].argsort(stable=True)]
    src_of = key_src[order]
    tgt_of = keys[order] % V
    rank = torch.arange(order.numel()) - torch.searchsorted(src_of, src_of, side="left")
    keep = (rank < top) & (src_of < Vs)
    candidates = torch.full((Vs, top), -1, dtype=torch.long)
    candidates[src_of[keep], rank[keep]] = tgt_of[keep]

    counts_tgt = torch.zeros(V, dtype=torch.long)
    for chunk in chunks:
        counts_tgt += torch.from_numpy(
            np.bincount(np.concatenate([data.tgt(i) for i in chunk]), minlength=V)
        )
    frequent_ids = counts_tgt.topk(frequent).indices.sort().values
    return Shortlist(
        candidates, frequent_ids, V, meta["spm"]["sha256"], meta["source_lang"], meta["target_lang"]
    )


def shortlist_command(
    data_dir: Path, output: Path, *, top: int, frequent: int, iterations: int, max_sentences: int
) -> None:
    """`nmt shortlist`: learn a shortlist and write it to `output` (checked before the work)."""
    target(output, "-o")
    meta = read_meta(data_dir)
    read = [FileArg("DATA_DIR", Path(data_dir) / META_FILE, "the data's description")]
    read += [
        FileArg("DATA_DIR", path(data_dir, "train", meta[side]), "the training data")
        for side in ("source_lang", "target_lang")
        for path in (bin_path, idx_path)
    ]
    check_outputs(read, [FileArg("-o", output)])
    shortlist = learn_shortlist(
        data_dir, top=top, frequent=frequent, iterations=iterations, max_sentences=max_sentences
    )
    save_shortlist(shortlist, output)
    log.info(
        "wrote %s (%d source tokens x top %d, %d frequent)",
        output,
        shortlist.vocab_size,
        top,
        shortlist.frequent.numel(),
    )


# ------------------------------------------------------------------ files


def save_shortlist(shortlist: Shortlist, path: str | Path) -> None:
    atomic_save(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "vocab_size": shortlist.vocab_size,
            "spm_sha256": shortlist.spm_sha256,
            "source_lang": shortlist.source_lang,
            "target_lang": shortlist.target_lang,
            "candidates": shortlist.candidates.to(torch.int32),
            "frequent": shortlist.frequent.to(torch.int32),
        },
        path,
    )


def load_shortlist(path: str | Path, tokenizer: Tokenizer) -> Shortlist:
    """Read a file written by `nmt shortlist` and check it belongs to the model's vocabulary:
    anything else (another torch file, a hand-made one with a key missing, a table of another
    shape or with ids outside the vocabulary) is an NmtError naming the file."""
    vocab_size = tokenizer.vocab_size
    spm_sha256 = tokenizer.sha256
    path = Path(path)
    expected = "a shortlist is the file `nmt shortlist DATA_DIR -o FILE` writes"
    try:
        with open_for_reading(path, "the shortlist", None) as f:
            obj = torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise NmtError(f"{path}: shortlist file not found") from None
    except NmtError:
        raise
    except Exception:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise NmtError(
            f"{path}: not a shortlist ({expected}; this is not a torch file of tensors)"
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        what = "a checkpoint" if isinstance(obj, dict) and "model" in obj else "another torch file"
        raise NmtError(f"{path}: not a shortlist ({expected}; this is {what})")
    if obj.get("format_version") != FORMAT_VERSION:
        raise NmtError(
            f"{path}: shortlist format version {obj.get('format_version')}, this nmt reads "
            f"{FORMAT_VERSION}"
        )
    missing = next(
        (key for key in ("vocab_size", "spm_sha256", "candidates", "frequent") if key not in obj),
        None,
    )
    if missing is not None:
        raise NmtError(f"{path}: not a shortlist (no {missing}); run nmt shortlist again")
    if obj["vocab_size"] != vocab_size or obj["spm_sha256"] != spm_sha256:
        raise NmtError(
            f"{path}: made for another vocabulary than the checkpoint's (different sentencepiece "
            "model); run nmt shortlist on the model's data directory"
        )
    candidates = _ids(
        obj, "candidates", tokenizer.source_vocab_size or vocab_size, -1, vocab_size, path
    )
    frequent = _ids(obj, "frequent", None, 0, vocab_size, path)
    copies = None
    # separate vocabularies: each source token's piece as a target id
    if tokenizer.source_vocab_size is not None:
        source, target = tokenizer.vocabularies()
        ids = {p: i for i, p in enumerate(target)}
        copies = torch.tensor([ids.get(p, -1) for p in source])
    return Shortlist(
        candidates,
        frequent,
        vocab_size,
        spm_sha256,
        obj.get("source_lang", ""),
        obj.get("target_lang", ""),
        copies,
    )


def _ids(obj: dict, key: str, rows: int | None, lowest: int, vocab_size: int, path: Path) -> Tensor:
    """A shortlist's table `obj[key]` as a long tensor, checked: integers, `rows` rows of ids
    (None: one row), each from `lowest` (-1: none) to the vocabulary's last id; else an NmtError
    naming the file (a hand-made table failed in the search with an IndexError)."""
    table = obj[key]
    shape = "one row" if rows is None else f"{rows} rows"
    if (
        not isinstance(table, Tensor)
        or table.dtype not in (torch.int16, torch.int32, torch.int64, torch.uint8)
        or table.dim() != (1 if rows is None else 2)
        or rows not in (None, len(table))
    ):
        raise NmtError(
            f"{path}: not a shortlist ({key} is not an integer table of {shape}); run nmt "
            "shortlist again"
        )
    table = table.long()
    if table.numel() and not (lowest <= int(table.min()) and int(table.max()) < vocab_size):
        raise NmtError(
            f"{path}: {key} holds token ids outside the vocabulary ({lowest} to {vocab_size - 1}); "
            "run nmt shortlist again"
        )
    return table
