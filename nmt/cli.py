"""The `nmt` command line: parses options, sets up logging, calls one library function.

This is the only module that imports typer. Library code raises `NmtError` for user
mistakes; `main()` prints it as one line (`nmt: error: ...`) and exits 1. Usage errors
(unknown option, bad value) are one line and exit 2. `--debug` shows tracebacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import inspect
import logging
import os
import signal
import sys
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args, get_origin

import typer

from nmt import __version__, options
from nmt.atomic import write_stdout
from nmt.config import DecodeConfig
from nmt.errors import NmtError

app = typer.Typer(
    name="nmt",
    help="Neural machine translation: prepare data, train, average, translate, score; import, "
    "fine-tune, distill, export and serve models; plot.",
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
    # torch's own default, set at the end of `import torch`: a signal during that import would
    # leave its INFO lines (an atexit "FakeTensor cache stats") after our last line
    logging.getLogger("torch").setLevel(logging.WARNING)


# ------------------------------------------------------------------ options from dataclasses


def _option(f: dataclasses.Field, tp: Any, default: Any, help: str) -> inspect.Parameter:
    """One typer argument or option for a dataclass field: its flags, type and help come from the
    field."""
    if get_origin(tp) is Literal:  # typer takes plain values; the library checks the choice
        tp = type(get_args(tp)[0])
    info = (
        typer.Argument(help=help)
        if f.metadata.get("argument")
        else typer.Option(*f.metadata["flags"], help=help)
    )
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[tp, info]
    )


def _options_command(
    name: str,
    cls: type,
    run: Callable[[Any], None],
    decode_after: str | None = None,
    group: typer.Typer = app,
) -> None:
    """Register command `name` of `group`, whose arguments and options are the fields of the
    dataclass `cls` (declared once, with their help, in nmt.options) and, after field
    `decode_after`, the DecodeConfig fields as optional overrides of a checkpoint's settings,
    collected in
    `cls.decode`; `run(options)` runs it, and its docstring is the command's help."""
    params = []
    decode_keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        # empty: required
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        if f.default_factory is not dataclasses.MISSING:  # an empty list: None on the command line
            default = f.default_factory() or None
        tp = hints[f.name] if default is not None else hints[f.name] | None
        params.append(_option(f, tp, default, f.metadata["help"]))
        if f.name == decode_after:  # the decode settings (translate: after the files)
            decode_hints = typing.get_type_hints(DecodeConfig)
            for d in dataclasses.fields(DecodeConfig):
                if d.metadata.get("cli", True):
                    decode_keys.append(d.name)
                    help = f"{d.metadata['help']} Default: the checkpoint's decode.{d.name}."
                    params.append(_option(d, decode_hints[d.name] | None, None, help))

    def command(**kwargs: Any) -> None:
        decode = {k: kwargs.pop(k) for k in decode_keys}
        if decode_after:
            kwargs["decode"] = {k: v for k, v in decode.items() if v is not None}
        run(
            cls(
                **{
                    k: ([] if v is None and get_origin(hints[k]) is list else v)
                    for k, v in kwargs.items()
                }
            )
        )

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = run.__doc__
    group.command(name)(command)


# ------------------------------------------------------------------ prepare-bpe


def _prepare_bpe(opts: Any) -> None:
    """Learn a joint sentencepiece BPE model and binarize train/valid/test.

    Example: nmt prepare-bpe -s en -t de --trainpref D/train --validpref D/val
    --testpref D/test_2016_flickr,D/test_2017_flickr --vocab-size 8000 --destdir data-bin/m30k
    """
    from nmt.prepare import prepare_bpe

    prepare_bpe(opts, progress=sys.stderr.isatty())


_options_command("prepare-bpe", options.PrepareOptions, _prepare_bpe)


# ------------------------------------------------------------------ train


