"""`nmt serve` against LibreTranslate serving the same weights: throughput, latency and answers
under 1 / 8 / 32 / 128 clients sending LibreTranslate's own requests, next to offline translation.

    python -m benchmarks libretranslate --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--sentences 0] \\
        [--precision fp32,int8] [--engines torch,ctranslate2] [--threads 2] \\
        [--lt-threads 1:2,2:1] [--nmt-workers 0] [--clients 1,8,32,128] [--beam 4] [--json FILE]

In one run, with nothing else running:
1. LibreTranslate in a virtual environment of its own (`--lt-venv`, default
   bench-out/libretranslate-venv), made where missing: `python -m venv`, `pip install
   torch==2.13.0` first (a CPU build here: releases whose splitter was Stanza depend on torch,
   and an unpinned one is a multi-GB CUDA build; libretranslate 1.9.6 with argos-translate-lt
   1.12.1 no longer needs it), then `pip install libretranslate`; the versions installed are
   reported.
2. For each `--precision` (fp32, int8), the checkpoint exported by `nmt export --format
   ctranslate2` (float32; int8 with `--quantization int8`), made into an Argos Translate package
   (metadata.json, model/ the CTranslate2 model, sentencepiece.model the checkpoint's own
   joint sentencepiece model, which `nmt export` writes as spm.model), zipped as a .argosmodel
   and installed by argostranslate's own `package.install_from_path` into
   `--workdir`/argos-PRECISION (HOME, XDG_DATA_HOME, XDG_CONFIG_HOME, XDG_CACHE_HOME and
   ARGOS_PACKAGES_DIR all there: never the user's home).
3. Offline: `nmt translate --engine E --precision P` of the lines in a child process, with the
   decode settings below and `--split-sentences` (what nmt serve's /translate does), start-up
   subtracted (`benchmarks.serve.offline`): sentences/s and the reference translations. The
   ctranslate2 engine's are LibreTranslate's reference too (the same weights, the same library).
4. Servers, one at a time, each ready before it is measured and stopped after: LibreTranslate
   on a free loopback port (`--load-only SRC,TGT`; `--threads N`, its waitress threads,
   `--lt-http-threads`, default LibreTranslate's own 4) once per `--lt-threads` setting INTER:INTRA
   (ARGOS_INTER_THREADS, ARGOS_INTRA_THREADS: the ctranslate2.Translator's inter_threads and
   intra_threads) and ARGOS_COMPUTE_TYPE float32 or int8_float32 (nmt's own CTranslate2 compute
   types for fp32 and int8); then `nmt serve --engine E --precision P --threads T --workers W`
   for each of `--engines` and `--nmt-workers` (0: one decode worker per thread; on CTranslate2
   each worker's batch runs on its own inter-thread, 1: one batch at a time on every thread).
5. Clients: for each count, that many threads, each with its own keep-alive connection
   (`benchmarks.common.closed_loop`), send LibreTranslate's request, `POST /translate` with
   {"q": line, "source": SRC, "target": TGT, "format": "text"}, one line a request, until all
   lines are answered: sentences/s (answered ones), p50 / p95 / p99 latency, the requests with
   no answer within `--timeout` seconds (or refused), and the answers that differ from the
   offline translation of their line (a few shown, with the source).
Prints a markdown table (each server's sentences/s also as a ratio to the best LibreTranslate
setting at that precision and client count, and to the offline sentences/s of its engine,
LibreTranslate's being nmt's ctranslate2 engine: the bar is at least 0.8x offline with 128
clients); `--json FILE` writes every figure. LibreTranslate's own request log (argostranslate
logs each request's tokens at INFO, as shipped) goes to `--workdir`/argos-P/libretranslate-PORT.log.

Decode settings. argostranslate (`translate.apply_packaged_translation`) calls
`translate_batch(tokens, replace_unknowns=True, max_batch_size=ARGOS_BATCH_SIZE (32),
batch_type="tokens", beam_size=max(num_hypotheses, ARGOS_BEAM_SIZE), num_hypotheses=1 (no
alternatives asked), length_penalty=0.2, return_scores=True)`, so CTranslate2's defaults hold
for the rest: max_decoding_length 256,
min_decoding_length 1, max_input_length 1024, patience 1, no repetition or coverage penalty.
The same on both sides: the weights; beam `--beam` (ARGOS_BEAM_SIZE; default 4, Argos' own);
length penalty 0.2 dividing the log-prob by |Y|**0.2, |Y| counting the EOS (`--lenpen 0.2
--lenpen-style length`; 0.2 is fixed in argostranslate; CTranslate2 counts the EOS with or
without return_end_token); at most 256 output tokens (`--max-len-a 0 --max-len-b 256`); EOS allowed
from the first token (`--min-len 1`); the CTranslate2 compute type; the tokenizer (the same
sentencepiece model; nmt adds the source EOS through the exported config, as Argos relies on).
What cannot be made the same:
- unknown words: Argos lets the search produce <unk> and replaces it with the source token of
  most attention (replace_unknowns); nmt never produces <unk> (disable_unk);
- batching: LibreTranslate translates each request alone (a batch of one sentence) on one of
  its waitress threads, at most INTER at once; nmt serve batches the sentences of all clients
  (torch: continuous batching) on T threads, one worker a thread. Batch shapes change the last
  bits of the floats, so a near tie can go the other way;
- the text around the search: LibreTranslate's `improve_translation_formatting` makes the last
  punctuation mark and the case of the first letter those of the source (and a lower-case or
  upper-case source gives the whole translation that case), and html-unescapes the answer;
  argostranslate's decoding writes "_" as a space; nmt cleans its output (`clean_output`);
- sentence splitting: LibreTranslate's splitters all need a model download (MiniSBD, its
  default, fetches an ONNX model at the first request; Stanza and spaCy models; ARGOS_CHUNK_TYPE
  NONE is not implemented and drops the package), so LibreTranslate runs with ARGOS_CHUNK_TYPE
  MINISBD and MiniSBD's split replaced by "a line is one sentence" (argostranslate still cuts a
  text at its line breaks), and its start-up model check (`libretranslate.init.boot`, which
  fetches the package index and the MiniSBD models) replaced by nothing: the package is
  installed by this suite. nmt serve cuts with sentencex's rules; on Multi30k's test sets each
  line is one sentence for both;
- int8: `nmt serve --engine torch --precision int8` is nmt's own int8 (fbgemm), not
  CTranslate2's: its answers are compared with the offline torch int8 ones.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    closed_loop,
    cpu_seconds,
    percentile,
    read_test_set,
    write_json,
)
from benchmarks.serve import START_TIMEOUT, Server, add_model_and_test_set, offline

# nmt's precision -> (`nmt export --quantization`, ARGOS_COMPUTE_TYPE = nmt's CTranslate2 type)
PRECISIONS = {"fp32": ("float32", "float32"), "int8": ("int8", "int8_float32")}
ARGOS_LENPEN = 0.2  # fixed in argostranslate.translate.apply_packaged_translation
CT2_MAX_DECODING_LENGTH = 256  # translate_batch's default, which argostranslate keeps
NAMES = {"en": "English", "de": "German", "fr": "French", "cs": "Czech"}
DISTRIBUTIONS = ("libretranslate", "argos-translate-lt", "argostranslate", "ctranslate2", "torch")

# run by the venv's python: LibreTranslate's own `main`, with two replacements that keep it off
# the network (see the module's docstring)
LAUNCHER = """\
import sys
import argostranslate.sbd
import libretranslate.init
argostranslate.sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]
libretranslate.init.boot = lambda *args, **kwargs: None
from libretranslate.main import main
sys.argv[0] = "libretranslate"
main()
"""
INSTALL = "import sys\nfrom argostranslate import package\npackage.install_from_path(sys.argv[1])"
VERSIONS = f"""\
import importlib.metadata as m, json
out = {{}}
for name in {DISTRIBUTIONS!r}:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


