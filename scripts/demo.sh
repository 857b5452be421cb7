#!/usr/bin/env bash
# The main job, as `make demo` runs it: Multi30k en->de, prepare -> train -> average ->
# translate -> score, each stage through the real `nmt` CLI. Re-running reuses what is done.
# Settings (environment): SRC, TGT, DATA, BIN, CONFIG, RUN, AVG (checkpoints averaged), LENPENS
# (the length penalties tried on val; the best is used on the test sets), EXTRA (more `nmt train`
# options, e.g. EXTRA="--set train.max_time=600").
set -euo pipefail
SRC=${SRC:-en}
TGT=${TGT:-de}
DATA=${DATA:-data/multi30k}
BIN=${BIN:-data-bin/m30k_${SRC}_${TGT}}
CONFIG=${CONFIG:-configs/multi30k.yaml}
RUN=${RUN:-runs/m30k_${SRC}_${TGT}}
AVG=${AVG:-5}
LENPENS=${LENPENS:-1.0 1.5 2.0 2.5}
EXTRA=${EXTRA:-}
TESTS=(test_2016_flickr test_2017_flickr)
start=$(date +%s)
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"

say "1/6 data: Multi30k $SRC-$TGT into $DATA"
bash scripts/get_multi30k.sh "$DATA" "$SRC" "$TGT"

say "2/6 nmt prepare-bpe -> $BIN"
if [ -f "$BIN/prepare.json" ]; then
  echo "reusing $BIN (delete it to prepare again)" >&2
else
  nmt prepare-bpe --source-lang "$SRC" --target-lang "$TGT" --trainpref "$DATA/train" \
    --validpref "$DATA/val" --testpref "$DATA/test_2016_flickr,$DATA/test_2017_flickr" \
    --vocab-size 8000 --destdir "$BIN"
fi

say "3/6 nmt train $CONFIG -> $RUN (resumes, or says it is finished)"
# shellcheck disable=SC2086
nmt train "$CONFIG" --set data.dir="$BIN" --set data.source_lang="$SRC" --set data.target_lang="$TGT" \
  --run-dir "$RUN" $EXTRA

say "4/6 nmt average-checkpoints --last $AVG"
average_last "$RUN" "$AVG"

say "5/6 the length penalty: nmt translate val with each of $LENPENS, keep the best BLEU"
gzip -dc "$DATA/val.$SRC.gz" > "$RUN/val.$SRC"
gzip -dc "$DATA/val.$TGT.gz" > "$RUN/val.ref.$TGT"
lenpen=""
: > "$RUN/lenpen.txt"
best=-1
for lp in $LENPENS; do
  nmt translate --checkpoint "$RUN/checkpoint_avg.pt" --lenpen "$lp" < "$RUN/val.$SRC" > "$RUN/val.hyp.$TGT"
  bleu=$(nmt score --ref "$RUN/val.ref.$TGT" --metrics bleu < "$RUN/val.hyp.$TGT" | awk '$1 == "BLEU" {print $3}')
  echo "val BLEU $bleu with lenpen $lp" | tee -a "$RUN/lenpen.txt" >&2
  if awk -v a="$bleu" -v b="$best" 'BEGIN {exit !(a > b)}'; then
    best=$bleu
    lenpen=$lp
  fi
done
echo "lenpen $lenpen (val BLEU $best)" | tee -a "$RUN/lenpen.txt" >&2

say "6/6 nmt translate + nmt score"
summary=()
for t in "${TESTS[@]}"; do
  gzip -dc "$DATA/$t.$SRC.gz" > "$RUN/$t.$SRC"
  gzip -dc "$DATA/$t.$TGT.gz" > "$RUN/$t.ref.$TGT"
  t0=$(date +%s)
  nmt translate --checkpoint "$RUN/checkpoint_avg.pt" --lenpen "$lenpen" < "$RUN/$t.$SRC" > "$RUN/$t.hyp.$TGT"
  t1=$(date +%s)
  nmt score --ref "$RUN/$t.ref.$TGT" --metrics bleu,chrf < "$RUN/$t.hyp.$TGT" | tee "$RUN/$t.score"
  summary+=("$t: $(head -n 1 "$RUN/$t.score") [translated in $((t1 - t0)) s]")
done

train_s=$(python3 - "$RUN/metrics.jsonl" <<'PY'
import json, sys
last = 0.0
for line in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(line)
    last = max(last, r.get("elapsed", 0.0))
print(f"{last:.0f}")
PY
)
say "summary"
{
  echo "Multi30k $SRC->$TGT, model $CONFIG, run $RUN"
  echo "training time: ${train_s} s; whole demo: $(( $(date +%s) - start )) s this invocation"
  echo "length penalty $lenpen, chosen on val (BLEU $best; tried $LENPENS)"
  for line in "${summary[@]}"; do echo "$line"; done
  grep -h -m1 "signature" "$RUN/${TESTS[0]}.score" || true
} | tee "$RUN/summary.txt"