def _train(opts: options.TrainOptions) -> None:
    """Train a Transformer (or an RNN: model.arch); running it again on the run directory resumes
    exactly.

    Many GPUs: torchrun --standalone --nproc_per_node N -m nmt train CONFIG

    Fine-tuning a checkpoint: --set train.init_from=CHECKPOINT, on data prepared with
    nmt prepare-bpe --tokenizer-from CHECKPOINT (docs/config.md lists every key).
    """
    from nmt import config as cfgmod

    # taken as given (a path is not YAML); errors name the option
    given = {
        key: (flag, value)
        for key, flag, value in (
            ("train.run_dir", "--run-dir", opts.run_dir),
            ("train.device", "--device", opts.device),
        )
        if value is not None
    }
    cfg = cfgmod.load_config(opts.config, opts.sets, given)
    from nmt.training.rundir import run_dir_of_config

    run_dir_given = opts.run_dir is not None or any(
        item.partition("=")[0].strip() == "train.run_dir" for item in opts.sets
    )
    cfg = run_dir_of_config(opts.config, cfg, run_dir_given=run_dir_given)
    if opts.dump_config:
        echo(cfgmod.dump_config(cfg))
        return
    from nmt.training.trainer import dry_run, train

    if opts.dry_run:
        echo(dry_run(cfg, opts.vocab_size))
        return
    result = train(cfg, reset_optimizer=opts.reset_optimizer, reset_data=opts.reset_data)
    if result.interrupted_by is not None:
        print(f"nmt train: {result.reason}", file=sys.stderr)
        raise typer.Exit(128 + result.interrupted_by)


_options_command("train", options.TrainOptions, _train)


# ------------------------------------------------------------------ distill


def _distill(opts: Any) -> None:
    """Distill a teacher into a student: the teacher translates the training source (in shards
    that a rerun never translates again), the best of --nbest by sentence chrF against the
    reference is kept, degenerate pairs are dropped, the rest is prepared with the teacher's
    vocabulary and the student trains on it (--config). Running it again resumes.

    Example: nmt distill --teacher runs/m30k_en_de/checkpoint_avg.pt -s en -t de --trainpref
    data/multi30k/train --validpref data/multi30k/val --out runs/distill --config
    configs/student.yaml
    """
    from nmt.distill import distill

    result = distill(opts, progress=sys.stderr.isatty())
    if result is not None and result.interrupted_by is not None:
        print(f"nmt distill: {result.reason}", file=sys.stderr)
        raise typer.Exit(128 + result.interrupted_by)


_options_command("distill", options.DistillOptions, _distill)


# ------------------------------------------------------------------ average-checkpoints


def _average(opts: options.AverageOptions) -> None:
    """Average model weights of several checkpoints (fp32 accumulation, original dtypes).

    Examples: nmt average-checkpoints runs/m30k --last 5 -o runs/m30k/checkpoint_avg.pt;
    nmt average-checkpoints a.pt b.pt c.pt -o avg.pt
    """
    from nmt.checkpoint import average_command

    average_command(**vars(opts))


_options_command("average-checkpoints", options.AverageOptions, _average)


# ------------------------------------------------------------------ translate


def _translate(opts: Any) -> None:
    """Translate raw text, one output line for every input line (stdin -> stdout).

    With no --checkpoint, uses the last `nmt train` run here (its checkpoint_avg.pt if
    present, else checkpoint_best.pt).
    """
    from nmt.translate import translate_main

    translate_main(opts)


_options_command("translate", options.TranslateOptions, _translate, decode_after="output")


# ------------------------------------------------------------------ serve


def _serve(opts: options.ServeOptions) -> None:
    """Serve checkpoints over HTTP: nmt's API, LibreTranslate's, metrics and a web page at /.

    Batches the sentences of all clients together (pip install 'nmt[serve]'). Examples: nmt
    serve -c runs/m30k/checkpoint_avg.pt; nmt serve --model en-de=a.pt --model de-en=b.pt --port 0
    """
    from nmt.device import spin_briefly

    spin_briefly()  # before nmt.serve.server imports torch
    from nmt.serve.server import serve

    serve(opts)


_options_command("serve", options.ServeOptions, _serve, decode_after="alignment_layer")


# ------------------------------------------------------------------ export


def _export(opts: options.ExportOptions) -> None:
    """Export a checkpoint for a deployment engine (CTranslate2: pip install 'nmt[ctranslate2]').

    Writes model.bin, config.json and shared_vocabulary.json, and spm.model to tokenize with,
    so that ctranslate2.Translator(OUT_DIR) translates. Example: nmt export
    runs/m30k/checkpoint_avg.pt m30k-ct2 --quantization int8
    """
    from nmt.convert.ctranslate2 import export

    export(**vars(opts))


_options_command("export", options.ExportOptions, _export)


def _import(opts: options.ImportOptions) -> None:
    """Import an OPUS-MT / Marian model as an nmt checkpoint (weights, config, tokenizer).

    The checkpoint translates, scores, averages, exports and fine-tunes like any other
    (train.init_from; prepare-bpe --tokenizer-from). Nothing in SOURCE is run: weights load
    as plain tensors. Example: nmt import opus-mt-en-de -o opus-en-de.pt
    """
    from nmt.convert.marian import import_command

    imported = import_command(**vars(opts))
    m = imported.model
    tok = imported.tokenizer
    vocab = (
        f"vocabularies {tok.source_vocab_size} + {tok.vocab_size}"
        if tok.source_vocab_size
        else f"vocabulary {tok.vocab_size}"
    )
    echo(
        f"{opts.output}: {m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, "
        f"{vocab}, {m.activation}, positions {m.positions}, from {imported.source}"
    )


