"""The options of every command (a training config's keys are nmt.config's), declared once with
their types, defaults, help and bounds. `nmt.cli` makes each command's arguments and flags from
these fields (and `translate`'s decode flags from `DecodeConfig`); the library checks their
bounds. The Python API (`nmt.api.Translator.load`) takes the fields of `TranslateOptions` that
are not the command's stream I/O (`opt(..., io=True)`) as keyword arguments, with the
`DecodeConfig` fields, so the command and the API cannot drift apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nmt.config import Config, load_config
from nmt.device import PRECISIONS
from nmt.errors import NmtError, require
from nmt.fields import REQUIRED, check_bounds, flag, opt, opt_list


def default_workers() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


DEFAULT_VOCAB_SIZE = 8000  # of the sentencepiece model prepare-bpe learns


@dataclass
class PrepareOptions:
    """The options of `nmt prepare-bpe`, declared once: the command's flags are made from
    these fields (nmt.cli); `check` checks them."""

    source_lang: str = opt(
        REQUIRED, "Source language suffix, e.g. en.", flags=("--source-lang", "-s")
    )
    target_lang: str = opt(
        REQUIRED, "Target language suffix, e.g. de.", flags=("--target-lang", "-t")
    )
    trainpref: str = opt(REQUIRED, "Train prefix: PREFIX.LANG or PREFIX.LANG.gz.")
    destdir: str = opt(REQUIRED, "Output directory for the binarized dataset.")
    validpref: str | None = opt(None, "Validation prefix (split 'valid').")
    testpref: str | None = opt(None, "Comma-separated test prefixes (splits test, test1, ...).")
    vocab_size: int | None = opt(
        None,
        f"Joint sentencepiece vocabulary size to learn (default {DEFAULT_VOCAB_SIZE}); "
        "with --separate-vocab, the source's.",
        at_least=8,
    )
    separate_vocab: bool = opt(
        False,
        "Learn a source and a target sentencepiece model, each on its own side "
        "(separate vocabularies; the model needs model.share_embeddings: false).",
    )
    target_vocab_size: int | None = opt(
        None,
        "With --separate-vocab: the target model's size (default: --vocab-size's).",
        at_least=8,
    )
    model_type: str = opt(
        "bpe", "Sentencepiece model type: bpe or unigram.", choices=("bpe", "unigram")
    )
    character_coverage: float = opt(1.0, "Sentencepiece character coverage.", above=0, at_most=1)
    byte_fallback: bool = opt(True, "Byte fallback, so no input becomes <unk>.")
    input_sentence_size: int = opt(
        2_000_000, "Sentences sampled to learn BPE (bounds memory/time on big corpora).", at_least=0
    )
    spm_model: str | None = opt(None, "Reuse this sentencepiece model instead of learning one.")
    tokenizer_from: str | None = opt(
        None,
        "Segment with the tokenizer and vocabulary of this nmt checkpoint (the sentencepiece "
        "model inside it, copied byte for byte to spm.model) instead of learning one: data to "
        "fine-tune it on (train.init_from). Not with --vocab-size or --spm-model.",
    )
    max_len: int = opt(
        250, "Drop training pairs with a side longer than this (tokens).", at_least=1
    )
    min_len: int = opt(1, "Drop training pairs with a side shorter than this (tokens).")
    max_ratio: float = opt(
        3.0, "Drop training pairs whose token-length ratio exceeds this; 0 = off."
    )
    workers: int = opt(
        None, "Encoding threads (default: all cores).", factory=default_workers, at_least=1
    )
    seed: int = opt(1, "Seed for sentence sampling.", at_least=0)
    force: bool = opt(False, "Replace an existing destdir.")

    def check(self) -> None:
        """The options' declared bounds and the rules between them, each refused in one line
        naming its flag."""
        require(
            bool(self.source_lang and self.target_lang),
            "--source-lang and --target-lang are required",
        )
        require(self.source_lang != self.target_lang, "--source-lang and --target-lang must differ")
        require(bool(self.trainpref), "--trainpref is required")
        require(bool(self.destdir), "--destdir is required")
        # --tokenizer-from: the checkpoint's vocabulary, nothing learned or chosen
        if self.tokenizer_from is not None:
            require(
                self.spm_model is None,
                "--tokenizer-from and --spm-model cannot be combined: the checkpoint "
                "brings its own sentencepiece model",
            )
            require(
                self.vocab_size is None,
                "--vocab-size cannot be combined with --tokenizer-from: the vocabulary "
                "is the checkpoint's",
            )
        require(
            not (self.separate_vocab and (self.spm_model or self.tokenizer_from)),
            "--separate-vocab learns two "
            "models; it cannot be combined with --spm-model or --tokenizer-from",
        )
        # --spm-model brings its own vocabulary: --vocab-size is not used then
        check_bounds(self if self.spm_model is None else replace(self, vocab_size=None), flag)
        require(
            self.separate_vocab or self.target_vocab_size is None,
            "--target-vocab-size needs --separate-vocab",
        )
        require(0 <= self.min_len <= self.max_len, "--min-len must be in [0, --max-len]")
        require(
            self.max_ratio == 0 or self.max_ratio >= 1, "--max-ratio must be 0 (off) or at least 1"
        )


@dataclass
class TranslateOptions:
    """The options of `nmt translate`, declared once: the command's flags are made from these
    fields (nmt.cli), and the decode settings from the fields of `DecodeConfig`."""

    checkpoints: list[Path] = opt_list(
        "Checkpoint(s); several decode as an ensemble.", flags=("--checkpoint", "-c")
    )
    input: Path | None = opt(
        None, "Input file, plain or gzip (default or -: stdin).", flags=("--input", "-i"), io=True
    )
    output: Path | None = opt(
        None, "Output file (default or -: stdout).", flags=("--output", "-o"), io=True
    )
    # the decode settings over the checkpoint's: DecodeConfig fields (--beam, --lenpen, ...)
    decode: dict[str, Any] = field(default_factory=dict, metadata={"cli": False})
    nbest: int = opt(1, "Hypotheses per input line (tab-separated with --scores).", io=True)
    scores: bool = opt(False, "Prefix each output with its score and a tab.", io=True)
    alignment: bool = opt(
        False,
        "After each translation, a tab and its hard alignment in Pharaoh format (source-target "
        "pairs `i-j` of sentencepiece pieces, 0-based, without </s>): for each target piece the "
        "source piece with the most cross-attention of --alignment-layer, averaged over heads.",
        io=True,
    )
    attention: Path | None = opt(
        None,
        "Write the cross-attention of each translation (every decoder layer and head, the best "
        "hypothesis) with its source and target pieces to this .npz file, as each line is "
        "translated (memory stays flat; the file grows by layers x heads x target x source x 4 "
        "bytes a line before compression, e.g. ~60 KB for 6 layers, 8 heads and 18 x 18 pieces) "
        "and complete at the end; draw it with `nmt plot attention`.",
        io=True,
    )
    buffer_lines: int = opt(
        0,
        "Translate after this many lines, or as soon as the input pauses (nothing more waiting on "
        "the pipe), so that a co-process gets each answer before it sends the next line; 1 = "
        "strictly line by line. 0 = chunks of 4096 lines, except on a terminal, which is answered "
        "as soon as a line is typed.",
        io=True,
    )
    device: str = opt("auto", "auto, cpu, cuda or cuda:N.")
    precision: str = opt(
        "fp32",
        "fp32, bf16, fp16 (CUDA only), int8 (CPU only, so --device auto means the CPU: the "
        "decoder and output projection in int8, as Marian's int8 decoding; see the translating "
        "guide) or auto (bf16 where the device computes it natively, AVX512-BF16, AMX or a GPU "
        "with bf16; fp32 elsewhere).",
        choices=(*PRECISIONS, "int8", "auto"),
    )
    engine: str = opt(
        "auto",
        "auto, torch or ctranslate2. ctranslate2 decodes with CTranslate2 (needs "
        "nmt[ctranslate2]), the checkpoint converted once into --cache-dir, and refuses a "
        "setting it cannot honour in one line; auto takes CTranslate2 where the settings allow "
        "it and torch elsewhere, and says which in the log (the translating guide has the "
        "table).",
        choices=("auto", "torch", "ctranslate2"),
    )
    cache_dir: Path | None = opt(
        None, "Where checkpoints converted for CTranslate2 are kept; default $XDG_CACHE_HOME/nmt."
    )
    threads: int = opt(0, "CPU threads; 0 = torch default.", at_least=0)
    workers: int = opt(
        0,
        "CPU: batches decoded at once, each on its own thread (the threads are "
        "shared out among them); 0 = one per thread. GPU: always 1.",
        at_least=0,
    )
    shortlist: Path | None = opt(
        None,
        "A file from `nmt shortlist`: decode each sentence over its "
        "likely target tokens only (faster, approximate; off by default).",
    )
    json_input: bool = opt(
        False,
        'Each input line is a JSON object: {"text": ..., "constraints": [...], "avoid": [...], '
        '"prefix": ..., "ordered": false}, every key but text optional (Sockeye\'s '
        "--json-input): target phrases that must appear, phrases that must not, the translation's "
        "start; still one output line per input line.",
        io=True,
    )
    split_sentences: bool = opt(
        False,
        "Translate each line sentence by sentence (needs nmt[split]): its sentences in the "
        "model's source language, pieces with nothing to translate (emoji, numbers, URLs) kept "
        "as they are, a sentence too long for the model translated in pieces with a warning; "
        "still one output line per input line, the translations of its sentences joined as "
        "they were (with --nbest, the n-best of one-sentence lines; one hypothesis otherwise). "
        "Not with --json-input or --attention.",
        io=True,
    )
    terminology: Path | None = opt(
        None,
        "A file of 'source term<TAB>target term' lines: where a source term occurs in a line "
        "(whole words, any case), its target term must appear in the translation (a lexical "
        "constraint). A summary goes to stderr at the end.",
    )
    target_lang: str | None = opt(
        None,
        "Multilingual models (OPUS-MT, Marian): the target language, e.g. fra: each source line "
        "starts with the model's >>fra<< token (a line that already starts with a >>xxx<< token "
        "keeps its own). The model must have the token; refused for models without such tokens.",
    )
    alignment_layer: int | None = opt(
        None,
        "Decoder layer whose cross-attention gives --alignment: 0-based, negative from the end; "
        "default: the last (the RNN has one).",
    )


def _as_in(cls: type, name: str) -> Any:
    """Field `name` of another options class, declared once there: the same default, help and
    bounds."""
    f = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
    return field(default=f.default, metadata=f.metadata)


@dataclass
class ServeOptions:
    """The options of `nmt serve`, declared once: the command's flags are made from these fields
    (nmt.cli), the decode settings from `DecodeConfig`'s; the model options are `nmt
    translate`'s."""

    checkpoints: list[Path] = opt_list(
        "A checkpoint to serve (several: an ensemble), under the name its "
        "languages give (e.g. en-de).",
        flags=("--checkpoint", "-c"),
    )
    models: list[str] = opt_list(
        "NAME=CHECKPOINT: serve this checkpoint as model NAME; repeat for several models, e.g. "
        "--model en-de=a.pt --model de-en=b.pt. A NAME like en-de says "
        "its languages (for /translate and /languages).",
        flags=("--model",),
    )
    host: str = opt(
        "127.0.0.1", "Address to bind; anything but loopback without --api-keys is warned about."
    )
    port: int = opt(
        8080,
        "Port to bind; 0 = a free one (the URL printed says which).",
        at_least=0,
        at_most=65535,
    )
    decode: dict[str, Any] = field(default_factory=dict, metadata={"cli": False})
    device: str = _as_in(TranslateOptions, "device")
    precision: str = _as_in(TranslateOptions, "precision")
    engine: str = _as_in(TranslateOptions, "engine")
    cache_dir: Path | None = _as_in(TranslateOptions, "cache_dir")
    threads: int = _as_in(TranslateOptions, "threads")
    workers: int = _as_in(TranslateOptions, "workers")
    shortlist: Path | None = _as_in(TranslateOptions, "shortlist")
    terminology: Path | None = _as_in(TranslateOptions, "terminology")
    target_lang: str | None = _as_in(TranslateOptions, "target_lang")
    alignment_layer: int | None = _as_in(TranslateOptions, "alignment_layer")
    batch_tokens: int = opt(
        4096,
        "A batch's (or running search's) budget of padded source tokens (sentences x the longest).",
        at_least=1,
    )
    continuous: bool = opt(
        True,
        "Sentences join a running beam search between its steps and are answered when "
        "theirs ends (plain beam search); --no-continuous decodes whole batches.",
    )
    max_wait_ms: float = opt(
        0.0,
        "Hold a batch that is not full until its oldest sentence has waited this long; "
        "0 = what is waiting when the worker is free goes.",
        at_least=0,
    )
    max_queue: int = opt(
        4096,
        "Sentences waiting per model; a request that would go over is answered 503 "
        "(429 on /translate) with Retry-After.",
        at_least=1,
    )
    timeout: float = opt(60.0, "Seconds a request may take, queue included; then 504.", above=0)
    read_timeout: float = opt(
        10.0, "Seconds a client may take to send its request body; then 408.", above=0
    )
    head_timeout: float = opt(
        10.0,
        "Seconds a client may take to send a request's head (request line and headers) from its "
        "connection or the previous answer; then 408, and the connection is closed.",
        above=0,
    )
    max_head_bytes: int = opt(
        16384, "Largest request head: request line and headers (431 above).", at_least=256
    )
    max_connections: int = opt(
        512, "Open connections at most; one more is answered 503 and closed.", at_least=1
    )
    drain_timeout: int = opt(
        30,
        "On SIGTERM or Ctrl-C, seconds to answer the requests in flight; those still "
        "running then are answered 503.",
        at_least=0,
    )
    max_body_bytes: int = opt(1_000_000, "Largest request body (413 above).", at_least=1)
    max_chars: int = opt(
        5000,
        "Most characters in one text, and in each of its constraints, avoided "
        "phrases and prefix together, and in a request's terminology (400 above).",
        at_least=1,
    )
    max_texts: int = opt(128, "Most texts in one request (400 above).", at_least=1)
    max_beam: int = opt(
        16,
        'Largest "beam" a request may ask for (400 above); the served beam is allowed.',
        at_least=1,
    )
    max_attention: int = opt(
        1_000_000,
        'Most attention weights a request with "alignment" or "attention" may ask for: target x '
        "source tokens of each hypothesis, its target at its length limit (400 above).",
        at_least=1,
    )
    api_keys: Path | None = opt(
        None,
        "A file of API keys, one a line: every translation request must carry one "
        "(api_key, or the header Authorization: Bearer KEY), else 403.",
    )
    cors_origins: list[str] = opt_list(
        "Allow browser pages of this origin (e.g. https://example.org, or *) to "
        "call the API; repeat for several. Off by default.",
        flags=("--cors-origin",),
    )


# : the sentence-level scores (higher is better) of `distill --select`, computed by
# `nmt.evaluate.sentence_scores`
SENTENCE_METRICS = ("chrf", "bleu")


@dataclass
class DistillOptions:
    """The options of `nmt distill`, declared once: the command's flags are made from these
    fields (nmt.cli); `check` checks their bounds, and the other methods make from them the
    options of what distill runs: prepare-bpe's, the teacher's, the student's config."""

    source_lang: str = _as_in(PrepareOptions, "source_lang")
    target_lang: str = _as_in(PrepareOptions, "target_lang")
    trainpref: str = opt(
        REQUIRED,
        "The original training text (PREFIX.LANG or PREFIX.LANG.gz): the teacher "
        "translates its source side; its target side is the reference of --nbest selection.",
    )
    out: Path = opt(
        REQUIRED,
        "The distillation directory: shards/ (the teacher's translations), distilled/ (the "
        "filtered pairs), data-bin/, run/ (the student), distill.json (the report), manifest.json "
        "(what each step was made from). Running the same command again resumes; "
        "finished shards of another teacher, text or setting are refused, never mixed.",
        flags=("--out", "-o"),
    )
    teachers: list[Path] = opt_list(
        "Teacher checkpoint; repeat for an ensemble (mean of log-probabilities). "
        "The student gets the first one's vocabulary.",
        flags=("--teacher",),
    )
    validpref: str | None = opt(
        None, "Validation prefix, prepared with the teacher's vocabulary as it is (not translated)."
    )
    testpref: str | None = opt(None, "Comma-separated test prefixes, prepared as they are.")
    config: Path | None = opt(
        None,
        "The student's training config, e.g. configs/student.yaml (data.dir and train.run_dir are "
        "set to OUT/data-bin and OUT/run). Without it, distill stops "
        "once OUT/data-bin is prepared.",
    )
    sets: list[str] = opt_list(
        "Override a key of the student's config, e.g. --set train.max_time=600 (repeatable).",
        flags=("--set",),
    )
    nbest: int = opt(
        1,
        "Hypotheses the teacher gives per sentence; with more than 1, the one with the best "
        "sentence --select score against the reference is kept (at most the beam).",
        at_least=1,
    )
    select: str = opt(
        "chrf",
        f"The sentence score of --nbest selection: {' or '.join(SENTENCE_METRICS)} "
        "(sacreBLEU's sentence chrF, or sentence BLEU with effective order).",
        choices=SENTENCE_METRICS,
    )
    shard_lines: int = opt(
        5000,
        "Source lines per shard: each shard of translations is written whole when "
        "it is done, and a run killed midway loses at most the shard it was translating.",
        at_least=1,
    )
    beam: int | None = opt(None, "Beam size of the teacher (default: the teacher's decode.beam).")
    device: str = opt(
        "auto",
        "Where the teacher translates: auto, cpu, cuda or cuda:N (the student trains "
        "on its config's train.device).",
    )
    precision: str = opt(
        "fp32",
        "The teacher's precision: fp32, bf16, fp16 (CUDA only), int8 (CPU only) or auto (as "
        "nmt translate's).",
    )
    engine: str = _as_in(TranslateOptions, "engine")
    cache_dir: Path | None = _as_in(TranslateOptions, "cache_dir")
    threads: int = opt(
        0, "CPU threads of the teacher; 0 = torch default (the student: train.threads)."
    )

    def check(self) -> None:
        """The options' declared bounds and the rules between them, each refused in one line
        naming its flag."""
        require(
            bool(self.teachers),
            "give the teacher: --teacher CHECKPOINT (repeat it for an ensemble)",
        )
        self.prepare_options(
            self.trainpref, str(Path(self.out) / "data-bin")
        ).check()  # the languages, the text
        check_bounds(self, flag)

    def prepare_options(self, trainpref: str, destdir: str, force: bool = False) -> PrepareOptions:
        """prepare-bpe's options for the student's data: `trainpref`, the original valid and test
        text, the first teacher's tokenizer."""
        return PrepareOptions(
            source_lang=self.source_lang,
            target_lang=self.target_lang,
            trainpref=trainpref,
            destdir=destdir,
            validpref=self.validpref,
            testpref=self.testpref,
            tokenizer_from=str(self.teachers[0]),
            force=force,
        )

    def teacher_options(self) -> TranslateOptions:
        """translate's options for the teacher (an ensemble for several)."""
        return TranslateOptions(
            checkpoints=list(self.teachers),
            decode={} if self.beam is None else {"beam": self.beam},
            nbest=self.nbest,
            device=self.device,
            precision=self.precision,
            engine=self.engine,
            cache_dir=self.cache_dir,
            threads=self.threads,
        )

    def student_config(self, out: Path) -> Config:
        """--config with --set, trained on OUT/data-bin in OUT/run (unless --set train.run_dir
        names another run directory); checked before anything is translated."""
        keys = {item.partition("=")[0].strip() for item in self.sets}
        options: dict[str, tuple[str, Any]] = {
            "data.dir": ("--out", str(out / "data-bin")),
            "data.source_lang": ("--source-lang", self.source_lang),
            "data.target_lang": ("--target-lang", self.target_lang),
        }
        for key in options:
            if key in keys:
                raise NmtError(
                    f"--set {key}: the student trains on {out / 'data-bin'} "
                    f"({self.source_lang}-{self.target_lang}), which distill prepares; leave it out"
                )
        if "train.run_dir" not in keys:
            options["train.run_dir"] = ("--out", str(out / "run"))
        return load_config(self.config, list(self.sets), options)


@dataclass
class TrainOptions:
    """The options of `nmt train`: a config file, overrides of its keys, what to do with it."""

    config: Path = opt(REQUIRED, "YAML config, e.g. configs/base.yaml.", argument=True)
    sets: list[str] = opt_list(
        "Override a config key, e.g. --set train.lr=7e-4 (repeatable).", flags=("--set",)
    )
    run_dir: str | None = opt(None, "Run directory (overrides train.run_dir).")
    device: str | None = opt(None, "cpu, cuda or cuda:N (overrides train.device).")
    dump_config: bool = opt(False, "Print the resolved config and exit.")
    dry_run: bool = opt(
        False, "Build the model without data, print its summary and parameter count."
    )
    vocab_size: int | None = opt(None, "Vocabulary size for --dry-run (default: from data.dir).")
    reset_optimizer: bool = opt(
        False, "On resume: keep the weights, start a fresh optimizer and schedule."
    )
    reset_data: bool = opt(False, "On resume: accept changed training data; restart the epoch.")


@dataclass
class AverageOptions:
    """The options of `nmt average-checkpoints` (nmt.checkpoint.average_command's arguments)."""

    inputs: list[Path] = opt(
        REQUIRED, "A run directory (with --last) or checkpoint files.", argument=True
    )
    output: Path = opt(REQUIRED, "Where to write the average.", flags=("--output", "-o"))
    last: int | None = opt(
        None, "Average the N latest checkpoint_<update>.pt of RUN_DIR.", at_least=1
    )


@dataclass
class ExportOptions:
    """The options of `nmt export` (nmt.convert.ctranslate2.export's arguments)."""

    checkpoint: Path = opt(REQUIRED, "A checkpoint (e.g. RUN/checkpoint_avg.pt).", argument=True)
    out_dir: Path = opt(REQUIRED, "The model directory to write.", argument=True)
    format: str = opt(
        "ctranslate2",
        "ctranslate2 (a CTranslate2 model directory) or hf (a Hugging Face MarianMT "
        "folder, for transformers and the Hub).",
    )
    quantization: str | None = opt(
        None,
        "ctranslate2: the weight type, int8, int8_float32, int8_float16, int8_bfloat16, "
        "float16, bfloat16 or float32 (default: the checkpoint's float32).",
    )
    force: bool = opt(False, "Replace an existing export in OUT_DIR.")


@dataclass
class ImportOptions:
    """The options of `nmt import` (nmt.convert.marian.import_command's arguments)."""

    source: Path = opt(
        REQUIRED,
        "A Hugging Face MarianMT folder (config.json, model.safetensors or pytorch_model.bin, "
        "source.spm, target.spm, vocab.json), or a Marian release: its folder with decoder.yml, "
        "or the decoder.yml.",
        argument=True,
    )
    output: Path = opt(REQUIRED, "The checkpoint to write.", flags=("--output", "-o"))
    config: Path | None = opt(
        None,
        "Also write a training config to fine-tune it: the imported model section, "
        "train.init_from set to the checkpoint, fine-tuning settings (lr 5e-5, 500 warm-up "
        "updates); set data.dir.",
    )


@dataclass
class ShortlistOptions:
    """The options of `nmt shortlist` (nmt.decoding.shortlist.shortlist_command's arguments)."""

    data_dir: Path = opt(REQUIRED, "A directory written by nmt prepare-bpe.", argument=True)
    output: Path = opt(REQUIRED, "Where to write the shortlist.", flags=("--output", "-o"))
    top: int = opt(20, "Likeliest translations kept per source token.", at_least=0)
    frequent: int = opt(100, "Most frequent target tokens always allowed.", at_least=0)
    iterations: int = opt(5, "EM iterations of IBM Model 1.", at_least=1)
    max_sentences: int = opt(1_000_000, "Learn from at most this many train pairs.", at_least=1)


@dataclass
class ScoreOptions:
    """The options of `nmt score` (what nmt.evaluate.score_command reads)."""

    ref: list[Path] = opt_list("Reference file(s); repeat for several.", flags=("--ref", "-r"))
    hyp: Path | None = opt(None, "Hypotheses (default stdin).")
    test_set: str | None = opt(None, "A sacreBLEU test set instead of --ref, e.g. wmt14.")
    langpair: str | None = opt(None, "Language pair for --test-set, e.g. en-de.")
    metrics: str = opt("bleu,chrf", "Comma-separated: bleu, chrf, ter.")
    tokenize: str | None = opt(None, "sacreBLEU tokenizer (default 13a).")
    lowercase: bool = opt(False, "Case-insensitive BLEU.")
    json: bool = opt(False, "Machine-readable output.", flags=("--json",))


@dataclass
class PlotAttentionOptions:
    """The options of `nmt plot attention` (nmt.plot.plot_attention's arguments)."""

    attention: Path = opt(
        REQUIRED, "A file from nmt translate --attention FILE.npz.", argument=True
    )
    out_dir: Path = opt(REQUIRED, "Directory for attention_<line>.png.", flags=("--output", "-o"))
    layer: int | None = opt(None, "Only this decoder layer (0-based, negative from the end).")
    average: bool = opt(False, "One panel averaged over layers and heads.")
    sentences: int = opt(0, "Only the first N sentences; 0 = all.", at_least=0)


@dataclass
class PlotCurvesOptions:
    """The options of `nmt plot curves` (nmt.plot.plot_curves's arguments)."""

    run_dirs: list[Path] = opt(
        REQUIRED, "Run directories of nmt train (metrics.jsonl).", argument=True
    )
    output: Path = opt(REQUIRED, "The figure to write, e.g. curves.png.", flags=("--output", "-o"))
    labels: list[str] = opt_list("A name per run for the legend (repeat).", flags=("--label",))