# ------------------------------------------------------------------ LibreTranslate's side


def lt_venv(venv: Path) -> tuple[Path, dict[str, str]]:
    """The python of LibreTranslate's virtual environment `venv`, made where it lacks
    libretranslate, and the versions of what it holds (read from its metadata: importing
    argostranslate or onnxruntime would write into the user's home)."""
    venv = venv.absolute()  # the servers run in another folder (bin/python: a link to keep)
    python = venv / "bin/python"

    def versions() -> dict[str, str]:
        out = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if "libretranslate" not in versions():
        pip = [str(python), "-m", "pip", "install"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: the CPU build
        subprocess.run([*pip, "libretranslate"], check=True)
    return python, versions()


def argos_env(home: Path) -> dict[str, str]:
    """The environment of every argostranslate process of `home`: its directories all under
    `home`, and an index at a closed loopback port (nothing fetched, should anything try)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    return {
        **env,
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "ARGOS_PACKAGES_DIR": str(home / "packages"),
        "ARGOS_PACKAGE_INDEX": "http://127.0.0.1:9/",
        "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_CHUNK_TYPE": "MINISBD",
    }


def export(checkpoint: str, out: Path, quantization: str) -> None:
    """`nmt export --format ctranslate2` of `checkpoint` into `out`."""
    subprocess.run(
        [sys.executable, "-m", "nmt", "export", checkpoint, str(out), "--format", "ctranslate2"]
        + ["--quantization", quantization, "--force"],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def argos_package(
    python: Path, model: Path, home: Path, src: str, tgt: str, argos_version: str
) -> Path:
    """The exported CTranslate2 model `model` as an Argos Translate package, zipped as a
    .argosmodel and installed by argostranslate into `home` (made anew); the package's folder."""
    shutil.rmtree(home, ignore_errors=True)
    build = home / "build" / f"translate-{src}_{tgt}-nmt"
    shutil.copytree(model, build / "model", ignore=shutil.ignore_patterns("spm.model"))
    shutil.copy(model / "spm.model", build / "sentencepiece.model")
    metadata = {
        "package_version": "1.0",
        "argos_version": argos_version,
        "from_code": src,
        "from_name": NAMES.get(src, src),
        "to_code": tgt,
        "to_name": NAMES.get(tgt, tgt),
        "type": "translate",
        "links": [],
    }
    (build / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    archive = shutil.make_archive(str(build), "zip", root_dir=build.parent, base_dir=build.name)
    argosmodel = Path(archive).rename(build.with_suffix(".argosmodel"))
    subprocess.run([python, "-c", INSTALL, str(argosmodel)], env=argos_env(home), check=True)
    installed = home / "packages" / build.name
    if not (installed / "metadata.json").is_file():
        sys.exit(f"argostranslate did not install {argosmodel} into {installed}")
    return installed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LibreTranslate(Server):
    """LibreTranslate's server (`LAUNCHER`) of the packages of `home` on a free loopback port,
    ready once it lists its languages and has answered one translation (argostranslate loads
    the model at the first); stopped with SIGINT when the `with` block ends."""

    def __init__(self, python: Path, home: Path, options: list[str], env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / f"libretranslate-{self.port}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [python, "-c", LAUNCHER, "--host", "127.0.0.1", "--port", str(self.port)] + options,
                env={**argos_env(home), **env},
                cwd=home,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while self.get("/languages")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(
                    f"LibreTranslate never got ready (exit {self.proc.returncode}): {self.log}"
                )
            time.sleep(0.2)

    def warm(self, request: dict[str, Any]) -> None:
        loop = closed_loop(self.port, [("/translate", request)], 1)
        if loop.answers[0] is None:
            self.stop()
            sys.exit(f"LibreTranslate did not translate ({loop.failures}): {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # waitress ends its loop
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------ measuring


def decode_options(beam: int) -> list[str]:
    """nmt's options for argostranslate's decode settings."""
    return ["--beam", str(beam), "--lenpen", str(ARGOS_LENPEN), "--lenpen-style", "length"] + [
        "--max-len-a",
        "0",
        "--max-len-b",
        str(CT2_MAX_DECODING_LENGTH),
        "--min-len",
        "1",
    ]


def measure(
    server: Server, lines: list[str], n: int, expected: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """One count of clients against `server`: the figures, and the answers that differ from
    `expected` (line, answer)."""
    body = {"source": args.src, "target": args.tgt, "format": "text"}
    requests = [("/translate", {"q": line, **body}) for line in lines]
    before = cpu_seconds(server.proc.pid)
    loop = closed_loop(server.port, requests, n, args.timeout)
    server_cpu = cpu_seconds(server.proc.pid) - before
    got = [a.get("translatedText") if isinstance(a, dict) else None for a in loop.answers]
    differ = [(i, g) for i, g in enumerate(got) if g is not None and g != expected[i]]
    lat = loop.latencies or [float("nan")]
    return {
        "clients": n,
        "sent_s": len(loop.latencies) / loop.seconds,
        "seconds": loop.seconds,
        **{f"p{q}_ms": 1000 * percentile(lat, q) for q in (50, 95, 99)},
        "unanswered": len(lines) - len(loop.latencies),
        "failures": loop.failures,
        "differ": len(differ),
        "differ_formatting_only": sum(formatting_only(expected[i], g) for i, g in differ),
        "examples": [
            {"line": i, "source": lines[i], "offline": expected[i], "answer": g}
            for i, g in differ[: args.examples]
        ],
        "server_cores": server_cpu / loop.seconds,
        "client_cores": loop.client_cpu_s / loop.seconds,
    }


def formatting_only(offline: str, answer: str) -> bool:
    """Whether `answer` is `offline` but for its last punctuation mark and the case of its
    letters (what LibreTranslate's `improve_translation_formatting` changes)."""

    def bare(text: str) -> str:
        return text.strip().rstrip("!?.,;。").lower()

    return bare(offline) == bare(answer)


def run_precision(
    args: argparse.Namespace, lines: list[str], python: Path, versions: dict[str, str], p: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Offline sentences/s of each engine, then every server at precision `p`: (offline figures
    by engine, one row per server setting and count of clients)."""
    work = Path(args.workdir).absolute()  # named in the servers' environment, run elsewhere
    quantization, compute_type = PRECISIONS[p]
    nmt_options = ["--precision", p, "--cache-dir", str(work / "nmt-cache")]
    nmt_options += decode_options(args.beam)
    offline_rows, expected = {}, {}
    for engine in dict.fromkeys([*args.engines, "ctranslate2"]):  # LibreTranslate's reference
        options = ["--engine", engine, "--split-sentences", *nmt_options]
        offline(args.checkpoint, lines[:1], args.threads, "cpu", options)  # the conversion, once
        seconds, expected[engine] = offline(args.checkpoint, lines, args.threads, "cpu", options)
        # nan where start-up varied more than the translation took (too few --sentences)
        sent_s = len(lines) / seconds if seconds > 0 else float("nan")
        offline_rows[engine] = {"sent_s": sent_s, "seconds": seconds}
        print(f"offline {engine} {p}: {sent_s:.1f} sent/s", file=sys.stderr)
    model = work / f"ct2-{quantization}"
    export(args.checkpoint, model, quantization)
    argos = versions.get("argos-translate-lt") or versions.get("argostranslate", "")
    home = work / f"argos-{p}"
    argos_package(python, model, home, args.src, args.tgt, argos)
    rows = []
    warm = {"q": lines[0], "source": args.src, "target": args.tgt, "format": "text"}
    for inter, intra in args.lt_threads:
        env = {
            "ARGOS_INTER_THREADS": str(inter),
            "ARGOS_INTRA_THREADS": str(intra),
            "ARGOS_COMPUTE_TYPE": compute_type,
            "ARGOS_BEAM_SIZE": str(args.beam),
        }
        options = ["--load-only", f"{args.src},{args.tgt}", "--threads", str(args.lt_http_threads)]
        options += ["--disable-files-translation", "--disable-web-ui"]
        with LibreTranslate(python, home, options, env) as server:
            server.warm(warm)
            for n in args.clients:
                row = measure(server, lines, n, expected["ctranslate2"], args)
                rows.append({"server": "libretranslate", "threads": f"{inter}:{intra}", **row})
                print(json.dumps(short(rows[-1])), file=sys.stderr)
    for engine in args.engines:
        for workers in args.nmt_workers:
            options = ["-c", args.checkpoint, "--threads", str(args.threads), "--engine", engine]
            options += ["--workers", str(workers), "--device", "cpu", "--max-queue", "100000"]
            options += ["--timeout", str(args.timeout)]
            with Server(*options, *nmt_options, threads=args.threads) as server:
                for n in args.clients:
                    row = measure(server, lines, n, expected[engine], args)
                    server_name = f"nmt serve --engine {engine}"
                    rows.append({"server": server_name, "threads": f"workers {workers}", **row})
                    print(json.dumps(short(rows[-1])), file=sys.stderr)
    for row in rows:
        row["precision"] = p
    return offline_rows, rows


def short(row: dict[str, Any]) -> dict[str, Any]:
    """A row without its examples, for the progress lines."""
    return {k: v for k, v in row.items() if k != "examples"}


# ------------------------------------------------------------------ the suite


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks libretranslate", description=__doc__.split("\n\n")[0]
    )
    add_model_and_test_set(p)
    p.add_argument("--precision", default="fp32,int8", help="comma-separated, of fp32, int8")
    p.add_argument("--engines", default="torch,ctranslate2", help="nmt serve --engine runs")
    p.add_argument("--clients", default="1,8,32,128")
    p.add_argument("--beam", type=int, default=4, help="both sides' beam (ARGOS_BEAM_SIZE)")
    p.add_argument(
        "--lt-threads",
        default="1:2,2:1",
        help="LibreTranslate's settings to try, INTER:INTRA (ARGOS_INTER_THREADS, "
        "ARGOS_INTRA_THREADS), comma-separated",
    )
    p.add_argument(
        "--nmt-workers",
        default="0",
        help="nmt serve --workers settings to try, comma-separated (0: one per thread; with "
        "CTranslate2, its inter_threads, each with threads/workers intra_threads)",
    )
    p.add_argument("--lt-http-threads", type=int, default=4, help="libretranslate --threads")
    p.add_argument("--lt-venv", default=str(ROOT / "bench-out/libretranslate-venv"))
    p.add_argument(
        "--workdir",
        default=str(ROOT / "bench-out/libretranslate"),
        help="the exports, Argos packages and data, nmt's CTranslate2 cache, the servers' logs",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a request may wait")
    p.add_argument("--examples", type=int, default=3, help="differing answers shown per run")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    args.precision = args.precision.split(",")
    args.engines = [e for e in args.engines.split(",") if e]
    args.clients = [int(c) for c in args.clients.split(",")]
    args.nmt_workers = [int(w) for w in args.nmt_workers.split(",")]
    try:
        args.lt_threads = [tuple(int(x) for x in t.split(":")) for t in args.lt_threads.split(",")]
    except ValueError:
        args.lt_threads = []
    if not args.lt_threads or any(len(t) != 2 or min(t) < 0 for t in args.lt_threads):
        p.error("--lt-threads: INTER:INTRA settings, e.g. 1:2,2:1")
    for precision in args.precision:
        if precision not in PRECISIONS:
            p.error(f"--precision {precision}: one of {', '.join(PRECISIONS)}")
    return args


def label(row: dict[str, Any]) -> str:
    if row["server"] == "libretranslate":
        return f"LibreTranslate {row['threads']}"
    return f"`{row['server']}` ({row['threads']})"


def table(args: argparse.Namespace, offline_rows: dict, rows: list[dict]) -> None:
    """The markdown table: offline, then each server, per precision; LibreTranslate's threads
    as INTER:INTRA, its answers compared with nmt's ctranslate2 engine's offline ones."""
    print(
        "| server | precision | clients | sent/s | p50 ms | p95 ms | p99 ms | unanswered "
        "| differ from offline | x LibreTranslate | x offline |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in args.precision:
        for engine, off in offline_rows[p].items():
            print(
                f"| offline `nmt translate --engine {engine}` | {p} | | {off['sent_s']:.1f} "
                "| | | | | | | 1.00 |"
            )
        for r in (r for r in rows if r["precision"] == p):
            same = [x for x in rows if x["precision"] == p and x["clients"] == r["clients"]]
            lt = [x["sent_s"] for x in same if x["server"] == "libretranslate"]
            best = max(lt, default=float("nan"))  # LibreTranslate's best threads
            engine = "ctranslate2" if r["server"] == "libretranslate" else r["server"].split()[-1]
            differ = f"{r['differ']}"
            if r["server"] == "libretranslate":
                differ += f" ({r['differ_formatting_only']} punctuation/case only)"
            print(
                f"| {label(r)} | {p} | {r['clients']} | {r['sent_s']:.1f} | {r['p50_ms']:.0f} "
                f"| {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {r['unanswered']} | {differ} "
                f"| {r['sent_s'] / best:.2f} "
                f"| {r['sent_s'] / offline_rows[p][engine]['sent_s']:.2f} |"
            )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    lines = read_test_set(args)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    python, versions = lt_venv(Path(args.lt_venv))
    print(f"LibreTranslate's environment: {json.dumps(versions)}", file=sys.stderr)
    offline_rows, rows = {}, []
    for p in args.precision:
        offline_rows[p], more = run_precision(args, lines, python, versions, p)
        rows += more
    print(
        f"\n{len(lines)} lines of {args.test}.{args.src}, {os.cpu_count()} cores, nmt --threads "
        f"{args.threads}, LibreTranslate INTER:INTRA threads, beam {args.beam}, length penalty "
        f"{ARGOS_LENPEN}, {args.checkpoint}; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + "\n"
    )
    table(args, offline_rows, rows)
    print()
    for r in rows:
        if r["clients"] == 128 and r["server"] != "libretranslate":
            ratio = r["sent_s"] / offline_rows[r["precision"]][r["server"].split()[-1]]["sent_s"]
            print(
                f"bar: {label(r)} {r['precision']} with 128 clients at {ratio:.2f}x the offline "
                "sentences/s of its engine (at least 0.8)"
            )
    for r in rows:
        if r["examples"]:
            print(f"\n{label(r)}, {r['precision']}, {r['clients']} clients: {r['differ']} differ")
            for e in r["examples"]:
                print(
                    f"- line {e['line']}: {e['source']!r}\n  offline: {e['offline']!r}\n"
                    f"  served:  {e['answer']!r}"
                )
    figures = {
        "versions": versions,
        "settings": {
            "checkpoint": args.checkpoint,
            "lines": len(lines),
            "threads": args.threads,
            "beam": args.beam,
            "lenpen": ARGOS_LENPEN,
            "max_decoding_length": CT2_MAX_DECODING_LENGTH,
            "lt_http_threads": args.lt_http_threads,
            "timeout_s": args.timeout,
        },
        "offline": offline_rows,
        "runs": rows,
    }
    write_json(args.json, figures)
    return figures
