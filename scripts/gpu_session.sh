#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md ("GPU measurements still to make"),
# in one command on a machine with one CUDA GPU (about 25 minutes on an H100):
#
#   scripts/gpu_session.sh [OUT_DIR]            (default bench-out/gpu; needs torch with CUDA,
#                                                sentencepiece, sacrebleu, typer, pyyaml, pytest)
#
# 1. the CUDA tests (make test-gpu: cached == full decode, training learns, fp16 overflow,
#    resume == uninterrupted, no host sync in an update, ...);
# 2. training on the synthetic WMT workload (scripts/bench_train.py --workload wmt), base and
#    big: bf16 and fp16 now; bf16 without length padding (train.pad_to_multiple=1); with
#    torch.compile and with compile + CUDA graphs (reduce-overhead); max_tokens 25k and 50k per
#    batch; and the code before this work (BEFORE, default bench-trees/before: the nmt/ of
#    commit a370fbb, made by `git archive a370fbb nmt | tar -x -C bench-trees/before`);
# 3. the Multi30k rows (configs/multi30k.yaml) in fp32 and bf16;
# 4. decoding: a base-size model trained on Multi30k for TRAIN_S seconds (bf16), averaged,
#    then scripts/bench_translate.py --device cuda, beam 4, source lines joined in pairs (WMT
#    lengths), batch 32, 128, 256 and 512.
# Multi30k comes from MULTI30K (default ../shared/data/multi30k, else bench-data/multi30k: on a
# machine without ../shared, `mkdir -p bench-data && cp -r ../shared/data/multi30k bench-data/` here
# first; bench-data/ and bench-trees/ are git-ignored, so carry them).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/gpu}
BEFORE=${BEFORE:-bench-trees/before}
TRAIN_S=${TRAIN_S:-240}
MULTI30K=${MULTI30K:-../shared/data/multi30k}
[ -d "$MULTI30K" ] || MULTI30K=bench-data/multi30k
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NMT_MULTI30K=$MULTI30K
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a "$OUT/gpu.txt"

step() { echo; echo "== $*"; }
train_bench() { $PY scripts/bench_train.py --workload wmt --no-header "$@"; }

step "CUDA tests"
$PY -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/test-gpu.txt"

step "training, synthetic WMT"
{
  $PY scripts/bench_train.py --workload wmt --precision bf16 fp16 --prepared "$OUT/wmt-data" --json "$OUT/train-now.json"
  train_bench --prepared "$OUT/wmt-data" --precision bf16 --set train.pad_to_multiple=1
  [ -d "$BEFORE/nmt" ] && train_bench --prepared "$OUT/wmt-data" --precision bf16 --repo "$BEFORE"
  train_bench --prepared "$OUT/wmt-data" --config configs/base.yaml --precision bf16 --set train.compile=true --warmup 15
  train_bench --prepared "$OUT/wmt-data" --config configs/base.yaml --precision bf16 --set train.compile=true \
    --set train.compile_mode=reduce-overhead --warmup 25
  for mt in 25000 50000; do
    train_bench --prepared "$OUT/wmt-data" --config configs/base.yaml --precision bf16 \
      --set train.max_tokens=$mt --set train.update_freq=1
  done
  train_bench --prepared "$OUT/wmt-data" --config configs/big.yaml --precision bf16 \
    --set train.max_tokens=25000 --set train.update_freq=1
} 2>&1 | tee "$OUT/train-wmt.md"

step "training, Multi30k"
$PY scripts/bench_train.py --data-dir "$MULTI30K" --precision fp32 bf16 2>&1 | tee "$OUT/train-multi30k.md"

step "decoding a base-size model"
DATA=$OUT/m30k-data RUN=$OUT/m30k-base
[ -f "$DATA/prepare.json" ] || $PY -m nmt prepare-bpe -s en -t de --trainpref "$MULTI30K/train" \
  --validpref "$MULTI30K/val" --testpref "$MULTI30K/test_2016_flickr" --vocab-size 8000 --destdir "$DATA"
$PY -m nmt train configs/base.yaml --set data.dir="$DATA" --run-dir "$RUN" --set train.max_time=$TRAIN_S \
  --set train.max_updates=0 --set train.warmup_updates=1000 --set train.save_interval_updates=250 \
  --set train.validate_interval_updates=0 --set train.max_tokens=25000 --set train.update_freq=1 \
  --set train.valid_bleu=false 2>&1 | tail -3
$PY -m nmt average-checkpoints "$RUN" --last 3 -o "$RUN/avg.pt"
for bs in 32 128 256 512; do
  $PY scripts/bench_translate.py --checkpoint "$RUN/avg.pt" --data-dir "$MULTI30K" --device cuda --beam 4 \
    --join 2 --batch-size $bs --threads 4 $([ $bs = 32 ] && echo --header) --json "$OUT/translate-$bs.json"
done 2>&1 | tee "$OUT/translate.md"
