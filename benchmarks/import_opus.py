"""An imported OPUS-MT-sized model: `nmt translate` against CTranslate2 on the same Hugging
Face MarianMT folder.

    python -m benchmarks import [--sentences 200] [--rounds 3] [--threads 2] [--json FILE]

The model has OPUS-MT's shape (6+6 layers, d_model 512, 8 heads, ffn 2048, swish, tied
embeddings): opus-mt-en-mg's config.json and tokenizer files where `../shared/data/opus-mt-en-mg`
is present (NMT_OPUS_MT_EN_MG overrides; 54,688 pieces), else a synthetic ~58k vocabulary of two
sentencepiece models trained on generated text. Its weights are transformers' random init
(normal, std 0.02) with two changes that make its decoding look like a model's: the gain of the
decoder's last LayerNorm is multiplied by -8 (a random decoder otherwise repeats one token for
ever, its own embedding winning through the tied output projection; the scale makes the
distributions peaked instead of near-uniform) and final_logits_bias is drawn from a normal
distribution. The pad row stays zero as in the published models (the decoder starts from it;
CTranslate2's converter starts from a zero embedding and drops that row) and its logit bias is
-1e4, so that nmt's softmax over the whole vocabulary equals CTranslate2's without the pad row.
transformers writes the folder; then
- nmt: `nmt import FOLDER -o model.pt` (the command, timed with its process start), translated
through the Python API
  that `nmt translate` reads and writes around (`Translator.load(..., threads=T)`,
  `translate(texts)`, its default workers: one per thread);
- CTranslate2: its own converter, `TransformersConverter(FOLDER).convert(...)`, run with
  `Translator(device="cpu", inter_threads=1, intra_threads=T)`, `translate_batch` on the pieces of
  the folder's source.spm plus `</s>` (its Marian models add no EOS), the output pieces turned into
  text by nmt's tokenizer, so that only the search can make them differ.
Both decode with beam `--beam` and the checkpoint's length penalty (`length` style: CTranslate2
counts the EOS, return_end_token), never produce <unk> (disable_unk), and stop each sentence at
nmt's limit int(max_len_a * (source tokens + EOS) + max_len_b) tokens (a random model rarely ends
on its own): CTranslate2 takes one limit per call (max_decoding_length), so its sentences go in
groups of equal limit. At the limit nmt forces the EOS and counts its log-probability in the
score, CTranslate2 stops without it: where the beam's best differ by that alone, so do outputs.

Sentences: the first `--sentences` of Multi30k's test_2016_flickr.en (`../shared/data/multi30k`,
NMT_MULTI30K overrides), else generated English-like ones. Each engine lives in its own process,
model loaded and warmed up once; the parent asks them in turn to translate all the sentences,
`--rounds` times each, alternating which goes first, and reports the median time (sentencepiece
encoding and decoding included for both). Prints a markdown table row and the machine; `--json`
writes the figures. Run it on an otherwise idle machine: with a busy core, a thread waiting for
a descheduled one makes both engines several times slower (see the translate suite on
OMP_WAIT_POLICY, which the children inherit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path

from benchmarks import ct2
from benchmarks.common import (
    MULTI30K,
    ROOT,
    Worker,
    child_env,
    median,
    peak_rss_mb,
    serve_requests,
    test_set_path,
    write_json,
)

OPUS_MT_EN_MG = Path(
    os.environ.get("NMT_OPUS_MT_EN_MG") or ROOT.parent / "shared/data/opus-mt-en-mg"
)
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
PAD_LOGIT_BIAS = -1e4
HEADER = (
    "| model | vocabulary | sentences | beam | max length | threads | import s | nmt sent/s | "
    "CTranslate2 sent/s | nmt / CTranslate2 | identical outputs |\n| --- | ---: | ---: | ---: | "
    "--- | --- | ---: | ---: | ---: | ---: | ---: |"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks import", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument(
        "--rounds", type=int, default=3, help="timed translations of all the sentences, per engine"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len-a", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=5)
    p.add_argument(
        "--vocab",
        type=int,
        default=58000,
        help="synthetic vocabulary size (only without opus-mt-en-mg's files)",
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="the synthetic vocabulary even where opus-mt-en-mg is",
    )
    p.add_argument(
        "--eos-bias",
        type=float,
        default=0.0,
        help="added to the EOS logit bias, so that outputs end on their own before the limit "
        "(opus-mt-en-mg, seed 26: +12 leaves most outputs at the limit, +14 ends them after ~3 "
        "words)",
    )
    p.add_argument("--seed", type=int, default=26)
    p.add_argument(
        "--workdir",
        help="keep the folder, checkpoint and CTranslate2 model here (default: a temporary "
        "directory)",
    )
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------ the model and the sentences


def synthetic_tokenizer(folder: Path, vocab: int, sentences: list[str], seed: int) -> None:
    """source.spm and target.spm of vocab/2 pieces each and the joint vocab.json (</s> 0, <unk> 1,
    the pieces, <pad> last) as MarianTokenizer reads it. The models are sentencepiece word
    models (unigram ones of this size take minutes to learn) of generated text in two made-up
    languages, the source one also of the benchmark's sentences, so that they are segmented
    into words as a real English model would mostly segment them."""
    import sentencepiece as spm

    rng = random.Random(seed)
    vowels, consonants = "aeiou", "bcdfghjklmnprstvwz"
    vocab_json = {"</s>": 0, "<unk>": 1}
    for name, letters in (("source", consonants[:9]), ("target", consonants[9:])):
        syllables = [c + v for c in letters for v in vowels] + [
            v + c for c in letters for v in vowels
        ]
        words = list({"".join(rng.choices(syllables, k=rng.randint(2, 4))) for _ in range(vocab)})
        text = [" ".join(rng.choices(words, k=12)) for _ in range(vocab * 2)]
        if name == "source":
            text += sentences * 20
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text),
            model_prefix=str(folder / name),
            vocab_size=vocab // 2,
            model_type="word",
            hard_vocab_limit=False,
            minloglevel=2,
        )
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
        (folder / f"{name}.vocab").unlink()
        sp = spm.SentencePieceProcessor(model_file=str(folder / f"{name}.spm"))
        for i in range(sp.vocab_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab_json.setdefault(sp.id_to_piece(i), len(vocab_json))
    vocab_json["<pad>"] = len(vocab_json)
    (folder / "vocab.json").write_text(json.dumps(vocab_json, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "xx"})
    )


def write_model(
    folder: Path, synthetic: bool, vocab: int, sentences: list[str], seed: int, eos_bias: float
) -> str:
    """The Hugging Face MarianMT folder (see the module docstring); returns what it is."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    folder.mkdir(parents=True, exist_ok=True)
    if synthetic:
        synthetic_tokenizer(folder, vocab, sentences, seed)
        size = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
        config = MarianConfig(
            vocab_size=size,
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
            activation_function="swish",
            pad_token_id=size - 1,
            eos_token_id=0,
            decoder_start_token_id=size - 1,
            max_position_embeddings=512,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
        )
        what = f"random, OPUS-MT shape, synthetic {size}-piece vocabulary"
    else:
        for name in TOKENIZER_FILES:
            shutil.copy(OPUS_MT_EN_MG / name, folder / name)
        config = MarianConfig.from_pretrained(OPUS_MT_EN_MG)
        what = "random, opus-mt-en-mg's config and tokenizer"
    torch.manual_seed(seed)
    model = MarianMTModel(
        config
    )  # transformers' init: normal(0, 0.02), LayerNorms 1 and 0, a zero pad row
    pad = config.pad_token_id
    with torch.no_grad():
        model.final_logits_bias.normal_()
        model.final_logits_bias[0, pad] = PAD_LOGIT_BIAS
        model.final_logits_bias[0, config.eos_token_id] += eos_bias
        model.model.decoder.layers[-1].final_layer_norm.weight.mul_(-8.0)
    model.save_pretrained(folder)
    return what


