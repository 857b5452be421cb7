"""What must hold on a CUDA GPU: `make test-gpu` (pytest -m gpu) runs these on one.

The default suite deselects them; without CUDA they fail rather than skip, so a green
`make test-gpu` always means they ran on a GPU.
- cached decoding equals the full forward pass (fp32, and bf16/fp16 under autocast);
- bf16 and fp16 training (autocast, fp32 master weights) learn the copy task;
- fp16 loss scaling on a real overflow: the update is skipped, not counted, the scale halves;
- resuming equals never stopping (fp32 and fp16, with the loss scaler's state);
- `nmt translate --device cuda` keeps the I/O contract and agrees with the CPU; int8 decoding
  with --device auto runs on the CPU;
- cuDNN's attention backend is off (it plans each new shape, see nmt.device.configure_device);
- an fp32 or bf16 training update never makes the host wait for the GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import TINY, nmt, records, with_overrides

from nmt import checkpoint as ckpt
from nmt.config import Config, ModelConfig, load_config
from nmt.models.transformer import Transformer
from nmt.tokenizer import NMT_SPECIALS
from nmt.training.trainer import train

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.fail(
            "the gpu tests need a CUDA device (run them with `make test-gpu` on a GPU machine)"
        )
    monkeypatch.chdir(tmp_path)  # `nmt train` writes .nmt-last-run here


def run_cfg(
    data_dir: Path, run_dir: Path, model: dict[str, Any] | None = None, **train_opts: Any
) -> Config:
    return with_overrides(
        load_config(TINY),
        data={"dir": str(data_dir)},
        model=model or {},
        train={"run_dir": str(run_dir), "log_interval": 1, "device": "cuda", **train_opts},
    )


# ------------------------------------------------------------------ model


def random_tokens(rows: int, width: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (rows, width), generator=g)


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-5), ("bf16", 0.1), ("fp16", 0.02)])
def test_cached_decoding_equals_full_forward(precision, atol):
    vocab = 97
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, ffn_dim=128, heads=4, max_positions=64
    )
    model = Transformer(cfg, vocab, pad_id=NMT_SPECIALS.pad).cuda().eval()
    src = random_tokens(3, 9, vocab, seed=1).cuda()
    src[1, 5:] = NMT_SPECIALS.pad  # a padded source row
    prev = random_tokens(3, 8, vocab, seed=2).cuda()
    prev[:, 0] = 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    amp = torch.autocast("cuda", dtype=dtype) if dtype else torch.autocast("cuda", enabled=False)
    with torch.inference_mode(), amp:
        full = torch.log_softmax(model(src, prev).float(), dim=-1)
        state = model.encode(src)
        state = model.reorder(state, torch.tensor([0, 0, 1, 1, 2, 2], device="cuda"))  # beams of 2
        rows = torch.tensor([0, 0, 1, 1, 2, 2])
        for t in range(prev.size(1)):
            log_probs, state = model.decode_step(prev[rows, t], state)
            assert log_probs.dtype == torch.float32 and log_probs.is_cuda
            torch.testing.assert_close(log_probs, full[rows, t], rtol=0, atol=atol)


# ------------------------------------------------------------------ training


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_small_model_learns_to_copy(copy_data, tmp_path, precision):
    cfg = run_cfg(
        copy_data,
        tmp_path / "run",
        model={"encoder_layers": 2, "decoder_layers": 2, "d_model": 64, "ffn_dim": 128, "heads": 4},
        precision=precision,
        max_tokens=1024,
        lr=3e-3,
        warmup_updates=100,
        max_updates=700,
        validate_interval_updates=700,
        valid_bleu=True,
        log_interval=50,
    )
    progress = train(cfg)
    assert progress.update == 700
    valid = records(tmp_path / "run", "valid")
    assert valid[-1]["valid_bleu"] > 80, valid
    state = ckpt.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert all(
        v.dtype != torch.float16 and v.dtype != torch.bfloat16 for v in state["model"].values()
    )
    if precision == "fp16":
        assert state["train_state"]["scaler"]["scale"] > 0
        assert "loss_scale" in records(tmp_path / "run", "train")[-1]


def test_fp16_overflow_skips_the_update_and_halves_the_scale(prepared, tmp_path):
    """A loss scale of 2^24 overflows fp16 activations' gradients for real (max 65504)."""
    init = 2.0**24
    cfg = run_cfg(
        prepared[0],
        tmp_path / "run",
        precision="fp16",
        fp16_init_scale=init,
        max_updates=6,
        max_tokens=1024,
        warmup_updates=100,
    )
    assert train(cfg).update == 6
    saved = ckpt.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    skipped = saved["train_state"]["progress"]["skipped_overflow"]
    assert skipped >= 1
    assert saved["train_state"]["scaler"]["scale"] == init / 2**skipped
    assert all(torch.isfinite(v).all() for v in saved["model"].values())
    train_rows = records(tmp_path / "run", "train")
    assert [r["update"] for r in train_rows] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]  # skipped updates are not counted
    assert all(r["loss"] == r["loss"] and r["loss"] < 20 for r in train_rows)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_update_never_synchronizes_with_the_host(prepared, tmp_path, precision):
    """torch.cuda.set_sync_debug_mode("error") raises on any call that makes the host wait for
    the GPU (a .item(), a boolean-mask index, a blocking copy), also inside torch's ops."""
    from nmt.training.distributed import Env
    from nmt.training.trainer import Trainer

    cfg = run_cfg(prepared[0], tmp_path / "run", precision=precision, clip_norm=1.0, update_freq=2)
    trainer = Trainer(cfg, Env(torch.device("cuda")), reset_optimizer=False, reset_data=False)
    groups = trainer.epoch_updates(1)[:4]
    trainer.train_update(groups[0])  # the first update allocates the optimizer state and handles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for group in groups[1:]:
            assert trainer.train_update(group) is not None
    finally:
        torch.cuda.set_sync_debug_mode(0)
    trainer.check_finite()
    trainer.close()


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("fp16", 1e-3)])
def test_resume_equals_uninterrupted(prepared, tmp_path, precision, tol):
    cfg = run_cfg(
        prepared[0],
        tmp_path / "a",
        precision=precision,
        max_tokens=1024,
        validate_interval_updates=4,
    )
    train(with_overrides(cfg, train={"max_updates": 9}))
    run_b = tmp_path / "b"
    train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": 4}))
    second = train(with_overrides(cfg, train={"run_dir": str(run_b), "max_updates": 9}))
    assert second.update == 9
    a = {r["update"]: r["loss"] for r in records(tmp_path / "a", "train")}
    b = {r["update"]: r["loss"] for r in records(run_b, "train")}
    assert sorted(b) == list(range(1, 10))
    assert a == pytest.approx(b, abs=tol)
    wa = ckpt.load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")
    wb = ckpt.load_checkpoint(run_b / "checkpoint_last.pt")
    for key, value in wa["model"].items():
        torch.testing.assert_close(value, wb["model"][key], rtol=0, atol=tol)
    if precision == "fp16":
        assert wa["train_state"]["scaler"] == wb["train_state"]["scaler"]
    # written from the GPU, a checkpoint holds CPU tensors: a plain torch.load works anywhere
    raw = torch.load(run_b / "checkpoint_last.pt", weights_only=True)
    tensors = [
        *raw["model"].values(),
        *(
            v
            for s in raw["train_state"]["optimizer"]["state"].values()
            for v in s.values()
            if isinstance(v, torch.Tensor)
        ),
    ]
    assert len(tensors) > len(raw["model"]) and all(t.device.type == "cpu" for t in tensors)


