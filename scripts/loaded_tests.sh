#!/usr/bin/env bash
# `make test` N times in a row on a loaded machine: BUSY processes spin beside it the whole
# time (CI runs on a loaded machine; a test that flakes under load is a defect). Stops at the
# first failure and keeps its log. Usage: scripts/loaded_tests.sh [N=20] [BUSY=2]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20} busy=${2:-2}
logs=$(mktemp -d "${TMPDIR:-/tmp}/nmt-loaded.XXXXXX")
pids=()
for _ in $(seq "$busy"); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for i in $(seq "$runs"); do
  start=$(date +%s)
  if make test > "$logs/run-$i.log" 2>&1; then
    echo "run $i/$runs: $(tail -1 "$logs/run-$i.log") ($(( $(date +%s) - start )) s)"
  else
    echo "run $i/$runs FAILED ($(( $(date +%s) - start )) s); log: $logs/run-$i.log"
    exit 1
  fi
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "not a git checkout: a copy of which commit?")
echo "$runs passed in a row beside $busy busy processes ($(date -u +%F), $commit)"