def english(n: int, seed: int) -> tuple[list[str], str]:
    """The first n sentences of Multi30k's test_2016_flickr.en, else generated ones."""
    from nmt.textio import read_lines

    if any(MULTI30K.glob("test_2016_flickr.en*")):
        lines = list(islice(read_lines(test_set_path(MULTI30K, "test_2016_flickr", "en")), n))
        if len(lines) == n:
            return lines, "Multi30k test_2016_flickr.en"
    rng = random.Random(seed)
    words = (
        "a man woman dog child two people in on the with is are of street blue red shirt playing "
        "running standing sitting water grass ball near front group young old small large white "
        "black green walks looks at holding while wearing car bike beach snow city market "
        "building table bench"
    ).split()
    lines = [
        " ".join(rng.choices(words, k=rng.randint(5, 20))).capitalize() + "." for _ in range(n)
    ]
    return lines, "generated English-like sentences"


# ------------------------------------------------------------------ the engine processes


def nmt_engine(spec: dict) -> Callable[[list[str]], list[str]]:
    from nmt import Translator

    translator = Translator.load(
        spec["checkpoint"],
        device="cpu",
        threads=spec["threads"],
        beam=spec["beam"],
        max_len_a=spec["max_len_a"],
        max_len_b=spec["max_len_b"],
    )
    return translator.translate