# ------------------------------------------------------------------ translate


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for 300 updates on the GPU: its last checkpoint."""
    run = tmp_path_factory.mktemp("trained") / "run"
    cfg = run_cfg(
        prepared[0],
        run,
        model={"d_model": 64, "ffn_dim": 128, "heads": 4},
        max_tokens=2048,
        lr=3e-3,
        max_updates=300,
        validate_interval_updates=300,
        log_interval=50,
    )
    train(cfg)
    return run / "checkpoint_last.pt"


def test_translate_on_cuda_agrees_with_the_cpu(trained, raw_corpus, tmp_path):
    lines = raw_corpus.lines("test", "en")
    lines[3] = ""  # an empty line gives an empty line
    text = "\n".join(lines) + "\n"
    outs = {}
    for device in ("cpu", "cuda"):
        r = nmt(
            "translate",
            "--checkpoint",
            str(trained),
            "--beam",
            "4",
            "--device",
            device,
            "--scores",
            stdin=text,
            cwd=tmp_path,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        outs[device] = r.stdout.split("\n")
        assert outs[device][-1] == "" and len(outs[device]) == len(lines) + 1
    assert outs["cuda"][3] == outs["cpu"][3] == ""
    pairs = [
        (c.split("\t"), g.split("\t")) for c, g in zip(outs["cpu"][:-1], outs["cuda"][:-1]) if c
    ]
    same = [(c, g) for c, g in pairs if c[1:] == g[1:]]  # "score\thypothesis"... compare hypotheses
    assert len(same) >= 0.9 * len(pairs), (len(same), len(pairs))
    for c, g in same:
        assert float(c[0]) == pytest.approx(float(g[0]), abs=1e-3)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_translate_in_half_precision_keeps_the_io_contract(
    trained, raw_corpus, tmp_path, precision
):
    lines = raw_corpus.lines("test", "en")
    r = nmt(
        "translate",
        "--checkpoint",
        str(trained),
        "--device",
        "cuda",
        "--precision",
        precision,
        "--batch-size",
        "7",
        stdin="\n".join(lines) + "\n",
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == ""
    assert sum(bool(line.strip()) for line in out[:-1]) >= 0.9 * len(lines)


def test_int8_with_device_auto_decodes_on_the_cpu(trained, raw_corpus, tmp_path):
    lines = raw_corpus.lines("test", "en")[:10]
    outs = []
    for device in ("auto", "cpu"):
        r = nmt(
            "translate",
            "--checkpoint",
            str(trained),
            "--precision",
            "int8",
            "--device",
            device,
            stdin="\n".join(lines) + "\n",
            cwd=tmp_path,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") == len(lines)
    r = nmt(
        "translate",
        "--checkpoint",
        str(trained),
        "--precision",
        "int8",
        "--device",
        "cuda",
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode != 0 and "int8 is for CPU decoding" in r.stderr.strip().splitlines()[-1]


def test_training_and_translation_on_cuda_turn_off_cudnn_attention(prepared, trained, tmp_path):
    """cuDNN's attention plans each new shape (~25 ms a call): nmt keeps flash/efficient."""
    from nmt.decoding.predict import load_models
    from nmt.training.trainer import Env, Trainer

    torch.backends.cuda.enable_cudnn_sdp(True)
    load_models([trained], torch.device("cuda"))
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    Trainer(
        run_cfg(prepared[0], tmp_path / "run"),
        Env(torch.device("cuda")),
        reset_optimizer=False,
        reset_data=False,
    ).close()
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert (
        torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    )
