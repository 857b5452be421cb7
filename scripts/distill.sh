#!/usr/bin/env bash
# `make distill`: sequence-level knowledge distillation of the demo's model (issue 28), each
# stage through the real CLI. The teacher is the model `make demo` trains
# (runs/m30k_SRC_TGT/checkpoint_avg.pt: run `make demo` first). `nmt distill` translates
# Multi30k train with it (resumable, in shards), filters the pairs, prepares them with the
# teacher's vocabulary and trains the student (configs/student.yaml: 6 + 1 layers, d_model 160) on them; the
# student's last checkpoints are averaged, then teacher and student translate test_2016_flickr
# and test_2017_flickr and are scored side by side. Re-running reuses what is done.
# Settings (environment): SRC, TGT, DATA, TEACHER, CONFIG, OUT, AVG (checkpoints averaged),
# BEAM (the teacher's beam while distilling, 5), NBEST (1: the teacher's best; N: the best of N
# by sentence chrF against the reference), EXTRA (more `nmt distill` options, e.g.
# EXTRA="--set train.max_time=600"), THREADS (CPU threads of the teacher's and the tests'
# translations; default nmt's own), REFERENCE (1: also train the student's config on the original
# references, prepared with the teacher's vocabulary, in OUT_reference: the baseline that shows
# what distillation adds at the same config and minutes; it doubles the script's time).
# SMOKE=1: every stage on the first 300 training lines (3 shards; 50 of val and of each test set), the
# student configs/tiny.yaml for 30 updates: a check of the script in about a minute, not a student.
set -euo pipefail
SRC=${SRC:-en}
TGT=${TGT:-de}
SMOKE=${SMOKE:-0}
DATA=${DATA:-data/multi30k}
TEACHER=${TEACHER:-runs/m30k_${SRC}_${TGT}/checkpoint_avg.pt}
AVG=${AVG:-5}
BEAM=${BEAM:-5}
NBEST=${NBEST:-1}
EXTRA=${EXTRA:-}
THREADS=${THREADS:-}
REFERENCE=${REFERENCE:-0}
REF_EXTRA=${REF_EXTRA:-}  # more `nmt train` options for the reference student (--set ...)
TESTS=(test_2016_flickr test_2017_flickr)
if [ "$SMOKE" = 1 ]; then
  CONFIG=${CONFIG:-configs/tiny.yaml}
  OUT=${OUT:-runs/distill_smoke_${SRC}_${TGT}}
  THREADS=${THREADS:-1}  # tiny models: a second thread only waits on a shared machine
  SETS="--set train.max_updates=30 --set train.save_interval_updates=10 --set train.threads=1"
  EXTRA="--shard-lines 100 $SETS $EXTRA"
  REF_EXTRA="$SETS $REF_EXTRA"
else
  CONFIG=${CONFIG:-configs/student.yaml}
  OUT=${OUT:-runs/distill_${SRC}_${TGT}}
fi
RUN=$OUT/run
REF=${OUT}_reference
THREAD_FLAGS=()
[ -n "$THREADS" ] && THREAD_FLAGS=(--threads "$THREADS")
EVAL=${OUT}_eval  # test sets, translations and scores (OUT itself is nmt distill's)
start=$(date +%s)
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"

say "1/4 data: Multi30k $SRC-$TGT into $DATA; teacher $TEACHER"
bash scripts/get_multi30k.sh "$DATA" "$SRC" "$TGT"
if [ ! -f "$TEACHER" ]; then
  echo "distill: no teacher at $TEACHER: run \`make demo\` first (or set TEACHER=CHECKPOINT)" >&2
  exit 1
fi
mkdir -p "$EVAL"
TRAIN=$DATA/train
VAL=$DATA/val
if [ "$SMOKE" = 1 ]; then  # the first lines only (sed reads to the end: no SIGPIPE under pipefail)
  for lang in "$SRC" "$TGT"; do
    gzip -dc "$DATA/train.$lang.gz" | sed -n '1,300p' > "$EVAL/train.$lang"
    gzip -dc "$DATA/val.$lang.gz" | sed -n '1,50p' > "$EVAL/val.$lang"
  done
  TRAIN=$EVAL/train
  VAL=$EVAL/val
