"""The `nmt` command line: parses options, sets up logging, calls one library function.

This is the only module that imports typer. Library code raises `NmtError` for user
mistakes; `main()` prints it as one line (`nmt: error: ...`) and exits 1. Usage errors
(unknown option, bad value) are one line and exit 2. `--debug` shows tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nmt import __version__
from nmt.errors import NmtError

app = typer.Typer(
    name="nmt",
    help="Neural machine translation: prepare data, train a Transformer, average, translate, score.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_DEBUG = False


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    global _DEBUG
    _DEBUG = debug
    setup_logging(logging.DEBUG if (verbose or debug) else logging.INFO)


def setup_logging(level: int) -> None:
    rank = os.environ.get("RANK", "0")
    fmt = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
    if rank != "0":
        fmt = f"[rank {rank}] " + fmt
        level = max(level, logging.WARNING)
    logging.basicConfig(level=level, format=fmt, datefmt="%H:%M:%S", stream=sys.stderr, force=True)


# ------------------------------------------------------------------ prepare-bpe


@app.command("prepare-bpe")
def prepare_bpe_cmd(
    source_lang: Annotated[str, typer.Option("--source-lang", "-s", help="Source language suffix, e.g. en.")],
    target_lang: Annotated[str, typer.Option("--target-lang", "-t", help="Target language suffix, e.g. de.")],
    trainpref: Annotated[str, typer.Option(help="Train prefix: PREFIX.LANG or PREFIX.LANG.gz.")],
    destdir: Annotated[Path, typer.Option(help="Output directory for the binarized dataset.")],
    validpref: Annotated[str | None, typer.Option(help="Validation prefix (split 'valid').")] = None,
    testpref: Annotated[
        str | None, typer.Option(help="Comma-separated test prefixes (splits test, test1, ...).")
    ] = None,
    vocab_size: Annotated[int, typer.Option(help="Joint sentencepiece vocabulary size.")] = 8000,
    model_type: Annotated[str, typer.Option(help="Sentencepiece model type: bpe or unigram.")] = "bpe",
    character_coverage: Annotated[float, typer.Option(help="Sentencepiece character coverage.")] = 1.0,
    byte_fallback: Annotated[
        bool, typer.Option(help="Byte fallback, so no input becomes <unk>.")
    ] = True,
    input_sentence_size: Annotated[
        int, typer.Option(help="Sentences sampled to learn BPE (bounds memory/time on big corpora).")
    ] = 2_000_000,
    spm_model: Annotated[
        Path | None, typer.Option(help="Reuse this sentencepiece model instead of learning one.")
    ] = None,
    max_len: Annotated[int, typer.Option(help="Drop training pairs with a side longer than this (tokens).")] = 250,
    min_len: Annotated[int, typer.Option(help="Drop training pairs with a side shorter than this (tokens).")] = 1,
    max_ratio: Annotated[
        float, typer.Option(help="Drop training pairs whose token-length ratio exceeds this; 0 = off.")
    ] = 3.0,
    workers: Annotated[int, typer.Option(help="Encoding processes (default: all cores).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed for sentence sampling.")] = 1,
    force: Annotated[bool, typer.Option(help="Replace an existing destdir.")] = False,
) -> None:
    """Learn a joint sentencepiece BPE model and binarize train/valid/test.

    Example: nmt prepare-bpe -s en -t de --trainpref D/train --validpref D/val
    --testpref D/test_2016_flickr,D/test_2017_flickr --vocab-size 8000 --destdir data-bin/m30k
    """
    from nmt.prepare import PrepareOptions, prepare_bpe

    opts = PrepareOptions(
        source_lang=source_lang,
        target_lang=target_lang,
        trainpref=trainpref,
        validpref=validpref,
        testpref=testpref,
        destdir=str(destdir),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        input_sentence_size=input_sentence_size,
        spm_model=str(spm_model) if spm_model else None,
        max_len=max_len,
        min_len=min_len,
        max_ratio=max_ratio,
        workers=workers or (os.cpu_count() or 1),
        force=force,
        seed=seed,
    )
    prepare_bpe(opts, progress=sys.stderr.isatty())


# ------------------------------------------------------------------ train

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key, e.g. --set train.lr=7e-4 (repeatable)."),
]


@app.command("train")
def train_cmd(
    config: Annotated[Path, typer.Argument(help="YAML config, e.g. configs/base.yaml.")],
    set_: SetOption = None,
    run_dir: Annotated[Path | None, typer.Option(help="Run directory (overrides train.run_dir).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N (overrides train.device).")] = None,
    dump_config: Annotated[bool, typer.Option(help="Print the resolved config and exit.")] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Build the model without data, print its summary and parameter count.")
    ] = False,
    vocab_size: Annotated[
        int | None, typer.Option(help="Vocabulary size for --dry-run (default: from data.dir).")
    ] = None,
    reset_optimizer: Annotated[
        bool, typer.Option(help="On resume: keep the weights, start a fresh optimizer and schedule.")
    ] = False,
    reset_data: Annotated[
        bool, typer.Option(help="On resume: accept changed training data; restart the epoch.")
    ] = False,
) -> None:
    """Train a Transformer; running it again on the same run directory resumes exactly.

    Many GPUs: torchrun --standalone --nproc_per_node N -m nmt train CONFIG
    """
    from nmt import config as cfgmod

    overrides = list(set_ or [])
    if run_dir is not None:
        overrides.append(f"train.run_dir={run_dir}")
    if device is not None:
        overrides.append(f"train.device={device}")
    cfg = cfgmod.load_config(config, overrides)
    if dump_config:
        typer.echo(cfgmod.dump_config(cfg), nl=False)
        return
    if dry_run:
        from nmt.train import dry_run as _dry_run

        typer.echo(_dry_run(cfg, vocab_size))
        return
    from nmt.train import train

    result = train(cfg, reset_optimizer=reset_optimizer, reset_data=reset_data)
    if result.interrupted_by is not None:
        print(f"nmt train: {result.reason}", file=sys.stderr)
        raise typer.Exit(128 + result.interrupted_by)


# ------------------------------------------------------------------ average-checkpoints


@app.command("average-checkpoints")
def average_cmd(
    inputs: Annotated[list[Path], typer.Argument(help="A run directory (with --last) or checkpoint files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the average.")],
    last: Annotated[
        int | None, typer.Option(help="Average the N latest checkpoint_<update>.pt of RUN_DIR.")
    ] = None,
) -> None:
    """Average model weights of several checkpoints (fp32 accumulation, original dtypes).

    Examples: nmt average-checkpoints runs/m30k --last 5 -o runs/m30k/checkpoint_avg.pt;
    nmt average-checkpoints a.pt b.pt c.pt -o avg.pt
    """
    from nmt.checkpoint import average_checkpoints, select_for_average

    if last is not None:
        if len(inputs) != 1 or not inputs[0].is_dir():
            raise NmtError("--last N takes exactly one run directory")
        if last < 1:
            raise NmtError("--last must be at least 1")
        paths = select_for_average(inputs[0], last)
    else:
        if any(p.is_dir() for p in inputs):
            raise NmtError(f"{next(p for p in inputs if p.is_dir())} is a directory: add --last N")
        paths = list(inputs)
    average_checkpoints(paths, output)
    logging.getLogger(__name__).info(
        "averaged %d checkpoints (%s) into %s", len(paths), ", ".join(p.name for p in paths), output
    )


# ------------------------------------------------------------------ translate


@app.command("translate")
def translate_cmd(
    checkpoint: Annotated[
        list[Path] | None,
        typer.Option("--checkpoint", "-c", help="Checkpoint(s); several decode as an ensemble."),
    ] = None,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="Input file (default stdin).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file (default stdout).")] = None,
    beam: Annotated[int | None, typer.Option(help="Beam size (default: the checkpoint's decode.beam).")] = None,
    lenpen: Annotated[
        float | None,
        typer.Option(help="Length penalty alpha. gnmt: score = logP / ((5+|Y|)/6)^alpha; "
                     "length: score = logP / |Y|^alpha; none: score = logP. |Y| counts EOS."),
    ] = None,
    lenpen_style: Annotated[str | None, typer.Option(help="gnmt, length or none.")] = None,
    max_len_a: Annotated[float | None, typer.Option(help="Max output length = a * src_len + b.")] = None,
    max_len_b: Annotated[int | None, typer.Option(help="See --max-len-a.")] = None,
    min_len: Annotated[int | None, typer.Option(help="Block EOS before this many tokens.")] = None,
    no_repeat_ngram_size: Annotated[int | None, typer.Option(help="Forbid repeated n-grams.")] = None,
    nbest: Annotated[int, typer.Option(help="Hypotheses per input line (tab-separated with --scores).")] = 1,
    scores: Annotated[bool, typer.Option(help="Prefix each output with its score and a tab.")] = False,
    batch_size: Annotated[int | None, typer.Option(help="Sentences per batch.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Source tokens per batch (instead of --batch-size).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    precision: Annotated[str, typer.Option(
        help="fp32, bf16, fp16 (CUDA only) or int8 (CPU only, so --device auto means the CPU: "
             "the decoder and output projection in int8, as Marian's int8 decoding; see README).")] = "fp32",
    threads: Annotated[int, typer.Option(help="CPU threads; 0 = torch default.")] = 0,
    workers: Annotated[
        int,
        typer.Option(help="CPU: batches decoded at once, each on its own thread (the threads are "
                     "shared out among them); 0 = one per thread. GPU: always 1."),
    ] = 0,
    shortlist: Annotated[
        Path | None,
        typer.Option(help="A file from `nmt shortlist`: decode each sentence over its likely target "
                     "tokens only (faster, approximate; off by default)."),
    ] = None,
) -> None:
    """Translate raw text, one output line for every input line (stdin -> stdout).

    With no --checkpoint, uses the last `nmt train` run here (its checkpoint_avg.pt if
    present, else checkpoint_best.pt).
    """
    from nmt.translate import TranslateOptions, translate_main

    opts = TranslateOptions(
        checkpoints=[str(p) for p in (checkpoint or [])],
        input=str(input) if input else None,
        output=str(output) if output else None,
        beam=beam,
        lenpen=lenpen,
        lenpen_style=lenpen_style,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        min_len=min_len,
        no_repeat_ngram_size=no_repeat_ngram_size,
        nbest=nbest,
        scores=scores,
        batch_size=batch_size,
        max_tokens=max_tokens,
        device=device,
        precision=precision,
        threads=threads,
        workers=workers,
        shortlist=str(shortlist) if shortlist else None,
    )
    translate_main(opts)


@app.command("shortlist")
def shortlist_cmd(
    data_dir: Annotated[Path, typer.Argument(help="A directory written by nmt prepare-bpe.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the shortlist.")],
    top: Annotated[int, typer.Option(help="Likeliest translations kept per source token.")] = 20,
    frequent: Annotated[int, typer.Option(help="Most frequent target tokens always allowed.")] = 100,
    iterations: Annotated[int, typer.Option(help="EM iterations of IBM Model 1.")] = 5,
    max_sentences: Annotated[int, typer.Option(help="Learn from at most this many train pairs.")] = 1_000_000,
) -> None:
    """Learn a lexical shortlist for `nmt translate --shortlist` (Marian's --shortlist).

    p(target token | source token) by IBM Model 1 on the train split; each sentence may then
    produce only the special and the --frequent most frequent tokens, its own tokens and the
    --top translations of each of its tokens. Example: nmt shortlist data-bin/m30k -o
    data-bin/m30k/shortlist.pt
    """
    from nmt.shortlist import learn_shortlist, save_shortlist

    shortlist = learn_shortlist(data_dir, top=top, frequent=frequent, iterations=iterations,
                                max_sentences=max_sentences)
    save_shortlist(shortlist, output)
    logging.getLogger(__name__).info("wrote %s (%d source tokens x top %d, %d frequent)", output,
                                     shortlist.vocab_size, top, shortlist.frequent.numel())


# ------------------------------------------------------------------ score


@app.command("score")
def score_cmd(
    ref: Annotated[
        list[Path] | None, typer.Option("--ref", "-r", help="Reference file(s); repeat for several.")
    ] = None,
    hyp: Annotated[Path | None, typer.Option(help="Hypotheses (default stdin).")] = None,
    test_set: Annotated[
        str | None, typer.Option(help="A sacreBLEU test set instead of --ref, e.g. wmt14.")
    ] = None,
    langpair: Annotated[str | None, typer.Option(help="Language pair for --test-set, e.g. en-de.")] = None,
    metrics: Annotated[str, typer.Option(help="Comma-separated: bleu, chrf, ter.")] = "bleu,chrf",
    tokenize: Annotated[str | None, typer.Option(help="sacreBLEU tokenizer (default 13a).")] = None,
    lowercase: Annotated[bool, typer.Option(help="Case-insensitive BLEU.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """sacreBLEU scores (BLEU, chrF, TER) of detokenized hypotheses, with signatures.

    Examples: nmt score --ref ref.de < out.de; nmt score --test-set wmt14 --langpair en-de < out.de
    """
    from nmt import evaluate

    if (ref is None) == (test_set is None):
        raise NmtError("give either --ref FILE or --test-set NAME --langpair XX-YY")
    if test_set is not None:
        if not langpair:
            raise NmtError("--test-set needs --langpair, e.g. --langpair en-de")
        _, refs = evaluate.load_test_set(test_set, langpair)
        ref_streams, names = refs, [f"{test_set}:{langpair}"] * len(refs)
    else:
        assert ref is not None
        ref_streams = [evaluate.read_lines(p) for p in ref]
        names = [str(p) for p in ref]
    if hyp is not None:
        hyps = evaluate.read_lines(hyp)
    else:
        hyps = [line.rstrip("\n") for line in sys.stdin]
    results = evaluate.score_corpus(
        hyps,
        ref_streams,
        metrics=tuple(m.strip() for m in metrics.split(",") if m.strip()),
        tokenize=tokenize,
        lowercase=lowercase,
        names=names,
    )
    typer.echo(evaluate.format_results(results, json=json_))


# ------------------------------------------------------------------ entry point


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, non-zero exits, tracebacks only with --debug."""
    args = sys.argv[1:] if argv is None else argv
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="nmt", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except NmtError as e:
        if _DEBUG or "--debug" in args:
            raise
        print(f"nmt: error: {e}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("nmt: interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as e:  # usage errors: unknown option, bad value, missing argument
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "nmt"
        print(f"{where}: error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("nmt: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # `nmt translate ... | head`: the reader went away; not an error of ours.
        sys.stderr.close()
        sys.exit(0)
