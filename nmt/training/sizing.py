"""The model a training config makes, sized before it is built: `model.ffn_dim=1000000000` is one
line naming the model keys, not an allocator traceback after the data has loaded (issue 25).

The size is counted on the meta device (shapes, no memory), and training needs fp32 weights,
their gradients and Adam's two moments: 16 bytes a parameter, before any activation. A model
that passes the estimate can still fail to allocate (memory in use, a container's limit):
that error is one line too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from nmt import device as devices
from nmt.config import ModelConfig
from nmt.errors import NmtError, one_line
from nmt.models.rnn import RNN
from nmt.models.transformer import Transformer, build_model, num_parameters
from nmt.tokenizer import Tokenizer
from nmt.training.oom import is_oom

TRAIN_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients, Adam's exp_avg and exp_avg_sq
LAYER_KEYS = ("encoder_layers", "decoder_layers", "rnn_layers")
# the keys that size each architecture (named in the error; heads and dropout change nothing)
SIZE_KEYS = {
    "transformer": ("d_model", "ffn_dim", "encoder_layers", "decoder_layers", "max_positions"),
    "rnn": ("d_model", "rnn_hidden", "rnn_layers"),
}


def meta_model(
    cfg: ModelConfig,
    vocab_size: int,
    pad_id: int,
    named: ModelConfig | None = None,
    source_vocab: int | None = None,
) -> Transformer | RNN:
    """The model of `cfg` on the meta device (shapes, no memory: `nmt train --dry-run`), or an
    NmtError naming the model keys of `named` (default `cfg`) where a tensor's size overflows
    (2^63 bytes or more: `model.d_model=1000000000`)."""
    try:
        with torch.device("meta"):
            return build_model(cfg, vocab_size, pad_id, source_vocab)
    except RuntimeError as e:
        if "overflow" not in str(e):
            raise
        raise NmtError(
            f"{_sizes(named or cfg, vocab_size)} make a model whose tensors cannot even be sized "
            f"({one_line(e)}); lower them"
        ) from None


def model_elements(
    cfg: ModelConfig, vocab_size: int, pad_id: int, source_vocab: int | None
) -> tuple[int, int]:
    """(parameters, buffer elements) of the model `cfg` makes, allocating nothing.

    Layers are counted from models of one and two layers per stack (the layers of a stack after
    the first are alike): building 10^6 layers, even on the meta device, takes minutes."""

    def count(**layers: Any) -> tuple[int, int]:
        model = meta_model(
            dataclasses.replace(cfg, **layers), vocab_size, pad_id, cfg, source_vocab
        )
        return num_parameters(model), sum(b.numel() for b in model.buffers())

    one = dict.fromkeys(LAYER_KEYS, 1)
    params, buffers = base = count(**one)
    for key in LAYER_KEYS:
        two = count(**{**one, key: 2})
        more = getattr(cfg, key) - 1  # layers beyond the first
        params += more * (two[0] - base[0])
        buffers += more * (two[1] - base[1])
    return params, buffers


def build_training_model(
    cfg: ModelConfig, tok: Tokenizer, device: torch.device
) -> Transformer | RNN:
    """The model of `cfg` on `device`; an NmtError naming the model keys when training it cannot
    fit in the device's memory, or when allocating it fails."""
    vocab_size = tok.vocab_size
    pad_id = tok.specials.pad
    params, buffers = model_elements(cfg, vocab_size, pad_id, tok.source_vocab_size)
    needed = params * TRAIN_BYTES_PER_PARAMETER + buffers * 4
    memory = devices.memory_bytes(device)
    if memory is not None and needed > memory:
        raise NmtError(
            f"{_sizes(cfg, vocab_size)} make a model of {_approx(params)} parameters and "
            f"{_approx(buffers)} buffer values: training it needs {_gib(needed)} (fp32 weights, "
            f"gradients, Adam's moments) and {device} has {_gib(memory)}; lower them"
        )
    try:
        return build_model(cfg, vocab_size, pad_id, tok.source_vocab_size).to(device)
    except (RuntimeError, MemoryError) as e:
        if not (is_oom(e) or isinstance(e, MemoryError)):
            raise
        raise NmtError(
            f"{_sizes(cfg, vocab_size)} make a model of {_approx(params)} parameters, which cannot "
            f"be allocated on {device} ({one_line(e)}); lower them"
        ) from None


def _sizes(cfg: ModelConfig, vocab_size: int) -> str:
    """'model.d_model=512, model.ffn_dim=2048, ... (vocabulary 8000)': the keys that size
    `cfg.arch`."""
    keys = ", ".join(f"model.{key}={getattr(cfg, key)}" for key in SIZE_KEYS[cfg.arch])
    return f"{keys} (vocabulary {vocab_size})"


def _approx(n: int) -> str:
    """`n` to 3 digits, or as a power of two past the range of floats
    (model.encoder_layers=10^400)."""
    return f"{n:.3g}" if n < 2**1000 else f"2^{n.bit_length() - 1}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n < 2**1000 else f"2^{n.bit_length() - 31} GiB"