def ct2_engine(spec: dict) -> Callable[[list[str]], list[str]]:
    import ctranslate2
    import sentencepiece as spm

    from nmt.checkpoint import load_model_checkpoint

    loaded = load_model_checkpoint(
        spec["checkpoint"], mmap=True
    )  # nmt's tokenizer, its decode settings
    tok = loaded.tokenizer
    decode = loaded.config.decode
    lenpen = ct2.lenpen(decode)
    ids = {piece: i for i, piece in enumerate(tok.pieces)}  # type: ignore[attr-defined]
    max_out = loaded.config.model.max_positions - 1
    sp = spm.SentencePieceProcessor(model_file=spec["source_spm"])
    translator = ctranslate2.Translator(
        spec["model_dir"], device="cpu", inter_threads=1, intra_threads=spec["threads"]
    )

    def translate(texts: list[str]) -> list[str]:
        pieces = [p + ["</s>"] for p in sp.encode(texts, out_type=str)]
        groups: dict[
            int, list[int]
        ] = {}  # nmt's limit (tokens before EOS) -> the sentences with it
        for i, p in enumerate(pieces):
            if texts[i].strip():
                limit = min(int(spec["max_len_a"] * len(p) + spec["max_len_b"]), max_out)
                groups.setdefault(limit, []).append(i)
        out = [""] * len(texts)
        for limit, group in sorted(groups.items()):
            results = translator.translate_batch(
                [pieces[i] for i in group],
                beam_size=spec["beam"],
                length_penalty=lenpen,
                return_end_token=True,
                disable_unk=True,
                max_decoding_length=limit,
                max_batch_size=decode.batch_size,
            )
            for i, r in zip(group, results, strict=True):
                out[i] = tok.decode([ids.get(p, tok.specials.unk) for p in r.hypotheses[0]])
        return out

    return translate


def child(spec: dict) -> None:
    """An engine's child: load, warm up, then for each request translate the sentences once,
    timed; write them to spec["output"] and answer with the seconds."""
    from nmt.api import clean_output

    if spec["engine"] == "nmt":
        translate = nmt_engine(spec)
    else:
        translate = ct2_engine(spec)
    texts = json.loads(Path(spec["input"]).read_text(encoding="utf-8"))
    translate(texts[:8])

    def answer() -> dict:
        start = time.perf_counter()
        out = translate(texts)
        seconds = time.perf_counter() - start
        cleaned = [clean_output(t) for t in out]
        Path(spec["output"]).write_text(json.dumps(cleaned, ensure_ascii=False), encoding="utf-8")
        return {"seconds": seconds, "peak_rss_mb": peak_rss_mb()}

    serve_requests(answer)


# ------------------------------------------------------------------ the benchmark


