#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md in one command that fits a 10-minute device call
# (each step is cut at its own time limit and at DEADLINE seconds from the start, default 540):
#
#   [STEPS="1 2 3 4 5"] scripts/gpu_session.sh [OUT_DIR]   (default bench-out/gpu; needs torch with
#                                            CUDA, sentencepiece, sacrebleu, typer, pyyaml, pytest)
#
# In order of importance (STEPS picks some, e.g. "4 5" for a second call; 3 needs 2's model):
# 1. training on the synthetic WMT workload (python -m benchmarks train --workload wmt): base bf16 with
#    the profiler's top operators (profile-base.txt); the CUDA tests (pytest -m gpu in
#    tests/test_gpu.py and tests/test_loss.py); base fp16; big bf16 eager (profile-big.txt);
# 2. decoding: a base-size model trained on Multi30k for TRAIN_S seconds (bf16), averaged, then
#    python -m benchmarks translate --device cuda, beam 4, source lines joined in pairs (WMT
#    lengths), batch 32, 128 and 512;
# 3. `nmt serve` on the GPU with that model (python -m benchmarks serve --device cuda, 32 and 128
#    clients), if starlette and uvicorn are importable or their wheels are carried in .whl;
# 4. torch.compile: base with CUDA graphs (train.compile_mode=reduce-overhead, warmed up on two
#    epochs so that every timed update's shapes were seen twice; torch's cudagraphs log in
#    cudagraphs.txt), base compiled; big bf16 compiled, its config's default (profile-big-compile.txt);
# 5. more training rows: the configs' former batches (base 12,500 x 4, big 6,250 x 8); base
#    without length padding (train.pad_to_multiple=1); the code before the GPU rebuild
#    (BEFORE, default bench-trees/before: `git archive a370fbb nmt | tar -x -C bench-trees/before`).
# Data, prepared here first and carried (bench-data/ and bench-trees/ are git-ignored):
#   mkdir -p bench-data && cp -r ../shared/data/multi30k bench-data/
#   python -c "from pathlib import Path; from benchmarks.train import synthetic_wmt; \
#     synthetic_wmt(Path('bench-data/wmt-data'))"
#   python -m nmt prepare-bpe -s en -t de --trainpref bench-data/multi30k/train \
#     --validpref bench-data/multi30k/val --vocab-size 8000 --destdir bench-data/m30k-data
#   echo /.whl/ >> .git/info/exclude   # nmt serve's extra, which the device image lacks:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl starlette uvicorn
# OUT_DIR receives at most 8 files: gpu.log (everything), test-gpu.txt, profile-base.txt,
# profile-big.txt, profile-big-compile.txt, cudagraphs.txt and results.tgz (every row's JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/gpu}
BEFORE=${BEFORE:-bench-trees/before}
TRAIN_S=${TRAIN_S:-120}
DEADLINE=${DEADLINE:-540}
MULTI30K=${MULTI30K:-bench-data/multi30k}
WMT=${WMT:-bench-data/wmt-data}
M30K=${M30K:-bench-data/m30k-data}
mkdir -p "$OUT"
WORK=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NMT_MULTI30K=$MULTI30K
PY=${PYTHON:-python3}
exec > >(tee -a "$OUT/gpu.log") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (nmt serve's extra)
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

# run LIMIT CMD...: CMD, cut at LIMIT seconds or at the deadline, whichever comes first
run() {
  local limit=$1 left=$((DEADLINE - SECONDS)); shift
  ((left < 20)) && { echo "skipped at ${SECONDS}s (deadline): $*"; return 1; }
  ((limit > left)) && limit=$left
  timeout "$limit" "$@"; local rc=$?
  ((rc == 124)) && echo "cut at ${limit}s: $*"
  return $rc
}
step() { echo; echo "== [${SECONDS}s] $*"; }
part() { [[ " ${STEPS:-1 2 3 4 5} " == *" $1 "* ]]; }
n=0
train_row() { n=$((n + 1)); run "$1" $PY -m benchmarks train --workload wmt --prepared "$WMT" --no-header \
  --json "$WORK/train-$n.json" "${@:2}"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
git log -1 --format='commit %h %cI' 2>/dev/null || true
date -u
$PY -c "from benchmarks.train import HEADER; print(HEADER)"

if part 1; then
step "training, synthetic WMT"
train_row 100 --config configs/base.yaml --precision bf16 --profile-table "$OUT/profile-base.txt"

step "CUDA tests"
run 150 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_loss.py 2>&1 | tail -25 | tee "$OUT/test-gpu.txt"

step "training, synthetic WMT (continued)"
train_row 60 --config configs/base.yaml --precision fp16
train_row 60 --config configs/big.yaml --precision bf16 --set train.compile=false --profile-table "$OUT/profile-big.txt"
fi

if part 2; then
step "decoding a base-size model trained ${TRAIN_S}s on Multi30k"
RUN=$WORK/m30k-base
run $((TRAIN_S + 60)) $PY -m nmt train configs/base.yaml --set data.dir="$M30K" --run-dir "$RUN" \
  --set train.max_time="$TRAIN_S" --set train.max_updates=0 --set train.warmup_updates=1000 \
  --set train.save_interval_updates=100 --set train.validate_interval_updates=0 --set train.keep_last=3 \
  --set train.max_tokens=25000 --set train.valid_bleu=false 2>&1 | tail -3
run 30 $PY -m nmt average-checkpoints "$RUN" --last 3 -o "$RUN/avg.pt"
for bs in 32 128 512; do
  run 60 $PY -m benchmarks translate --checkpoint "$RUN/avg.pt" --data-dir "$MULTI30K" --device cuda --beam 4 \
    --join 2 --batch-size $bs --repeat 2 --no-command $([ $bs = 32 ] && echo --header) --json "$WORK/translate-$bs.json"
done
fi

if part 3; then
step "nmt serve on the GPU, the same model"
if $PY -c "import starlette, uvicorn" 2>/dev/null; then
  run 150 $PY -m benchmarks serve --checkpoint "$RUN/avg.pt" --data-dir "$MULTI30K" --device cuda --threads 4 \
    --clients 32,128 --alone 50 --json "$WORK/serve.json"
else
  echo "skipped: starlette and uvicorn are not installed (carry their wheels in .whl)"
fi
fi

if part 4; then
step "training with torch.compile"
# CUDA graphs replay a shape from its third time; an epoch has 80 shapes in 217 updates, so after 15 warm-up
# updates (H200, 2026-11-26) 16 of the 30 timed ones had new shapes (--shapes-only). Two epochs first
TORCH_LOGS=cudagraphs,perf_hints train_row 300 --config configs/base.yaml --precision bf16 --set train.compile=true \
  --set train.compile_mode=reduce-overhead --warmup-epochs 2 --show-stderr 2> "$OUT/cudagraphs.txt"
train_row 240 --config configs/base.yaml --precision bf16 --set train.compile=true --warmup 15
train_row 200 --config configs/big.yaml --precision bf16 --warmup 15 --profile-table "$OUT/profile-big-compile.txt"
fi

if part 5; then
step "training, synthetic WMT: the configs' former batches, no padding, the code before the GPU rebuild"
train_row 60 --config configs/base.yaml --precision bf16 --set train.max_tokens=12500 --set train.update_freq=4
train_row 60 --config configs/big.yaml --precision bf16 --set train.compile=false --set train.max_tokens=6250 --set train.update_freq=8
train_row 60 --config configs/base.yaml --precision bf16 --set train.pad_to_multiple=1
[ -d "$BEFORE/nmt" ] && train_row 60 --config configs/base.yaml --precision bf16 --repo "$BEFORE"
fi

step "done at ${SECONDS}s"
tar -czf "$OUT/results.tgz" -C "$WORK" $(cd "$WORK" && ls ./*.json 2>/dev/null)
