#!/usr/bin/env bash
# The three models of docs/benchmarks.md ("RNN, RNN with attention, Transformer: the same CPU
# time"), trained on Multi30k en->de for the same CPU time: the data prepared once,
# then the three trainings started together, each with one thread and the same
# train.max_time, so that each gets the same share of the cores. Then test_2016_flickr is
# translated (beam 5, each config's decode settings) and scored, the learning curves are drawn, and the attention of the same test
# sentences is saved and drawn for the RNN and the Transformer.
#
#   scripts/bench_three_models.sh [MAX_TIME_SECONDS]     (default 900)
#
# Outputs: runs/bench_{rnn_none,rnn_attention,transformer}, bench-out/three_models/.
set -euo pipefail
MAX_TIME=${1:-900}
RAW=${MULTI30K_LOCAL:-../shared/data/multi30k}
DATA=data-bin/m30k_en_de
OUT=bench-out/three_models
NMT=${NMT:-"python -m nmt"}
SENTENCES=${SENTENCES:-"1 4"}  # test_2016_flickr lines (1-based) whose attention is drawn
mkdir -p "$OUT"

if [ ! -f "$DATA/prepare.json" ]; then
  $NMT prepare-bpe -s en -t de --trainpref "$RAW/train" --validpref "$RAW/val" \
    --testpref "$RAW/test_2016_flickr,$RAW/test_2017_flickr" --vocab-size 8000 --destdir "$DATA"
fi

common=(--set "data.dir=$DATA" --set train.threads=1 --set "train.max_time=$MAX_TIME")
$NMT train configs/rnn_multi30k.yaml "${common[@]}" --set model.attention=none \
  --run-dir runs/bench_rnn_none > "$OUT/train_rnn_none.log" 2>&1 &
$NMT train configs/rnn_multi30k.yaml "${common[@]}" \
  --run-dir runs/bench_rnn_attention > "$OUT/train_rnn_attention.log" 2>&1 &
$NMT train configs/multi30k.yaml "${common[@]}" \
  --run-dir runs/bench_transformer > "$OUT/train_transformer.log" 2>&1 &
wait

gzip -dc "$RAW/test_2016_flickr.en.gz" > "$OUT/test.en"
gzip -dc "$RAW/test_2016_flickr.de.gz" > "$OUT/test.de"
for i in $SENTENCES; do sed -n "${i}p" "$OUT/test.en"; done > "$OUT/attention.en"
# Two readings of each run: its last checkpoint, and the average of its last 3 numbered ones
# (a 15-minute run has 3-5, written every 200 updates: averaging 5 would reach back to
# update 200 of a model still learning fast).
for run in rnn_none rnn_attention transformer; do
  $NMT average-checkpoints "runs/bench_$run" --last 3 -o "runs/bench_$run/checkpoint_avg3.pt"
  for c in last avg3; do
    start=$(date +%s.%N)
    $NMT translate -c "runs/bench_$run/checkpoint_$c.pt" --beam 5 -i "$OUT/test.en" -o "$OUT/hyp_${run}_$c.de"
    echo "$run $c: translated in $(echo "$(date +%s.%N) - $start" | bc) s" | tee -a "$OUT/translate_times.txt"
    $NMT score --ref "$OUT/test.de" --hyp "$OUT/hyp_${run}_$c.de" --metrics bleu,chrf | tee "$OUT/score_${run}_$c.txt"
  done
  if [ "$run" != rnn_none ]; then
    $NMT translate -c "runs/bench_$run/checkpoint_last.pt" --beam 5 -i "$OUT/attention.en" \
      --alignment --attention "$OUT/att_${run}_last.npz" > "$OUT/att_${run}_last.de"
    $NMT plot attention "$OUT/att_${run}_last.npz" -o "$OUT/maps_$run" --layer -1
  fi
done
$NMT plot curves runs/bench_rnn_none runs/bench_rnn_attention runs/bench_transformer \
  --label "RNN, no attention" --label "RNN + attention" --label Transformer -o "$OUT/curves.png"
# Which decoder layer aligns best (docs/benchmarks.md, "Which layer aligns")
python scripts/check_alignment_layer.py --data "$DATA" --sentences 500 \
  --checkpoint runs/bench_transformer/checkpoint_last.pt --checkpoint runs/bench_rnn_attention/checkpoint_last.pt
