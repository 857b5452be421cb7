#!/usr/bin/env bash
# Get Multi30k (task 1, raw) into DEST: train, val, test_2016_flickr, test_2017_flickr.
#   scripts/get_multi30k.sh DEST [LANG ...]        (default languages: en de)
# Downloads the public files of the multi30k/dataset repository (data/task1/raw); a file that
# cannot be downloaded is copied from a local copy instead: $MULTI30K_LOCAL, or ../shared/data/multi30k
# beside this checkout when present.
set -euo pipefail
DEST=${1:?usage: scripts/get_multi30k.sh DEST [LANG ...]}
shift || true
LANGS=("$@")
[ ${#LANGS[@]} -gt 0 ] || LANGS=(en de)
URL=${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw}
HERE=$(cd "$(dirname "$0")/.." && pwd)
LOCAL=${MULTI30K_LOCAL:-$HERE/../shared/data/multi30k}
SPLITS=(train val test_2016_flickr test_2017_flickr)

mkdir -p "$DEST"
missing=()
online=1
for split in "${SPLITS[@]}"; do
  for lang in "${LANGS[@]}"; do
    f=$split.$lang.gz
    [ -s "$DEST/$f" ] && continue
    if [ $online -eq 1 ] && curl -fsSL --retry 2 --connect-timeout 10 -o "$DEST/$f.part" "$URL/$f" 2>/dev/null; then
      mv "$DEST/$f.part" "$DEST/$f"
    elif online=0 && [ -s "$LOCAL/$f" ]; then  # after one failed download, stop trying the network
      cp "$LOCAL/$f" "$DEST/$f.part" && mv "$DEST/$f.part" "$DEST/$f"
    else
      rm -f "$DEST/$f.part"
      # test_2017_flickr has no Czech side upstream; anything else missing is an error
      [ "$split.$lang" = "test_2017_flickr.cs" ] || missing+=("$f")
    fi
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  # one line of advice, whatever is missing
  echo "get_multi30k: could not download ${#missing[@]} file(s) (${missing[*]}) from $URL and found no local copy in $LOCAL: put the Multi30k task 1 raw files in $DEST, or set MULTI30K_LOCAL=DIR to a folder that has them" >&2
  exit 1
fi
echo "Multi30k (${LANGS[*]}) in $DEST: $(ls "$DEST" | wc -l) files" >&2
