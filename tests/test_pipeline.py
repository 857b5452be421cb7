"""Integration through the real CLI: prepare-bpe -> train -> average -> translate -> score.

A few hundred lines of real data and a tiny model: this checks that the stages fit
together the way the README shows them, not translation quality (see test_recipes.py).
"""

import json
from functools import partial

import sacrebleu
import torch
from helpers import ROOT, nmt

# every command must succeed (an assertion shows the end of its stderr if not)
nmt_ok = partial(nmt, env={"PYTHONUNBUFFERED": "1"}, timeout=300, check=True)


def test_prepare_train_average_translate_score(raw_corpus, tmp_path):
    p = raw_corpus.prefix
    nmt_ok(
        "prepare-bpe",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        p("train"),
        "--validpref",
        p("val"),
        "--testpref",
        p("test"),
        "--vocab-size",
        "500",
        "--destdir",
        "bin",
        cwd=tmp_path,
    )
    meta = json.loads((tmp_path / "bin/prepare.json").read_text())
    assert meta["splits"]["test"]["kept"] == len(raw_corpus.lines("test", "en"))

    r = nmt_ok(
        "train",
        str(ROOT / "configs/tiny.yaml"),
        "--set",
        "data.dir=bin",
        "--set",
        "train.max_updates=8",
        "--set",
        "train.save_interval_updates=2",
        "--set",
        "train.keep_last=3",
        "--set",
        "train.valid_bleu=true",
        "--set",
        "train.validate_interval_updates=4",
        "--set",
        "train.log_interval=1",
        "--run-dir",
        "run",
        cwd=tmp_path,
    )
    run = tmp_path / "run"
    names = sorted(x.name for x in run.glob("checkpoint_*.pt"))
    assert names == [
        "checkpoint_4.pt",
        "checkpoint_6.pt",
        "checkpoint_8.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
    ]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if r["type"] == "train"] == list(range(1, 9))
    assert {"valid_loss", "valid_ppl", "valid_bleu"} <= set(
        next(r for r in records if r["type"] == "valid")
    )
    assert (
        (run / "config.yaml").exists()
        and (run / "spm.model").exists()
        and (run / "train.log").exists()
    )

    # started again, a finished run says so and changes nothing
    before = {x.name: x.stat().st_mtime_ns for x in run.glob("checkpoint_*.pt")}
    r = nmt_ok(
        "train",
        str(ROOT / "configs/tiny.yaml"),
        "--set",
        "data.dir=bin",
        "--set",
        "train.max_updates=8",
        "--run-dir",
        "run",
        cwd=tmp_path,
    )
    assert "already finished" in r.stderr
    assert before == {x.name: x.stat().st_mtime_ns for x in run.glob("checkpoint_*.pt")}

    nmt_ok("average-checkpoints", "run", "--last", "3", "-o", "run/checkpoint_avg.pt", cwd=tmp_path)
    avg = torch.load(run / "checkpoint_avg.pt", weights_only=True)
    parts = [torch.load(run / f"checkpoint_{u}.pt", weights_only=True)["model"] for u in (4, 6, 8)]
    key = next(k for k, v in avg["model"].items() if v.is_floating_point())
    assert torch.allclose(avg["model"][key], sum(m[key] for m in parts) / 3, atol=1e-6)
    assert "train_state" not in avg

    src = "\n".join(raw_corpus.lines("test", "en")[:20]) + "\n"
    out = nmt_ok(
        "translate", "--beam", "3", "--max-len-b", "5", cwd=tmp_path, stdin=src
    )  # uses the last run
    assert "checkpoint_avg.pt" in out.stderr
    hyps = out.stdout.split("\n")
    assert len(hyps) == 21 and hyps[-1] == ""
    (tmp_path / "hyp.de").write_text(out.stdout, encoding="utf-8")
    refs = raw_corpus.lines("test", "de")[:20]
    (tmp_path / "ref.de").write_text("\n".join(refs) + "\n", encoding="utf-8")
    scored = json.loads(
        nmt_ok("score", "--ref", "ref.de", "--hyp", "hyp.de", "--json", cwd=tmp_path).stdout
    )
    bleu = next(s for s in scored if s["name"] == "bleu")
    assert abs(bleu["score"] - sacrebleu.corpus_bleu(hyps[:-1], [refs]).score) < 1e-9
