"""Tiny random Hugging Face MarianMT folders, written by transformers itself, for the tests of
`nmt import` (tests/test_import_hf.py).

A folder is what an OPUS-MT model on the Hub holds: `config.json` and the weights from
`MarianMTModel.save_pretrained` (`model.safetensors`; or `pytorch_model.bin`, the state dict
pickled by `torch.save`, which is what transformers 4's
`save_pretrained(safe_serialization=False)` wrote and older OPUS-MT uploads hold:
transformers 5 writes safetensors only), `source.spm` / `target.spm` (sentencepiece models with its
own defaults, <unk>=0 <s>=1 </s>=2, whose ids the model never sees), `vocab.json` (the model's
ids, as transformers' convert_marian_to_pytorch builds it from Marian's vocabulary: `</s>` 0,
`<unk>` 1, the target-language tokens `>>xxx<<`, the pieces of both models, and `<pad>`
appended last: the pad row, the decoder's start) and `tokenizer_config.json`.

`Variant` picks what differs between real models: the FFN activation, separate source and
target embeddings (`share_encoder_decoder_embeddings: false`), an untied output projection
(`tie_word_embeddings: false`), `</s>` at an id other than 0 (and a vocab.json without
`<pad>`, the pad row one past it), the weights' file format, a zero pad row (as in a model
converted from Marian, which has none), separate source and target vocabularies (`vocab.json`
and `target_vocab.json` of different sizes, `separate_vocabs` in `tokenizer_config.json`, as
transformers reads the opus-mt-tc models with them; `<pad>` at id 2 in both). Every model has a
d_model that is no power of two (40, 4 heads of 10), a random non-zero `final_logits_bias`, weights
far from their initialisation (std 0.02 would make every distribution nearly flat, so that any two
implementations' argmaxes would be near-ties), a non-zero pad row unless asked, and an EOS
bias that makes `</s>` the likeliest token at some steps, so that many searches end on their
own rather than at a length limit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch
from transformers import MarianConfig, MarianMTModel

LANGUAGE_TOKENS = (">>fra<<", ">>deu<<")
SPM_VOCAB = 250  # per side; with both sides merged, the model's vocabulary is ~400
D_MODEL, HEADS, FFN, LAYERS = 40, 4, 80, 2
MAX_POSITIONS = 128
EOS_RATE = 0.15  # </s> is the likeliest token at about this share of the decoding steps


@dataclass(frozen=True)
class Variant:
    """What one test model changes from OPUS-MT's usual (swish, tied everything, safetensors)."""

    activation: str = "swish"
    share_embeddings: bool = True  # config share_encoder_decoder_embeddings
    tie_output: bool = True  # config tie_word_embeddings
    eos_last: bool = False  # </s> is vocab.json's last piece (not id 0), <unk> id 0, no <pad> entry
    zero_pad_row: bool = False  # the pad row (the decoder's start embedding) is zero
    safetensors: bool = True  # else pytorch_model.bin
    # vocab.json the source's, target_vocab.json the target's (needs share_embeddings off)
    separate_vocabs: bool = False
    seed: int = 0


# The seeds gave outputs of many lengths, different for each source, with Multi30k's
# vocabulary (a random model may also say "X </s>" whatever the source, or never end).
# "gelu_new, untied output" keeps share_encoder_decoder_embeddings: transformers 5 then ties
# nothing, and its encoder and decoder read two tables of their own beside `shared`.
VARIANTS: dict[str, Variant] = {
    "swish": Variant(),
    "gelu, pytorch_model.bin": Variant(activation="gelu", safetensors=False),
    "relu, separate source/target embeddings": Variant(
        activation="relu", share_embeddings=False, seed=3
    ),
    "gelu_new, untied output": Variant(activation="gelu_new", tie_output=False, seed=3),
    "eos not 0, separate embeddings, untied output": Variant(
        share_embeddings=False, tie_output=False, eos_last=True
    ),
    "zero pad row": Variant(zero_pad_row=True),
    "separate vocabularies, untied output": Variant(
        share_embeddings=False, tie_output=False, separate_vocabs=True
    ),
}


def train_spm_pair(
    source_lines: Sequence[str], target_lines: Sequence[str], folder: Path
) -> tuple[Path, Path]:
    """`folder`/source.spm and target.spm: unigram models of SPM_VOCAB pieces with
    sentencepiece's defaults, as OPUS-MT's are (a few hundred short sentences take < 1 s)."""
    folder.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(1)
    out = []
    for name, lines in (("source", source_lines), ("target", target_lines)):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_prefix=str(folder / name),
            vocab_size=SPM_VOCAB,
            model_type="unigram",
            character_coverage=1.0,
            hard_vocab_limit=False,
            num_threads=1,
            minloglevel=2,
        )
        path = (folder / f"{name}.model").rename(folder / f"{name}.spm")
        out.append(path)
    return out[0], out[1]