fi

say "2/4 nmt distill -> $OUT (resumes, or reuses what is done)"
# shellcheck disable=SC2086
nmt distill --teacher "$TEACHER" -s "$SRC" -t "$TGT" --trainpref "$TRAIN" --validpref "$VAL" \
  --out "$OUT" --config "$CONFIG" --beam "$BEAM" --nbest "$NBEST" ${THREAD_FLAGS[@]+"${THREAD_FLAGS[@]}"} $EXTRA

if [ "$REFERENCE" = 1 ]; then
  say "2b/4 the reference: $CONFIG on the original references -> $REF (resumes, or says it is finished)"
  if [ ! -f "$REF/data-bin/prepare.json" ]; then
    nmt prepare-bpe --source-lang "$SRC" --target-lang "$TGT" --trainpref "$TRAIN" --validpref "$VAL" \
      --tokenizer-from "$TEACHER" --destdir "$REF/data-bin"
  else
    echo "reusing $REF/data-bin" >&2
  fi
  # shellcheck disable=SC2086
  nmt train "$CONFIG" --set data.dir="$REF/data-bin" --set data.source_lang="$SRC" --set data.target_lang="$TGT" \
    --run-dir "$REF/run" $REF_EXTRA
fi

say "3/4 nmt average-checkpoints --last $AVG"
average_last "$RUN" "$AVG"
if [ "$REFERENCE" = 1 ]; then average_last "$REF/run" "$AVG"; fi

MODELS=(teacher student)
if [ "$REFERENCE" = 1 ]; then MODELS+=(reference); fi
say "4/4 nmt translate + nmt score: ${MODELS[*]}"
summary=()
for t in "${TESTS[@]}"; do
  if [ "$SMOKE" = 1 ]; then
    gzip -dc "$DATA/$t.$SRC.gz" | sed -n '1,50p' > "$EVAL/$t.$SRC"
    gzip -dc "$DATA/$t.$TGT.gz" | sed -n '1,50p' > "$EVAL/$t.ref.$TGT"
  else
    gzip -dc "$DATA/$t.$SRC.gz" > "$EVAL/$t.$SRC"
    gzip -dc "$DATA/$t.$TGT.gz" > "$EVAL/$t.ref.$TGT"
  fi
  lines=$(wc -l < "$EVAL/$t.$SRC")
  for who in "${MODELS[@]}"; do
    case $who in
      teacher) ck=$TEACHER ;;
      student) ck=$RUN/checkpoint_avg.pt ;;
      reference) ck=$REF/run/checkpoint_avg.pt ;;
    esac
    t0=$(date +%s%N)
    nmt translate --checkpoint "$ck" ${THREAD_FLAGS[@]+"${THREAD_FLAGS[@]}"} < "$EVAL/$t.$SRC" > "$EVAL/$t.$who.$TGT"
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    nmt score --ref "$EVAL/$t.ref.$TGT" --metrics bleu,chrf < "$EVAL/$t.$who.$TGT" > "$EVAL/$t.$who.score"
    summary+=("$t $who: $(head -n 1 "$EVAL/$t.$who.score"); $(grep -m1 '^chrF' "$EVAL/$t.$who.score" || true)"
              "  $lines sentences in $((ms / 1000)).$(( (ms % 1000) / 100 )) s (nmt translate, its decode settings)")
  done
done

distilled=$(python3 - "$OUT/distill.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1], encoding="utf-8"))
f, p = r["filter"], r.get("prepare", {})
drops = ", ".join(f"{n} {why}" for why, n in {**f["dropped"], **p.get("dropped", {})}.items() if n) or "none"
print(f"{r['lines']} pairs translated, {p.get('kept', f['kept'])} kept for the student (dropped: {drops}); "
      f"n-best {r['select']['nbest']} by {r['select']['metric']}")
PY
)
say "summary"
{
  echo "Multi30k $SRC->$TGT distillation: teacher $TEACHER, student $CONFIG in $RUN"
  echo "$distilled"
  echo "whole script: $(( $(date +%s) - start )) s this invocation"
  for line in "${summary[@]}"; do echo "$line"; done
} | tee "$EVAL/summary.txt"
