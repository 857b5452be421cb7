"""Properties of nmt.models.transformer.Transformer and nmt.models.rnn.RNN: causality, padding
invariance, cached == full decoding (both architectures, every variant); for the Transformer also
parameter counts against the closed form, weight tying, dropout, bf16 autocast."""

import math
from pathlib import Path

import pytest
import torch

from nmt.config import ModelConfig, load_config
from nmt.models.layers import Dropout, sinusoids
from nmt.models.transformer import Transformer, build_model, num_parameters, summary

ROOT = Path(__file__).resolve().parents[1]
V = 41  # tiny vocabulary; ids 0..3 are pad, unk, bos, eos
PAD, BOS = 0, 2

VARIANTS = {
    "post-norm": {},
    "pre-norm": {"norm_first": True},
    "learned-positions": {"learned_positions": True},
    "separate-embeddings": {"share_embeddings": False, "norm_first": True},
    # the options an OPUS-MT / Marian Transformer needs (issue 26)
    "marian-like": {
        "activation": "swish",
        "output_bias": True,
        "tie_output": False,
        "positions": "marian",
        "decoder_start": "zeros",
        "norm_eps": 1e-6,
    },
    "hf-marian-like": {
        "activation": "gelu",
        "output_bias": True,
        "positions": "hf_marian",
        "decoder_start": "zeros",
        "share_embeddings": False,
    },
    "gelu-variants-pre-norm": {
        "activation": "gelu_sigmoid",
        "norm_first": True,
        "tie_output": False,
    },
    "gelu-tanh": {"activation": "gelu_tanh", "output_bias": True},
    # the RNN encoder-decoder (nmt.models.rnn) behind the same protocol
    "rnn-gru": {"arch": "rnn"},
    "rnn-lstm": {"arch": "rnn", "cell": "lstm", "share_embeddings": False},
    "rnn-no-attention": {"arch": "rnn", "attention": "none"},
    "rnn-2-layers": {"arch": "rnn", "rnn_layers": 2},
}
RNNS = [name for name in VARIANTS if name.startswith("rnn")]


def make(seed: int = 0, **overrides) -> Transformer:
    cfg = dict(
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        ffn_dim=64,
        heads=4,
        max_positions=64,
        dropout=0.1,
        rnn_hidden=24,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    return build_model(ModelConfig(**cfg), V, pad_id=PAD).eval()  # type: ignore[return-value]


def tokens(*lengths: int, width: int | None = None, bos: bool = False, seed: int = 1):
    """(len(lengths), width) random real tokens, right-padded with PAD; BOS first if `bos`."""
    g = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    out = torch.full((len(lengths), width), PAD)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, V, (n,), generator=g)
        if bos:
            out[i, 0] = BOS
    return out


