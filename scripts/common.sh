# Shell functions the demo scripts share (sourced by scripts/demo.sh and scripts/distill.sh).

say() { printf '\n== %s\n' "$*" >&2; }

# average_last RUN N: average the last N (or fewer, as many as there are) update checkpoints of
# RUN into RUN/checkpoint_avg.pt, unless that is newer than RUN/checkpoint_last.pt already.
average_last() {
  local run=$1 last=$2 n
  if [ ! -f "$run/checkpoint_avg.pt" ] || [ "$run/checkpoint_last.pt" -nt "$run/checkpoint_avg.pt" ]; then
    n=$(ls "$run" | grep -cE '^checkpoint_[0-9]+\.pt$' || true)
    nmt average-checkpoints "$run" --last "$(( n < last ? n : last ))" -o "$run/checkpoint_avg.pt"
  else
    echo "reusing $run/checkpoint_avg.pt" >&2
  fi
}
