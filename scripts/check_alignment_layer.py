#!/usr/bin/env python
"""Which decoder layer's cross-attention aligns best? The check behind
`nmt.decoding.alignment.default_layer` (docs/benchmarks.md, "Which layer aligns").

No gold alignments are needed: the reference is the Viterbi alignment of IBM Model 1
(Brown et al. 1993), learnt by EM on the prepared training split (the same code as
`nmt shortlist`). For the first N pairs of the valid split, each reference target piece j is
linked to argmax_i p(t_j | s_i) over its source pieces (none where the NULL word wins); the
model, teacher-forced on the reference, links j to the source piece with the most attention
of a layer (heads averaged). Reported per layer: the share of IBM-linked target pieces whose
link agrees, and the same for a diagonal baseline (j -> round(j * |src| / |tgt|)).

    python scripts/check_alignment_layer.py --data data-bin/m30k_en_de \\
        --checkpoint runs/m30k/checkpoint_avg.pt [--checkpoint runs/rnn/checkpoint_avg.pt] --sentences 500
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from nmt.data import ParallelData, read_meta
from nmt.decoding.alignment import attention_matrices
from nmt.decoding.predict import load_models
from nmt.decoding.shortlist import _chunks, model1


def ibm1_links(data_dir: Path, pairs: list[tuple[np.ndarray, np.ndarray]], iterations: int) -> list[dict[int, int]]:
    meta = read_meta(data_dir)
    V = int(meta["vocab_size"])
    train = ParallelData.load(data_dir, "train")
    ids = np.arange(len(train))
    ids = ids[(train.src_sizes > 0) & (train.tgt_sizes > 0)]
    keys, prob = model1(train, _chunks(train, ids), V, iterations)
    links = []
    for src, tgt in pairs:
        s = torch.tensor(np.concatenate(([V], src)).astype(np.int64))  # NULL first
        t = torch.tensor(tgt.astype(np.int64))
        key = (s.unsqueeze(0) * V + t.unsqueeze(1)).view(-1)  # (T * (S + 1))
        pos = torch.searchsorted(keys, key).clamp(max=keys.numel() - 1)
        p = torch.where(keys[pos] == key, prob[pos], 0.0).view(len(t), len(s))  # (T, S + 1)
        best = p.argmax(1)
        links.append({j: int(i) - 1 for j, i in enumerate(best.tolist()) if i > 0})  # NULL: no link
    return links


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a prepare-bpe directory (train and valid splits)")
    ap.add_argument("--checkpoint", type=Path, action="append", required=True)
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--iterations", type=int, default=5)
    args = ap.parse_args()
    valid = ParallelData.load(args.data, "valid")
    pairs = [(valid.src(i), valid.tgt(i)) for i in range(min(args.sentences, len(valid)))]
    pairs = [(s, t) for s, t in pairs if len(s) and len(t)]
    links = ibm1_links(args.data, pairs, args.iterations)
    total = sum(map(len, links))
    diagonal = sum(min(round(j * len(s) / len(t)), len(s) - 1) == i
                   for (s, t), lk in zip(pairs, links, strict=True) for j, i in lk.items())
    print(f"{len(pairs)} valid pairs, {total} target pieces linked by IBM Model 1; "
          f"diagonal baseline agrees on {100 * diagonal / total:.1f}%")
    for path in args.checkpoint:
        loaded = load_models([path], torch.device("cpu"))
        weights = attention_matrices(loaded.model, [s.tolist() for s, _ in pairs], [t.tolist() for _, t in pairs],
                                     specials=loaded.tokenizer.specials)
        layers = weights[0].shape[0]
        for layer in range(layers):
            agree = 0
            for w, lk in zip(weights, links, strict=True):
                argmax = w[layer].mean(0)[:-1, :-1].argmax(1)  # (T,) without the EOS row / column
                agree += sum(int(argmax[j]) == i for j, i in lk.items())
            print(f"{path}: layer {layer} of {layers}: {100 * agree / total:.1f}% agree with IBM Model 1")


if __name__ == "__main__":
    main()