@pytest.mark.parametrize(
    "variant", ["post-norm", "pre-norm", "marian-like", "hf-marian-like", *RNNS]
)
def test_future_target_tokens_do_not_change_earlier_logits(variant):
    model = make(**VARIANTS[variant])
    src, prev = tokens(6, 4), tokens(7, 7, bos=True)
    changed = prev.clone()
    changed[:, 4:] = tokens(3, 3, seed=2)
    a, b = model(src, prev), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize(
    "variant", ["post-norm", "pre-norm", "marian-like", "hf-marian-like", *RNNS]
)
def test_padding_does_not_change_logits(variant):
    model = make(**VARIANTS[variant])
    src, prev = tokens(5, 9, seed=3), tokens(4, 8, bos=True, seed=4)  # row 0 padded on both sides
    batched = model(src, prev)
    alone = model(src[:1, :5], prev[:1, :4])
    torch.testing.assert_close(batched[:1, :4], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoding_equals_full_forward_through_reorders(variant):
    model = make(**VARIANTS[variant])
    src = tokens(6, 3, 8, seed=5)  # padded source rows
    prev = tokens(7, 7, 7, bos=True, seed=6)
    full = torch.log_softmax(model(src, prev).float(), dim=-1)  # (3, 7, V)

    # reorders applied before steps 0..6, each with the group size it must leave:
    # expand to beams (grouped), swap beams within sentences (grouped), prune sentence 1
    # (grouped, fewer sources) then swap again, permute + duplicate rows across sentences
    # (one source per row)
    rows = torch.arange(3)  # the sentence each decoder row belongs to
    plan = {
        0: [(torch.arange(3).repeat_interleave(2), 2)],
        2: [(torch.tensor([1, 0, 3, 2, 4, 5]), 2)],
        3: [(torch.tensor([0, 1, 4, 5]), 2), (torch.tensor([1, 0, 2, 3]), 2)],
        5: [(torch.tensor([3, 0, 0, 2, 1]), 1)],
    }
    with torch.inference_mode():
        state = model.encode(src)
        for t in range(prev.size(1)):
            for index, group in plan.get(t, []):
                state = model.reorder(state, index)
                rows = rows[index]
                assert state.group == group
            log_probs, state = model.decode_step(prev[rows, t], state)
            assert log_probs.dtype == torch.float32 and log_probs.shape == (len(rows), V)
            torch.testing.assert_close(log_probs, full[rows, t], rtol=0, atol=1e-5)
    assert getattr(state, "step", prev.size(1)) == prev.size(1)


TRANSFORMERS = [name for name in VARIANTS if name not in RNNS]


@pytest.mark.parametrize("variant", TRANSFORMERS)
def test_sentences_merged_into_a_running_decode_equal_the_full_forward(variant):
    """Continuous batching (nmt serve): sentences join a state decoded for some steps, each at its
    own position, with a longer or shorter source; every row keeps its full-forward log-probs
    through later reorders and a second join."""
    model = make(**VARIANTS[variant])
    src = tokens(6, 3, 9, 2, seed=7)  # sentences 0-1 start, 2 joins at step 2, 3 at step 4
    prev = tokens(*[8] * 4, bos=True, seed=8)
    full = torch.log_softmax(model(src, prev).float(), dim=-1)  # (4, 8, V)
    starts = [0, 0, 2, 4]
    with torch.inference_mode():
        state, rows = (
            model.encode(src[:2, :6]),
            torch.tensor([0, 1]),
        )  # rows: the sentence of each row
        state = model.reorder(state, torch.tensor([0, 0, 1, 1]))  # two rows a sentence
        rows = rows[torch.tensor([0, 0, 1, 1])]
        for t in range(6):
            if t in (2, 4):
                s = starts.index(t)
                joining = model.reorder(
                    model.encode(src[s : s + 1, : 9 if s == 2 else 2]), torch.tensor([0, 0])
                )
                state, rows = model.merge(state, joining), torch.cat([rows, torch.tensor([s, s])])
            if t == 3:  # a swap within each sentence and one pruned: still two rows a sentence
                index = torch.tensor([1, 0, 4, 5])
                state, rows = model.reorder(state, index), rows[index]
            position = torch.tensor([t - starts[r] for r in rows.tolist()])
            log_probs, state = model.decode_step(prev[rows, position], state)
            torch.testing.assert_close(log_probs, full[rows, position], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="merge"):
        model.merge(model.encode(src[:1]), state)  # a state already decoded cannot join


@pytest.mark.parametrize("variant", ["post-norm", "rnn-gru", "rnn-lstm"])
def test_attention_weights_are_distributions_over_the_real_source(variant):
    model = make(**VARIANTS[variant])
    src, prev = tokens(6, 3, seed=7), tokens(5, 5, bos=True, seed=8)  # row 1: 3 real source tokens
    with torch.inference_mode():
        weights = model.attention_weights(src, prev)  # (B, L, H, T, S)
    layers = 1 if variant.startswith("rnn") else 2
    heads = 1 if variant.startswith("rnn") else 4
    assert weights.shape == (2, layers, heads, 5, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, layers, heads, 5), rtol=0, atol=1e-5)
    assert (weights[1, ..., 3:] == 0).all()  # no attention on padding
    # what the search saw: the same weights for a sentence alone
    with torch.inference_mode():
        alone = model.attention_weights(src[1:, :3], prev[1:])
    torch.testing.assert_close(weights[1:, ..., :3], alone, rtol=0, atol=1e-5)


def test_rnn_without_attention_has_no_attention_weights():
    model = make(**VARIANTS["rnn-no-attention"])
    assert model.attention_weights(tokens(4), tokens(3, bos=True)) is None
    assert not any("attn" in name for name, _ in model.named_parameters())


def closed_form(cfg: ModelConfig, vocab: int) -> int:
    """Parameters of the tied-embedding Transformer from its dimensions."""
    D, F = cfg.d_model, cfg.ffn_dim
    attention = 4 * (D * D + D)  # q, k, v, out projections with biases
    ffn = D * F + F + F * D + D
    encoder_layer = attention + ffn + 2 * 2 * D  # two LayerNorms
    decoder_layer = 2 * attention + ffn + 3 * 2 * D
    final_norms = 2 * 2 * D if cfg.norm_first else 0
    embeddings = vocab * D * (1 + (not cfg.share_embeddings) + (not cfg.tie_output))
    output_bias = vocab if cfg.output_bias else 0
    return (
        embeddings
        + cfg.encoder_layers * encoder_layer
        + cfg.decoder_layers * decoder_layer
        + final_norms
        + output_bias
    )


