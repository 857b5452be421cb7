"""Validation during training: valid loss and perplexity, BLEU of the search (decoded as
`nmt translate` decodes), and the bookkeeping of the best checkpoint and of patience."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

import torch

from nmt import data as datamod
from nmt.config import Config
from nmt.decoding.predict import translate_token_lists
from nmt.evaluate import corpus_bleu
from nmt.tokenizer import Tokenizer
from nmt.training.state import Progress

log = logging.getLogger(__name__)

# batch -> label-smoothed loss and NLL summed over the batch's target tokens
BatchLoss = Callable[[datamod.Batch], tuple[torch.Tensor, torch.Tensor]]


def validate(
    cfg: Config,
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    valid_data: datamod.ParallelData,
    device: torch.device,
    batch_loss: BatchLoss,
    precision: str,
) -> dict[str, float]:
    """Valid loss/perplexity and (if train.valid_bleu) detokenized sacreBLEU of the search.

    `batch_loss` is the trainer's: the valid loss is the loss that training minimises; the search
    decodes at the trainer's `precision` (train.precision resolved). The references are the valid
    split's cfg.data.target_lang side (the trainer's cfg names the direction it read)."""
    t = cfg.train
    model.eval()
    loss_sum = nll_sum = ntok = 0.0
    batches = datamod.make_batches(
        valid_data.src_sizes,
        valid_data.tgt_sizes,
        t.max_tokens,
        seed=0,
        epoch=1,
        shuffle=False,
        max_positions=cfg.model.max_positions,
    )
    with torch.no_grad():
        for ids in batches:
            batch = datamod.collate(valid_data, ids, tokenizer.specials).to(device)
            loss, nll = batch_loss(batch)
            loss_sum += loss.item()
            nll_sum += nll.item()
            ntok += batch.num_target_tokens
    nll_bits = nll_sum / max(ntok, 1) / math.log(2)
    result = {
        "valid_loss": loss_sum / max(ntok, 1) / math.log(2),
        "valid_nll": nll_bits,
        "valid_ppl": 2**nll_bits,
    }
    if t.valid_bleu:
        sources = [valid_data.src(i).tolist() for i in range(len(valid_data))]
        hyps = translate_token_lists(
            model,
            sources,
            replace(cfg.decode, beam=t.valid_beam),
            specials=tokenizer.specials,
            device=device,
            precision=precision,
            max_positions=cfg.model.max_positions,
            workers=0,
        )  # as nmt translate
        text = [tokenizer.decode(h[0].tokens) for h in hyps]
        refs = datamod.read_raw(cfg.data.dir, cfg.data.valid_split, cfg.data.target_lang)
        result["valid_bleu"] = corpus_bleu(text, [refs])
    return result


def track_best(p: Progress, result: dict[str, float], best_metric: str) -> bool:
    """Track the best validation and patience in `p`; returns whether this one is the best so far. A
    best of another metric (train.best_metric or valid_bleu changed on resume) starts them anew."""
    metric = "bleu" if best_metric == "bleu" and "valid_bleu" in result else "loss"
    if p.best is not None and p.best_metric not in ("", metric):
        log.info(
            "the best validation so far is a %s (%.3f); tracking %s now, a new best and patience "
            "start",
            p.best_metric,
            p.best,
            metric,
        )
        p.best = None
        p.bad_validations = 0
    value = result[f"valid_{metric}"]
    improved = p.best is None or (value > p.best if metric == "bleu" else value < p.best)
    if improved:
        p.best = value
        p.bad_validations = 0
        p.best_metric = metric
    else:
        p.bad_validations += 1
    return improved