_options_command("import", options.ImportOptions, _import)


def _shortlist(opts: options.ShortlistOptions) -> None:
    """Learn a lexical shortlist for `nmt translate --shortlist` (Marian's --shortlist).

    p(target token | source token) by IBM Model 1 on the train split; each sentence may then
    produce only the special and the --frequent most frequent tokens, its own tokens and the
    --top translations of each of its tokens. Example: nmt shortlist data-bin/m30k -o
    data-bin/m30k/shortlist.pt
    """
    from nmt.decoding.shortlist import shortlist_command

    shortlist_command(**vars(opts))


_options_command("shortlist", options.ShortlistOptions, _shortlist)


# ------------------------------------------------------------------ score


def _score(opts: options.ScoreOptions) -> None:
    """sacreBLEU scores (BLEU, chrF, TER) of detokenized hypotheses, with signatures.

    Examples: nmt score --ref ref.de < out.de; nmt score --test-set wmt14 --langpair en-de < out.de
    """
    from nmt.evaluate import score_command

    echo(score_command(opts))


_options_command("score", options.ScoreOptions, _score)


# ------------------------------------------------------------------ plot

plot_app = typer.Typer(
    help="Attention maps and learning curves (needs matplotlib: pip install 'nmt[plot]')."
)
app.add_typer(plot_app, name="plot", no_args_is_help=True)


def _plot_attention(opts: options.PlotAttentionOptions) -> None:
    """Heat maps of cross-attention, one PNG per sentence (heads averaged, a panel per layer).

    Example: nmt plot attention att.npz -o maps/"""
    from nmt.plot import plot_attention

    plot_attention(**vars(opts))


def _plot_curves(opts: options.PlotCurvesOptions) -> None:
    """Loss, perplexity, valid BLEU and lr against updates and wall time, runs on one figure.

    Example: nmt plot curves runs/a runs/b -o curves.png"""
    from nmt.plot import plot_curves

    plot_curves(**vars(opts))


_options_command("attention", options.PlotAttentionOptions, _plot_attention, group=plot_app)
_options_command("curves", options.PlotCurvesOptions, _plot_curves, group=plot_app)


# ------------------------------------------------------------------ entry point


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt for SIGINT, so that what is
    being written is cleaned up (temporaries removed, old files kept) before the exit (143).
    `nmt train` handles SIGTERM itself while it trains (a checkpoint, then exit 143)."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def _quiet_broken_pipe() -> None:
    """The reader of our stdout went away (`nmt translate ... | head`): not our error, as for any
    Unix filter. Exit 0, quietly; stdout goes to /dev/null so that the interpreter's last flush
    of it cannot complain either."""
    if sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, non-zero exits, tracebacks only with --debug.

    The command runs under our own handlers rather than the CLI framework's: its handlers
    would exit 1 on a broken pipe and 130 on Ctrl-C without a word."""
    args = sys.argv[1:] if argv is None else argv
    command = typer.main.get_command(app)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        _run(command, list(args))
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(command: Any, args: list[str]) -> None:
    try:
        with command.make_context("nmt", args) as ctx:
            command.invoke(ctx)
    except NmtError as e:
        if _DEBUG or "--debug" in args:
            raise
        print(f"nmt: error: {e}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Terminated:
        print("nmt: stopped by SIGTERM", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except (typer.Abort, KeyboardInterrupt):  # not EOFError: a truncated file raises it
        print("nmt: interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except typer.TyperException as e:  # usage errors: unknown option, bad value, missing argument
        ctx = getattr(e, "ctx", None)
        help_only = type(e).__name__ == "NoArgsIsHelpError"  # `nmt` alone: the help
        print(
            ("" if help_only else f"{ctx.command_path if ctx else 'nmt'}: error: ")
            + e.format_message(),
            file=sys.stderr,
        )
        sys.exit(e.exit_code)
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        _quiet_broken_pipe()


def echo(text: str) -> None:
    """Print `text` (and a newline unless it ends in one) on stdout: a closed or full stdout is one
    line naming it; a broken pipe ends quietly (main)."""
    write_stdout(lambda out: out.write(text if text.endswith("\n") else text + "\n"))