@pytest.mark.parametrize("name, low, high", [("base", 60e6, 66e6), ("big", 205e6, 215e6)])
def test_parameter_count_matches_paper(name, low, high):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml").model
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = Transformer(cfg, 37000, pad_id=PAD)
    n = num_parameters(model)
    assert n == closed_form(cfg, 37000)
    assert low <= n <= high  # Vaswani et al. 2017, Table 3: 65M (base), 213M (big)


def test_share_embeddings_ties_one_matrix():
    shared = make(share_embeddings=True)
    assert shared.src_embed.tokens.weight is shared.tgt_embed.tokens.weight
    assert num_parameters(shared) == closed_form(shared.cfg, V)
    separate = make(share_embeddings=False)
    assert separate.src_embed.tokens.weight is not separate.tgt_embed.tokens.weight
    assert num_parameters(separate) == closed_form(separate.cfg, V)
    # the output projection is the decoder input embedding in both cases
    for model in (shared, separate):
        x = torch.randn(2, 32)
        torch.testing.assert_close(model.output(x), x @ model.tgt_embed.tokens.weight.T)


def test_initialisation():
    model = make()
    assert model.tgt_embed.tokens.weight[PAD].abs().sum() == 0
    assert all(m.bias.abs().sum() == 0 for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_dropout_only_in_training():
    model = make(dropout=0.3, attention_dropout=0.2, activation_dropout=0.2)
    src, prev = tokens(5, 4), tokens(5, 3, bos=True)
    torch.testing.assert_close(model(src, prev), model(src, prev), rtol=0, atol=0)
    model.train()
    assert not torch.allclose(model(src, prev), model(src, prev))


def test_set_dropout_changes_sublayer_and_embedding_dropout_only():
    model = make(dropout=0.1, attention_dropout=0.05, activation_dropout=0.02)
    model.set_dropout(0.25)
    rates = {name: m.p for name, m in model.named_modules() if isinstance(m, Dropout)}
    ffn = {name: p for name, p in rates.items() if ".ffn." in name}
    other = {name: p for name, p in rates.items() if ".ffn." not in name}
    assert len(ffn) == 4 and set(ffn.values()) == {0.02}
    assert (
        "src_embed.dropout" in other
        and "decoder.1.dropout" in other
        and set(other.values()) == {0.25}
    )
    assert {m.dropout for m in model.modules() if hasattr(m, "heads")} == {0.05}  # attention
    # with the other rates 0, set_dropout(0) makes training mode deterministic
    model = make(dropout=0.3)
    src, prev = tokens(5, 4), tokens(5, 3, bos=True)
    expected = model(src, prev)
    model.train()
    assert not torch.allclose(model(src, prev), expected)
    model.set_dropout(0.0)
    torch.testing.assert_close(model(src, prev), expected, rtol=0, atol=0)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_dropout_rate_scale_gradient_and_seed(p):
    x = torch.ones(400_000, requires_grad=True)
    drop = Dropout(p).train()
    torch.manual_seed(5)
    y = drop(x)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - p) < 4 * (p * (1 - p) / x.numel()) ** 0.5  # 4 sigma
    scale = y[kept].unique()
    assert scale.numel() == 1 and scale.item() == pytest.approx(1 / (1 - p), rel=1e-4)
    assert abs(y.mean().item() - 1) < 0.01  # the expectation is kept
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d y / d x: the same mask and scale
    torch.manual_seed(5)
    assert torch.equal(drop(x), y)  # the default generator's state decides the mask
    assert not torch.equal(drop(x), y)
    assert torch.equal(drop.eval()(x), x)


def test_cpu_dropout_edges_and_odd_sizes():
    x = torch.randn(3, 5, 7)  # 105 elements: not a multiple of 4
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    y = Dropout(0.5).train()(x.bfloat16())
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)