def opus_vocab(source_spm: Path, target_spm: Path, eos_last: bool = False) -> dict[str, int]:
    """vocab.json as OPUS-MT's conversion writes it: `</s>` 0, `<unk>` 1, the language tokens,
    every piece of the source and then the target model once (their control symbols aside),
    `<pad>`. With `eos_last`: `<unk>` 0, ..., `</s>` last, no `<pad>` (the importer then
    adds the pad row's piece itself)."""
    pieces: list[str] = []
    for path in (source_spm, target_spm):
        sp = spm.SentencePieceProcessor(model_file=str(path))
        pieces += [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))
        ]
    if eos_last:
        ordered = ["<unk>", *LANGUAGE_TOKENS, *pieces, "</s>"]
    else:
        ordered = ["</s>", "<unk>", *LANGUAGE_TOKENS, *pieces, "<pad>"]
    vocab: dict[str, int] = {}
    for piece in ordered:
        vocab.setdefault(piece, len(vocab))
    return vocab


def separate_vocabs(source_spm: Path, target_spm: Path) -> tuple[dict[str, int], dict[str, int]]:
    """vocab.json and target_vocab.json of a model with separate vocabularies: `</s>` 0, `<unk>`
    1, `<pad>` 2 in both, the language tokens in the source's, then each side's model's pieces."""
    vocabs = []
    for path, extra in ((source_spm, LANGUAGE_TOKENS), (target_spm, ())):
        sp = spm.SentencePieceProcessor(model_file=str(path))
        pieces = [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))
        ]
        vocabs.append(
            {p: i for i, p in enumerate(dict.fromkeys(["</s>", "<unk>", "<pad>", *extra, *pieces]))}
        )
    return vocabs[0], vocabs[1]


def write_hf_marian(folder: Path, variant: Variant, source_spm: Path, target_spm: Path) -> Path:
    """A tiny random MarianMT model of `variant` in `folder` (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    if variant.separate_vocabs:
        vocab, target_vocab = separate_vocabs(source_spm, target_spm)
        (folder / "target_vocab.json").write_text(
            json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8"
        )
    else:
        vocab = target_vocab = opus_vocab(source_spm, target_spm, variant.eos_last)
    for path in (source_spm, target_spm):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"source_lang": "en", "target_lang": "de", "separate_vocabs": variant.separate_vocabs}
        )
    )
    pad = vocab.get("<pad>", len(vocab))  # vocab.json's <pad> or one past its last id
    size, eos = max(pad + 1, len(vocab)), vocab["</s>"]
    cfg = MarianConfig(
        vocab_size=size,
        decoder_vocab_size=max(pad + 1, len(target_vocab)),
        d_model=D_MODEL,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        activation_function=variant.activation,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=pad,
        eos_token_id=eos,
        forced_eos_token_id=eos,
        decoder_start_token_id=pad,
        share_encoder_decoder_embeddings=variant.share_embeddings,
        tie_word_embeddings=variant.tie_output,
        scale_embedding=True,
    )
    torch.manual_seed(variant.seed)
    model = MarianMTModel(cfg).eval()
    perturb(model, eos)
    if variant.zero_pad_row:
        with torch.no_grad():
            for table in (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens):
                table.weight[pad] = 0.0
    model.save_pretrained(folder)
    if (
        not variant.safetensors
    ):  # transformers 5 writes safetensors only; 4.x's .bin was this pickle
        state = {
            k: v for k, v in model.state_dict().items() if k not in model._keys_to_ignore_on_save
        }
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    return folder


@torch.no_grad()
def perturb(model: MarianMTModel, eos: int) -> None:
    """Weights far from transformers' initialisation (std 0.02 everywhere, a zero pad row and a
    zero final_logits_bias): distinct log-probabilities, a pad row and bias that count; then
    `</s>`'s bias set so that it is the likeliest token at about EOS_RATE of the steps (see
    `eos_margins`): outputs of every length, most of them ending on their own."""
    for name, p in model.named_parameters():
        if "layer_norm" in name:
            p.add_(torch.randn_like(p) * 0.1)
        else:
            p.normal_(
                0.0, 0.15 if "embed" in name or "shared" in name or "lm_head" in name else 0.2
            )
    model.final_logits_bias.normal_(0.0, 1.0)
    margins = eos_margins(model, eos)
    model.final_logits_bias[0, eos] += torch.quantile(margins, EOS_RATE)


@torch.no_grad()
def eos_margins(
    model: MarianMTModel, eos: int, sentences: int = 8, steps: int = 10
) -> torch.Tensor:
    """How far `</s>`'s logit is below the best other token's, at each step of greedy decoding
    (with `</s>` never chosen) of a few random sources, the first step aside."""
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    margins = []
    for _ in range(sentences):
        src = torch.randint(
            0,
            cfg.pad_token_id if cfg.pad_token_id + 1 == cfg.vocab_size else cfg.vocab_size,
            (1, int(torch.randint(4, 16, (1,), generator=gen))),
            generator=gen,
        )
        src[0, -1] = eos
        prev = torch.tensor([[cfg.decoder_start_token_id]])
        for step in range(steps):
            logits = model(input_ids=src, decoder_input_ids=prev).logits[0, -1]
            margin, best = (
                logits.clone()
                .index_fill_(0, torch.tensor([eos, cfg.pad_token_id]), -float("inf"))
                .max(0)
            )
            if step:  # </s> as the first token is blocked (min_len 1)
                margins.append(margin - logits[eos])
            prev = torch.cat([prev, best.view(1, 1)], 1)
    return torch.stack(margins)