def machine() -> dict:
    import ctranslate2
    import torch
    import transformers

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ctranslate2": ctranslate2.__version__,
        "transformers": transformers.__version__,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return {}
    synthetic = args.synthetic or not all(
        (OPUS_MT_EN_MG / f).is_file() for f in ("config.json", *TOKENIZER_FILES)
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        folder, ckpt, ct2_dir = work / "hf", work / "model.pt", work / "ct2"
        texts, origin = english(args.sentences, args.seed)
        what = write_model(folder, synthetic, args.vocab, texts, args.seed, args.eos_bias)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "nmt", "import", str(folder), "-o", str(ckpt)],
            cwd=ROOT,
            check=True,
            env=child_env(),
        )
        import_s = time.perf_counter() - start
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(folder)).convert(str(ct2_dir), force=True)
        (work / "input.json").write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        base = {
            "checkpoint": str(ckpt),
            "input": str(work / "input.json"),
            "threads": args.threads,
            "beam": args.beam,
            "max_len_a": args.max_len_a,
            "max_len_b": args.max_len_b,
        }
        env = child_env(args.threads)
        nmt_spec = {**base, "engine": "nmt", "output": str(work / "nmt.json")}
        ct2_spec = {
            **base,
            "engine": "ct2",
            "output": str(work / "ct2.json"),
            "model_dir": str(ct2_dir),
            "source_spm": str(folder / "source.spm"),
        }
        workers = {"nmt": Worker("import", nmt_spec, env), "ct2": Worker("import", ct2_spec, env)}
        seconds: dict[str, list[float]] = {"nmt": [], "ct2": []}
        rss: dict[str, float] = {}
        for r in range(args.rounds):
            for engine in ("nmt", "ct2") if r % 2 == 0 else ("ct2", "nmt"):
                answer = workers[engine].run()
                seconds[engine].append(answer["seconds"])
                rss[engine] = answer["peak_rss_mb"]
        for w in workers.values():
            w.close()
        outputs = {
            e: json.loads(Path(spec["output"]).read_text(encoding="utf-8"))
            for e, spec in (("nmt", nmt_spec), ("ct2", ct2_spec))
        }
        vocab = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))

    medians = {e: median(s) for e, s in seconds.items()}
    same = sum(a == b for a, b in zip(outputs["nmt"], outputs["ct2"], strict=True))
    words = {e: sum(len(t.split()) for t in out) / max(1, len(out)) for e, out in outputs.items()}
    result = {
        "model": what,
        "vocabulary": vocab,
        "sentences": len(texts),
        "sentences_from": origin,
        "beam": args.beam,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "eos_bias": args.eos_bias,
        "threads": args.threads,
        "rounds": args.rounds,
        "nmt_layout": f"Translator API, threads={args.threads}, default workers",
        "ct2_layout": f"inter_threads=1, intra_threads={args.threads}",
        "import_s": import_s,
        "seconds": seconds,
        "median_s": medians,
        "sent_per_s": {e: len(texts) / s for e, s in medians.items()},
        "peak_rss_mb": rss,
        "identical": same,
        "mean_output_words": words,
        "machine": machine(),
    }
    print_result(result)
    write_json(args.json, result)
    return result


def print_result(r: dict) -> None:
    m, sps = r["machine"], r["sent_per_s"]
    eos = f", EOS bias +{r['eos_bias']:g}" if r["eos_bias"] else ""
    print(
        f"\n{r['model']}{eos}; {r['sentences']} {r['sentences_from']}; median of {r['rounds']} "
        f"alternating rounds; nmt: {r['nmt_layout']}; CTranslate2: {r['ct2_layout']}\n"
    )
    print(HEADER)
    print(
        f"| OPUS-MT 6+6 d512 | {r['vocabulary']} | {r['sentences']} | {r['beam']} | "
        f"{r['max_len_a']:g}·src+{r['max_len_b']} | {r['threads']} | {r['import_s']:.1f} | "
        f"{sps['nmt']:.1f} | {sps['ct2']:.1f} | {sps['nmt'] / sps['ct2']:.2f} | {r['identical']} / "
        f"{r['sentences']} |"
    )
    print(
        f"\nmachine: {m['cpu']} ({m['cpus']} CPUs), Python {m['python']}, torch {m['torch']}, "
        f"ctranslate2 {m['ctranslate2']}, transformers {m['transformers']}; peak RSS MB nmt "
        f"{r['peak_rss_mb']['nmt']:.0f}, CTranslate2 {r['peak_rss_mb']['ct2']:.0f}; mean output "
        f"words nmt {r['mean_output_words']['nmt']:.1f}, CTranslate2 "
        f"{r['mean_output_words']['ct2']:.1f}"
    )