def test_bf16_autocast_is_close_to_fp32():
    model = make(norm_first=True)
    src, prev = tokens(6, 4), tokens(5, 3, bos=True)
    fp32 = model(src, prev)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        bf16 = model(src, prev)
        state = model.encode(src)
        log_probs, state = model.decode_step(prev[:, 0], model.reorder(state, torch.tensor([1, 0])))
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), fp32, rtol=0.05, atol=0.1)
    assert log_probs.dtype == torch.float32
    expected = torch.log_softmax(fp32[[1, 0], 0], -1)
    torch.testing.assert_close(log_probs, expected, rtol=0.05, atol=0.1)
    model.train()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = model(src, prev).float().logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_decode_step_uses_up_the_state_it_is_given():
    """decode_step frees the old cache layer by layer: a second step from the same state is an
    error, never a silent wrong answer."""
    model = make()
    with torch.inference_mode():
        state = model.encode(tokens(5, 2))
        _, state = model.decode_step(torch.tensor([BOS, BOS]), state)
        _, later = model.decode_step(torch.tensor([BOS, BOS]), state)
        with pytest.raises(ValueError, match="already passed to decode_step"):
            model.decode_step(torch.tensor([BOS, BOS]), state)
        _, later = model.decode_step(torch.tensor([BOS, BOS]), later)
    assert later.step == 3


def test_longer_than_max_positions_is_a_clear_error():
    model = make(max_positions=8)
    with pytest.raises(ValueError, match="max_positions=8"):
        model(tokens(9), tokens(3, bos=True))
    state = model.encode(tokens(8))
    for _ in range(8):
        _, state = model.decode_step(torch.tensor([BOS]), state)
    with pytest.raises(ValueError, match="max_positions"):
        model.decode_step(torch.tensor([BOS]), state)


def test_summary_ends_with_parameter_count():
    model = make()
    assert summary(model).splitlines()[-1] == f"parameters: {num_parameters(model)}"


# ------------------------------------------------------------------ the options of issue 26


@pytest.mark.parametrize("share, tie", [(True, True), (True, False), (False, True), (False, False)])
def test_source_target_and_output_tying_are_independent(share, tie):
    model = make(share_embeddings=share, tie_output=tie, output_bias=True)
    src, tgt, out = (
        model.src_embed.tokens.weight,
        model.tgt_embed.tokens.weight,
        model.output_weight,
    )
    assert (src is tgt) == share and (out is tgt) == tie and (out is src) == (share and tie)
    assert num_parameters(model) == closed_form(model.cfg, V)
    with torch.no_grad():
        model.output_bias.copy_(torch.randn(V))
    x = torch.randn(2, 32)
    torch.testing.assert_close(model.output(x), x @ out.T + model.output_bias)
    # a shortlist's columns get the same weight rows and bias entries
    vocab = torch.tensor([0, 5, 9, 17])
    torch.testing.assert_close(model.projection(vocab)(x), model.output(x)[:, vocab])


def hf_marian_table(n_pos: int, dim: int) -> torch.Tensor:
    """transformers' MarianSinusoidalPositionalEmbedding._init_weight, transcribed."""
    import numpy as np

    enc = np.array(
        [[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(n_pos)]
    )
    out = torch.empty(n_pos, dim)
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out[:, :sentinel] = torch.FloatTensor(np.sin(enc[:, 0::2]))
    out[:, sentinel:] = torch.FloatTensor(np.cos(enc[:, 1::2]))
    return out


def marian_table(n_pos: int, dim: int) -> torch.Tensor:
    """Marian's SinusoidalPositionEmbeddings (src/tensors/cpu/tensor_operators.cpp), transcribed."""
    half = dim / 2
    step = math.log(10000.0) / (half - 1.0)
    return torch.tensor(
        [
            [
                math.sin(v) if i < int(half) else math.cos(v)
                for i in range(dim)
                for v in [p * math.exp((i % int(half)) * -step)]
            ]
            for p in range(n_pos)
        ]
    )


@pytest.mark.parametrize("dim", [32, 36, 7])
def test_position_tables_equal_their_references(dim):
    ours = {layout: sinusoids(50, dim, layout) for layout in ("nmt", "marian", "hf_marian")}
    torch.testing.assert_close(ours["hf_marian"], hf_marian_table(50, dim), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours["marian"], marian_table(50, dim), rtol=0, atol=2e-5)
    if dim % 2 == 0:  # Marian's own table is nmt's; Hugging Face's is not
        torch.testing.assert_close(ours["marian"], ours["nmt"], rtol=0, atol=0)
        assert not torch.allclose(ours["hf_marian"], ours["nmt"], atol=1e-2)
    model = make(positions="hf_marian")
    torch.testing.assert_close(
        model.tgt_embed.sinusoids, sinusoids(64, 32, "hf_marian"), rtol=0, atol=0
    )


def test_a_zero_decoder_start_ignores_the_start_token():
    src, prev = tokens(6, 4), tokens(5, 5, bos=True)
    other = prev.clone()
    other[:, 0] = torch.tensor([7, 11])  # any token in position 0
    zeros = make(decoder_start="zeros")
    torch.testing.assert_close(zeros(src, prev), zeros(src, other), rtol=0, atol=0)
    # only position 0's token embedding is dropped: its position, and later tokens, still count
    x = zeros.tgt_embed(prev)
    torch.testing.assert_close(x[:, 0], zeros.tgt_embed.sinusoids[0].expand(2, -1))
    torch.testing.assert_close(x[:, 1:], make(decoder_start="bos").tgt_embed(prev)[:, 1:])
    bos = make(decoder_start="bos")
    assert not torch.allclose(bos(src, prev), bos(src, other))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("relu", lambda x: x.clamp(min=0)),
        ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
        (
            "gelu_tanh",
            lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        ),
        ("gelu_sigmoid", lambda x: x / (1 + torch.exp(-1.702 * x))),
        ("swish", lambda x: x / (1 + torch.exp(-x))),
    ],
)
def test_feed_forward_activations(name, expected):
    ffn = make(activation=name).encoder[0].ffn
    x = torch.linspace(-5, 5, 101)
    torch.testing.assert_close(ffn.activation(x), expected(x), rtol=1e-5, atol=1e-6)


def test_norm_eps_reaches_every_layer_norm():
    model = make(norm_eps=1e-6, norm_first=True)
    eps = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert eps == {1e-6}
    assert {m.eps for m in make().modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-5}


@pytest.mark.parametrize("variant", ["marian-like", "hf-marian-like"])
def test_a_few_updates_lower_the_loss(variant):
    """Every new parameter (the untied output matrix, the output bias) trains through the
    chunked loss of nmt.training.loss."""
    from nmt.training.loss import TranslationLoss

    model = make(**{**VARIANTS[variant], "dropout": 0.0}).train()
    loss_fn = TranslationLoss(model, epsilon=0.1)
    src, prev = tokens(6, 5, 7, seed=7), tokens(5, 6, 4, bos=True, seed=8)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), PAD)], 1)
    index = (target != PAD).flatten().nonzero().squeeze(1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _ = loss_fn(src, prev, index, target.flatten()[index])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {"output_bias", *(["output_embedding"] if not model.cfg.tie_output else [])} <= changed


RNN_REFUSES = [
    ("output_bias", True),
    ("tie_output", False),
    ("activation", "gelu"),
    ("positions", "marian"),
    ("decoder_start", "zeros"),
    ("norm_eps", 1e-6),
]


@pytest.mark.parametrize(
    "model, message",
    [
        *[
            pytest.param(
                {"arch": "rnn", key: value},
                f"model.{key} applies to model.arch transformer only",
                id=f"rnn-{key}-{value}",
            )
            for key, value in RNN_REFUSES
        ],
        pytest.param(
            {"learned_positions": True, "positions": "hf_marian"},
            "model.positions hf_marian is a sinusoid table",
            id="hf-positions-learned",
        ),
    ],
)
def test_model_options_that_do_not_go_together_are_refused(model, message):
    """Transformer-only options on the RNN; learned Hugging Face positions (a fixed table)."""
    from nmt.config import Config, ConfigError, validate

    with pytest.raises(ConfigError, match=message):
        validate(Config(model=ModelConfig(**model)))


def test_a_checkpointed_marian_like_model_rebuilds_the_same(tmp_path):
    """The new options' state (untied output matrix, output bias) is in the state dict; the
    tables and the zero start are rebuilt from the config."""
    from nmt.config import Config, config_from_dict, config_to_dict

    model = make(**VARIANTS["marian-like"])
    with torch.no_grad():
        model.output_bias.normal_()
    assert {"output_embedding", "output_bias"} <= set(model.state_dict())
    torch.save(
        {"model": model.state_dict(), "config": config_to_dict(Config(model=model.cfg))},
        tmp_path / "m.pt",
    )
    saved = torch.load(tmp_path / "m.pt", weights_only=True)
    again = build_model(config_from_dict(saved["config"]).model, V, pad_id=PAD).eval()
    again.load_state_dict(saved["model"])
    src, prev = tokens(6, 4), tokens(5, 5, bos=True)
    torch.testing.assert_close(again(src, prev), model(src, prev), rtol=0, atol=0)
